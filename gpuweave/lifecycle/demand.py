"""Pending GPU demand the autoscaler cannot read, judged by the extender's own decision core.

``read_demand`` walks the pending pods of a ``ClusterView`` (the extender's cache and core over
listed objects) and keeps those that ask for shares, MIG profiles or a gang in a required tier,
that fit no node now, and that would fit a new machine of a configured pool (``NewMachines``: the
same core, asked about an empty machine of each pool, built from the pool's node profile and what
it offers). ``shares_stuck`` finds the pool machines whose shares fit no other node now.
Reading only: no API calls, no writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devicemodel.contracts import NODE_INVENTORY_KIND
from devicemodel.gangs import BadGangError, gang_of
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.lifecycle.capacity import GangDemand, MigDemand, PoolOffer, ShareDemand
from gpuweave.lifecycle.capacity_config import CapacityConfig
from gpuweave.status.cluster_view import ClusterView
from gpuweave.status.node_rules import excluded_by_scheduler
from health.scope import TAINT_HEALTH_PENDING
from mig.demand import claim_of
from nodeagent.published import inventory_object
from scheduler_ext.api import BadPodRequestError, PodRequest, host_requests, pod_is_ours, pod_request
from topology.network import DEFAULT_TIER_LABELS

Object = Mapping[str, Any]
# Taints of a machine that is on its way: it counts as capacity for "fits now".
COMING_TAINTS = frozenset({TAINT_HEALTH_PENDING, "karpenter.sh/unregistered"})
LABEL_NODEPOOL = "karpenter.sh/nodepool"


@dataclass(frozen=True)
class Demand:
    shares: tuple[ShareDemand, ...] = ()
    migs: tuple[MigDemand, ...] = ()
    gangs: tuple[GangDemand, ...] = ()
    # Pending pods (namespace/name) that fit a node now or that a node's MIG manager claimed:
    # placed soon, not demand; a buffer that asked for them stays until they are bound.
    arriving: frozenset[str] = frozenset()


class NewMachines:
    """One empty machine per pool, in a view of its own, for "would it fit a new machine"."""

    def __init__(self, config: CapacityConfig) -> None:
        self.config = config
        objects: list[dict[str, Any]] = []
        for name, offer in config.pools.items():
            inventory = config.inventories[name]
            node = {
                "kind": "Node",
                "metadata": {"name": inventory.name, "labels": {LABEL_NODEPOOL: name}},
                "status": {"allocatable": {"cpu": "100000", "memory": "1Pi", "pods": "1000"}},
            }
            sharing = _sharing(offer)
            objects += [node, {**inventory_object(inventory, sharing=sharing), "kind": NODE_INVENTORY_KIND}]
        self.view = ClusterView.of(objects)
        self.machine = {name: config.inventories[name].name for name in config.pools}

    def pools_for(
        self, request: PodRequest, pod: Object, *, offers: Iterable[str], nodepools: Mapping[str, Object]
    ) -> tuple[str, ...]:
        """The pools offering one of ``offers`` whose empty machine the pod fits (and whose
        NodePool's taints and labels admit it: ``nodepools`` by name), by name."""
        wanted = set(offers)
        host = host_requests(pod)
        fitting = []
        for name, offer in sorted(self.config.pools.items()):
            if offer.offers not in wanted or name not in nodepools:
                continue
            if excluded_by_scheduler(pod, pool_node(nodepools[name], name, offer)) is not None:
                continue
            state = self.view.cache.node(self.machine[name])
            if state is not None and self.view.core.decide(request, state, host=host).fits:
                fitting.append(name)
        return tuple(fitting)


def pool_node(nodepool: Object, name: str, offer: PoolOffer) -> Object:
    """A Node as a new machine of the NodePool will be, for kube-scheduler's own filters: the
    template's labels and taints (start-up taints go before the pod could be placed)."""
    template = (nodepool.get("spec") or {}).get("template") or {}
    labels = {**((template.get("metadata") or {}).get("labels") or {}), LABEL_NODEPOOL: name}
    labels["node.kubernetes.io/instance-type"] = offer.instance_type
    return {
        "metadata": {"name": f"new-{name}", "labels": labels},
        "spec": {"taints": (template.get("spec") or {}).get("taints") or []},
    }


def _sharing(offer: PoolOffer) -> SharingPlan:
    modes = {"fractional": SharingMode.FRACTIONAL, "time-sliced": SharingMode.TIME_SLICED}
    mode = modes.get(offer.offers, SharingMode.EXCLUSIVE)
    return SharingPlan(default=GpuSharing(mode, offer.replicas))


def pending(pod: Object) -> bool:
    """Unbound, not going, and marked unschedulable by kube-scheduler."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if status.get("phase") not in (None, "Pending"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def fitting_nodes(view: ClusterView, pod: Object, request: PodRequest, *, skip: str = "") -> list[str]:
    """The nodes the pod fits now, machines still starting included; ``skip`` one by name."""
    names = []
    for name in view.cache.node_names():
        node = view.nodes.get(name)
        if name == skip or node is None or excluded_by_scheduler(pod, _arrived(node)) is not None:
            continue
        names.append(name)
    verdicts = view.core.decide_many(request, names, view.cache.states(), host=host_requests(pod))
    return [name for name, verdict in zip(names, verdicts, strict=True) if verdict.fits]


def claimed_by_a_node(view: ClusterView, pod: Object) -> bool:
    """A node's MIG manager (demand mode) claimed the pod and is making its instance: capacity on
    its way, not demand. A claim naming a node that is gone, or with no readable time, counts for
    nothing."""
    claim = claim_of((pod.get("metadata") or {}).get("annotations"))
    return claim is not None and claim.at is not None and claim.node in view.nodes


def _arrived(node: Object) -> Object:
    """The node as it will be once its start-up taints are gone."""
    spec = dict(node.get("spec") or {})
    spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") not in COMING_TAINTS]
    return {**node, "spec": spec}


def read_demand(view: ClusterView, machines: NewMachines, nodepools: Mapping[str, Object]) -> Demand:
    """The pending pods' demand (module doc); ``nodepools``: the pools' NodePool objects by name."""
    shares: list[ShareDemand] = []
    migs: list[MigDemand] = []
    gangs: dict[str, list[tuple[Object, PodRequest]]] = {}
    arriving: set[str] = set()
    for key, pod in sorted(view.pods.items()):
        if not pending(pod) or not pod_is_ours(pod):
            continue
        try:
            request = pod_request(pod)
            gang = gang_of(pod, min_members={}, tier_labels=DEFAULT_TIER_LABELS)
        except (BadPodRequestError, BadGangError):
            continue  # the extender refuses it on every node; no machine would help
        if gang is not None and gang.tier and request.pod_gpus():
            gangs.setdefault(gang.key, []).append((pod, request))
            continue
        if fitting_nodes(view, pod, request) or claimed_by_a_node(view, pod):
            arriving.add(key)
            continue
        shares += _shares(key, pod, request, machines, nodepools)
        migs += _migs(key, pod, request, machines, nodepools)
    gang_demands = [
        demand
        for g, members in sorted(gangs.items())
        if (demand := _gang(view, g, members, machines, nodepools))
    ]
    return Demand(tuple(shares), tuple(migs), tuple(gang_demands), frozenset(arriving))


def _shares(
    key: str, pod: Object, request: PodRequest, machines: NewMachines, nodepools: Mapping[str, Object]
) -> list[ShareDemand]:
    app = [c for c in request.containers if not c.init and (c.compute or c.memory_gib or c.shared)]
    if not app:
        return []
    offers = ("time-sliced",) if any(c.shared for c in app) else ("fractional",)
    pools = machines.pools_for(request, pod, offers=offers, nodepools=nodepools)
    return [ShareDemand(key, c.compute, c.memory_gib, c.shared, pools) for c in app] if pools else []


def _migs(
    key: str, pod: Object, request: PodRequest, machines: NewMachines, nodepools: Mapping[str, Object]
) -> list[MigDemand]:
    profiles: dict[str, int] = {}
    for container in request.containers:
        if not container.init:
            for profile, count in container.mig:
                profiles[profile] = profiles.get(profile, 0) + count
    if not profiles:
        return []
    pools = tuple(
        name
        for name, offer in sorted(machines.config.pools.items())
        if offer.offers == "mig"
        and all(p in offer.mig_max for p in profiles)
        and name in nodepools
        and excluded_by_scheduler(pod, pool_node(nodepools[name], name, offer)) is None
    )
    return [MigDemand(key, profiles, pools)] if pools else []


def _gang(
    view: ClusterView,
    gang: str,
    members: Sequence[tuple[Object, PodRequest]],
    machines: NewMachines,
    nodepools: Mapping[str, Object],
) -> GangDemand | None:
    """What the gang still lacks in its best domain, when all its members are pending.

    A domain of its tier holds, for each member, a node the member fits now, or a place on a
    pool machine still starting there (the autoscaler launched it for what it reads of the
    members: their whole GPUs). The domain that holds most wins; what it lacks is the demand, and
    only that is asked for, in that domain. None when a domain holds them all already."""
    pod, request = members[0]
    found = gang_of(pod, min_members={}, tier_labels=DEFAULT_TIER_LABELS)
    if found is None or len(members) < found.size:
        return None  # not all members exist (or some are placed): the extender plans around them
    pools = machines.pools_for(request, pod, offers=("exclusive",), nodepools=nodepools)
    if not pools:
        return None
    per_machine = max(1, machines.config.pools[pools[0]].gpus // max(1, request.pod_gpus()))
    held: dict[str, int] = {}
    for name in fitting_nodes(view, pod, request):
        value = _labels(view.nodes[name]).get(found.tier)
        if value:
            held[value] = held.get(value, 0) + 1
    for labels in starting_machines(view, pools[0]):
        value = labels.get(found.tier)
        if value:
            held[value] = held.get(value, 0) + per_machine
    domain, have = max(sorted(held.items()), key=lambda item: item[1], default=("", 0))
    if have >= found.size:
        return None
    keys = tuple(sorted(_key(member) for member, _ in members))
    cpu = max(host_requests(member)[0] for member, _ in members)
    return GangDemand(gang, keys, found.size - have, request.pod_gpus(), found.tier, pools, cpu, domain)


def starting_machines(view: ClusterView, pool: str) -> list[Mapping[str, str]]:
    """Labels of the pool's machines still on their way: registered, without an inventory yet or
    still behind their start-up taint, not being deleted."""
    starting = []
    for name, node in view.nodes.items():
        metadata = node.get("metadata") or {}
        if _labels(node).get(LABEL_NODEPOOL) != pool or metadata.get("deletionTimestamp"):
            continue
        taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
        if name not in view.inventories or taints & COMING_TAINTS:
            starting.append(_labels(node))
    return starting


def _labels(node: Object) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _key(pod: Object) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def shares_stuck(view: ClusterView, *, pools: set[str]) -> dict[str, set[str]]:
    """Pool machine -> its running share pods that fit no other node now."""
    stuck: dict[str, set[str]] = {}
    for key, pod in view.pods.items():
        node = (pod.get("spec") or {}).get("nodeName")
        labels = ((view.nodes.get(node or "", {}).get("metadata") or {}).get("labels")) or {}
        if not node or labels.get(LABEL_NODEPOOL) not in pools:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or not pod_is_ours(pod):
            continue
        try:
            request = pod_request(pod)
        except BadPodRequestError:
            continue
        if not any(c.compute or c.memory_gib or c.shared for c in request.containers):
            continue
        if not fitting_nodes(view, pod, request, skip=node):
            stuck.setdefault(node, set()).add(key)
    return stuck
