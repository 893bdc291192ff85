"""The four extender verbs over the cache and the decision core, transport-free.

The HTTP adapter decodes a body into a wire model, calls one method here and encodes the result;
this module decides nothing about HTTP and the core decides nothing about Kubernetes objects.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any, Protocol

import numpy as np

from devicemodel.assignment import ImexDomain, PodAssignment, imex_domain_name
from devicemodel.errors import GpuweaveError, clip
from devicemodel.gangs import BadGangError, gang_key
from scheduler_ext.cluster.cache import ClusterCache, DoubleBookingError
from scheduler_ext.cluster.objects import PodRecord, pod_identity
from scheduler_ext.cluster.preempt import choose_victims
from scheduler_ext.decide.by_state import Filtered, StateGroups, held_per_state
from scheduler_ext.decide.cliques import best_fit_cliques, whole_free_counts
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.parsed import ParsedPod, ParsedPods
from scheduler_ext.decide.ranking import ranked_scores, ranks
from scheduler_ext.decide.shortlist import shortlist
from scheduler_ext.decide.verdict import Verdict, materialize
from scheduler_ext.gangs.policy import NO_GANGS, GangPolicy, Taken, gang_policy
from scheduler_ext.pods.host import NO_HOST, HostRequest
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest
from scheduler_ext.serving.flights import FlightTimeoutError, SingleFlight
from scheduler_ext.serving.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
)
from topology.fragmentation import TaskShape
from topology.network import LABEL_GPU_CLIQUE

LOG = logging.getLogger(__name__)
BIND_WAIT_S = 30.0  # how long a retried bind waits for the first call of the same pod


class BindError(GpuweaveError):
    """Writing the assignment or the Binding failed; nothing stays half-done."""


class Binder(Protocol):
    """Makes a bind real: annotation then Binding (API), or in-memory only (snapshot)."""

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None: ...


class Observer(Protocol):
    """Where decisions are counted (metrics); a no-op is fine."""

    def decided(self, verb: str, *, passed: int, rejected: Mapping[str, int]) -> None:
        """``rejected``: how many nodes were rejected for each distinct reason."""


@dataclass
class ExtenderService:
    cache: ClusterCache
    core: DecisionCore
    binder: Binder
    observer: Observer | None = None
    keep: int = 0  # filter passes at most this many fitting nodes (``shortlist``); 0: all of them
    # all-or-nothing gang placement, or none (``NO_GANGS``; None is taken for it): ``gangs.policy``
    gangs: GangPolicy = NO_GANGS
    binds: SingleFlight[str] = field(default_factory=lambda: SingleFlight(wait_s=BIND_WAIT_S))
    parsed: ParsedPods = field(default_factory=ParsedPods)  # each pod version parsed once for all verbs

    def __post_init__(self) -> None:
        self.gangs = gang_policy(self.gangs)

    # ---- filter / prioritize --------------------------------------------------------------------
    def filter(self, args: ExtenderArgs, pod: Mapping[str, Any]) -> ExtenderFilterResult:
        names = self._names(args)
        parsed = self.parsed.of(pod)
        if not parsed.ours:
            return self._filter_result(args, names, {}, {})
        self.cache.remember_pod(pod)
        try:
            request = parsed.checked()
            gang = self.gangs.gang_of(pod)
        except (BadPodRequestError, BadGangError) as exc:
            reason = clip(str(exc))  # one reason per node: escaped and bounded whatever the pod carries
            self._observe("filter", 0, {reason: len(names)})
            return self._filter_result(args, [], {}, dict.fromkeys(names, reason))
        self._learn(request, parsed)
        self.gangs.sweep()
        if gang is not None:
            answer = self.gangs.filter(gang, request, names, parsed.host)
            if answer is not None and answer.retry:  # e.g. its nodes' preflight is running
                self._observe("filter", 0, {clip(answer.retry): len(names)})
                return ExtenderFilterResult(NodeNames=[], Error=clip(answer.retry))
            if answer is not None:  # the member goes to its planned node (no shortlist: one node)
                failed, hopeless = leaving(answer.failed), leaving(answer.hopeless)
                rejected = Counter([*failed.values(), *hopeless.values()])
                self._observe("filter", len(answer.passed), rejected)
                return self._filter_result(args, answer.passed, failed, hopeless)
        groups = StateGroups.of(self.cache.token_keys(names))
        representatives = groups.representatives(names)  # one name per state, decided for all
        verdicts = self._verdicts(request, representatives, parsed.host, groups.tokens)
        spread = Filtered.spread(names, groups, verdicts)
        fits = spread.fits
        self._observe("filter", int(fits.sum()), spread.rejected)
        if gang is not None and not fits.any():
            alone = self.gangs.unplaced_alone(
                gang, request, names, parsed.host, failed=spread.failed, hopeless=spread.hopeless
            )
            if alone is not None:  # a gang of one preempts by the gang rules (recovering only)
                return self._filter_result(args, [], leaving(alone.failed), leaving(alone.hopeless))
        if (kept := self.gangs.keep_places(names, fits.tolist())) is not None:
            fits = np.array(kept, dtype=bool)  # kept for a waiting gang: only for pods that fit nowhere else
        passed: list[str] = list(compress(names, fits.tolist()))
        if 0 < self.keep < len(passed) and not parsed.soft:
            passed = self._best(
                request, parsed.shape, passed, states=(groups, representatives, verdicts), fits=fits
            )
        return self._filter_result(args, passed, spread.failed, spread.hopeless)

    def _best(
        self,
        request: PodRequest,
        shaped: tuple[TaskShape, int] | None,
        passed: list[str],
        *,
        states: tuple[StateGroups, list[str], list[Verdict]],
        fits: np.ndarray,
    ) -> list[str]:
        """The ``keep`` fitting nodes prioritize would rank best, fuller nodes first among equals.

        Ranked per node state, not per node (``by_state``): a state's verdict, reservation cost and
        devices held are the same on every node that has it. The states ranked are those with a
        passing node, as prioritize would rank the passing nodes. Per node: numpy passes only."""
        groups, representatives, verdicts = states
        ranked_states, local = groups.present(fits)
        chosen = [verdicts[i] for i in ranked_states]
        per_kind = self._per_kind_costs(shaped)
        costs = None
        if per_kind is not None:
            number_of = self.cache.kinds.number_of
            costs = [per_kind.get(number_of.get(representatives[i]), 0.0) for i in ranked_states]
        ranked = ranks(chosen, costs)[local]
        fullness = held_per_state(chosen)[local]
        return shortlist(passed, ranked, fullness, keep=self.keep, seed=request.uid or request.key)

    @staticmethod
    def _filter_result(
        args: ExtenderArgs, passed: list[str], failed: Mapping[str, str], hopeless: Mapping[str, str]
    ) -> ExtenderFilterResult:
        """Answer in the form asked: ``NodeNames`` when called with names, else the passing ``Nodes``.
        The rejected names stay as given (``by_state.RejectedNames`` for the per-state path), so
        the answer's encoder can write them per state."""
        if args.NodeNames is None and args.Nodes is not None:
            keep = set(passed)
            nodes = args.Nodes.model_copy(
                update={"items": [n for n in args.Nodes.items or [] if n.metadata.name in keep]}
            )
            return ExtenderFilterResult(
                Nodes=nodes, FailedNodes=dict(failed), FailedAndUnresolvableNodes=dict(hopeless)
            )
        return ExtenderFilterResult.model_construct(
            NodeNames=passed, FailedNodes=failed, FailedAndUnresolvableNodes=hopeless, Nodes=None, Error=""
        )

    def prioritize(self, args: ExtenderArgs, pod: Mapping[str, Any]) -> tuple[list[str], list[int]]:
        """Hosts and their scores 0..10, as two lists (the hot path builds no object per node)."""
        names = self._names(args)
        parsed = self.parsed.of(pod)
        if not parsed.ours:
            return names, self._host_only_scores(parsed.host, names)
        request = parsed.request
        if request is None:
            return names, [0] * len(names)
        verdicts = self._verdicts(request, names, parsed.host)
        scores = ranked_scores(verdicts, self._reservation_costs(parsed.shape, names))
        if not self._planned_as_gang(pod):  # a gang's nodes come from its plan; any other pod fits one node
            scores = self._best_fit_cliques(names, scores)
        return names, scores

    def _planned_as_gang(self, pod: Mapping[str, Any]) -> bool:
        """Whether the pod names a gang that is not a gang of one (``Gang.alone``, placed like any pod)."""
        if not gang_key(pod):
            return False
        try:
            gang = self.gangs.gang_of(pod)
        except BadGangError:
            return True
        return gang is None or not gang.alone

    def _best_fit_cliques(self, names: list[str], scores: list[int]) -> list[int]:
        """Among the best nodes, those of the clique with the fewest entirely free nodes (``cliques``)."""
        labels = self.cache.node_labels()
        states = self.cache.states()

        def clique_of(name: str) -> str | None:
            return labels.get(name, {}).get(LABEL_GPU_CLIQUE)

        def whole_free(name: str) -> bool:
            state = states.get(name)
            free = state.free if state is not None else None
            return free is not None and bool(free.free_gpus) and free.free_gpus == free.healthy_gpus

        counts: dict[str, int] | None = None

        def whole_free_in(clique: str) -> int:
            nonlocal counts
            if counts is None:
                counts = whole_free_counts(labels, whole_free, label=LABEL_GPU_CLIQUE)
            return counts.get(clique, 0)

        return best_fit_cliques(names, scores, clique_of, whole_free_in)

    def prioritize_claims(self, args: ExtenderArgs, pod: Mapping[str, Any]) -> tuple[list[str], list[int]]:
        """The ``prioritize-claims`` verb (the second extender entry, which kube-scheduler calls for
        every pod): 0..10 per node for a pod whose ResourceClaims ask for gpuweave.io GPUs or EFA
        adapters (``claims.score_node``); all 0, with no per-node step, for any other pod."""
        names = self._names(args)
        return names, self.cache.claims.scores(pod, names)

    def _reservation_costs(
        self, shaped: tuple[TaskShape, int] | None, names: list[str]
    ) -> list[float] | None:
        """Per node, what the pod's GPUs cost the tasks only that node's kind can serve (milli-GPU)."""
        per_kind = self._per_kind_costs(shaped)
        if per_kind is None:
            return None
        kinds = self.cache.kinds
        return list(map(per_kind.get, map(kinds.number_of.get, names), repeat(0.0)))  # C-level passes

    def _per_kind_costs(self, shaped: tuple[TaskShape, int] | None) -> dict[int | None, float] | None:
        """Kind number -> the reservation cost of the pod's GPUs on that kind (``shaped``: the pod's
        ``ParsedPod.shape``); None: no cost anywhere."""
        if shaped is None or shaped[0].total_gpu_milli == 0:
            return None
        kinds = self.cache.kinds
        per_kind = self.core.reserved(kinds).costs(shaped[0].total_gpu_milli, shaped[0].cpu_milli, kinds)
        if not per_kind:
            return None
        return {number: c for number, kind in enumerate(kinds.kinds) if (c := per_kind.get(kind))}

    def _host_only_scores(self, host: HostRequest, names: list[str]) -> list[int]:
        """A pod asking for no device, sent by a profile that sends every pod: steer its CPU and
        memory away from GPUs they would strand. No host request: no opinion (all 0)."""
        if host == NO_HOST:
            return [0] * len(names)
        return ranked_scores(self.core.decide_host_only(names, self.cache.states(), host=host))

    def _learn(self, request: PodRequest, parsed: ParsedPod) -> None:
        """Count the pod's shape in the workload the scorer places against (once per pod)."""
        if request.interested and (shaped := parsed.shape) is not None:
            self.core.workload.observe(request.uid or request.key, *shaped)

    def _names(self, args: ExtenderArgs) -> list[str]:
        if args.NodeNames is not None:
            return list(args.NodeNames)
        return [n.metadata.name for n in (args.Nodes.items or [] if args.Nodes else [])]

    def _verdicts(
        self, request: PodRequest, names: list[str], host: HostRequest, tokens: list[int | None] | None = None
    ) -> list[Verdict]:
        return self.core.decide_many(
            request, names, self.cache.states(), self.cache.tokens(), host=host, looked_up=tokens
        )

    def _observe(self, verb: str, passed: int, rejected: Mapping[str, int]) -> None:
        if self.observer is not None:
            self.observer.decided(verb, passed=passed, rejected=rejected)

    # ---- bind -----------------------------------------------------------------------------------
    def bind(self, args: ExtenderBindingArgs) -> str:
        """Returns "" on success, else the error text for ``ExtenderBindingResult.Error``.

        One bind per pod at a time: a retry that arrives while the first call is still writing
        gets that call's result (``flights``), never a success of its own before the first ends.
        """
        pod = args.PodUID or f"{args.PodNamespace}/{args.PodName}"
        for _ in range(2):  # a follower asking for another node runs its own bind once the first ends
            try:
                error, node = self.binds.run(pod, lambda: self._bind_once(args), tag=args.Node)
            except FlightTimeoutError as exc:
                return f"pod {pod}: an earlier bind of it is still in flight ({exc}); retry later"
            if node == args.Node:
                return error
        return f"pod {pod} is being bound to node {node} by another call; not binding it to {args.Node}"

    def _bind_once(self, args: ExtenderBindingArgs) -> str:
        key = f"{args.PodNamespace}/{args.PodName}"
        pod = self.cache.pod_object(uid=args.PodUID) if args.PodUID else self.cache.pod_object(key=key)
        if pod is None:
            return (
                f"pod {key} (uid {args.PodUID or '?'}) is unknown to the extender: not filtered here, "
                "or re-created since; kube-scheduler will retry it"
            )
        known = pod_identity(pod)[1]
        if known != key:
            LOG.warning("bind refused: uid %.200s is pod %s, not %.200s", args.PodUID, known, key)
            return f"pod uid {args.PodUID:.200} is pod {known}, not {key:.200}: binding nothing"
        parsed = self.parsed.of(pod)
        request = parsed.request
        if request is None:
            return parsed.error
        if not request.interested or all(c.is_empty for c in request.containers):
            return self._bind_plain(pod, args.Node)
        held = self.cache.holding(request.uid)
        if held is not None:  # a retried bind (e.g. after a timeout): never take a second set
            if held.record.node == args.Node:
                return ""
            return (
                f"pod {key} already holds devices on node {held.record.node}; not binding it to {args.Node}"
            )
        return self._bind_devices(pod, request, host=parsed.host, node=args.Node)

    def _bind_devices(
        self, pod: Mapping[str, Any], request: PodRequest, *, host: HostRequest, node: str
    ) -> str:
        """Hold the pod's devices on ``node`` and write the bind. A pod that names no gang binds past
        every gang hook (``NO_GANGS``) whichever policy holds, so gangs on or off it takes the same
        calls through the cache; a gang member takes over its planned slot, and a gang of one
        remembers where it ran."""
        gang = gang_key(pod)
        gangs = self.gangs if gang else NO_GANGS
        gangs.sweep()
        try:
            _, assignment, slot = self._assume(request, node, host, gang=gang, gangs=gangs)
        except (DoubleBookingError, BindError) as exc:
            return str(exc)
        if request.imex:
            assignment = with_imex_domain(assignment, request, slot, gang=gang)
        try:
            self.binder.bind(pod, node=node, assignment=assignment)
        except BindError as exc:
            self.cache.forget(request.uid)
            if slot is not None:
                gangs.give_back(slot, request)
            return str(exc)
        if slot is not None:
            gangs.bound(slot)
        elif gang:
            gangs.bound_alone(pod, node)
        return ""

    def _assume(
        self, request: PodRequest, node_name: str, host: HostRequest, *, gang: str, gangs: GangPolicy
    ) -> tuple[PodRecord, PodAssignment, Taken | None]:
        """Decide and hold the pod's devices on the node; a gang member first takes over the
        slot planned for it there (given back if the decision or the hold fails)."""
        with self.cache.node_lock(node_name):
            slot = gangs.take_slot(request.uid, node_name)
            try:
                record, assignment = self._assume_locked(request, node_name, host, gang=gang)
            except (DoubleBookingError, BindError):
                if slot is not None:
                    gangs.give_back(slot, request)
                raise
        return record, assignment, slot

    def _assume_locked(
        self, request: PodRequest, node_name: str, host: HostRequest, *, gang: str
    ) -> tuple[PodRecord, PodAssignment]:
        node = self.cache.node(node_name)
        verdict = self.core.decide(request, node, name=node_name, host=host)
        if not verdict.fits or node is None:
            raise BindError(f"pod {request.key} no longer fits node {node_name}: {verdict.reason}")
        assignment = materialize(verdict.plan, node)
        record = PodRecord(
            uid=request.uid,
            namespace=request.namespace,
            name=request.name,
            node=node_name,
            devices=frozenset(assignment.all_device_ids()),
            priority=request.priority,
            terminated=False,
            cpu_milli=host[0],
            memory_mib=host[1],
            gang=gang,
        )
        self.cache.assume(record)  # re-checks for double booking (re-entrant node lock)
        return record, assignment

    def _bind_plain(self, pod: Mapping[str, Any], node: str) -> str:
        try:
            self.binder.bind(pod, node=node, assignment=None)
        except BindError as exc:
            return str(exc)
        return ""

    # ---- preempt --------------------------------------------------------------------------------
    def preempt(self, args: ExtenderPreemptionArgs, pod: Mapping[str, Any]) -> ExtenderPreemptionResult:
        nodes = args.proposed()
        parsed = self.parsed.of(pod)
        if not parsed.ours:
            chosen = {node: args.victims(node) for node in nodes}
        else:
            try:
                request = parsed.checked()
                gang = self.gangs.gang_of(pod)
            except (BadPodRequestError, BadGangError):
                return ExtenderPreemptionResult()
            if gang is not None:
                # a gang member evicts only where its recovering gang's plan needs room (else
                # nowhere): the victims of the other nodes are never read
                room = self.gangs.preemption_room(gang, request, nodes, parsed.host)
                nodes = [n for n in nodes if n in room]
            proposed = {node: args.victims(node) for node in nodes}
            chosen = choose_victims(request, proposed, cache=self.cache, core=self.core)
            if gang is not None:  # a node that needs no eviction brings the gang no closer
                chosen = {n: v for n, v in chosen.items() if v[0]}
        return ExtenderPreemptionResult(
            NodeNameToMetaVictims={
                node: MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=pdb)
                for node, (uids, pdb) in chosen.items()
            }
        )


def leaving(rejected: Mapping[str, str]) -> dict[str, str]:
    """Rejection reasons as they leave in filter's answer (and from there in kube-scheduler's
    FailedScheduling Event): each escaped and clipped (``errors.clip``: ``devicemodel.text``),
    since the gang code words them with the pod's own gang name; each distinct reason once."""
    done: dict[str, str] = {}
    return {name: done.get(r) or done.setdefault(r, clip(r)) for name, r in rejected.items()}


def with_imex_domain(
    assignment: PodAssignment, request: PodRequest, slot: Taken | None, *, gang: str
) -> PodAssignment:
    """The assignment with the pod's IMEX domain: a gang member's is its gang's planned nodes (the
    same name and nodes on every member), a lone pod's its own node."""
    if slot is not None:
        reservation, _ = slot
        nodes = tuple(sorted({s.node for s in reservation.slots}))
        name = imex_domain_name(gang or reservation.key)
    else:
        nodes, name = (assignment.node,), imex_domain_name(request.key)
    return assignment.model_copy(update={"imex": ImexDomain(name=name, nodes=nodes)})
