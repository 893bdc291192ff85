//go:build k134

package main

// The pod-resources providers of the 1.34 build (podresources.go serves them): no logger
// arguments, the CPU and memory providers are asked by pod UID and container name, and a claim's
// device has no share ID (DRAConsumableCapacity is alpha in 1.34).

import (
	"context"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

func podResourcesClient(_ context.Context, socket string) (podresourcesapi.PodResourcesListerClient, *grpc.ClientConn, error) {
	return podresources.GetV1Client(socket, 10*time.Second, 16*1024*1024)
}

type devicesProvider struct{ dm *devicemanager.ManagerImpl }

func (d devicesProvider) UpdateAllocatedDevices() {
	d.dm.UpdateAllocatedDevices()
}

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetDevices(podUID, containerName))
}

func (d devicesProvider) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetAllocatableDevices())
}

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }

// draResources lists a container's prepared claims from the DRA manager's claim cache, as the
// kubelet's container manager does (GetDynamicResources in container_manager_linux.go, whose
// shape is kept: the CDI IDs of a claim's devices accumulate per driver, so a device's entry
// also lists those of the devices before it).
type draResources struct{ n *simNode }

func (d draResources) GetDynamicResources(pod *v1.Pod, c *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := d.n.dra.GetContainerClaimInfos(pod, c)
	if err != nil {
		klog.Background().Error(err, "Unable to get container claim info state")
		return []*podresourcesapi.DynamicResource{}
	}
	var out []*podresourcesapi.DynamicResource
	for _, info := range infos {
		var resources []*podresourcesapi.ClaimResource
		for driver, state := range info.DriverState {
			var cdi []*podresourcesapi.CDIDevice
			for _, device := range state.Devices {
				for _, id := range device.CDIDeviceIDs {
					cdi = append(cdi, &podresourcesapi.CDIDevice{Name: id})
				}
				resources = append(resources, &podresourcesapi.ClaimResource{CdiDevices: cdi, DriverName: driver,
					PoolName: device.PoolName, DeviceName: device.DeviceName})
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{ClaimName: info.ClaimName,
			ClaimNamespace: info.Namespace, ClaimResources: resources})
	}
	return out
}
