package main

// The node's control loops: Node registration and status (capacity/allocatable from the device
// manager), the DRA manager and plugin watcher (dra.go), and a pod informer feeding one
// admission worker, as the kubelet admits pods one by one.

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// simNode is one node's state: its clients, the kubelet managers, and which pods it runs.
type simNode struct {
	flags    nodeFlags
	client   kubernetes.Interface
	devices  *devicemanager.ManagerImpl
	dra      *dra.Manager // the kubelet's DRA manager (dra.go)
	ready    config.SourcesReady
	topology topologymanager.Manager
	predAdm  lifecycle.PodAdmitHandler
	pods     cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]

	runtime      *runtimeState
	sourcesReady atomic.Bool // false until the pods present at start were admitted (kubelet order)

	mu          sync.Mutex
	node        *v1.Node
	admitted    sets.Set[string] // pod UIDs admitted (or rejected) once
	terminating sets.Set[string] // pod UIDs whose graceful deletion is in progress
	terminated  sets.Set[string] // pod UIDs whose containers are gone
}

func serveNode(ctx context.Context, f nodeFlags) error {
	logger := klog.FromContext(ctx)
	restCfg, err := clientcmd.BuildConfigFromFlags("", nodeKubeconfigPath(f))
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	n := &simNode{flags: f, admitted: sets.New[string](), terminating: sets.New[string](),
		terminated: sets.New[string]()}
	if n.client, err = kubernetes.NewForConfig(restCfg); err != nil {
		return err
	}
	if n.runtime, err = loadRuntimeState(f.kubeletDir); err != nil {
		return fmt.Errorf("reading runtime state: %w", err)
	}
	if err := n.startManagers(logger); err != nil {
		return err
	}
	defer func() { _ = stopDeviceManager(logger, n.devices) }()
	if err := n.register(ctx, n.devices.ShouldResetExtendedResourceCapacity()); err != nil {
		return err
	}
	if err := n.startDRA(ctx, n.ready); err != nil { // after the Node exists: drivers register against it
		return fmt.Errorf("DRA manager: %w", err)
	}
	defer stopDRAManager(n.dra) // compat_k1xx.go
	n.startPodInformer(ctx)
	if err := n.servePodResources(ctx); err != nil {
		return fmt.Errorf("pod-resources API: %w", err)
	}
	n.admitInitialPods(ctx)
	go n.drainHealthUpdates(ctx)
	go n.statusLoop(ctx)
	n.admissionWorker(ctx)
	return nil
}

func (n *simNode) startManagers(logger klog.Logger) error {
	var topo []numaNode
	for i := 0; i < n.flags.numaNodes && n.flags.topologyPolicy != topologymanager.PolicyNone; i++ {
		topo = append(topo, newNUMANode(i))
	}
	tm, dm, err := newDeviceManagers(logger, topo, n.flags.topologyPolicy) // compat_k1xx.go
	if err != nil {
		return fmt.Errorf("topology and device managers: %w", err)
	}
	n.topology, n.devices = tm, dm
	n.predAdm = newPredicateAdmitHandler(n)
	n.ready = config.NewSourcesReady(func(sets.Set[string]) bool { return n.sourcesReady.Load() })
	containers, running := n.runtime.initial()
	if err := startDeviceManager(logger, dm, n.activePods, n.ready, containers, running); err != nil {
		return fmt.Errorf("device manager start (plugin registration server): %w", err)
	}
	logger.Info("device manager serving", "socket", "/var/lib/kubelet/device-plugins/kubelet.sock",
		"hostPath", n.flags.kubeletDir+"/device-plugins/kubelet.sock")
	return nil
}

// nodeNow is the Node as this node last wrote it (the kubelet's getNodeAnyWay).
func (n *simNode) nodeNow() (*v1.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.node == nil {
		return nil, fmt.Errorf("node %s not registered yet", n.flags.name)
	}
	return n.node.DeepCopy(), nil
}

// activePods is what the kubelet calls active: bound here, not terminal, containers not gone.
// The device manager frees the devices of every pod missing from this list.
func (n *simNode) activePods() []*v1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*v1.Pod
	for _, obj := range n.pods.List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		if n.terminated.Has(string(pod.UID)) {
			continue
		}
		out = append(out, pod)
	}
	return out
}

func (n *simNode) baseResources() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse(n.flags.cpu),
		v1.ResourceMemory:           resource.MustParse(n.flags.memory),
		v1.ResourcePods:             resource.MustParse("110"),
		v1.ResourceEphemeralStorage: resource.MustParse("1Ti"),
	}
}

// register creates the Node object (a kubelet may create its own Node under NodeRestriction), or
// adopts the one that exists (an autoscaler's provider may create it first, as Karpenter's kwok
// provider does). As the kubelet's reconcileExtendedResource does, a node whose device manager has
// no checkpoint yet (a new machine) zeroes the extended resources it finds there until its device
// plugins register them: what the creator wrote is not what this node's devices offer.
func (n *simNode) register(ctx context.Context, resetExtended bool) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.flags.name, Labels: map[string]string{
			"kubernetes.io/hostname": n.flags.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		}},
	}
	created, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = n.adopt(ctx, resetExtended)
	}
	if err != nil {
		return fmt.Errorf("registering Node %s: %w", n.flags.name, err)
	}
	n.mu.Lock()
	n.node = created
	n.mu.Unlock()
	return n.updateStatus(ctx)
}

