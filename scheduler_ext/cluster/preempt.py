"""Preemption: which pods to evict on a node so the preemptor gets a topology-good device set.

kube-scheduler proposes victims from its in-tree dry run, which cannot see our device topology
(and, for nodes only this extender rejected, proposes none). We keep its victims (they free the
CPU and memory its filters need), then, if the pod still does not fit, add lower-priority pods that
hold devices on that node, lowest priority first, and finally drop any added pod the fit does not
need. Nodes where no eviction helps are left out of the answer, as the protocol asks.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.state import NodeState
from scheduler_ext.pods.requests import PodRequest

Victims = tuple[list[str], int]


def choose_victims(
    request: PodRequest, proposed: Mapping[str, Victims], *, cache: ClusterCache, core: DecisionCore
) -> dict[str, Victims]:
    chosen: dict[str, Victims] = {}
    for node_name, (uids, pdb) in proposed.items():
        state = cache.node(node_name)
        if state is None:
            continue
        extra = _extra_victims(request, state, set(uids), cache=cache, core=core)
        if extra is not None:
            chosen[node_name] = (list(uids) + extra, pdb)
    return chosen


def _fits_without(
    request: PodRequest, state: NodeState, removed: set[str], *, core: DecisionCore
) -> tuple[bool, bool]:
    """(fits, hopeless) once the pods in ``removed`` release their devices."""
    holders = {d: u for d, u in state.holders.items() if u not in removed}
    trial = core.registry.tokenized(state.with_holders(holders))
    verdict = core.decide(request, trial)
    return verdict.fits, verdict.unresolvable


def _extra_victims(
    request: PodRequest, state: NodeState, removed: set[str], *, cache: ClusterCache, core: DecisionCore
) -> list[str] | None:
    """Pods to add to ``removed`` so the request fits, [] when none are needed, None when hopeless."""
    fits, hopeless = _fits_without(request, state, removed, core=core)
    if fits:
        return []
    if hopeless:
        return None
    candidates = sorted(
        (r for r in cache.holdings_on(state.name) if evictable(r, request, removed, cache=cache)),
        key=lambda r: (r.priority, -len(r.devices), r.uid),
    )
    added: list[str] = []
    for record in candidates:
        removed.add(record.uid)
        added.append(record.uid)
        if _fits_without(request, state, removed, core=core)[0]:
            break
    else:
        return None
    for uid in reversed(added[:-1]):  # keep only what the fit needs
        removed.discard(uid)
        if _fits_without(request, state, removed, core=core)[0]:
            added.remove(uid)
        else:
            removed.add(uid)
    return added


def evictable(record: PodRecord, request: PodRequest, removed: set[str], *, cache: ClusterCache) -> bool:
    """A bound pod of lower priority than ``request`` that holds devices and is not removed yet."""
    holding = cache.holding(record.uid)
    return (
        record.uid not in removed
        and record.uid != request.uid
        and record.priority < request.priority
        and holding is not None
        and not holding.assumed  # not yet bound: kube-scheduler's snapshot may not have it on the node
        and bool(record.devices)
    )
