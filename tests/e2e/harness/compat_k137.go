//go:build !k134

package main

// The calls into the kubelet's and kube-controller-manager's internal packages whose signatures
// differ between the Kubernetes minors the harness is built at (compat_k134.go is the 1.34 side,
// built with -tags k134 against go.k134.mod). This file is the default build, k8s.io/kubernetes
// v1.37 (go.mod): the managers take a logger or a context, the ResourceClaim controller watches
// PodGroups, and the device taint eviction controller runs on the v1 DeviceTaintRule API.

import (
	"context"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/devicetainteviction"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// numaNode is one NUMA node as the topology and device managers take it.
type numaNode = cadvisorapi.Node

func newNUMANode(id int) numaNode { return cadvisorapi.Node{Id: id} }

// newDeviceManagers builds the topology manager (container scope) and the device manager as its
// hint provider, as the kubelet's container manager does.
func newDeviceManagers(logger klog.Logger, topo []numaNode, policy string) (topologymanager.Manager,
	*devicemanager.ManagerImpl, error) {
	tm, err := topologymanager.NewManager(logger, topo, policy, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return nil, nil, err
	}
	dm, err := devicemanager.NewManagerImpl(logger, topo, tm)
	if err != nil {
		return nil, nil, err
	}
	tm.AddHintProvider(logger, dm)
	return tm, dm, nil
}

func newPredicateAdmitHandler(n *simNode) lifecycle.PodAdmitHandler {
	getNode := func(context.Context, bool) (*v1.Node, error) { return n.nodeNow() }
	return lifecycle.NewPredicateAdmitHandler(getNode, lifecycle.NewAdmissionFailureHandlerStub(),
		n.devices.UpdatePluginResources)
}

func startDeviceManager(logger klog.Logger, dm *devicemanager.ManagerImpl, activePods func() []*v1.Pod,
	ready config.SourcesReady, containers containermap.ContainerMap, running sets.Set[string]) error {
	return dm.Start(logger, activePods, ready, containers, running)
}

func stopDeviceManager(logger klog.Logger, dm *devicemanager.ManagerImpl) error {
	return dm.Stop(logger)
}

func deviceCapacity(logger klog.Logger, dm *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return dm.GetCapacity(logger)
}

func deviceRunOptions(ctx context.Context, dm *devicemanager.ManagerImpl, pod *v1.Pod,
	c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return dm.GetDeviceRunContainerOptions(ctx, pod, c)
}

func admitWith(ctx context.Context, h lifecycle.PodAdmitHandler, attrs *lifecycle.PodAdmitAttributes) lifecycle.PodAdmitResult {
	return h.Admit(ctx, attrs)
}

func startDRAManager(ctx context.Context, m *dra.Manager, n *simNode, ready config.SourcesReady) error {
	getNode := func(context.Context) (*v1.Node, error) { return n.nodeNow() }
	return m.Start(ctx, n.activePods, getNode, ready)
}

// newAdmitAttributes: a pod being added, as the kubelet's HandlePodAdditions admits it.
func newAdmitAttributes(pod *v1.Pod, others []*v1.Pod) *lifecycle.PodAdmitAttributes {
	return &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation}
}

func stopDRAManager(m *dra.Manager) { m.Stop() }

func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready config.SourcesReady) {
	pm.Run(ctx, ready, ctx.Done())
}

// draControllers builds the ResourceClaim controller and the device taint eviction controller on
// the shared factory; the returned function runs both until ctx ends.
func draControllers(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) (func(), []string, error) {
	logger := klog.FromContext(ctx)
	claims, err := resourceclaim.NewController(klog.LoggerWithName(logger, "resource-claim-controller"),
		client, factory.Core().V1().Pods(), factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		return nil, nil, err
	}
	taints := devicetainteviction.New(client, factory.Core().V1().Pods(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceSlices(),
		factory.Resource().V1().DeviceTaintRules(), factory.Resource().V1().DeviceClasses(),
		deviceTaintControllerName)
	run := func() {
		go claims.Run(ctx, resourceClaimWorkers)
		if err := taints.Run(ctx, deviceTaintEvictWorkers); err != nil {
			logger.Error(err, "device taint eviction stopped")
		}
	}
	return run, []string{"resource-claim-controller", deviceTaintControllerName}, nil
}

// jobController builds the Job controller on the shared factory as kube-controller-manager does
// (pkg/controller/job; the Workload and PodGroup informers only with the WorkloadWithJob gate,
// which is off here); the returned function runs it with kube-controller-manager's worker count.
func jobController(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory) (func(), error) {
	jc, err := job.NewController(ctx, client, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(), nil, nil)
	if err != nil {
		return nil, err
	}
	return func() { jc.Run(ctx, jobWorkers) }, nil
}