func (n *simNode) adopt(ctx context.Context, resetExtended bool) (*v1.Node, error) {
	var adopted *v1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.flags.name, metav1.GetOptions{})
		if err != nil || !resetExtended {
			adopted = node
			return err
		}
		for _, list := range []v1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
			for name := range list {
				if v1helper.IsExtendedResourceName(name) {
					list[name] = *resource.NewQuantity(0, resource.DecimalSI)
				}
			}
		}
		adopted, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err == nil {
		klog.FromContext(ctx).Info("adopted an existing Node", "node", n.flags.name, "extendedResourcesZeroed", resetExtended)
	}
	return adopted, err
}

// updateStatus writes capacity/allocatable (base + device manager) and a Ready condition.
func (n *simNode) updateStatus(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	capacity, allocatable, removed := deviceCapacity(logger, n.devices)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.flags.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		applyResources(node, n.baseResources(), capacity, allocatable, removed)
		setReady(node)
		updated, err := n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.node = updated
		n.mu.Unlock()
		return nil
	})
}

func applyResources(node *v1.Node, base, capacity, allocatable v1.ResourceList, removed []string) {
	if node.Status.Capacity == nil {
		node.Status.Capacity = v1.ResourceList{}
	}
	if node.Status.Allocatable == nil {
		node.Status.Allocatable = v1.ResourceList{}
	}
	for _, list := range []v1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
		for name, q := range base {
			list[name] = q
		}
		for _, name := range removed {
			delete(list, v1.ResourceName(name))
		}
	}
	for name, q := range capacity {
		node.Status.Capacity[name] = q
	}
	for name, q := range allocatable {
		node.Status.Allocatable[name] = q
	}
}

func setReady(node *v1.Node) {
	now := metav1.Now()
	ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
		Message: "gpuweave e2e node is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
	for i, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			ready.LastTransitionTime = c.LastTransitionTime
			node.Status.Conditions[i] = ready
			return
		}
	}
	node.Status.Conditions = append(node.Status.Conditions, ready)
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.NodeInfo.KubeletVersion = version.Get().GitVersion // build.sh sets it
	node.Status.NodeInfo.OperatingSystem = "linux"
	node.Status.NodeInfo.Architecture = "amd64"
}

func (n *simNode) statusLoop(ctx context.Context) {
	ticker := time.NewTicker(n.flags.statusInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if err := n.updateStatus(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "updating Node status", "node", n.flags.name)
			}
		}
	}
}

// drainHealthUpdates consumes the device manager's per-pod health updates (a bounded channel).
func (n *simNode) drainHealthUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-n.devices.Updates():
			klog.FromContext(ctx).V(2).Info("device health update", "pods", u.PodUIDs)
		}
	}
}

func (n *simNode) startPodInformer(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(n.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.flags.name).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	n.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			n.queue.Add(key)
		}
	}
	forget := func(obj any) {
		if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		if pod, ok := obj.(*v1.Pod); ok {
			if err := n.runtime.stop(pod); err != nil {
				klog.FromContext(ctx).Error(err, "recording stopped containers", "pod", klog.KObj(pod))
			}
		}
		enqueue(obj)
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: forget,
	})
	n.pods = inf.GetIndexer()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	go func() { <-ctx.Done(); n.queue.ShutDown() }()
}

// admitInitialPods handles the pods already bound here at start as the kubelet handles its first
// batch: oldest first, while its sources are not yet all ready (so containers the runtime still
// runs keep their checkpointed devices), then marks the sources ready.
func (n *simNode) admitInitialPods(ctx context.Context) {
	var pods []*v1.Pod
	for _, obj := range n.pods.List() {
		pods = append(pods, obj.(*v1.Pod))
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp)
	})
	for _, pod := range pods {
		key, _ := cache.MetaNamespaceKeyFunc(pod)
		if err := n.syncPod(ctx, key); err != nil {
			klog.FromContext(ctx).Error(err, "admitting pod present at start", "pod", key)
		}
	}
	n.sourcesReady.Store(true)
	if err := n.runtime.keepOnly(pods); err != nil {
		klog.FromContext(ctx).Error(err, "removing containers of pods gone while the node was down")
	}
}

func (n *simNode) admissionWorker(ctx context.Context) {
	for {
		key, quit := n.queue.Get()
		if quit {
			return
		}
		if err := n.syncPod(ctx, key); err != nil {
			klog.FromContext(ctx).Error(err, "syncing pod", "pod", key)
			n.queue.AddRateLimited(key)
		} else {
			n.queue.Forget(key)
		}
		n.queue.Done(key)
	}
}
