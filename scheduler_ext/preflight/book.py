"""Gang preflights: which member nodes must prove their GPUs before a multi-node gang starts, and
what each said. No API calls: ``PreflightPort`` (``scheduler_ext.preflight.kube`` in a cluster)
creates and deletes the requests, and feeds the answers back through ``result``.

A gang (or a Kueue Workload) asks ``check(key, nodes)`` with the GPUs it will use on each member
node; the book answers the gang's verdict:

- ``passed`` when the gang is on one node (nothing between nodes to prove), or when every node
  either serves no preflight (``serves(node)`` is False: an agent too old to, or a node without
  gpuweave's agent) or has passed one for those GPUs within ``fresh_s`` (a gang re-planned, or
  the pods of a Kueue Workload its admission check just proved, ask nothing again);
- ``pending`` while a request is out: one per node and gang, asked once;
- ``failed`` naming each node whose preflight failed, was refused, did not finish (a GPU could
  not be checked), or did not answer within ``timeout_s``. Those nodes are avoided by this gang
  for ``avoid_s`` (``avoided``), so its next plan goes elsewhere; the node's own agent marks the
  GPUs that failed (health, ``active-check``), which keeps every other workload off them too.

Thread-safe; the clock is passed in (a fake one in tests).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from devicemodel.assignment import parent_gpu_of_share

FRESH_S = 600.0
TIMEOUT_S = 30.0  # below the gang TTL (60 s): a plan waits for its preflights inside its reservation
AVOID_S = 600.0
NAME_PREFIX = "gpuweave-preflight-"
MAX_REASON = 300


@dataclass(frozen=True)
class PreflightSettings:
    """``gpuweave extender --gang-preflight agent|off --gang-preflight-timeout S
    --gang-preflight-fresh S``."""

    check: Literal["agent", "off"] = "agent"  # agent: the member node's own agent runs it
    checks: Literal["bandwidth", "full"] = "bandwidth"  # what the agent runs: the copies, or every check
    timeout_s: float = TIMEOUT_S
    fresh_s: float = FRESH_S
    avoid_s: float = AVOID_S


class Phase(StrEnum):
    PENDING = "Pending"  # asked, no answer yet
    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"  # a GPU failed its checks: the node's agent withholds it
    INCOMPLETE = "Incomplete"  # a GPU could not be checked (a pod holds it, the run ended early)
    REFUSED = "Refused"  # the agent would not run it (no such GPU, a bad request)
    TIMEOUT = "Timeout"  # no answer within timeout_s (set here, never by an agent)


FINAL = frozenset({Phase.PASSED, Phase.FAILED, Phase.INCOMPLETE, Phase.REFUSED, Phase.TIMEOUT})


@dataclass(frozen=True)
class PreflightRequest:
    """One node's preflight for one gang: the object ``PreflightPort.create`` writes."""

    name: str
    node: str
    gpus: tuple[str, ...]  # GPU UUIDs; empty: every GPU of the node nothing holds
    requester: str  # the gang's key or the Workload's, for whoever reads the object


@dataclass(frozen=True)
class GangPreflight:
    state: Literal["passed", "pending", "failed"]
    pending: tuple[str, ...] = ()  # nodes still running
    failed: Mapping[str, str] = field(default_factory=dict)  # node -> why

    def reason(self, key: str) -> str:
        if self.state == "pending":
            return f"gang {key}: waiting for the preflight of its GPUs on node(s) {', '.join(self.pending)}"
        if self.state == "failed":
            node, why = sorted(self.failed.items())[0]
            more = f" and {len(self.failed) - 1} more node(s)" if len(self.failed) > 1 else ""
            return f"gang {key}: preflight failed on node {node}{more} ({why}); placing it elsewhere"
        return f"gang {key}: preflight passed"


def gpus_of_devices(devices: Collection[str]) -> set[str]:
    """The GPU UUIDs behind device IDs: a GPU's own, a share's GPU; MIG devices and NICs name none."""
    gpus = {parent_gpu_of_share(d) or d for d in devices}
    return {g for g in gpus if g.startswith("GPU-")}


class PreflightPort(Protocol):
    def create(self, request: PreflightRequest) -> None: ...  # returns at once; the write is queued

    def delete(self, name: str) -> None: ...


@dataclass
class _Ask:
    request: PreflightRequest
    asked_at: float
    phase: Phase = Phase.PENDING
    reason: str = ""


