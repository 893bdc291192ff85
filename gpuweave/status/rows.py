"""``gpuweave status`` rows: per node and GPU, what the scheduler sees, as plain values.

Built from a ``ClusterView`` (the extender's own cache over the listed objects), so a GPU shows
as not healthy exactly when the extender keeps new work off it (labelled with the health
state the node agent's reason names: failed, suspect, probation ...), and a pod holds the devices its
assignment annotation names. Per GPU: product, sharing mode, holders (whole GPU, MIG device or
share units), health and its reason, the MIG layout, whether the bad-hardware list names it, and
what each container's processes use of it (the inventory's ``status.podUsage``, which the node
agent publishes).
Per node and cluster-wide: free GPUs and the fragment F_n(M) the scorer weighs
(``shares.node_fragment``, FGD's measure for the learned workload mix). Cluster-wide, the pods
the gpuweave scheduler has not placed, each with kube-scheduler's reason. No I/O and no text
layout here: the command renders these rows as a table or JSON.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from devicemodel.assignment import parent_gpu_of_share
from devicemodel.contracts import SCHEDULER_NAME
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, MILLI_PER_GPU, SharingMode
from gpuweave.status.cluster_view import BadHardware, ClusterView
from gpuweave.status.explain import asks_text
from health.policy import DeviceState
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.decide.layout import GpuSlot
from scheduler_ext.decide.shares import ModelFor, fragment_models, node_fragment
from scheduler_ext.decide.state import NodeState, share_capacity
from scheduler_ext.pods.requests import BadPodRequestError, pod_is_ours, pod_request

HEALTHY, WITHHELD, UNHEALTHY, RETIRED = "healthy", "withheld", "unhealthy", "retired"
HEALTH_STATES = frozenset(s.value for s in DeviceState if s is not DeviceState.HEALTHY)


@dataclass(frozen=True)
class Holder:
    pod: str  # namespace/name
    holds: str  # "whole", "MIG 1g.10gb", "40% compute, 10 GiB", "1 replica"


@dataclass(frozen=True)
class UsageRow:
    """What one container's processes use of the GPU, as its node agent last published it."""

    pod: str  # namespace/name
    container: str
    utilization: float  # 0..1 of the GPU's SMs
    memory_bytes: int
    memory_limit_bytes: int | None  # its share's limit; None without one


@dataclass(frozen=True)
class MigRow:
    uuid: str
    profile: str
    health: str
    reason: str
    holder: str  # namespace/name, "" when free


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    product: str
    memory_gib: int
    sharing: str  # exclusive | fractional | time-sliced | mig
    health: str  # healthy | suspect | failed | remediating | probation | retired | withheld | unhealthy
    reason: str
    free: str  # "free", "held", "60% free", "2/4 free" (replicas or MIG devices)
    holders: tuple[Holder, ...]
    migs: tuple[MigRow, ...]
    usage: tuple[UsageRow, ...] = ()  # the inventory's status.podUsage for this GPU


@dataclass(frozen=True)
class NodeRow:
    name: str
    topology: str  # nvswitch-8, nvlink-8, pcie-8 (the inventory's label)
    gpus: tuple[GpuRow, ...]
    pods: int
    free_gpus: int  # whole GPUs free for new work
    fragment_milli: float
    idle_milli: float
    unhealthy_nics: tuple[tuple[str, str], ...]  # (name, reason)


@dataclass(frozen=True)
class PendingRow:
    """A pod of the gpuweave scheduler, asking for GPU resources, not placed yet."""

    pod: str  # namespace/name
    asks: str  # "4 GPUs, placement nvlink-required"
    reason: str  # kube-scheduler's last FailedScheduling message (its PodScheduled condition)
    since: str  # when that condition last changed (RFC 3339), "" when there is none


@dataclass(frozen=True)
class ClusterStatus:
    nodes: tuple[NodeRow, ...]
    without_inventory: tuple[str, ...]  # Nodes with no GpuNodeInventory (no gpuweave node agent)
    bad_hardware: tuple[BadHardware, ...]
    fragment_milli: float
    idle_milli: float
    mix: str  # what the fragment is measured against
    pending: tuple[PendingRow, ...] = ()  # cluster-wide; left out when one node is asked for


def cluster_status(view: ClusterView, *, node: str | None = None) -> ClusterStatus:
    """The rows of every node (or of ``node`` only; cluster totals stay cluster-wide)."""
    bad = {b.uuid: b for b in view.bad_hardware}
    mix = view.core.workload.mix
    models = fragment_models(mix.workload)  # the scorer's models for this mix (``DecisionCore``)
    rows, bare = [], []
    for name in sorted(view.cache.node_names()):
        state = view.cache.node(name)
        if state is None or state.layout is None:
            bare.append(name)
            continue
        rows.append(_node_row(view, state, bad=bad, models=models))
    shown = [r for r in rows if node is None or r.name == node]
    return ClusterStatus(
        nodes=tuple(shown),
        without_inventory=tuple(n for n in bare if node is None or n == node),
        bad_hardware=view.bad_hardware,
        fragment_milli=sum(r.fragment_milli for r in rows),
        idle_milli=sum(r.idle_milli for r in rows),
        mix=_mix_text(mix.pinned, mix.version, mix.pods_seen),
        pending=pending_rows(view.pods.values()) if node is None else (),
    )


