package main

// The kubelet's pod-resources API (k8s.io/kubernetes/pkg/kubelet/apis/podresources, v1), served
// as the kubelet serves it on /var/lib/kubelet/pod-resources/kubelet.sock (in this node's mount
// namespace; <kubelet-dir>/pod-resources/kubelet.sock from outside), backed by this node's device
// manager, its DRA manager (prepared claims) and pods. No CPU or memory managers run here, so
// those lists are empty, as on a kubelet with the none policies. The providers' method sets differ
// between minors: podresources_k137.go and podresources_k134.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

const podResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

type podsProvider struct{ n *simNode }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.n.activePods() }

func (p podsProvider) GetPods() []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range p.n.pods.List() {
		out = append(out, obj.(*v1.Pod))
	}
	return out
}

func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	obj, ok, err := p.n.pods.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	return obj.(*v1.Pod), true
}

// toContainerDevices lists one entry per device and NUMA node, the kubelet's wire shape.
func toContainerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resourceName, byID := range devs {
		for id, dev := range byID {
			entry := &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{id}}
			nodes := dev.GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, entry)
				continue
			}
			for _, numa := range nodes {
				withTopology := &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{id},
					Topology: &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: numa.GetID()}}}}
				out = append(out, withTopology)
			}
		}
	}
	return out
}

// servePodResources listens on the kubelet's pod-resources socket until ctx ends.
func (n *simNode) servePodResources(ctx context.Context) error {
	providers := podresources.PodResourcesProviders{Pods: podsProvider{n}, Devices: devicesProvider{n.devices},
		Cpus: noCPUs{}, Memory: noMemory{}, DynamicResources: draResources{n}}
	if err := os.MkdirAll("/var/lib/kubelet/pod-resources", 0o750); err != nil {
		return err
	}
	_ = os.Remove(podResourcesSocket)
	listener, err := net.Listen("unix", podResourcesSocket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() { <-ctx.Done(); server.Stop() }()
	go func() {
		if err := server.Serve(listener); err != nil {
			klog.FromContext(ctx).Error(err, "pod-resources server stopped")
		}
	}()
	klog.FromContext(ctx).Info("serving the pod-resources API", "socket", podResourcesSocket)
	return nil
}

// runPodResourcesList is `harness podresources SOCKET`: the v1 List and GetAllocatableResources
// answers as JSON, read the way a monitoring agent reads them.
func runPodResourcesList(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("podresources: want the socket path (e.g. <kubelet-dir>/pod-resources/kubelet.sock)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, conn, err := podResourcesClient(ctx, "unix://"+args[0]) // podresources_k1xx.go
	if err != nil {
		return err
	}
	defer conn.Close()
	listed, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("List: %w", err)
	}
	allocatable, err := client.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return fmt.Errorf("GetAllocatableResources: %w", err)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"list": listed, "allocatable": allocatable})
}
