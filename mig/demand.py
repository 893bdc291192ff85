"""Demand mode's decisions: which pending pods a node serves, when it may claim one, and whether a
plan covers what the claimed pods ask for.

Pure: the Kubernetes adapter (``mig/kube_demand.py``) turns Pod objects into
``PendingPod`` values and carries out the claims; this module only decides. A pod counts when it
is Pending, the scheduler marked it unschedulable (PodScheduled=False, reason Unschedulable), it
asks for ``nvidia.com/mig-*`` resources, and this node could run it: ``spec.nodeName`` empty or
this node, ``spec.nodeSelector`` a subset of the node's labels. Affinity, taints and tolerations,
topology spread and the pod's other resources are not evaluated.

Claims coordinate nodes: before reshaping for a pod a node writes its name and the time into the
pod's annotations with an optimistic-concurrency precondition, so two nodes never reshape for the
same pod. A claim older than ``ttl_s`` (the pod still unscheduled) may be taken over by another
node; the node that let it expire waits a second ``ttl_s`` before trying again, so another node
gets its turn.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mig.intent import GpuMigState, mig_requests
from mig.planner import Plan

CLAIM_ANNOTATION = "gpuweave.io/mig-demand-claim"
CLAIM_TIME_ANNOTATION = "gpuweave.io/mig-demand-claim-time"
DEFAULT_CLAIM_TTL_S = 120.0


@dataclass(frozen=True)
class Claim:
    """Which node claimed a pod, and when (seconds since the epoch; None when unreadable)."""

    node: str
    at: float | None


@dataclass(frozen=True)
class PendingPod:
    """The parts of a Pod demand mode looks at."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    phase: str
    unschedulable: bool
    node_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, int] = field(default_factory=dict)  # MIG profile -> count
    claim: Claim | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimAction(enum.Enum):
    CLAIM = "claim"  # unclaimed, or another node's claim expired: try to take it
    HELD = "held"  # this node's live claim: its demand counts
    SKIP = "skip"  # another node's live claim, or this node's claim just expired


def pod_requests(
    containers: Iterable[Mapping[str, int]], init_containers: Iterable[Mapping[str, int]] = ()
) -> dict[str, int]:
    """A pod's MIG requests (profile -> count): the containers' sum, at least any init container's."""
    total: Counter[str] = Counter()
    for resources in containers:
        total.update(mig_requests(resources))
    for resources in init_containers:
        for profile, count in mig_requests(resources).items():
            total[profile] = max(total[profile], count)
    return dict(total)


def wants_mig(pod: PendingPod) -> bool:
    """Pending, unschedulable, and asking for at least one MIG device."""
    return pod.phase == "Pending" and pod.unschedulable and any(c > 0 for c in pod.requests.values())


def could_run_here(pod: PendingPod, *, node: str, labels: Mapping[str, str]) -> bool:
    """``spec.nodeName`` and ``spec.nodeSelector`` allow this node (nothing else is evaluated)."""
    if pod.node_name and pod.node_name != node:
        return False
    return all(labels.get(key) == value for key, value in pod.node_selector.items())


def claim_action(
    pod: PendingPod, *, node: str, now: float, ttl_s: float = DEFAULT_CLAIM_TTL_S
) -> ClaimAction:
    claim = pod.claim
    if claim is None:
        return ClaimAction.CLAIM
    age = None if claim.at is None else now - claim.at
    expired = age is None or age >= ttl_s
    if claim.node != node:
        return ClaimAction.CLAIM if expired else ClaimAction.SKIP
    if not expired:
        return ClaimAction.HELD
    return ClaimAction.CLAIM if age is None or age >= 2 * ttl_s else ClaimAction.SKIP


@dataclass(frozen=True)
class DemandView:
    """One pass over the pending pods: what this node holds and what it may try to claim."""

    held: tuple[PendingPod, ...]
    to_claim: tuple[PendingPod, ...]


def select_demand(
    pods: Iterable[PendingPod],
    *,
    node: str,
    labels: Mapping[str, str],
    now: float,
    ttl_s: float = DEFAULT_CLAIM_TTL_S,
) -> DemandView:
    """The pods this node holds live claims on, and those it may claim, oldest key order first."""
    held: list[PendingPod] = []
    to_claim: list[PendingPod] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if not wants_mig(pod) or not could_run_here(pod, node=node, labels=labels):
            continue
        action = claim_action(pod, node=node, now=now, ttl_s=ttl_s)
        if action is ClaimAction.HELD:
            held.append(pod)
        elif action is ClaimAction.CLAIM:
            to_claim.append(pod)
    return DemandView(tuple(held), tuple(to_claim))


def demand_covered(
    pending: Sequence[Mapping[str, int]], gpus: Sequence[GpuMigState], plans: Mapping[int, Plan]
) -> bool:
    """Whether the node after ``plans`` has an idle instance for every pending request."""
    wanted: Counter[str] = Counter()
    for requests in pending:
        wanted.update({p: c for p, c in requests.items() if c > 0})
    idle: Counter[str] = Counter()
    for gpu in gpus:
        plan = plans.get(gpu.index)
        if plan is None:
            idle.update(i.profile for i in gpu.instances if not i.busy)
            continue
        busy_starts = {i.start for i in gpu.instances if i.busy}
        idle.update(p.profile for p in plan.final if p.start not in busy_starts)
    return all(idle[profile] >= count for profile, count in wanted.items())


def claim_annotations(node: str, now: float) -> dict[str, str]:
    """The annotations a claim writes."""
    return {CLAIM_ANNOTATION: node, CLAIM_TIME_ANNOTATION: format_time(now)}


def claim_of(annotations: Mapping[str, str] | None) -> Claim | None:
    """The claim recorded in a pod's annotations (an unreadable time counts as expired)."""
    node = (annotations or {}).get(CLAIM_ANNOTATION)
    if not node:
        return None
    return Claim(node, parse_time((annotations or {}).get(CLAIM_TIME_ANNOTATION, "")))


def format_time(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
