package main

// Pod admission and termination on a simulated node. Admission runs the kubelet's own handlers
// in the kubelet's order: the topology manager (which calls the device manager's Allocate, and
// through it the plugin's GetPreferredAllocation and Allocate), then the predicate handler. The
// devices the device manager assigned are recorded in the pod's status as condition
// `e2e.gpuweave.io/DevicesAllocated` (message: JSON) and in <kubelet-dir>/allocations/.
// Pods with resourceClaims are prepared through the kubelet's DRA manager before they "run", and
// unprepared once their containers stopped (dra.go); the prepared devices and CDI device IDs are
// recorded in the same JSON. A pod being deleted keeps its devices for its grace period, then
// is deleted for good.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// AllocatedCondition is the pod condition type that carries the device manager's allocation.
const AllocatedCondition v1.PodConditionType = "e2e.gpuweave.io/DevicesAllocated"

// containerAllocation is what the device manager gave one container, and what DRA drivers
// prepared for its resource claims (the devices and the CDI device IDs the runtime would get).
type containerAllocation struct {
	Devices      map[string][]string `json:"devices"`
	Env          map[string]string   `json:"env,omitempty"`
	ClaimDevices []claimDevice       `json:"claimDevices,omitempty"`
	CDIDevices   []string            `json:"cdiDevices,omitempty"`
}

// podAllocation is the JSON recorded for a pod.
type podAllocation struct {
	Node       string                         `json:"node"`
	Containers map[string]containerAllocation `json:"containers"`
}

func (n *simNode) syncPod(ctx context.Context, key string) error {
	obj, exists, err := n.pods.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*v1.Pod)
	uid := string(pod.UID)
	n.mu.Lock()
	seen, terminating := n.admitted.Has(uid), n.terminating.Has(uid)
	n.mu.Unlock()
	switch {
	case pod.DeletionTimestamp != nil && !terminating:
		n.startTermination(ctx, pod)
	case pod.DeletionTimestamp != nil, seen:
		return nil
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return nil
	default:
		return n.admit(ctx, pod)
	}
	return nil
}

func (n *simNode) admit(ctx context.Context, pod *v1.Pod) error {
	logger := klog.FromContext(ctx)
	attrs := newAdmitAttributes(pod, n.otherActivePods(pod)) // compat_k1xx.go
	result := admitWith(ctx, n.topology, attrs)              // compat_k1xx.go
	if result.Admit {
		result = admitWith(ctx, n.predAdm, attrs)
	}
	if !result.Admit {
		n.markAdmitted(pod)
		logger.Info("pod rejected at admission", "pod", klog.KObj(pod), "reason", result.Reason,
			"message", result.Message)
		return n.writePodStatus(ctx, pod, func(s *v1.PodStatus) {
			s.Phase, s.Reason, s.Message = v1.PodFailed, result.Reason, result.Message
		})
	}
	if hasResourceClaims(pod) {
		// As the kubelet's SyncPod: claims are prepared before any container starts; a failure
		// leaves the pod Pending and is retried (the queue's backoff), admission is not repeated
		// for the device manager (its allocation is kept per container).
		if err := n.dra.PrepareResources(ctx, pod); err != nil {
			logger.Error(err, "preparing resource claims", "pod", klog.KObj(pod))
			return err
		}
	}
	n.markAdmitted(pod)
	alloc, err := n.allocationOf(ctx, pod)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(alloc)
	if err != nil {
		return err
	}
	logger.Info("pod admitted", "pod", klog.KObj(pod), "allocation", string(raw))
	if n.runtime.runs(pod) && pod.Status.Phase == v1.PodRunning {
		return nil // a restarted kubelet re-admits a running pod; its containers and status stay
	}
	if err := n.writeAllocationFile(pod, raw); err != nil {
		return err
	}
	if err := n.runtime.start(pod); err != nil {
		return err
	}
	return n.writePodStatus(ctx, pod, func(s *v1.PodStatus) { markRunning(pod, s, string(raw)) })
}

func (n *simNode) markAdmitted(pod *v1.Pod) {
	n.mu.Lock()
	n.admitted.Insert(string(pod.UID))
	n.mu.Unlock()
}

func (n *simNode) otherActivePods(pod *v1.Pod) []*v1.Pod {
	var out []*v1.Pod
	for _, p := range n.activePods() {
		if p.UID != pod.UID {
			out = append(out, p)
		}
	}
	return out
}

