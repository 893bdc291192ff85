//go:build !k134

package main

// The pod-resources providers of the 1.37 build (podresources.go serves them): the methods take a
// logger, the CPU provider is asked by pod and container, and a claim's device carries its share
// ID (DRAConsumableCapacity).

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

func podResourcesClient(ctx context.Context, socket string) (podresourcesapi.PodResourcesListerClient, *grpc.ClientConn, error) {
	return podresources.GetV1Client(ctx, socket, 10*time.Second, 16*1024*1024)
}

type devicesProvider struct{ dm *devicemanager.ManagerImpl }

func (d devicesProvider) UpdateAllocatedDevices(logger klog.Logger) {
	d.dm.UpdateAllocatedDevices(logger)
}

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetDevices(podUID, containerName))
}

func (d devicesProvider) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return toContainerDevices(d.dm.GetAllocatableDevices(logger))
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

// draResources lists a container's prepared claims from the DRA manager's claim cache, as the
// kubelet's container manager does (GetDynamicResources in container_manager_linux.go, whose
// shape is kept: the CDI IDs of a claim's devices accumulate per driver, so a device's entry
// also lists those of the devices before it).
type draResources struct{ n *simNode }

func (d draResources) GetDynamicResources(logger klog.Logger, pod *v1.Pod, c *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := d.n.dra.GetContainerClaimInfos(pod, c)
	if err != nil {
		logger.Error(err, "Unable to get container claim info state")
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
					PoolName: device.PoolName, DeviceName: device.DeviceName, ShareId: (*string)(device.ShareID)})
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{ClaimName: info.ClaimName,
			ClaimNamespace: info.Namespace, ClaimResources: resources})
	}
	return out
}
