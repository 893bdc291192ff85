"""One node's device state as an immutable value: layout, health, and who holds which device.

The cluster cache replaces a node's ``NodeState`` wholesale on every change (copy-on-write), so
a decision reads one consistent value with no lock. ``FreeState`` is the per-state summary the
decision core works on, computed once per state and keyed for memoization.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, SharingMode
from scheduler_ext.decide.layout import LayoutIndex, NodeLayout


@dataclass(frozen=True)
class ShareUse:
    """Units of one share-mode GPU in use."""

    compute: int = 0
    memory: int = 0
    replicas: int = 0


@dataclass(frozen=True)
class FreeState:
    """What is free on a node, by layout position; ``key`` identifies it for memoization."""

    free_gpus: frozenset[int]  # exclusive-mode GPUs, healthy, not held
    healthy_gpus: frozenset[int]  # exclusive-mode GPUs that are healthy, held or not
    free_migs: frozenset[int]
    healthy_migs: frozenset[int]
    share_use: tuple[tuple[int, ShareUse], ...]  # healthy share-mode GPUs only
    free_nics: frozenset[int]
    healthy_nics: frozenset[int]
    # Generically planned kinds (``NodeLayout.extra``): per resource, healthy and free positions.
    extra_healthy: tuple[tuple[str, frozenset[int]], ...] = ()
    extra_free: tuple[tuple[str, frozenset[int]], ...] = ()

    @cached_property
    def key(self) -> tuple[object, ...]:
        extra = tuple(
            (r, _mask(h), _mask(f))
            for (r, h), (_, f) in zip(self.extra_healthy, self.extra_free, strict=True)
        )
        return (
            _mask(self.free_gpus),
            _mask(self.healthy_gpus),
            _mask(self.free_migs),
            _mask(self.healthy_migs),
            self.share_use,
            _mask(self.free_nics),
            _mask(self.healthy_nics),
            extra,
        )


def _mask(items: frozenset[int]) -> int:
    value = 0
    for item in items:
        value |= 1 << item
    return value


@dataclass(frozen=True)
class NodeState:
    """A node as the extender knows it. ``layout`` is None when the node publishes no inventory."""

    name: str
    layout: NodeLayout | None = None
    layout_id: int = -1
    index: LayoutIndex | None = None
    unhealthy: frozenset[str] = frozenset()
    holders: Mapping[str, str] = field(default_factory=dict)  # device ID -> pod UID
    token: int = -1  # interned (layout, free state); equal tokens decide alike
    host_free: tuple[int, int] | None = None  # (CPU milli, memory MiB) left; None: not known

    @property
    def memo_key(self) -> tuple[object, ...]:
        return (self.layout_id, self.free.key, self.host_free)

    def with_holders(self, holders: Mapping[str, str]) -> NodeState:
        return replace(self, holders=holders, token=-1)

    def with_host_free(self, host_free: tuple[int, int] | None) -> NodeState:
        return replace(self, host_free=host_free, token=-1)

    @cached_property
    def free(self) -> FreeState:
        return free_state(self)


def free_state(node: NodeState) -> FreeState:
    layout, index = node.layout, node.index
    if layout is None or index is None:
        empty: frozenset[int] = frozenset()
        return FreeState(empty, empty, empty, empty, (), empty, empty)
    bad_gpus = frozenset(i for i, uuid in index.gpu_uuids.items() if uuid in node.unhealthy)
    exclusive = frozenset(
        g.index for g in layout.gpus if g.mode is SharingMode.EXCLUSIVE and not g.mig_enabled
    )
    healthy_gpus = exclusive - bad_gpus
    held = node.holders
    free_gpus = frozenset(i for i in healthy_gpus if index.gpu_uuids[i] not in held)
    healthy_migs = frozenset(
        m.position
        for m in layout.migs
        if m.parent_index not in bad_gpus and index.mig_uuids[m.position] not in node.unhealthy
    )
    free_migs = frozenset(p for p in healthy_migs if index.mig_uuids[p] not in held)
    healthy_nics = frozenset(
        n.position for n in layout.nics if index.nic_names[n.position] not in node.unhealthy
    )
    free_nics = frozenset(p for p in healthy_nics if index.nic_names[p] not in held)
    extra_healthy, extra_free = _kind_state(node, bad_gpus)
    return FreeState(
        free_gpus=free_gpus,
        healthy_gpus=healthy_gpus,
        free_migs=free_migs,
        healthy_migs=healthy_migs,
        share_use=_share_use(node, bad_gpus),
        free_nics=free_nics,
        healthy_nics=healthy_nics,
        extra_healthy=extra_healthy,
        extra_free=extra_free,
    )


Positions = tuple[tuple[str, frozenset[int]], ...]


def _kind_state(node: NodeState, bad_gpus: frozenset[int]) -> tuple[Positions, Positions]:
    """Healthy and free positions of each generically planned resource: a device is withheld when
    it, or the GPU it is made from, is unhealthy; free when no pod holds its ID."""
    assert node.layout is not None and node.index is not None
    healthy: list[tuple[str, frozenset[int]]] = []
    free: list[tuple[str, frozenset[int]]] = []
    for resource, slots in node.layout.extra:
        ids = node.index.extra_ids[resource]
        good = frozenset(
            s.position
            for s in slots
            if ids[s.position] not in node.unhealthy and (s.gpu_index is None or s.gpu_index not in bad_gpus)
        )
        healthy.append((resource, good))
        free.append((resource, frozenset(p for p in good if ids[p] not in node.holders)))
    return tuple(healthy), tuple(free)


def _share_use(node: NodeState, bad_gpus: frozenset[int]) -> tuple[tuple[int, ShareUse], ...]:
    """Units in use per healthy share-mode GPU, nothing on a node without share-mode GPUs. A
    fractional node holds a device ID per unit in use (``<GPU UUID>::<kind>-<n>``): they are counted
    by their ``<GPU UUID>::<kind>`` prefix in one pass, then each distinct prefix is read once."""
    assert node.layout is not None and node.index is not None
    gpus = node.layout.gpus
    shared = [g.index for g in gpus if g.mode is not SharingMode.EXCLUSIVE and g.index not in bad_gpus]
    if not shared:
        return ()
    by_uuid = {node.index.gpu_uuids[i]: i for i in shared}
    counts: dict[int, dict[str, int]] = {}
    for prefix, used in Counter(d.rpartition("-")[0] for d in node.holders).items():
        parent, sep, kind = prefix.partition("::")
        index = by_uuid.get(parent) if sep else None
        if index is not None:
            per_gpu = counts.setdefault(index, {})
            per_gpu[kind] = per_gpu.get(kind, 0) + used
    result = []
    for index in shared:
        got = counts.get(index, {})
        result.append((index, ShareUse(got.get("compute", 0), got.get("memory", 0), got.get("replica", 0))))
    return tuple(result)


def share_capacity(layout: NodeLayout, gpu_index: int) -> ShareUse:
    """Total units a share-mode GPU offers."""
    gpu = layout.gpu_by_index[gpu_index]
    if gpu.mode is SharingMode.FRACTIONAL:
        return ShareUse(compute=COMPUTE_UNITS_PER_GPU, memory=gpu.memory_gib)
    if gpu.mode is SharingMode.TIME_SLICED:
        return ShareUse(replicas=gpu.replicas)
    return ShareUse()
