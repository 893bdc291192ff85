"""``gpuweave status --explain NS/POD``: the extender's decision for one pod, and why.

For a pending pod, the decision core (``DecisionCore.decide_many``, the call filter makes) runs
over every node kube-scheduler's own filters would pass (``node_rules``), and the rejections are
counted as kube-scheduler's FailedScheduling message counts them (``summary``). Then what would
make it fit, found by asking the same core about changed nodes: the node that fits once the
fewest pods there end (lowest priority first, as preemption picks), a node that fits once its
withheld devices are healthy again, a node kube-scheduler filters out that would fit, or how far
the largest node is from the request; for a share or MIG pod first the node that would fit with
its GPUs shared, or with a MIG layout, and the configuration that does it (``fixes``). For a
placed pod, the devices its assignment names, their topology score (``topology.scoring``)
against the best set of that size on the node, and every node ranked for its request as
prioritize ranks them (``ExtenderService.prioritize``) with the pod's own devices counted free.
No I/O: the objects come from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from devicemodel.errors import InvalidInputError
from devicemodel.sharing import SharingMode
from gpuweave.status.cluster_view import ClusterView, Object, unbound
from gpuweave.status.fixes import mig_fix, sharing_fix
from gpuweave.status.node_rules import excluded_by_scheduler
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.cluster.snapshot import SnapshotBinder
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.summary import DeviceGroup, device_groups, generic_reason, reason_counts
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.pods.host import host_requests
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest, pod_is_ours, pod_request
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import ExtenderArgs
from topology.fragmentation import TargetWorkload
from topology.scoring import SetScore, score_set
from topology.search import best_set

MAX_NEAREST_NODES = 64  # nodes tried for "fits once N pods end": each try is one decision per pod freed


@dataclass(frozen=True)
class Ranked:
    node: str
    fits: bool
    score: int  # prioritize's 0..10 for this pod (0 when it does not fit)
    reason: str
    gpus: tuple[int, ...] = ()  # the whole GPUs the scorer picks there


@dataclass(frozen=True)
class Pending:
    pod: str
    asks: str
    total: int
    available: tuple[str, ...]  # nodes gpuweave would accept now
    reasons: tuple[tuple[str, int], ...]  # (reason, nodes): kube-scheduler's filters, then gpuweave's
    scheduler_said: str  # the pod's PodScheduled=False message, if kube-scheduler wrote one
    hints: tuple[str, ...]


@dataclass(frozen=True)
class Placed:
    pod: str
    asks: str
    node: str
    devices: tuple[DeviceGroup, ...]
    topology: SetScore | None  # of the whole GPUs it holds
    best_value: float  # value of the best set of that size on the idle node (0: no whole GPUs)
    ranking: tuple[Ranked, ...]


def explain(
    objects: Iterable[Object], key: str, *, workload: TargetWorkload | None = None
) -> Pending | Placed:
    """The explanation for pod ``key`` (namespace/name) in the cluster ``objects`` describe."""
    listed = list(objects)
    pod = _find_pod(listed, key)
    request = _request(pod, key)
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if node:
        return _placed(ClusterView.of(listed, workload=workload, pending=key), pod, request, node)
    return _pending(ClusterView.of(listed, workload=workload), pod, request)


def _find_pod(objects: Sequence[Object], key: str) -> Object:
    namespace, _, name = key.rpartition("/")
    wanted = (namespace or "default", name)
    for obj in objects:
        metadata = obj.get("metadata") or {}
        found = (metadata.get("namespace") or "default", metadata.get("name"))
        if obj.get("kind") == "Pod" and found == wanted:
            return obj
    raise InvalidInputError(
        f"pod {key} is not in the cluster; give NAMESPACE/POD as `kubectl get pods -A` lists it"
    )


def _request(pod: Object, key: str) -> PodRequest:
    if not pod_is_ours(pod):
        raise InvalidInputError(
            f"pod {key} asks for no GPU, MIG, EFA or gpuweave resource: kube-scheduler places it "
            "without the extender (see `kubectl describe pod`)"
        )
    try:
        return pod_request(pod)
    except BadPodRequestError as exc:
        raise InvalidInputError(f"pod {key}: the extender rejects it on every node: {exc}") from None


def asks_text(request: PodRequest) -> str:
    """What the pod asks of gpuweave, in one line (``4 GPUs, placement nvlink-required``)."""
    app = [c for c in request.containers if not c.init]
    gpus = request.pod_gpus()
    parts = [f"{gpus} GPU" + ("s" if gpus > 1 else "")] if gpus else []
    migs: dict[str, int] = {}
    for container in app:
        for profile, count in container.mig:
            migs[profile] = migs.get(profile, 0) + count
        if container.compute or container.memory_gib:
            parts.append(f"{container.compute}% compute + {container.memory_gib} GiB of one GPU")
        if container.shared:
            parts.append(f"{container.shared} time-sliced replica(s)")
    parts += [f"{count} MIG {profile}" for profile, count in sorted(migs.items())]
    efa = sum(c.efa for c in app)
    parts += [f"{efa} EFA"] if efa else []
    parts += [f"placement {request.placement.value}"] if request.placement.value != "best-effort" else []
    parts += [f"gpu-selector {request.selector}"] if request.selector else []
    return ", ".join(parts) or "nothing from gpuweave"


# ---- pending ----------------------------------------------------------------------------------
def _pending(view: ClusterView, pod: Object, request: PodRequest) -> Pending:
    names = sorted(view.cache.node_names())
    excluded = {n: r for n in names if (r := excluded_by_scheduler(pod, view.nodes.get(n, {}))) is not None}
    candidates = [n for n in names if n not in excluded]
    host = host_requests(pod)
    verdicts = view.core.decide_many(request, candidates, view.cache.states(), host=host)
    by_node = dict(zip(candidates, verdicts, strict=True))
    rejected = [(n, v.reason) for n, v in by_node.items() if not v.fits]
    counts = reason_counts(excluded.items()) + reason_counts(rejected)
    return Pending(
        pod=request.key,
        asks=asks_text(request),
        total=len(names),
        available=tuple(n for n, v in by_node.items() if v.fits),
        reasons=tuple(counts),
        scheduler_said=_scheduler_message(pod),
        hints=tuple(_hints(view, request, host=host, verdicts=by_node, excluded=excluded)),
    )


def _scheduler_message(pod: Object) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


def _hints(
    view: ClusterView,
    request: PodRequest,
    *,
    host: tuple[int, int],
    verdicts: Mapping[str, Verdict],
    excluded: Mapping[str, str],
) -> list[str]:
    fitting = [n for n, v in verdicts.items() if v.fits]
    if fitting:
        return [
            f"gpuweave would place it now on {len(fitting)} node(s) ({', '.join(fitting[:3])}); "
            "kube-scheduler retries it; if it stays pending, kube-scheduler's own filters "
            "refuse it (`kubectl describe pod`)"
        ]
    hints = [
        h
        for h in (
            sharing_fix(view, request, host=host, verdicts=verdicts),
            mig_fix(view, request, verdicts=verdicts),
            _nearest_by_ending(view, request, host, verdicts),
            _nearest_by_health(view, request, host, verdicts),
        )
        if h
    ]
    hints += _filtered_out_would_fit(view, request, host, excluded)
    hints += _largest_node(view, request, verdicts)
    return hints or ["no node fits it even with every pod there ended: change the request or the nodes"]


def _nearest_by_ending(
    view: ClusterView, request: PodRequest, host: tuple[int, int], verdicts: Mapping[str, Verdict]
) -> str:
    best: tuple[int, int, str, list[PodRecord]] | None = None
    busy = [n for n, v in verdicts.items() if not v.fits and not v.unresolvable][:MAX_NEAREST_NODES]
    for name in busy:
        state = view.cache.node(name)
        ending = _pods_to_end(view, request, host, state) if state is not None else None
        if ending is not None:
            cost = (len(ending), sum(len(r.devices) for r in ending), name, ending)
            best = cost if best is None or cost[:3] < best[:3] else best
    if best is None:
        return ""
    count, _, name, ending = best
    pods = ", ".join(r.key for r in ending[:4]) + (" ..." if len(ending) > 4 else "")
    if all(r.priority < request.priority for r in ending):
        return f"fits node {name} once {count} pod(s) there end or are preempted: {pods}"
    return (
        f"fits node {name} once {count} pod(s) there end: {pods} (preemption takes only pods "
        f"of a priority below the pod's {request.priority})"
    )


def _pods_to_end(
    view: ClusterView, request: PodRequest, host: tuple[int, int], state: NodeState
) -> list[PodRecord] | None:
    """The fewest of the node's pods (lowest priority first) whose end lets the pod fit, or None."""
    order = sorted(view.cache.holdings_on(state.name), key=lambda r: (r.priority, -len(r.devices), r.key))
    for count in range(1, len(order) + 1):
        if view.core.decide(request, _without(state, order[:count]), name=state.name, host=host).fits:
            return order[:count]
    return None


