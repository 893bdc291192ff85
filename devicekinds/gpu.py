"""Whole GPUs, ``nvidia.com/gpu``: every exclusive GPU not in MIG mode, and the GPUs the driver
counts but cannot reach (listed so the kubelet counts them in capacity, always Unhealthy).

The extender plans whole GPUs with the topology search (``scheduler_ext/decide/planners.py``);
GetPreferredAllocation asks the same search through the node agent's chooser.
"""

from __future__ import annotations

from collections.abc import Sequence

from devicekinds.device import DeviceKind, PluginDevice, numa_of
from devicekinds.grant import ContainerGrant, GrantContext, listed, with_devices
from devicekinds.kind import (
    DeviceNames,
    Devices,
    DeviceText,
    PreferContext,
    ResourceKind,
    fill,
    numa_key,
    short_id,
)
from devicemodel.assignment import device_id_gpu
from devicemodel.contracts import RESOURCE_GPU
from devicemodel.inventory import Gpu, LostGpu, NodeInventory
from devicemodel.sharing import SharingMode, SharingPlan


def lost_device_id(lost: LostGpu) -> str:
    """The ID a lost GPU is listed under: its UUID when known, else its bus id (or index) marked
    unreachable, so the kubelet counts it in capacity but never allocates it."""
    return lost.uuid or f"unreachable-{lost.pci_bus_id or f'index-{lost.index}'}"


class WholeGpu(ResourceKind):
    words = (DeviceKind.GPU,)
    resources = (RESOURCE_GPU,)
    core_planned = True

    def gpu_devices(self, gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        if gpu.mig_enabled or plan.for_gpu(gpu).mode is not SharingMode.EXCLUSIVE:
            return []
        return [
            PluginDevice(
                id=device_id_gpu(gpu.uuid),
                resource=RESOURCE_GPU,
                kind=DeviceKind.GPU,
                numa_node=numa_of(gpu.numa_node),
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                pcie_switch=gpu.pcie_switch,
            )
        ]

    def node_devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        return [
            PluginDevice(
                id=lost_device_id(lost),
                resource=RESOURCE_GPU,
                kind=DeviceKind.GPU,
                numa_node=None,
                gpu_uuid=lost.uuid or None,
            )
            for lost in inventory.lost_gpus
        ]

    def prefer(self, candidates: Devices, must: Devices, size: int, context: PreferContext) -> list[str]:
        by_index = {d.gpu_index: d for d in candidates if d.gpu_index is not None}
        if context.gpu_chooser is not None:
            must_indexes = frozenset(d.gpu_index for d in must if d.gpu_index is not None)
            picked = context.gpu_chooser(frozenset(by_index), size, must_indexes)
            if picked is not None and len(picked) == size and all(i in by_index for i in picked):
                return [by_index[i].id for i in picked]
        return fill(must, sorted(candidates, key=numa_key), size)

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        return with_devices(listed(resource, [d.id for d in chosen], listing=context.listing), chosen)

    def describe(self, resource: str, ids: Sequence[str], names: DeviceNames) -> DeviceText:
        gpu_index = names.gpu_index
        indices = tuple(sorted(gpu_index[i] for i in ids if i in gpu_index))
        labels = [*map(str, indices), *(short_id(i) for i in ids if i not in gpu_index)]
        return DeviceText(("GPUs " if len(labels) > 1 else "GPU ") + ",".join(labels), indices)