def pending_rows(pods: Iterable[Mapping[str, Any]]) -> tuple[PendingRow, ...]:
    """The pods the gpuweave scheduler has to place and has not: no node, not ended, asking for a
    GPU resource (or a gpuweave annotation), oldest first; each with kube-scheduler's reason."""
    rows = []
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or spec.get("schedulerName") != SCHEDULER_NAME or not pod_is_ours(pod):
            continue
        status = pod.get("status") or {}
        if status.get("phase") not in (None, "", "Pending"):
            continue
        metadata = pod.get("metadata") or {}
        key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
        try:
            asks = asks_text(pod_request(pod))
        except BadPodRequestError as exc:
            asks = f"a request the extender refuses: {exc}"
        reason, since = _unscheduled(status)
        rows.append((str(metadata.get("creationTimestamp") or ""), PendingRow(key, asks, reason, since)))
    return tuple(row for _, row in sorted(rows, key=lambda r: (r[0], r[1].pod)))


def _unscheduled(status: Mapping[str, Any]) -> tuple[str, str]:
    """kube-scheduler's reason from the pod's PodScheduled condition (the FailedScheduling Event's
    message is the same text), and when it last changed."""
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            if condition.get("status") == "True":
                return "scheduled; waiting for the binding", str(condition.get("lastTransitionTime") or "")
            said = str(condition.get("message") or "") or str(condition.get("reason") or "")
            return said or "not scheduled", str(condition.get("lastTransitionTime") or "")
    return "not tried by gpuweave-scheduler yet (is it running?)", ""


def _mix_text(pinned: bool, version: int, pods: int) -> str:
    if pinned:
        return "pinned workload"
    return f"mix learned from {pods} pods" if version else "cold-start mix"


def _node_row(
    view: ClusterView, state: NodeState, *, bad: Mapping[str, BadHardware], models: ModelFor
) -> NodeRow:
    assert state.layout is not None and state.index is not None
    records = {r.uid: r for r in view.cache.holdings_on(state.name)}
    health = _DeviceHealth.of(view.inventories.get(state.name), state)
    fragment, idle = node_fragment(state.layout, state.free, model_for=models, host_free=state.host_free)
    gpus = tuple(
        _gpu_row(state, slot, records=records, health=health, bad=bad.get(state.index.gpu_uuids[slot.index]))
        for slot in state.layout.gpus
    )
    usage = _usage_rows(view.inventories.get(state.name))
    gpus = tuple(replace(g, usage=usage.get(g.uuid, ())) for g in gpus)
    nics = tuple((nic, health.reason(nic)) for nic in state.index.nic_names if nic in state.unhealthy)
    labels = (view.inventories.get(state.name, {}).get("metadata") or {}).get("labels") or {}
    return NodeRow(
        name=state.name,
        topology=str(labels.get("gpuweave.io/topology") or f"{len(gpus)} GPUs"),
        gpus=gpus,
        pods=len({r.key for r in records.values()}),
        free_gpus=len(state.free.free_gpus),
        fragment_milli=fragment,
        idle_milli=idle,
        unhealthy_nics=nics,
    )


def _usage_rows(inventory: Mapping[str, Any] | None) -> dict[str, tuple[UsageRow, ...]]:
    """GPU UUID -> its containers' use, from the inventory's ``status.podUsage`` (bad entries left out)."""
    found: dict[str, list[UsageRow]] = {}
    for entry in ((inventory or {}).get("status") or {}).get("podUsage") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("gpu"), str):
            continue
        limit = entry.get("memoryLimitBytes")
        row = UsageRow(
            pod=f"{entry.get('namespace') or '?'}/{entry.get('pod') or '?'}",
            container=str(entry.get("container") or ""),
            utilization=float(entry.get("utilization") or 0.0),
            memory_bytes=int(entry.get("memoryUsedBytes") or 0),
            memory_limit_bytes=int(limit) if isinstance(limit, int) else None,
        )
        found.setdefault(entry["gpu"], []).append(row)
    return {gpu: tuple(rows) for gpu, rows in found.items()}


