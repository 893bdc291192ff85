"""Per-inventory facts the decision core asks about, derived once per distinct node layout.

Thousands of nodes share a handful of hardware layouts. ``NodeLayout`` holds what decisions depend
on with every per-node identifier (UUIDs, names) stripped, so decisions memoize across nodes of
the same layout; ``LayoutIndex`` keeps the per-node identifiers that turn an index-based plan into
device IDs at bind time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations

from devicekinds.kind import KindSlot
from devicekinds.registry import KINDS
from devicemodel.inventory import Gpu, NicType, NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan, memory_units
from scheduler_ext.pods.selector import DeviceAttributes


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as decisions see it (no UUID)."""

    index: int
    numa_node: int
    pcie_switch: str | None
    attributes: DeviceAttributes
    mode: SharingMode
    replicas: int
    memory_gib: int
    mig_enabled: bool


@dataclass(frozen=True)
class MigSlot:
    position: int  # index into the node's mig_devices tuple
    parent_index: int
    profile: str


@dataclass(frozen=True)
class NicSlot:
    position: int  # index into the node's EFA NIC list
    numa_node: int
    pcie_switch: str | None


@dataclass(frozen=True)
class NodeLayout:
    """Identifier-free description of a node's devices; equal layouts share memoized decisions."""

    gpus: tuple[GpuSlot, ...]
    nvlink_pairs: frozenset[tuple[int, int]]
    migs: tuple[MigSlot, ...]
    nics: tuple[NicSlot, ...]
    # The devices of the resource kinds the core plans generically, per resource name (``KINDS``).
    extra: tuple[tuple[str, tuple[KindSlot, ...]], ...] = ()
    # NVLink pairs an active check found slow (``NodeInventory.degraded_links``): (a, b, share
    # kept), a < b; not in ``nvlink_pairs``, and their search scores them at the share they keep
    degraded: tuple[tuple[int, int, float], ...] = ()

    @cached_property
    def extra_slots(self) -> Mapping[str, tuple[KindSlot, ...]]:
        return dict(self.extra)

    @cached_property
    def gpu_by_index(self) -> Mapping[int, GpuSlot]:
        return {g.index: g for g in self.gpus}

    def nvlinked(self, a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in self.nvlink_pairs

    def all_nvlinked(self, gpus: tuple[int, ...]) -> bool:
        return all(self.nvlinked(a, b) for a, b in combinations(gpus, 2))

    def nic_switches(self) -> frozenset[str]:
        return frozenset(n.pcie_switch for n in self.nics if n.pcie_switch is not None)

    def nic_aligned(self, gpu: int) -> bool:
        """A GPU with an EFA adapter on its own PCIe switch."""
        switch = self.gpu_by_index[gpu].pcie_switch
        return switch is not None and switch in self.nic_switches()


@dataclass(frozen=True)
class LayoutIndex:
    """The per-node identifiers behind a layout's positions."""

    gpu_uuids: Mapping[int, str]
    mig_uuids: tuple[str, ...]
    nic_names: tuple[str, ...]
    extra_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # by ``NodeLayout.extra``


def _nvlink_pairs(inventory: NodeInventory) -> frozenset[tuple[int, int]]:
    pairs = {
        (min(link.gpu_a, link.gpu_b), max(link.gpu_a, link.gpu_b))
        for link in inventory.nvlinks
        if link.links > 0
    }
    if inventory.nvswitch is not None:
        pairs.update((a, b) for a, b in combinations(sorted(inventory.nvswitch.gpus), 2))
    return frozenset(pairs) - {(a, b) for a, b, _ in _degraded(inventory)}


def _degraded(inventory: NodeInventory) -> tuple[tuple[int, int, float], ...]:
    found: dict[tuple[int, int], float] = {}
    for link in inventory.degraded_links:
        a, b = min(link.gpu_a, link.gpu_b), max(link.gpu_a, link.gpu_b)
        found[(a, b)] = min(link.fraction, found.get((a, b), link.fraction))
    return tuple(sorted((a, b, share) for (a, b), share in found.items()))


def build_layout(
    inventory: NodeInventory, *, sharing: Mapping[str, GpuSharing] | None = None
) -> tuple[NodeLayout, LayoutIndex]:
    """Derive the layout and its identifiers; ``sharing`` maps GPU UUID or index to its mode."""
    pairs = _nvlink_pairs(inventory)
    slots = tuple(
        _gpu_slot(inventory, gpu, pairs=pairs, sharing=sharing or {})
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
    )
    migs = tuple(MigSlot(i, m.parent_index, m.profile) for i, m in enumerate(inventory.mig_devices))
    efa = [n for n in inventory.nics if n.type is NicType.EFA]
    nics = tuple(NicSlot(i, n.numa_node, n.pcie_switch) for i, n in enumerate(efa))
    extra, extra_ids = _kind_devices(inventory, sharing or {})
    layout = NodeLayout(
        gpus=slots, nvlink_pairs=pairs, migs=migs, nics=nics, extra=extra, degraded=_degraded(inventory)
    )
    index = LayoutIndex(
        gpu_uuids={g.index: g.uuid for g in inventory.gpus},
        mig_uuids=tuple(m.uuid for m in inventory.mig_devices),
        nic_names=tuple(n.name for n in efa),
        extra_ids=extra_ids,
    )
    return layout, index


def _kind_devices(
    inventory: NodeInventory, sharing: Mapping[str, GpuSharing]
) -> tuple[tuple[tuple[str, tuple[KindSlot, ...]], ...], dict[str, tuple[str, ...]]]:
    """The devices of every generically planned kind, as each kind lists them on the node (the
    same list the node agent serves), split into identifier-free slots and their IDs."""
    kinds = KINDS.planned_generically()
    if not kinds:
        return (), {}
    plan = SharingPlan(per_gpu=dict(sharing))
    slots: dict[str, list[KindSlot]] = {}
    ids: dict[str, list[str]] = {}
    for kind in kinds:
        for device in kind.devices(inventory, plan):
            listed = slots.setdefault(device.resource, [])
            listed.append(KindSlot(len(listed), device.numa_node, device.pcie_switch, device.gpu_index))
            ids.setdefault(device.resource, []).append(device.id)
    extra = tuple((resource, tuple(found)) for resource, found in sorted(slots.items()))
    return extra, {resource: tuple(found) for resource, found in ids.items()}


def _gpu_slot(
    inventory: NodeInventory,
    gpu: Gpu,
    *,
    pairs: frozenset[tuple[int, int]],
    sharing: Mapping[str, GpuSharing],
) -> GpuSlot:
    entry = sharing.get(gpu.uuid) or sharing.get(str(gpu.index)) or GpuSharing(SharingMode.EXCLUSIVE)
    switched = inventory.nvswitch is not None and gpu.index in inventory.nvswitch.gpus
    attributes = DeviceAttributes(
        architecture=str(gpu.architecture.value),
        product_name=gpu.product,
        compute_capability=gpu.compute_capability,
        driver_version=inventory.driver_version,
        memory_bytes=gpu.memory_mib * 2**20,
        mig_capable=gpu.mig_capable,
        nvlink_peers=sum(1 for pair in pairs if gpu.index in pair),
        nvswitch=switched,
        numa_node=gpu.numa_node,
    )
    return GpuSlot(
        index=gpu.index,
        numa_node=gpu.numa_node,
        pcie_switch=gpu.pcie_switch,
        attributes=attributes,
        mode=entry.mode,
        replicas=entry.replicas,
        memory_gib=memory_units(gpu.memory_mib),
        mig_enabled=gpu.mig_enabled or bool(inventory.mig_devices_of(gpu.index)),
    )
