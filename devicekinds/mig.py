"""MIG devices, ``nvidia.com/mig-<profile>`` (mixed strategy): one resource per profile on the
node, a device per MIG instance of a GPU in MIG mode.

The extender packs them (``scheduler_ext/decide/planners.py``, ``plan_migs``); so does
GetPreferredAllocation: onto the GPU with the fewest free devices, keeping emptier GPUs whole.
"""

from __future__ import annotations

from collections import defaultdict
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
from devicemodel.assignment import device_id_mig
from devicemodel.contracts import RESOURCE_MIG_PREFIX, mig_resource_name
from devicemodel.inventory import Gpu, NodeInventory
from devicemodel.sharing import SharingPlan


class MigDevice(ResourceKind):
    words = (DeviceKind.MIG,)
    prefixes = (RESOURCE_MIG_PREFIX,)
    core_planned = True

    def gpu_devices(self, gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        if not gpu.mig_enabled:
            return []
        return [
            PluginDevice(
                id=device_id_mig(mig.uuid),
                resource=mig_resource_name(mig.profile),
                kind=DeviceKind.MIG,
                numa_node=numa_of(gpu.numa_node),
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                pcie_switch=gpu.pcie_switch,
            )
            for mig in inventory.mig_devices_of(gpu.index)
        ]

    def prefer(self, candidates: Devices, must: Devices, size: int, context: PreferContext) -> list[str]:
        free_on_gpu: dict[str | None, int] = defaultdict(int)
        for device in candidates:
            free_on_gpu[device.gpu_uuid] += 1
        must_gpus = {d.gpu_uuid for d in must}
        return fill(
            must,
            sorted(
                candidates,
                key=lambda d: (d.gpu_uuid not in must_gpus, free_on_gpu[d.gpu_uuid], *numa_key(d)),
            ),
            size,
        )

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        return with_devices(listed(resource, [d.id for d in chosen], listing=context.listing), chosen)

    def describe(self, resource: str, ids: Sequence[str], names: DeviceNames) -> DeviceText:
        return DeviceText(", ".join(names.mig_names.get(i, short_id(i)) for i in sorted(ids)))
