"""The pure decision core: does a pod fit a node, with which devices, and how good is the node.

No I/O here: the HTTP adapter and the cluster cache hand in values (``PodRequest``, ``NodeState``)
and get values back (``Verdict``). Decisions are memoized by (node state token, request), where
equal tokens mean the same layout in the same free state; that is what makes a 5,000-node filter
cheap: nodes differ in name, rarely in state.

Verdict semantics, as kube-scheduler uses them: ``fits=False, unresolvable=True`` means no amount
of preemption on this node can help (too few GPUs, none matching the selector, unhealthy
hardware, an impossible topology policy); plain ``fits=False`` means freeing devices would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import compress
from operator import not_

from scheduler_ext.decide.layout import NodeLayout
from scheduler_ext.decide.planners import Planner
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.reservation import KindTotals, ReservedDemand
from scheduler_ext.decide.shares import UNLIMITED, ModelFor, fragment_models, host_only_level, quality_of
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import MAX_SCORE, PASS_THROUGH, PlanStep, Verdict, fail, unresolvable
from scheduler_ext.decide.workload import WorkloadLearner
from scheduler_ext.pods.host import NO_HOST, HostRequest
from scheduler_ext.pods.requests import PodRequest
from scheduler_ext.pods.selector import SelectorCache, SelectorError
from topology.fragmentation import TargetWorkload

MAX_MEMO_ENTRIES = 500_000
NOTHING_ASKED = Verdict(fits=True, score=MAX_SCORE // 2)


class DecisionCore:
    """Decides per (pod, node); owns the decision memo. Thread-safe."""

    def __init__(
        self,
        registry: LayoutRegistry,
        *,
        selectors: SelectorCache | None = None,
        share_workload: TargetWorkload | None = None,
        workload: WorkloadLearner | None = None,
    ) -> None:
        """``workload`` learns the mix FGD scores against; ``share_workload`` pins one instead."""
        self.registry = registry
        self.selectors = selectors or SelectorCache()
        self.workload = workload or WorkloadLearner(pinned=share_workload)
        self._memo: dict[tuple[object, ...], dict[int, Verdict]] = {}
        self._size = 0
        self._lock = threading.Lock()
        self._mix_version = self.workload.mix.version
        self._models: ModelFor = fragment_models(self.workload.mix.workload)
        self._reserved: tuple[tuple[int, int], ReservedDemand] | None = None

    def decide(
        self, request: PodRequest, node: NodeState | None, *, name: str = "", host: HostRequest = NO_HOST
    ) -> Verdict:
        name = name or (node.name if node is not None else "")
        return self.decide_many(request, [name], {name: node} if node is not None else {}, host=host)[0]

    def decide_many(
        self,
        request: PodRequest,
        names: Sequence[str],
        states: Mapping[str, NodeState],
        tokens: Mapping[str, int] | None = None,
        *,
        host: HostRequest = NO_HOST,
        looked_up: list[int | None] | None = None,
    ) -> list[Verdict]:
        """One verdict per name; a name missing from ``states`` is a node the cache does not know.

        ``host`` is the pod's (CPU milli, memory MiB) request: the scorer weighs what a node's
        host resources leave usable, so decisions are memoized per (request, host request).

        The hot path of filter and prioritize. With ``tokens`` (name -> state token, kept by the
        cache) the memo hits are two ``map`` passes in C; only misses run Python code.
        ``looked_up``: the names' tokens, looked up by the caller (who keeps them), saving a pass.
        """
        if not request.interested:
            return [PASS_THROUGH] * len(names)
        if all(c.is_empty for c in request.containers):
            return [NOTHING_ASKED] * len(names)
        if self.workload.mix.version != self._mix_version:
            self._follow_mix()
        key = (request.signature, host)
        memo = self._memo.get(key)
        if memo is None:
            with self._lock:
                memo = self._memo.setdefault(key, {})
        if tokens is None:
            tokens = {n: self._token(s) for n, s in states.items()}
        keys = looked_up if looked_up is not None else map(tokens.get, names)
        verdicts: list[Verdict | None] = list(map(memo.get, keys))  # type: ignore[arg-type]
        # Verdicts are always truthy, so ``all`` and ``not_`` find the misses at C speed (``None in``
        # would call the dataclass ``__eq__`` per element, a Python loop would cost a step per node).
        if not all(verdicts):
            for index in compress(range(len(names)), map(not_, verdicts)):
                verdicts[index] = self._miss(request, names[index], states.get(names[index]), memo, host)
        return verdicts  # type: ignore[return-value]

    def _miss(
        self,
        request: PodRequest,
        name: str,
        node: NodeState | None,
        memo: dict[int, Verdict],
        host: HostRequest,
    ) -> Verdict:
        if node is None:
            return fail(f"node {name} is not (yet) in the gpuweave extender's cache")
        token = self._token(node)
        verdict = memo.get(token)  # an identical node earlier in this same call may have filled it
        if verdict is None:
            verdict = self._decide_uncached(request, node, host)
            if verdict.fits and node.holders:  # equal tokens hold equally many devices
                verdict = replace(verdict, held=len(node.holders))
            self._remember(memo, token, verdict)
        return verdict

    def decide_host_only(
        self, names: Sequence[str], states: Mapping[str, NodeState], *, host: HostRequest
    ) -> list[Verdict]:
        """Verdicts for a pod that asks for no device (kube-scheduler filters it alone): every
        node fits; quality is what its CPU and memory cost the node's idle GPUs (``shares``)."""
        if self.workload.mix.version != self._mix_version:
            self._follow_mix()
        memo = self._memo.get(("host-only", host))
        if memo is None:
            with self._lock:
                memo = self._memo.setdefault(("host-only", host), {})
        verdicts = []
        for name in names:
            node = states.get(name)
            if node is None:
                verdicts.append(Verdict(fits=True, quality=0.0))
                continue
            token = self._token(node)
            verdict = memo.get(token)
            if verdict is None:
                verdict = self._host_only(node, host)
                self._remember(memo, token, verdict)
            verdicts.append(verdict)
        return verdicts

    def _host_only(self, node: NodeState, host: HostRequest) -> Verdict:
        before = node.host_free or (UNLIMITED, UNLIMITED)
        hosts = (before, (before[0] - host[0], before[1] - host[1]))
        level, idle = host_only_level(node.layout, node.free, model_for=self._models, hosts=hosts)
        quality = quality_of(level, idle)
        return Verdict(fits=True, score=round(quality * MAX_SCORE), quality=quality, level=level, idle=idle)

    def reserved(self, kinds: KindTotals) -> ReservedDemand:
        """The reservation by node kind for the current mix and cluster (rebuilt when either changes)."""
        key = (self.workload.mix.version, kinds.version)
        cached = self._reserved
        if cached is None or cached[0] != key:
            capacity = dict(kinds.capacity)
            cached = self._reserved = (key, ReservedDemand.of(self.workload.mix.workload, capacity))
        return cached[1]

    def _follow_mix(self) -> None:
        """The learned mix changed: score against it from now on (memoized verdicts are stale)."""
        with self._lock:
            mix = self.workload.mix
            self._models = fragment_models(mix.workload)
            for inner in self._memo.values():
                inner.clear()
            self._size = 0
            self._mix_version = mix.version

    def _token(self, node: NodeState) -> int:
        return node.token if node.token >= 0 else self.registry.token(node.memo_key)

    def _remember(self, memo: dict[int, Verdict], token: int, verdict: Verdict) -> None:
        with self._lock:
            if self._size >= MAX_MEMO_ENTRIES:
                for inner in self._memo.values():
                    inner.clear()
                self._size = 0
            memo[token] = verdict
            self._size += 1

    def _decide_uncached(self, request: PodRequest, node: NodeState, host: HostRequest) -> Verdict:
        if node.layout is None:
            return unresolvable(
                f"node {node.name} publishes no GpuNodeInventory; run the gpuweave node agent there "
                "or keep GPU pods off it"
            )
        try:
            eligible = self._eligible_gpus(request.selector, node.layout)
        except SelectorError as exc:
            return unresolvable(str(exc))
        if request.selector is not None and not eligible:
            products = sorted({g.attributes.product_name for g in node.layout.gpus}) or ["no GPUs"]
            return unresolvable(
                f"no GPU on the node matches the gpu-selector (node has {', '.join(products)})"
            )
        planner = Planner(
            request=request,
            layout=node.layout,
            free=node.free,
            eligible=eligible,
            search=self.registry.search(node.layout_id),
            share_models=self._models,
            host=host,
            host_free=node.host_free,
        )
        steps: list[PlanStep] = []
        for stage in (
            planner.plan_gpus,
            planner.plan_migs,
            planner.plan_shares,
            planner.plan_nics,
            planner.plan_kinds,
        ):
            step = stage()
            if isinstance(step, Verdict):
                return step
            steps.append(step)
        return planner.combine(steps)

    def _eligible_gpus(self, selector: str | None, layout: NodeLayout) -> frozenset[int]:
        if selector is None:
            return frozenset(g.index for g in layout.gpus)
        self.selectors.check(selector)
        return frozenset(g.index for g in layout.gpus if self.selectors.matches(selector, g.attributes))

    def memo_size(self) -> int:
        return self._size
