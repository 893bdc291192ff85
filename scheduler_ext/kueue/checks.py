"""The ``gpuweave.io/gpu-health`` Kueue admission check: what its state should be. Pure.

Kueue admits a Workload once quota is reserved and every admission check of its ClusterQueue
is ``Ready``; a check set to ``Retry`` evicts the admitted Workload (the job is suspended, all its
pods go) and requeues it whole, the check reset to ``Pending``. gpuweave answers its check:

- ``Pending`` with quota reserved: ``Ready`` when the Workload's pods fit on healthy free GPUs of
  the nodes its flavors select (whole GPUs, best fit, each pod on one node), else it stays
  ``Pending`` with what is missing, and is looked at again as devices free up or heal.
- ``Ready`` and admitted: ``Retry`` when one of the Workload's pods holds a device that is now
  unhealthy (the node agent's published health), naming the device, so Kueue evicts the whole
  job and requeues it; the check's next ``Pending`` then admits it once it fits on healthy GPUs.

``Workload`` is the part of a ``kueue.x-k8s.io/v1beta2`` Workload read here, validated at the
boundary (``parse_workload``): an object that does not parse is skipped with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.assignment import parent_gpu_of_share
from devicemodel.errors import InvalidInputError
from devicemodel.text import safe_text
from scheduler_ext.decide.state import NodeState
from scheduler_ext.pods.requests import BadPodRequestError, pod_request

CONTROLLER_NAME: Final = "gpuweave.io/gpu-health"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
MAX_MESSAGE: Final = 1024  # of a check's message (Kueue allows 32768)
MAX_NODES_NAMED: Final = 4

CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class OwnerRef(_Lenient):
    kind: str = ""
    name: str = ""
    controller: bool = False


class Meta(_Lenient):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(default="default", max_length=63)
    uid: str = ""
    resource_version: str = Field(default="", alias="resourceVersion")
    owner_references: list[OwnerRef] = Field(default_factory=list, alias="ownerReferences", max_length=64)


class PodSet(_Lenient):
    name: str = Field(min_length=1, max_length=63)
    count: int = Field(ge=0, le=1_000_000)
    template: dict[str, Any] = Field(default_factory=dict)


class Condition(_Lenient):
    type: str
    status: str
    reason: str = ""


class CheckStatus(_Lenient):
    name: str
    state: str = "Pending"
    message: str = ""
    retry_count: int = Field(default=0, alias="retryCount")
    last_transition: str = Field(default="", alias="lastTransitionTime")


class PodSetAssignment(_Lenient):
    name: str
    count: int | None = None
    flavors: dict[str, str] = Field(default_factory=dict)


class Admission(_Lenient):
    cluster_queue: str = Field(default="", alias="clusterQueue")
    pod_set_assignments: list[PodSetAssignment] = Field(
        default_factory=list, alias="podSetAssignments", max_length=64
    )


class WorkloadStatus(_Lenient):
    conditions: list[Condition] = Field(default_factory=list, max_length=64)
    admission: Admission | None = None
    admission_checks: list[CheckStatus] = Field(default_factory=list, alias="admissionChecks", max_length=64)


class WorkloadSpec(_Lenient):
    pod_sets: list[PodSet] = Field(default_factory=list, alias="podSets", max_length=64)


class Workload(_Lenient):
    metadata: Meta
    spec: WorkloadSpec = Field(default_factory=WorkloadSpec)
    status: WorkloadStatus = Field(default_factory=WorkloadStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def condition(self, kind: str) -> bool:
        return any(c.type == kind and c.status == "True" for c in self.status.conditions)

    def check(self, names: Iterable[str]) -> CheckStatus | None:
        """The state of the first of ``names`` (gpuweave's AdmissionChecks) this Workload has."""
        wanted = set(names)
        return next((c for c in self.status.admission_checks if c.name in wanted), None)

    @property
    def assignments(self) -> list[PodSetAssignment]:
        admission = self.status.admission
        return admission.pod_set_assignments if admission is not None else []

    def owner(self) -> tuple[str, str] | None:
        """(kind, name) of the object Kueue made this Workload for (its controller owner)."""
        refs = self.metadata.owner_references
        ref = next((r for r in refs if r.controller), refs[0] if refs else None)
        return (ref.kind, ref.name) if ref is not None else None


def parse_workload(obj: Mapping[str, Any]) -> Workload:
    """Raises ``InvalidInputError`` naming the field that does not parse."""
    try:
        return Workload.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInputError(f"Workload {where}: {first['msg']}") from None


@dataclass(frozen=True)
class Verdict:
    """The check state to write, with its message (``Retry`` asks Kueue to requeue at once)."""

    state: CheckState
    message: str


@dataclass(frozen=True)
class HeldFault:
    """A pod holding a device its node reports unhealthy."""

    node: str
    device: str
    pod_uid: str


def held_faults(states: Mapping[str, NodeState]) -> list[HeldFault]:
    """Every (node, unhealthy device, holder) in the cache: the devices that failed under a pod
    (a share of a failed GPU counts as that GPU). Only nodes with an unhealthy device are read."""
    found: dict[HeldFault, None] = {}  # one per (device, pod): a pod's shares of one GPU are one
    for name, state in states.items():
        if not state.unhealthy or not state.holders:
            continue
        for device, uid in sorted(state.holders.items()):
            failed = device if device in state.unhealthy else parent_gpu_of_share(device)
            if failed is not None and failed in state.unhealthy:
                found[HeldFault(node=name, device=failed, pod_uid=uid)] = None
    return list(found)


def verdict_for_faults(workload: Workload, faults: Sequence[tuple[HeldFault, str]]) -> Verdict | None:
    """``Retry`` when the admitted Workload's pods (``faults``: each fault with its pod's
    namespace/name) hold failed devices; None while none does."""
    if not faults:
        return None
    fault, pod = faults[0]
    more = f" and {len(faults) - 1} more" if len(faults) > 1 else ""
    return Verdict(
        "Retry",
        _clip(
            f"device {fault.device} on node {fault.node} failed under pod {pod}{more}: "
            "the whole workload is evicted and requeued, to run again on healthy GPUs"
        ),
    )


@dataclass(frozen=True)
class PodSetNeed:
    name: str
    count: int
    gpus: int  # whole GPUs per pod
    nodes: frozenset[str] | None  # the nodes its flavor selects; None: any


def pod_set_needs(workload: Workload, flavor_nodes: Mapping[str, frozenset[str]]) -> list[PodSetNeed]:
    """Per pod set: pods admitted (the admission's count, else the spec's), whole GPUs per pod, and
    the nodes its ``nvidia.com/gpu`` flavor selects (``flavor_nodes``: flavor -> node names; a
    flavor missing there selects any node). Raises ``InvalidInputError`` for a template that
    does not parse as a pod."""
    assigned = {a.name: a for a in workload.assignments}
    needs: list[PodSetNeed] = []
    for pod_set in workload.spec.pod_sets:
        template = pod_set.template
        pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec") or {}}
        try:
            gpus = pod_request(pod).pod_gpus()
        except BadPodRequestError as exc:
            raise InvalidInputError(f"Workload pod set {pod_set.name}: {exc}") from None
        assignment = assigned.get(pod_set.name)
        count = assignment.count if assignment is not None and assignment.count is not None else pod_set.count
        flavor = assignment.flavors.get("nvidia.com/gpu") if assignment is not None else None
        nodes = flavor_nodes.get(flavor) if flavor else None
        needs.append(PodSetNeed(pod_set.name, count, gpus, nodes))
    return needs


def free_gpus_by_node(states: Mapping[str, NodeState]) -> dict[str, int]:
    """Healthy whole GPUs no pod holds, per node with an inventory (one pass over the cache)."""
    return {name: len(state.free.free_gpus) for name, state in states.items() if state.layout is not None}


def _histogram(free: Mapping[str, int], nodes: frozenset[str] | None) -> dict[int, int]:
    """free GPUs -> how many of ``nodes`` (None: every node) have that many."""
    counts: dict[int, int] = {}
    for name in free if nodes is None else (n for n in nodes if n in free):
        counts[free[name]] = counts.get(free[name], 0) + 1
    return counts


def verdict_for_admission(needs: Sequence[PodSetNeed], free: Mapping[str, int]) -> Verdict:
    """``Ready`` when every pod fits on healthy free whole GPUs (``free``: per node, from
    ``free_gpus_by_node``; best fit: each pod on a node with the fewest free GPUs that still holds
    it, larger pods first), else ``Pending`` naming the first pod set that does not fit and what
    its nodes have left. Works on counts of nodes per free-GPU value, so a pod costs a few steps
    whatever the cluster's size; pod sets on one flavor share those counts (pod sets on two
    flavors whose nodes overlap are each counted against all of their nodes)."""
    by_nodes: dict[frozenset[str] | None, dict[int, int]] = {}
    total = sum(n.count * n.gpus for n in needs)
    for need in sorted(needs, key=lambda n: -n.gpus):
        if need.gpus == 0 or need.count == 0:
            continue
        if need.nodes not in by_nodes:
            by_nodes[need.nodes] = _histogram(free, need.nodes)
        counts = by_nodes[need.nodes]
        for placed in range(need.count):
            fit = min((v for v, c in counts.items() if c and v >= need.gpus), default=None)
            if fit is None:
                left = sorted(
                    (v for v, c in counts.items() for _ in range(min(c, MAX_NODES_NAMED))), reverse=True
                )
                have = ", ".join(str(v) for v in left[:MAX_NODES_NAMED]) if left else "no node"
                return Verdict(
                    "Pending",
                    _clip(
                        f"waiting for healthy GPUs: pod set {need.name} needs {need.count} pods x "
                        f"{need.gpus} GPUs, {placed} fit; most free healthy GPUs left on one of its "
                        f"nodes: {have}"
                    ),
                )
            counts[fit] -= 1
            counts[fit - need.gpus] = counts.get(fit - need.gpus, 0) + 1
    return Verdict("Ready", _clip(f"{total} GPUs fit on healthy free devices"))


def placement_nodes(needs: Sequence[PodSetNeed], free: Mapping[str, int]) -> dict[str, int]:
    """Node -> GPUs the Workload's pods would take there, by the same best fit as
    ``verdict_for_admission`` with nodes named (ties: the name); for a Workload that fits. The
    gang preflight asks these nodes to prove their GPUs before the check turns ``Ready``."""
    left = dict(free)
    used: dict[str, int] = {}
    for need in sorted(needs, key=lambda n: -n.gpus):
        if need.gpus == 0:
            continue
        names = sorted(left if need.nodes is None else (n for n in need.nodes if n in left))
        for _ in range(need.count):
            fit = min((n for n in names if left[n] >= need.gpus), key=lambda n: (left[n], n), default=None)
            if fit is None:
                break
            left[fit] -= need.gpus
            used[fit] = used.get(fit, 0) + need.gpus
    return used


def _clip(text: str) -> str:
    """A check's message as it leaves (``devicemodel.text``): it names pods and pod sets."""
    return safe_text(text, limit=MAX_MESSAGE)
