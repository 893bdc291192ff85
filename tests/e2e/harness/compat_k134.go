//go:build k134

package main

// The 1.34 side of compat_k137.go, built with -tags k134 against go.k134.mod (k8s.io/kubernetes
// v1.34): the managers take no logger or context, getNode takes no arguments, cadvisor's machine
// model lives in github.com/google/cadvisor/info/v1, the ResourceClaim controller takes its
// feature flags, and the device taint eviction controller is not run (its DeviceTaintRule API is
// v1alpha3 behind the DRADeviceTaints gate, off by default in 1.34, as kube-controller-manager
// 1.34 leaves the controller off without the gate).

import (
	"context"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type numaNode = cadvisorapi.Node

func newNUMANode(id int) numaNode { return cadvisorapi.Node{Id: id} }

func newDeviceManagers(_ klog.Logger, topo []numaNode, policy string) (topologymanager.Manager,
	*devicemanager.ManagerImpl, error) {
	tm, err := topologymanager.NewManager(topo, policy, containerTopologyScope, nil)
	if err != nil {
		return nil, nil, err
	}
	dm, err := devicemanager.NewManagerImpl(topo, tm)
	if err != nil {
		return nil, nil, err
	}
	tm.AddHintProvider(dm)
	return tm, dm, nil
}

func newPredicateAdmitHandler(n *simNode) lifecycle.PodAdmitHandler {
	return lifecycle.NewPredicateAdmitHandler(n.nodeNow, lifecycle.NewAdmissionFailureHandlerStub(),
		n.devices.UpdatePluginResources)
}

func startDeviceManager(_ klog.Logger, dm *devicemanager.ManagerImpl, activePods func() []*v1.Pod,
	ready config.SourcesReady, containers containermap.ContainerMap, running sets.Set[string]) error {
	return dm.Start(activePods, ready, containers, running)
}

func stopDeviceManager(_ klog.Logger, dm *devicemanager.ManagerImpl) error { return dm.Stop() }

func deviceCapacity(_ klog.Logger, dm *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return dm.GetCapacity()
}

func deviceRunOptions(_ context.Context, dm *devicemanager.ManagerImpl, pod *v1.Pod,
	c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return dm.GetDeviceRunContainerOptions(pod, c)
}

func admitWith(_ context.Context, h lifecycle.PodAdmitHandler, attrs *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	return h.Admit(attrs)
}

func startDRAManager(ctx context.Context, m *dra.Manager, n *simNode, ready config.SourcesReady) error {
	return m.Start(ctx, n.activePods, n.nodeNow, ready)
}

// containerTopologyScope is the kubelet's topologyManagerScope "container" (unexported in 1.34).
const containerTopologyScope = "container"

// newAdmitAttributes: a pod being added (1.34's attributes have no operation).
func newAdmitAttributes(pod *v1.Pod, others []*v1.Pod) *lifecycle.PodAdmitAttributes {
	return &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others}
}

// stopDRAManager: 1.34's DRA manager has no Stop; its goroutines end with the context.
func stopDRAManager(*dra.Manager) {}

func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready config.SourcesReady) {
	pm.Run(ready, ctx.Done())
}

func draControllers(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) (func(), []string, error) {
	logger := klog.FromContext(ctx)
	claims, err := resourceclaim.NewController(klog.LoggerWithName(logger, "resource-claim-controller"),
		resourceclaim.Features{
			AdminAccess:     utilfeature.DefaultFeatureGate.Enabled(features.DRAAdminAccess),
			PrioritizedList: utilfeature.DefaultFeatureGate.Enabled(features.DRAPrioritizedList),
		},
		client, factory.Core().V1().Pods(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		return nil, nil, err
	}
	return func() { claims.Run(ctx, resourceClaimWorkers) }, []string{"resource-claim-controller"}, nil
}

func jobController(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) (func(), error) {
	jc, err := job.NewController(ctx, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(), client)
	if err != nil {
		return nil, err
	}
	return func() { jc.Run(ctx, jobWorkers) }, nil
}