class PreflightBook:
    def __init__(
        self,
        port: PreflightPort,
        *,
        serves: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        fresh_s: float = FRESH_S,
        timeout_s: float = TIMEOUT_S,
        avoid_s: float = AVOID_S,
    ) -> None:
        self.port, self.serves, self.clock = port, serves, clock
        self.fresh_s, self.timeout_s, self.avoid_s = fresh_s, timeout_s, avoid_s
        self._lock = threading.Lock()
        self._asks: dict[str, dict[str, _Ask]] = {}  # gang key -> node -> its request
        self._by_name: dict[str, tuple[str, str]] = {}  # object name -> (gang key, node)
        self._passed: dict[str, dict[str, float]] = {}  # node -> GPU -> when it passed
        self._avoid: dict[str, dict[str, float]] = {}  # gang key -> node -> until
        self._serial = itertools.count()
        self.outcomes: dict[str, int] = {}  # passed, failed, timeout, ... (for metrics)

    def check(self, key: str, nodes: Mapping[str, Collection[str]]) -> GangPreflight:
        """The gang's verdict on ``nodes`` (node -> the GPU UUIDs it will use there); asks for the
        preflights still needed (module docstring)."""
        if len(nodes) < 2:
            return GangPreflight("passed")
        now = self.clock()
        created: list[PreflightRequest] = []
        replaced: list[str] = []
        with self._lock:
            asks = self._asks.setdefault(key, {})
            for node, gpus in sorted(nodes.items()):
                if not self.serves(node) or self._fresh(node, gpus, now):
                    continue
                ask = asks.get(node)
                if ask is None or not set(gpus) <= set(ask.request.gpus):
                    if ask is not None:
                        replaced.append(ask.request.name)
                        self._by_name.pop(ask.request.name, None)
                    ask = asks[node] = self._new_ask(key, node, gpus, now)
                    created.append(ask.request)
                elif ask.phase not in FINAL and now - ask.asked_at > self.timeout_s:
                    self._finish(ask, Phase.TIMEOUT, f"no answer within {self.timeout_s:g} s")
            verdict = self._verdict(key, {n: a for n, a in asks.items() if n in nodes}, now)
        for name in replaced:
            self.port.delete(name)
        for request in created:
            self.port.create(request)
        return verdict

    def _fresh(self, node: str, gpus: Collection[str], now: float) -> bool:
        passed = self._passed.get(node, {})
        return bool(gpus) and all(now - passed.get(g, float("-inf")) <= self.fresh_s for g in gpus)

    def _new_ask(self, key: str, node: str, gpus: Collection[str], now: float) -> _Ask:
        digest = hashlib.sha256(f"{key}\0{node}\0{now}\0{next(self._serial)}".encode()).hexdigest()[:20]
        request = PreflightRequest(NAME_PREFIX + digest, node, tuple(sorted(gpus)), key)
        self._by_name[request.name] = (key, node)
        return _Ask(request, now)

    def _verdict(self, key: str, asks: Mapping[str, _Ask], now: float) -> GangPreflight:
        failed = {n: a.reason or a.phase.value for n, a in asks.items() if a.phase in FINAL - {Phase.PASSED}}
        if failed:
            avoid = self._avoid.setdefault(key, {})
            avoid.update(dict.fromkeys(failed, now + self.avoid_s))
            return GangPreflight("failed", failed=failed)
        pending = tuple(sorted(n for n, a in asks.items() if a.phase not in FINAL))
        return GangPreflight("pending", pending=pending) if pending else GangPreflight("passed")

    def result(self, name: str, phase: Phase, reason: str, *, passed_gpus: Collection[str] = ()) -> None:
        """An agent's answer to request ``name``; ``passed_gpus``: the GPUs it found good."""
        with self._lock:
            where = self._by_name.get(name)
            ask = self._asks.get(where[0], {}).get(where[1]) if where is not None else None
            if ask is None or ask.phase in FINAL:
                return
            if phase in FINAL:
                self._finish(ask, phase, reason)
                stamp = self.clock()
                for gpu in passed_gpus:
                    self._passed.setdefault(ask.request.node, {})[gpu] = stamp
            else:
                ask.phase = phase

    def _finish(self, ask: _Ask, phase: Phase, reason: str) -> None:
        ask.phase, ask.reason = phase, reason[:MAX_REASON]
        self.outcomes[phase.value] = self.outcomes.get(phase.value, 0) + 1

    def avoided(self, key: str) -> frozenset[str]:
        """Nodes this gang's preflights failed on, while it avoids them."""
        now = self.clock()
        with self._lock:
            avoid = self._avoid.get(key, {})
            for node in [n for n, until in avoid.items() if until <= now]:
                del avoid[node]
            if not avoid:
                self._avoid.pop(key, None)
            return frozenset(avoid)

    def forget(self, key: str) -> None:
        """The gang started, or its plan went: its requests are deleted (the nodes it avoids stay
        avoided until their time is up)."""
        with self._lock:
            asks = self._asks.pop(key, {})
            for ask in asks.values():
                self._by_name.pop(ask.request.name, None)
        for ask in asks.values():
            self.port.delete(ask.request.name)

    def gangs(self) -> int:
        with self._lock:
            return len(self._asks)
