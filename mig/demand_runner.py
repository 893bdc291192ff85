"""Demand mode's loop body: claim a pending pod, then reshape for it through the MIG service.

Transport-free: the claims go through a ``ClaimStore`` (the Kubernetes adapter writes pod
annotations with a resourceVersion precondition) and the pods come in as ``PendingPod`` values.
Only after winning a claim does the node plan, for every pod it holds a live claim on plus the
new one, so instances it created for an earlier pod are not counted twice. If the MIG-enabled
GPUs cannot serve the demand without touching busy instances, or the reshape fails, the claim is
released and the pod is left alone for one claim lifetime, so another node gets its chance.

The scheduler does not know which pod an instance was made for: another pod asking for the same
profile may take it first. So on every pass the pods the node still holds claims on must be
covered by idle instances; when they are not, the node reshapes again for them. A node with no
MIG-enabled GPU (yet: the layout that enables them may still be on its way) claims nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from devicemodel.errors import GpuweaveError
from mig.demand import DEFAULT_CLAIM_TTL_S, PendingPod, select_demand
from mig.reconciler import ReshapeResult
from mig.service import MigService

LOG = logging.getLogger(__name__)


class ClaimStore(Protocol):
    """Where claims are recorded (pod annotations, written with optimistic concurrency)."""

    def claim(self, pod: PendingPod, *, node: str, now: float) -> bool:
        """Record this node's claim; False when another writer changed the pod first (it won)."""
        ...

    def release(self, pod: PendingPod, *, node: str) -> None:
        """Remove this node's claim if it is still there."""
        ...


@dataclass(frozen=True)
class DemandOutcome:
    """What one pass did for one pod: ``served`` (claimed and reshaped, or nothing to change),
    ``lost`` (another node won the claim), ``released`` (this node cannot serve it), ``kept`` (a
    pod held already, reshaped for again: other pods took the instances made for it)."""

    pod: str
    outcome: str
    results: tuple[ReshapeResult, ...] = ()
    reason: str = ""


class DemandRunner:
    """One per node agent; ``run_once`` is called on every pod or node change and periodically."""

    def __init__(
        self,
        service: MigService,
        claims: ClaimStore,
        *,
        node: str,
        clock: Callable[[], float],
        ttl_s: float = DEFAULT_CLAIM_TTL_S,
    ) -> None:
        self._service = service
        self._claims = claims
        self._node = node
        self._clock = clock
        self._ttl_s = ttl_s
        self._gave_up: dict[str, float] = {}  # pod UID -> when this node released it

    def run_once(self, pods: Iterable[PendingPod], labels: Mapping[str, str]) -> list[DemandOutcome]:
        now = self._clock()
        self._gave_up = {uid: at for uid, at in self._gave_up.items() if now - at < self._ttl_s}
        view = select_demand(pods, node=self._node, labels=labels, now=now, ttl_s=self._ttl_s)
        if not (view.held or view.to_claim) or not self._service.demand_states():
            return []
        held = [dict(p.requests) for p in view.held]
        outcomes: list[DemandOutcome] = self._keep(view.held, held) if held else []
        for pod in view.to_claim:
            if pod.uid in self._gave_up:
                continue
            if not self._claims.claim(pod, node=self._node, now=now):
                outcomes.append(DemandOutcome(pod.key, "lost"))
                continue
            outcome = self._serve(pod, held)
            if outcome.outcome == "served":
                held.append(dict(pod.requests))
            outcomes.append(outcome)
        return outcomes

    def _keep(self, pods: tuple[PendingPod, ...], held: list[dict[str, int]]) -> list[DemandOutcome]:
        """Reshape again for held pods whose instances other pods took (nothing when idle
        instances still cover them); a node that cannot lets their claims expire."""
        keys = ", ".join(p.key for p in pods)
        try:
            results = self._service.apply_demand_if_covered(held)
        except GpuweaveError as exc:
            LOG.warning("MIG demand of pod(s) %s held on %s, not served again: %s", keys, self._node, exc)
            return []
        changed = tuple(r for r in results or () if r.changed)
        if results is None:
            LOG.info("MIG demand of pod(s) %s held on %s no longer fits; its claims expire", keys, self._node)
        elif changed:
            LOG.warning(
                "MIG demand of pod(s) %s served again on %s: other pods took their instances "
                "(%d GPU(s) reshaped)",
                keys,
                self._node,
                len(changed),
            )
        return [DemandOutcome(p.key, "kept", changed) for p in pods] if changed else []

    def _serve(self, pod: PendingPod, held: list[dict[str, int]]) -> DemandOutcome:
        try:
            results = self._service.apply_demand_if_covered([*held, dict(pod.requests)])
            reason = "" if results is not None else "the MIG-enabled GPUs cannot fit it beside busy instances"
        except GpuweaveError as exc:
            results, reason = None, str(exc)
        if results is not None:
            changed = tuple(r for r in results if r.changed)
            LOG.warning(
                "MIG demand of pod %s served on %s (%d GPU(s) reshaped)", pod.key, self._node, len(changed)
            )
            return DemandOutcome(pod.key, "served", changed)
        LOG.warning("MIG demand of pod %s not served on %s: %s; claim released", pod.key, self._node, reason)
        self._gave_up[pod.uid] = self._clock()
        try:
            self._claims.release(pod, node=self._node)
        except GpuweaveError as exc:
            LOG.warning("releasing the MIG demand claim on pod %s failed: %s", pod.key, exc)
        return DemandOutcome(pod.key, "released", reason=reason)
