package main

// The node's "container runtime" state: which containers it runs, kept in
// <kubelet-dir>/e2e-runtime.json so that a restarted node reports them as a real runtime does
// through the CRI. The kubelet hands this to the device manager at start (containerMap and the
// running set), which is how a restarted kubelet keeps running containers' devices without asking
// the device plugin again (kubernetes#118559).

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
)

type runtimeContainer struct {
	PodUID string `json:"podUID"`
	Name   string `json:"name"`
}

type runtimeState struct {
	path       string
	mu         sync.Mutex
	containers map[string]runtimeContainer // container ID -> container
}

func loadRuntimeState(kubeletDir string) (*runtimeState, error) {
	r := &runtimeState{path: filepath.Join(kubeletDir, "e2e-runtime.json"), containers: map[string]runtimeContainer{}}
	raw, err := os.ReadFile(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	return r, json.Unmarshal(raw, &r.containers)
}

func containerID(pod *v1.Pod, name string) string { return "e2e://" + string(pod.UID) + "/" + name }

// initial is what the runtime reports at kubelet start: every container it runs, all running.
func (r *runtimeState) initial() (containermap.ContainerMap, sets.Set[string]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cm, running := containermap.NewContainerMap(), sets.New[string]()
	for id, c := range r.containers {
		cm.Add(c.PodUID, c.Name, id)
		running.Insert(id)
	}
	return cm, running
}

func (r *runtimeState) runs(pod *v1.Pod) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range pod.Spec.Containers {
		if _, ok := r.containers[containerID(pod, c.Name)]; !ok {
			return false
		}
	}
	return len(pod.Spec.Containers) > 0
}

func (r *runtimeState) start(pod *v1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range pod.Spec.Containers {
		r.containers[containerID(pod, c.Name)] = runtimeContainer{PodUID: string(pod.UID), Name: c.Name}
	}
	return r.save()
}

func (r *runtimeState) stop(pod *v1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.containers {
		if c.PodUID == string(pod.UID) {
			delete(r.containers, id)
		}
	}
	return r.save()
}

// keepOnly forgets the containers of pods that no longer exist (deleted while the node was down).
func (r *runtimeState) keepOnly(pods []*v1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	live := sets.New[string]()
	for _, p := range pods {
		live.Insert(string(p.UID))
	}
	for id, c := range r.containers {
		if !live.Has(c.PodUID) {
			delete(r.containers, id)
		}
	}
	return r.save()
}

func (r *runtimeState) save() error {
	raw, err := json.Marshal(r.containers)
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, r.path)
}
