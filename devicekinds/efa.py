"""EFA adapters, ``vpc.amazonaws.com/efa``: a device per adapter, named by the adapter, handed to
the container as its uverbs device node (and the host's ``rdma_cm`` when it has one).

The extender puts adapters beside the pod's GPUs (``scheduler_ext/decide/nics.py``); so does
GetPreferredAllocation, beside the GPUs just granted to the same container: PCIe switch first,
then NUMA node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import ClassVar

from devicekinds.device import DeviceKind, PluginDevice, numa_of
from devicekinds.grant import (
    ANNOTATION_DEVICES,
    ContainerGrant,
    DeviceListStrategy,
    DeviceNode,
    GrantContext,
    cdi_annotation_key,
)
from devicekinds.kind import DeviceNames, Devices, DeviceText, PreferContext, ResourceKind, fill
from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from devicemodel.errors import AllocationRejectedError
from devicemodel.inventory import NicType, NodeInventory
from devicemodel.sharing import SharingPlan

CDI_KIND_EFA = "vpc.amazonaws.com/efa"


class EfaAdapter(ResourceKind):
    words = (DeviceKind.EFA,)
    resources = (RESOURCE_EFA,)
    core_planned = True
    siblings: ClassVar[Mapping[str, str]] = {RESOURCE_EFA: RESOURCE_GPU}

    def node_devices(self, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        return [
            PluginDevice(
                id=nic.name,
                resource=RESOURCE_EFA,
                kind=DeviceKind.EFA,
                numa_node=numa_of(nic.numa_node),
                device_nodes=(nic.uverbs_device,) if nic.uverbs_device else (),
                pcie_switch=nic.pcie_switch,
            )
            for nic in inventory.nics
            if nic.type is NicType.EFA
        ]

    def prefer(self, candidates: Devices, must: Devices, size: int, context: PreferContext) -> list[str]:
        """Adapters beside ``near`` (the container's GPUs) or the must-include ones: switch, then NUMA."""
        per_numa: dict[int | None, int] = defaultdict(int)
        for device in candidates:
            per_numa[device.numa_node] += 1
        anchors = list(must) or list(context.near)
        if anchors:
            numas = {d.numa_node for d in anchors}
        else:
            numas = {max(per_numa, key=lambda n: (per_numa[n], -(n or 0)))} if per_numa else set()
        switches = {d.pcie_switch for d in anchors if d.pcie_switch}
        return fill(
            must,
            sorted(candidates, key=lambda d: (d.pcie_switch not in switches, d.numa_node not in numas, d.id)),
            size,
        )

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        listing = context.listing
        missing = [d.id for d in chosen if not d.device_nodes]
        if missing:
            raise AllocationRejectedError(
                f"{resource}: adapter(s) {', '.join(missing)} have no uverbs device node"
            )
        paths = [path for d in chosen for path in d.device_nodes]
        if listing.rdma_cm:  # libfabric's EFA provider opens the RDMA connection manager too
            paths.append(listing.rdma_cm)
        names = tuple(f"{CDI_KIND_EFA}={d.id}" for d in chosen)
        annotations = {ANNOTATION_DEVICES: ",".join(d.id for d in chosen)}
        if DeviceListStrategy.CDI_ANNOTATIONS in listing.strategies:
            annotations[cdi_annotation_key(resource)] = ",".join(names)
        return ContainerGrant(
            device_nodes=tuple(DeviceNode(path, path, "rw") for path in paths),
            annotations=annotations,
            cdi_devices=names if DeviceListStrategy.CDI_CRI in listing.strategies else (),
        )

    def describe(self, resource: str, ids: Sequence[str], names: DeviceNames) -> DeviceText:
        return DeviceText("EFA " + ",".join(sorted(ids)))
