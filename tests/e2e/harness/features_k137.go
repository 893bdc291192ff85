//go:build !k134

package main

// The feature gates every component of the e2e cluster runs with for DRA. In 1.37 all four are on
// by default (pkg/features/kube_features.go: DRAPartitionableDevices beta since 1.36,
// DRADeviceTaints GA in 1.37, not locked; DRAConsumableCapacity beta since 1.36; DRAExtendedResource
// GA and locked in 1.37); they are set explicitly so that a Kubernetes bump that changes a default
// does not silently drop shared counters, device taints or a device's allowMultipleAllocations and
// request policies, which the API server discards without an error when its gate is off, nor stop
// kube-scheduler from serving an extended resource through a DeviceClass's extendedResourceName. kube-apiserver and kube-scheduler get
// them as --feature-gates; harness node (the kubelet's DRA manager) and harness controllers set
// them on the process's default gate; harness realnode writes them into the kubelet's config.
// features_k134.go is the 1.34 build's set.

const draFeatureGates = "DRAPartitionableDevices=true,DRADeviceTaints=true,DRAConsumableCapacity=true,DRAExtendedResource=true"