def _without(state: NodeState, records: Sequence[PodRecord]) -> NodeState:
    gone = {r.uid for r in records}
    holders = {d: uid for d, uid in state.holders.items() if uid not in gone}
    host_free = state.host_free
    if host_free is not None:
        host_free = (
            host_free[0] + sum(r.cpu_milli for r in records),
            host_free[1] + sum(r.memory_mib for r in records),
        )
    return replace(state, holders=holders, host_free=host_free, token=-1)


def _nearest_by_health(
    view: ClusterView, request: PodRequest, host: tuple[int, int], verdicts: Mapping[str, Verdict]
) -> str:
    """A node that fits once its withheld devices are back (and, if need be, some pods ended)."""
    for name, verdict in verdicts.items():
        state = view.cache.node(name)
        if verdict.fits or state is None or not state.unhealthy or state.index is None:
            continue
        healed = replace(state, unhealthy=frozenset(), token=-1)
        by_uuid = {uuid: f"GPU {i}" for i, uuid in state.index.gpu_uuids.items()}
        withheld = ", ".join(sorted(by_uuid.get(d, d) for d in state.unhealthy)[:4])
        if view.core.decide(request, healed, host=host).fits:
            return f"fits node {name} once its withheld devices are healthy again: {withheld}"
        ending = _pods_to_end(view, request, host, healed)
        if ending is not None:
            pods = ", ".join(r.key for r in ending[:4]) + (" ..." if len(ending) > 4 else "")
            return (
                f"fits node {name} once its withheld devices are healthy again ({withheld}) "
                f"and {len(ending)} pod(s) there end: {pods}"
            )
    return ""


