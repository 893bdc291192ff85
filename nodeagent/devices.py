"""The device catalogue: which kubelet resources a node offers and the devices in each.

Pure functions of a ``NodeInventory`` and a ``SharingPlan``. Device IDs follow
``devicemodel.assignment`` so the extender's recorded choice and the kubelet's IDs agree: a GPU's
UUID, a MIG device's UUID, an EFA adapter's name, and ``<gpu-uuid>::<kind>-<unit>`` for shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from devicemodel.assignment import device_id_gpu, device_id_mig, device_id_share
from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    RESOURCE_IMEX_CHANNEL,
    imex_channel_path,
    mig_resource_name,
)
from devicemodel.inventory import Gpu, LostGpu, NicType, NodeInventory
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, MIB_PER_GIB, SharingMode, SharingPlan

MAX_DEVICE_ID_LENGTH = 63


class DeviceKind(StrEnum):
    GPU = "gpu"
    MIG = "mig"
    EFA = "efa"
    COMPUTE = "compute"
    MEMORY = "memory"
    REPLICA = "replica"
    IMEX = "imex"


IMEX_CHANNEL_ID = "imex-channel-0"
IMEX_CHANNEL = 0  # one IMEX domain per node at a time (its daemon serves one), so one channel


@dataclass(frozen=True)
class PluginDevice:
    """One device as the kubelet sees it, with what Allocate needs to hand it to a container."""

    id: str
    resource: str
    kind: DeviceKind
    numa_node: int | None
    gpu_uuid: str | None = None  # the physical GPU behind a GPU, MIG or share device
    gpu_index: int | None = None
    unit: int = 0  # share unit number
    device_nodes: tuple[str, ...] = ()  # host device nodes handed to the container (EFA uverbs)
    pcie_switch: str | None = None


def _numa(value: int) -> int | None:
    """NUMA node as sysfs reports it; -1 (unknown) becomes None so TopologyInfo is omitted."""
    return value if value >= 0 else None


def _gpu_device(gpu: Gpu) -> PluginDevice:
    return PluginDevice(
        id=device_id_gpu(gpu.uuid),
        resource=RESOURCE_GPU,
        kind=DeviceKind.GPU,
        numa_node=_numa(gpu.numa_node),
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        pcie_switch=gpu.pcie_switch,
    )


def _share_devices(gpu: Gpu, *, resource: str, kind: DeviceKind, units: int) -> list[PluginDevice]:
    return [
        PluginDevice(
            id=device_id_share(gpu.uuid, kind.value, unit),
            resource=resource,
            kind=kind,
            numa_node=_numa(gpu.numa_node),
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            unit=unit,
            pcie_switch=gpu.pcie_switch,
        )
        for unit in range(units)
    ]


def _devices_of_gpu(gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
    if gpu.mig_enabled:
        return [
            PluginDevice(
                id=device_id_mig(mig.uuid),
                resource=mig_resource_name(mig.profile),
                kind=DeviceKind.MIG,
                numa_node=_numa(gpu.numa_node),
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                pcie_switch=gpu.pcie_switch,
            )
            for mig in inventory.mig_devices_of(gpu.index)
        ]
    sharing = plan.for_gpu(gpu)
    if sharing.mode is SharingMode.FRACTIONAL:
        compute = _share_devices(
            gpu, resource=RESOURCE_GPU_COMPUTE, kind=DeviceKind.COMPUTE, units=COMPUTE_UNITS_PER_GPU
        )
        memory_units = gpu.memory_mib // MIB_PER_GIB
        return compute + _share_devices(
            gpu, resource=RESOURCE_GPU_MEMORY, kind=DeviceKind.MEMORY, units=memory_units
        )
    if sharing.mode is SharingMode.TIME_SLICED:
        return _share_devices(
            gpu, resource=RESOURCE_GPU_SHARED, kind=DeviceKind.REPLICA, units=sharing.replicas
        )
    return [_gpu_device(gpu)]


def _efa_devices(inventory: NodeInventory) -> list[PluginDevice]:
    return [
        PluginDevice(
            id=nic.name,
            resource=RESOURCE_EFA,
            kind=DeviceKind.EFA,
            numa_node=_numa(nic.numa_node),
            device_nodes=(nic.uverbs_device,) if nic.uverbs_device else (),
            pcie_switch=nic.pcie_switch,
        )
        for nic in inventory.nics
        if nic.type is NicType.EFA
    ]


def _imex_devices(inventory: NodeInventory) -> list[PluginDevice]:
    """Channel 0 on a node of a multi-node NVLink domain, none elsewhere. One device: the kubelet
    gives it to one pod at a time, so two jobs on a node never share a channel (an IMEX channel
    reaches the memory every process on it exports across the domain)."""
    fabric = inventory.nvswitch
    if fabric is None or fabric.clique is None:
        return []
    return [
        PluginDevice(
            id=IMEX_CHANNEL_ID,
            resource=RESOURCE_IMEX_CHANNEL,
            kind=DeviceKind.IMEX,
            numa_node=None,
            unit=IMEX_CHANNEL,
            device_nodes=(imex_channel_path(IMEX_CHANNEL),),
        )
    ]


def lost_device_id(lost: LostGpu) -> str:
    """The ID a lost GPU is listed under: its UUID when known, else its bus id (or index) marked
    unreachable, so the kubelet counts it in capacity but never allocates it."""
    return lost.uuid or f"unreachable-{lost.pci_bus_id or f'index-{lost.index}'}"


def _lost_devices(inventory: NodeInventory) -> list[PluginDevice]:
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


def lost_reasons(inventory: NodeInventory) -> dict[str, str]:
    """Device ID -> reason for every GPU the driver counts but cannot reach (always Unhealthy)."""
    return {
        lost_device_id(lost): f"GPU {lost.index} unreachable: {lost.reason}" for lost in inventory.lost_gpus
    }


def build_catalogue(inventory: NodeInventory, plan: SharingPlan) -> dict[str, tuple[PluginDevice, ...]]:
    """Resource name -> devices, sorted by ID. ``nvidia.com/gpu`` is always present (maybe empty);
    a GPU that does not answer is listed there (and reported Unhealthy: ``lost_reasons``)."""
    by_resource: dict[str, list[PluginDevice]] = {RESOURCE_GPU: []}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        for device in _devices_of_gpu(gpu, inventory, plan):
            by_resource.setdefault(device.resource, []).append(device)
    by_resource[RESOURCE_GPU].extend(_lost_devices(inventory))
    for device in [*_efa_devices(inventory), *_imex_devices(inventory)]:
        by_resource.setdefault(device.resource, []).append(device)
    for resource, devices in by_resource.items():
        for device in devices:
            if len(device.id) > MAX_DEVICE_ID_LENGTH:
                raise ValueError(f"device ID {device.id!r} of {resource} is longer than 63 characters")
    return {resource: tuple(devices) for resource, devices in by_resource.items()}


def unhealthy_reasons(
    devices: Iterable[PluginDevice], *, faults: Mapping[str, str], withheld: Mapping[str, str]
) -> dict[str, str]:
    """Device ID -> reason for every device that must be reported Unhealthy.

    A fault or withholding recorded on a physical GPU's UUID fans out to every device backed by
    that GPU (its MIG devices, shares and replicas) and to nothing else.
    """
    reasons: dict[str, str] = {}
    for device in devices:
        for source in (faults, withheld):
            reason = source.get(device.id) or (source.get(device.gpu_uuid) if device.gpu_uuid else None)
            if reason:
                reasons[device.id] = reason
                break
    return reasons
