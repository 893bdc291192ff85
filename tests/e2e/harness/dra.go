package main

// Dynamic Resource Allocation on a simulated node, wired as the kubelet wires it
// (pkg/kubelet/kubelet.go, pkg/kubelet/cm/container_manager_linux.go): the kubelet's DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) is the DRAPlugin handler of the kubelet's plugin
// manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager), whose watcher registers the drivers
// whose sockets appear in /var/lib/kubelet/plugins_registry (<kubelet-dir>/plugins_registry
// from outside). An admitted pod with resourceClaims is prepared (NodePrepareResources through
// the driver's socket) before its containers "start", as the kubelet's SyncPod does, and
// unprepared after its containers stopped, before it is deleted. The CDI device IDs the
// driver returned are recorded beside the device manager's allocation.

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

const (
	kubeletRootDir      = "/var/lib/kubelet"
	pluginsRegistryDir  = kubeletRootDir + "/plugins_registry"
	draUnprepareRetryIn = time.Second
)

// claimDevice is one device a DRA driver prepared for a container's claim.
type claimDevice struct {
	Claim   string   `json:"claim"`
	Driver  string   `json:"driver"`
	Pool    string   `json:"pool"`
	Device  string   `json:"device"`
	Request []string `json:"requests,omitempty"`
	CDI     []string `json:"cdiDeviceIDs,omitempty"`
}

// startDRA creates the DRA manager (checkpoint in /var/lib/kubelet/dra_manager_state, as the
// kubelet's), starts it and runs the plugin manager with it as the DRAPlugin handler.
func (n *simNode) startDRA(ctx context.Context, ready config.SourcesReady) error {
	logger := klog.FromContext(ctx)
	manager, err := dra.NewManager(logger, n.client, kubeletRootDir)
	if err != nil {
		return err
	}
	if err := startDRAManager(ctx, manager, n, ready); err != nil { // compat_k1xx.go
		return err
	}
	plugins := pluginmanager.NewPluginManager(pluginsRegistryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	go runPluginManager(ctx, plugins, ready)
	n.dra = manager
	logger.Info("DRA manager serving", "pluginsRegistry", pluginsRegistryDir,
		"hostPath", n.flags.kubeletDir+"/plugins_registry")
	return nil
}

// hasResourceClaims: the pod's own claims, or the claim kube-scheduler made for its extended
// resources that a DeviceClass serves (extendedResourceName), as the DRA manager prepares both.
func hasResourceClaims(pod *v1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

// claimDevicesOf reads back from the DRA manager what each claim of the container was prepared
// with, and the CDI device IDs the container gets (what the kubelet passes to the runtime).
func (n *simNode) claimDevicesOf(pod *v1.Pod, c *v1.Container) ([]claimDevice, []string, error) {
	if !hasResourceClaims(pod) {
		return nil, nil, nil
	}
	infos, err := n.dra.GetContainerClaimInfos(pod, c)
	if err != nil {
		return nil, nil, err
	}
	var out []claimDevice
	for _, info := range infos {
		for driver, state := range info.DriverState {
			for _, d := range state.Devices {
				out = append(out, claimDevice{Claim: info.ClaimName, Driver: driver, Pool: d.PoolName,
					Device: d.DeviceName, Request: d.RequestNames, CDI: d.CDIDeviceIDs})
			}
		}
	}
	slices.SortFunc(out, func(a, b claimDevice) int {
		return cmp.Or(strings.Compare(a.Claim, b.Claim), strings.Compare(a.Device, b.Device))
	})
	info, err := n.dra.GetResources(pod, c)
	if err != nil {
		return nil, nil, err
	}
	var cdi []string
	for _, d := range info.CDIDevices {
		cdi = append(cdi, d.Name)
	}
	return out, cdi, nil
}

// unprepareUntilDone calls the DRA manager's UnprepareResources until the drivers confirm
// (the kubelet does not finish a pod's termination before that); a driver that is down is
// retried every second. Claims of pods gone while the node was down are the DRA manager's
// reconcile loop's to unprepare.
func (n *simNode) unprepareUntilDone(ctx context.Context, pod *v1.Pod) {
	if !hasResourceClaims(pod) {
		return
	}
	logger := klog.FromContext(ctx)
	_ = wait.PollUntilContextCancel(ctx, draUnprepareRetryIn, true, func(ctx context.Context) (bool, error) {
		if err := n.dra.UnprepareResources(ctx, pod); err != nil {
			logger.Error(err, "unpreparing resource claims, will retry", "pod", klog.KObj(pod))
			return false, nil
		}
		logger.Info("resource claims unprepared", "pod", klog.KObj(pod))
		return true, nil
	})
}