def _filtered_out_would_fit(
    view: ClusterView, request: PodRequest, host: tuple[int, int], excluded: Mapping[str, str]
) -> list[str]:
    names = list(excluded)
    verdicts = view.core.decide_many(request, names, view.cache.states(), host=host)
    fitting = [n for n, v in zip(names, verdicts, strict=True) if v.fits]
    if not fitting:
        return []
    return [
        f"{len(fitting)} node(s) kube-scheduler filters out would fit: {fitting[0]} ({excluded[fitting[0]]})"
    ]


def _largest_node(view: ClusterView, request: PodRequest, verdicts: Mapping[str, Verdict]) -> list[str]:
    need = request.pod_gpus()
    sizes: dict[str, int] = {}
    for name in verdicts:
        state = view.cache.node(name)
        if state is not None and state.layout is not None:
            gpus = state.layout.gpus
            sizes[name] = sum(1 for g in gpus if not g.mig_enabled and g.mode is SharingMode.EXCLUSIVE)
    if not need or not sizes or max(sizes.values()) >= need:
        return []
    largest = max(sizes, key=lambda n: (sizes[n], n))
    return [f"no node has {need} whole GPUs: the largest offers {sizes[largest]} (node {largest})"]


# ---- placed -----------------------------------------------------------------------------------
def _placed(view: ClusterView, pod: Object, request: PodRequest, node: str) -> Placed:
    state = view.cache.node(node)
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
    assignment = PodAssignment.from_annotation(raw) if raw else None
    groups = tuple(device_groups(assignment, state)) if assignment is not None else ()
    whole = tuple(i for g in groups for i in g.gpu_indices)
    topology, best = _topology(view, state, whole)
    return Placed(
        pod=request.key,
        asks=asks_text(request),
        node=node,
        devices=groups,
        topology=topology,
        best_value=best,
        ranking=tuple(_ranking(view, unbound(pod), request)),
    )


def _topology(
    view: ClusterView, state: NodeState | None, gpus: tuple[int, ...]
) -> tuple[SetScore | None, float]:
    if state is None or state.layout is None or not gpus:
        return None, 0.0
    graph = view.cache.registry.search(state.layout_id).graph
    every = frozenset(g.index for g in state.layout.gpus)
    ideal = best_set(graph, available=every, size=len(gpus), lookahead=False)
    return score_set(graph, gpus), float(ideal.score.value) if ideal is not None else 0.0


def _ranking(view: ClusterView, pod: dict[str, Any], request: PodRequest) -> list[Ranked]:
    names = sorted(view.cache.node_names())
    excluded = {n: r for n in names if (r := excluded_by_scheduler(pod, view.nodes.get(n, {}))) is not None}
    candidates = [n for n in names if n not in excluded]
    verdicts = view.core.decide_many(request, candidates, view.cache.states(), host=host_requests(pod))
    service = ExtenderService(cache=view.cache, core=view.core, binder=SnapshotBinder(view.cache))
    _, scores = service.prioritize(ExtenderArgs.model_validate({"Pod": pod, "NodeNames": candidates}), pod)
    ranked = [
        Ranked(n, v.fits, s, generic_reason(n, v.reason), tuple(sorted({i for p in v.plan for i in p.gpus})))
        for n, v, s in zip(candidates, verdicts, scores, strict=True)
    ]
    ranked += [Ranked(n, False, 0, reason) for n, reason in excluded.items()]
    return sorted(ranked, key=lambda r: (not r.fits, -r.score, r.node))