// allocationOf reads back from the device manager what each container was given.
func (n *simNode) allocationOf(ctx context.Context, pod *v1.Pod) (podAllocation, error) {
	alloc := podAllocation{Node: n.flags.name, Containers: map[string]containerAllocation{}}
	all := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	for i := range all {
		c := &all[i]
		got := containerAllocation{Devices: map[string][]string{}, Env: map[string]string{}}
		for resourceName, devs := range n.devices.GetDevices(string(pod.UID), c.Name) {
			ids := make([]string, 0, len(devs))
			for id := range devs {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			got.Devices[resourceName] = ids
		}
		opts, err := deviceRunOptions(ctx, n.devices, pod, c)
		if err != nil {
			return alloc, fmt.Errorf("device run options for %s/%s: %w", pod.Name, c.Name, err)
		}
		if opts != nil {
			for _, e := range opts.Envs {
				got.Env[e.Name] = e.Value
			}
		}
		if got.ClaimDevices, got.CDIDevices, err = n.claimDevicesOf(pod, c); err != nil {
			return alloc, fmt.Errorf("prepared claims of %s/%s: %w", pod.Name, c.Name, err)
		}
		alloc.Containers[c.Name] = got
	}
	return alloc, nil
}

func (n *simNode) writeAllocationFile(pod *v1.Pod, raw []byte) error {
	dir := filepath.Join(n.flags.kubeletDir, "allocations")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	final := filepath.Join(dir, pod.Namespace+"."+pod.Name+".json")
	tmp := final + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

func markRunning(pod *v1.Pod, s *v1.PodStatus, allocation string) {
	now := metav1.Now()
	s.Phase, s.HostIP, s.PodIP, s.StartTime = v1.PodRunning, "127.0.0.1", "127.0.0.1", &now
	s.Conditions = []v1.PodCondition{
		{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: AllocatedCondition, Status: v1.ConditionTrue, Reason: "DeviceManagerAllocated",
			Message: allocation, LastTransitionTime: now},
	}
	s.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sha256:e2e", ContainerID: containerID(pod, c.Name),
			Ready: true, Started: ptrTo(true), State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// statusRetry retries a pod status write on a conflict and on Forbidden: the API server's Node
// authorizer learns that a pod is bound here from its own watch, which can trail the node's pod
// watch by a moment under load ("no relationship found between node and this object"); the
// kubelet's status manager likewise writes again until it succeeds. About 10 s in all.
var statusRetry = wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 2, Cap: 2 * time.Second}

func retriableStatusError(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsForbidden(err)
}

func (n *simNode) writePodStatus(ctx context.Context, pod *v1.Pod, mutate func(*v1.PodStatus)) error {
	return retry.OnError(statusRetry, retriableStatusError, func() error {
		current, err := n.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if current.UID != pod.UID {
			return nil
		}
		mutate(&current.Status)
		_, err = n.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
}

// startTermination keeps the pod's devices for its deletion grace period (as a container that
// takes its whole grace period to stop would), then deletes it for good.
func (n *simNode) startTermination(ctx context.Context, pod *v1.Pod) {
	n.mu.Lock()
	n.terminating.Insert(string(pod.UID))
	n.mu.Unlock()
	grace := time.Duration(0)
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	klog.FromContext(ctx).Info("pod terminating", "pod", klog.KObj(pod), "grace", grace)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(grace):
		}
		n.mu.Lock()
		n.terminated.Insert(string(pod.UID))
		n.mu.Unlock()
		if err := n.runtime.stop(pod); err != nil {
			klog.FromContext(ctx).Error(err, "recording stopped containers", "pod", klog.KObj(pod))
		}
		n.unprepareUntilDone(ctx, pod) // after the containers stopped, before the pod is gone
		// As the kubelet's status manager does (TerminatePod): a pod whose containers were stopped
		// for its deletion ends in a terminal phase before it goes, so a controller that waits for
		// one (a Job's finalizer, podReplacementPolicy: Failed) sees it.
		if err := n.writePodStatus(ctx, pod, func(status *v1.PodStatus) {
			if status.Phase != v1.PodSucceeded && status.Phase != v1.PodFailed {
				status.Phase = v1.PodFailed
			}
		}); err != nil {
			klog.FromContext(ctx).Error(err, "writing the terminated pod's phase", "pod", klog.KObj(pod))
		}
		opts := metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0)),
			Preconditions: &metav1.Preconditions{UID: &pod.UID}}
		err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			klog.FromContext(ctx).Error(err, "deleting terminated pod", "pod", klog.KObj(pod))
		}
		klog.FromContext(ctx).Info("pod terminated", "pod", klog.KObj(pod), "afterGrace", grace)
	}()
}
