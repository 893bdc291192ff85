"""The device catalogue: which kubelet resources a node offers and the devices in each.

Pure functions of a ``NodeInventory`` and a ``SharingPlan``. Each resource kind of the registry
(``devicekinds.registry.KINDS``) says which devices it makes; device IDs follow
``devicemodel.assignment`` so the extender's recorded choice and the kubelet's IDs agree: a GPU's
UUID, a MIG device's UUID, an EFA adapter's name, and ``<gpu-uuid>::<kind>-<unit>`` for shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from devicekinds.device import DeviceKind, PluginDevice
from devicekinds.gpu import lost_device_id
from devicekinds.imex import IMEX_CHANNEL, IMEX_CHANNEL_ID
from devicekinds.registry import KINDS, KindRegistry
from devicemodel.contracts import RESOURCE_GPU
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan

MAX_DEVICE_ID_LENGTH = 63


def lost_reasons(inventory: NodeInventory) -> dict[str, str]:
    """Device ID -> reason for every GPU the driver counts but cannot reach (always Unhealthy)."""
    return {
        lost_device_id(lost): f"GPU {lost.index} unreachable: {lost.reason}" for lost in inventory.lost_gpus
    }


def build_catalogue(
    inventory: NodeInventory, plan: SharingPlan, *, kinds: KindRegistry = KINDS
) -> dict[str, tuple[PluginDevice, ...]]:
    """Resource name -> devices, as each kind of ``kinds`` lists them (per GPU in index order,
    then the node's other devices). ``nvidia.com/gpu`` is always present (maybe empty); a GPU that
    does not answer is listed there (and reported Unhealthy: ``lost_reasons``)."""
    by_resource: dict[str, list[PluginDevice]] = {RESOURCE_GPU: []}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        for kind in kinds:
            for device in kind.gpu_devices(gpu, inventory, plan):
                by_resource.setdefault(device.resource, []).append(device)
    for kind in kinds:
        for device in kind.node_devices(inventory, plan):
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


__all__ = ["IMEX_CHANNEL", "IMEX_CHANNEL_ID", "DeviceKind", "PluginDevice", "lost_device_id"]