@dataclass(frozen=True)
class _DeviceHealth:
    """Per device ID: the state the extender acts on, and the reason the node agent published."""

    unhealthy: frozenset[str]
    withheld: frozenset[str]
    reasons: Mapping[str, str]

    @classmethod
    def of(cls, inventory: Mapping[str, Any] | None, state: NodeState) -> _DeviceHealth:
        status = (inventory or {}).get("status") or {}
        reasons = {
            str(d.get("id")): str(d.get("reason") or "")
            for d in status.get("devices") or []
            if isinstance(d, Mapping) and d.get("id")
        }
        return cls(state.unhealthy, frozenset(map(str, status.get("withheld") or [])), reasons)

    def state(self, device_id: str, parent: str = "") -> str:
        """healthy; the health state the agent's reason starts with (failed, suspect, probation
        ...); else withheld (a gate or an operator held it) or unhealthy."""
        if device_id not in self.unhealthy and parent not in self.unhealthy:
            return HEALTHY
        named = self.reason(device_id, parent).partition(":")[0]
        if named in HEALTH_STATES:
            return named.lower()
        return WITHHELD if {device_id, parent} & self.withheld else UNHEALTHY

    def reason(self, device_id: str, parent: str = "") -> str:
        return self.reasons.get(device_id) or self.reasons.get(parent, "")


def _gpu_row(
    state: NodeState,
    slot: GpuSlot,
    *,
    records: Mapping[str, PodRecord],
    health: _DeviceHealth,
    bad: BadHardware | None,
) -> GpuRow:
    assert state.layout is not None and state.index is not None
    uuid = state.index.gpu_uuids[slot.index]
    sharing = "mig" if slot.mig_enabled else slot.mode.value
    migs = _mig_rows(state, slot.index, records=records, health=health)
    holders = _holders(state, uuid, slot, records)
    condition = RETIRED if bad is not None else health.state(uuid)
    reason = bad.reason if bad is not None else health.reason(uuid) if condition != HEALTHY else ""
    return GpuRow(
        index=slot.index,
        uuid=uuid,
        product=slot.attributes.product_name,
        memory_gib=slot.memory_gib,
        sharing=sharing,
        health=condition,
        reason=reason,
        free=_free_text(state, slot, migs=migs, held=bool(holders)),
        holders=holders,
        migs=migs,
    )


def _holders(
    state: NodeState, uuid: str, slot: GpuSlot, records: Mapping[str, PodRecord]
) -> tuple[Holder, ...]:
    def key(uid: str) -> str:
        record = records.get(uid)
        return record.key if record is not None else uid

    if slot.mode is SharingMode.EXCLUSIVE or slot.mig_enabled:
        uid = state.holders.get(uuid)
        return (Holder(key(uid), "whole"),) if uid is not None and not slot.mig_enabled else ()
    units: dict[str, Counter[str]] = {}
    for device_id, uid in state.holders.items():
        if parent_gpu_of_share(device_id) == uuid:
            units.setdefault(uid, Counter())[device_id.rpartition("::")[2].partition("-")[0]] += 1
    shares = (Holder(key(uid), _share_words(counts)) for uid, counts in units.items())
    return tuple(sorted(shares, key=lambda h: h.pod))


def _share_words(units: Counter[str]) -> str:
    parts = []
    if units["compute"]:
        parts.append(f"{units['compute']}% compute")
    if units["memory"]:
        parts.append(f"{units['memory']} GiB")
    if units["replica"]:
        parts.append(f"{units['replica']} replica" + ("s" if units["replica"] > 1 else ""))
    return ", ".join(parts)


def _mig_rows(
    state: NodeState, gpu: int, *, records: Mapping[str, PodRecord], health: _DeviceHealth
) -> tuple[MigRow, ...]:
    assert state.layout is not None and state.index is not None
    parent = state.index.gpu_uuids[gpu]
    rows = []
    for mig in (m for m in state.layout.migs if m.parent_index == gpu):
        uuid = state.index.mig_uuids[mig.position]
        uid = state.holders.get(uuid)
        record = records.get(uid or "")
        condition = health.state(uuid, parent)
        reason = health.reason(uuid, parent) if condition != HEALTHY else ""
        holder = record.key if record is not None else uid or ""
        rows.append(MigRow(uuid=uuid, profile=mig.profile, health=condition, reason=reason, holder=holder))
    return tuple(rows)


def _free_text(state: NodeState, slot: GpuSlot, *, migs: Sequence[MigRow], held: bool) -> str:
    if slot.mig_enabled:
        free = sum(1 for m in migs if not m.holder and m.health == HEALTHY)
        return f"{free}/{len(migs)} free"
    if slot.mode is SharingMode.EXCLUSIVE:
        return "held" if held else "free" if slot.index in state.free.free_gpus else "-"
    assert state.layout is not None
    use = dict(state.free.share_use).get(slot.index)
    if use is None:
        return "-"  # withheld: offers nothing
    if slot.mode is SharingMode.FRACTIONAL:
        return f"{COMPUTE_UNITS_PER_GPU - use.compute}% free"
    return f"{share_capacity(state.layout, slot.index).replicas - use.replicas}/{slot.replicas} free"


def fragment_percent(fragment_milli: float, idle_milli: float) -> float:
    """The fragment as a share of the idle GPU it is part of (0 with nothing idle)."""
    return 100.0 * fragment_milli / idle_milli if idle_milli > 0 else 0.0


def gpus(milli: float) -> float:
    return milli / MILLI_PER_GPU
