"""The inputs of a gang's tier decision, read from the cache, and how long each gang has waited.

``gangs.tier_cost`` decides; this gathers what it decides on when a gang's plan lands on a looser
tier than the tightest one a domain of which could hold it once its holders end: the pending
member's expected duration (its pod object), the tight domains' GPUs free now and the pods holding
the rest with their expected ends (the cache's holdings: ``PodRecord.started_s``, ``expected_s``,
``deadline_s``), the tiers the offered nodes carry (the stretch's steps). It also remembers when
each gang first waited, so ``--gang-max-tier-wait`` bounds the wait. No I/O: the cache is memory.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from devicemodel.gangs import (
    ANNOTATION_EXPECTED_DURATION,
    BadGangError,
    Gang,
    active_deadline_s,
    parse_expected_duration,
)
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.decide.state import NodeState
from scheduler_ext.gangs.book import Clock
from scheduler_ext.gangs.limits import gpus_of
from scheduler_ext.gangs.plan import GangPlan
from scheduler_ext.gangs.tier_cost import (
    Duration,
    NodeRelease,
    TierChoice,
    TierCostSettings,
    choose_tier,
    expected_wait,
    job_duration,
    tier_stretch,
)
from topology.network import group_by_domain, tier_name

MAX_WAITING_GANGS = 4096  # first-wait times remembered; the oldest goes first
_NO_LABELS: Mapping[str, str] = {}


@dataclass(frozen=True)
class TightDomain:
    """The domain a gang would wait for: its tier, ``LABEL=VALUE``, its nodes with GPUs free now
    (kept for the gang while it waits, as for a gang that fits nowhere), the expected wait."""

    tier: int
    where: str
    nodes: tuple[str, ...]
    wait_s: float


@dataclass
class TierWaits:
    """Per extender: the settings, the clocks, the first-wait times and the decisions' counts."""

    cache: ClusterCache
    settings: TierCostSettings = field(default_factory=TierCostSettings)
    tier_labels: Sequence[str] = ()
    clock: Clock = time.monotonic  # how long a gang has waited (the book's clock)
    wall_clock: Clock = time.time  # pods' start times are Unix seconds
    counts: dict[str, int] = field(default_factory=lambda: {"waited": 0, "looser": 0})
    _since: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def choose(
        self, gang: Gang, pod: Mapping[str, object] | None, plan: GangPlan, *, candidates: Sequence[str]
    ) -> tuple[TierChoice, TightDomain] | None:
        """The decision for ``plan`` of ``gang``, None when there is none to make (the plan is at
        the tightest tier a domain of which could ever hold the gang)."""
        if plan.tier == 0 or not plan.slots:
            return None
        states, labels = self.cache.states(), self.cache.node_labels()
        first = plan.slots[0]
        per_member = gpus_of(first.devices, states.get(first.node))
        tight = self._tight_domain(plan, candidates, states, labels, per_member=per_member)
        if tight is None:
            return None
        carried = {
            t for n in candidates for t, label in enumerate(self.tier_labels) if label in labels.get(n, {})
        }
        choice = choose_tier(
            duration=self.duration_of(pod),
            expected_wait_s=tight.wait_s,
            stretch=tier_stretch(
                tight.tier,
                plan.tier,
                carried=sorted(carried),
                stretch_per_step=self.settings.stretch_per_step,
            ),
            waited_s=self._waited(gang.key),
            max_wait_s=self.settings.max_wait_s,
            tight=tight.where,
            loose=self._where(plan.tier, plan.domain),
        )
        self._count(gang.key, choice)
        return choice, tight

    def forget(self, key: str) -> None:
        """The gang is planned or gone: its next wait counts from zero."""
        with self._lock:
            self._since.pop(key, None)

    def duration_of(self, pod: Mapping[str, object] | None) -> Duration:
        """The pending member's expected run time (``tier_cost.job_duration``)."""
        default_s = self.settings.default_duration_s
        metadata = pod.get("metadata") if pod is not None else None
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        raw = annotations.get(ANNOTATION_EXPECTED_DURATION) if isinstance(annotations, Mapping) else None
        deadline = active_deadline_s(pod) if pod is not None else None
        if raw is None:
            return job_duration(declared=None, deadline=deadline, default_s=default_s)
        try:
            declared = parse_expected_duration(raw)
        except BadGangError as exc:
            return job_duration(declared=None, deadline=deadline, default_s=default_s, bad=str(exc))
        return job_duration(declared=declared, deadline=deadline, default_s=default_s)

    def _tight_domain(
        self,
        plan: GangPlan,
        candidates: Sequence[str],
        states: Mapping[str, NodeState],
        labels: Mapping[str, Mapping[str, str]],
        *,
        per_member: int,
    ) -> TightDomain | None:
        """At the tightest tier with a domain that holds the gang once its holders end, the domain
        that does so soonest; None when no tier tighter than the plan's has one. A domain whose
        free GPUs hold the gang now, yet the plan did not place it there, is left out: what keeps
        the gang out (a failed preflight, unhealthy GPUs, CPU or memory) is not a holder that ends."""
        needed = len(plan.slots)
        with_inventory = [
            n for n in dict.fromkeys(candidates) if (s := states.get(n)) is not None and s.layout
        ]
        now = self.wall_clock()
        for tier in range(min(plan.tier, len(self.tier_labels))):
            nodes = ((n, labels.get(n, _NO_LABELS)) for n in with_inventory)
            best: TightDomain | None = None
            for domain, names in sorted(group_by_domain(nodes, tier, tier_labels=self.tier_labels).items()):
                release = [self._release(states[n], now) for n in names]
                wait_s = expected_wait(release, needed=needed, gpus_per_member=per_member)
                if 0 < wait_s < math.inf and (best is None or wait_s < best.wait_s):
                    room = tuple(sorted(n for n, r in zip(names, release, strict=True) if r.free_gpus))
                    best = TightDomain(tier, self._where(tier, domain), room, wait_s)
            if best is not None:
                return best
        return None

    def _release(self, state: NodeState, now: float) -> NodeRelease:
        """The node's GPUs free now and when each pod holding some is expected to end."""
        by_holder: dict[str, list[str]] = {}
        for device, holder in state.holders.items():
            by_holder.setdefault(holder, []).append(device)
        held = gpus_of(state.holders.keys(), state)
        total = len(state.layout.gpus) if state.layout is not None else 0
        ends = tuple(
            (gpus_of(devices, state), self._left_s(holder, now)) for holder, devices in by_holder.items()
        )
        return NodeRelease(free_gpus=max(0, total - held), holders=tuple(e for e in ends if e[0]))

    def _left_s(self, holder: str, now: float) -> float:
        """Seconds until the holder is expected to end: its start (now when unknown) plus its own
        expected duration by the pending pod's rules."""
        holding = self.cache.holding(holder)
        record: PodRecord | None = holding.record if holding is not None else None
        default_s = self.settings.default_duration_s
        if record is None:
            return default_s
        duration = job_duration(declared=record.expected_s, deadline=record.deadline_s, default_s=default_s)
        started = record.started_s if record.started_s is not None else now
        return max(0.0, started + duration.seconds - now)

    def _waited(self, key: str) -> float:
        with self._lock:
            since = self._since.get(key)
        return 0.0 if since is None else self.clock() - since

    def _count(self, key: str, choice: TierChoice) -> None:
        with self._lock:
            if choice.wait:
                if key not in self._since:  # one wait counted per gang, not per retry
                    self.counts["waited"] += 1
                    self._since[key] = self.clock()
                    while len(self._since) > MAX_WAITING_GANGS:
                        self._since.popitem(last=False)
            else:
                self.counts["looser"] += 1
                self._since.pop(key, None)

    def _where(self, tier: int, domain: str) -> str:
        if tier >= len(self.tier_labels):
            return "all offered nodes together"
        return f"{tier_name(tier, tier_labels=self.tier_labels)}={domain}"


def _has_layout(state: NodeState | None) -> bool:
    return state is not None and state.layout is not None
