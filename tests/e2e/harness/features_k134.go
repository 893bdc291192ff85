//go:build k134

package main

// The DRA feature gates of the 1.34 build: the four gates the 1.37 build turns on are alpha and
// off by default in 1.34 (pkg/features/kube_features.go: DRAPartitionableDevices, DRADeviceTaints,
// DRAConsumableCapacity and DRAExtendedResource, all alpha), and a 1.34 cluster as users run it
// has them off. They are set off explicitly, so the API server drops shared counters, device
// taints, consumable capacity and a DeviceClass's extendedResourceName without an error, as it
// does on such a cluster; the 1.34 tests check that gpuweave detects this and degrades.

const draFeatureGates = "DRAPartitionableDevices=false,DRADeviceTaints=false,DRAConsumableCapacity=false,DRAExtendedResource=false"
