"""Wait for the tightest network tier, or take a looser one now: whichever costs the job less. Pure.

A gang whose tightest tier has no domain free now would, left alone, take the closest looser
domain that holds it (``gangs.plan``). On a looser tier every step of the gang's all-reduce
crosses more switch hops, so the job runs longer; if the tight domain frees within minutes and the
job runs for hours, waiting is cheaper. The cost of each choice is the time until the job ends:

- wait: ``expected_wait + duration`` (the run at the tight tier's speed, 1.0);
- looser tier now: ``duration x stretch`` (``stretch``: the looser tier's run-time factor).

The gang waits when ``expected_wait < (stretch - 1) x duration`` and the wait stays inside
``max_wait_s`` counted from its first wait (``waited_s + expected_wait <= max_wait_s``): a gang
never waits past the maximum, and one that has waited that long takes the looser tier, so nothing
starves on an estimate that keeps slipping.

The inputs, each estimated simply (docs/extender.md, "Waiting for the tightest tier"):

- ``duration``: the pending member's ``gpuweave.io/expected-duration``, else its
  ``activeDeadlineSeconds`` where that is shorter than the default (it runs no longer), else
  ``--gang-expected-duration`` (``job_duration``);
- ``expected_wait``: the time until the tight domain's nodes, as the pods holding their GPUs end,
  hold the gang: each holder ends at its start plus its own expected duration (the same rules;
  no start known: it started now), each node then holds ``free GPUs // GPUs per member``
  members (``expected_wait``);
- ``stretch``: ``stretch_per_step ** steps``, one step per network tier between the two that the
  offered nodes carry, the whole offered set counting as the last (``--gang-tier-stretch``,
  default 1.15 a step: ``tier_stretch``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from devicemodel.errors import InvalidInputError
from devicemodel.gangs import MAX_EXPECTED_DURATION_S, MIN_EXPECTED_DURATION_S

DEFAULT_JOB_DURATION_S = 3600.0  # --gang-expected-duration
DEFAULT_STRETCH_PER_STEP = 1.15  # --gang-tier-stretch: run time x this per looser tier step
DEFAULT_MAX_WAIT_S = 1800.0  # --gang-max-tier-wait; 0 never waits (the looser tier at once)
MAX_STRETCH_PER_STEP = 10.0
MAX_WAIT_LIMIT_S = 86400.0


@dataclass(frozen=True)
class TierCostSettings:
    """``--gang-expected-duration``, ``--gang-tier-stretch``, ``--gang-max-tier-wait``."""

    default_duration_s: float = DEFAULT_JOB_DURATION_S
    stretch_per_step: float = DEFAULT_STRETCH_PER_STEP
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    def __post_init__(self) -> None:
        if not MIN_EXPECTED_DURATION_S <= self.default_duration_s <= MAX_EXPECTED_DURATION_S:
            raise InvalidInputError(
                f"--gang-expected-duration {self.default_duration_s:g} s is outside "
                f"{MIN_EXPECTED_DURATION_S:g}..{MAX_EXPECTED_DURATION_S:g} s"
            )
        if not 1.0 <= self.stretch_per_step <= MAX_STRETCH_PER_STEP:  # NaN fails both
            raise InvalidInputError(
                f"--gang-tier-stretch {self.stretch_per_step:g} is outside 1..{MAX_STRETCH_PER_STEP:g}"
            )
        if not 0.0 <= self.max_wait_s <= MAX_WAIT_LIMIT_S:
            raise InvalidInputError(
                f"--gang-max-tier-wait {self.max_wait_s:g} s is outside 0..{MAX_WAIT_LIMIT_S:g} s"
            )


@dataclass(frozen=True)
class Duration:
    """A job's expected run time and where it came from; ``note``: why the annotation was not used."""

    seconds: float
    source: str  # annotation | activeDeadlineSeconds | default
    note: str = ""


def job_duration(
    *, declared: float | None, deadline: float | None, default_s: float, bad: str = ""
) -> Duration:
    """The run time a job is expected to take (module doc): ``declared`` (its annotation, parsed),
    else its deadline when shorter than ``default_s``, else ``default_s``. ``bad``: why a declared
    value could not be read (kept as the note; the default applies)."""
    if declared is not None:
        return Duration(declared, "annotation")
    if deadline is not None and deadline < default_s:
        return Duration(deadline, "activeDeadlineSeconds", bad)
    return Duration(default_s, "default", bad)


@dataclass(frozen=True)
class NodeRelease:
    """One node of the tight domain: its GPUs free now and, per pod holding some, (GPUs, seconds
    until that pod is expected to end)."""

    free_gpus: int
    holders: tuple[tuple[int, float], ...] = ()


def expected_wait(nodes: Sequence[NodeRelease], *, needed: int, gpus_per_member: int) -> float:
    """Seconds until ``nodes`` hold ``needed`` members of ``gpus_per_member`` GPUs each, as their
    holders end (module doc); 0 when they hold them now, ``math.inf`` when never."""
    per_member = max(1, gpus_per_member)
    free = [n.free_gpus for n in nodes]
    ends = sorted((max(0.0, left), i, gpus) for i, n in enumerate(nodes) for gpus, left in n.holders)
    if sum(f // per_member for f in free) >= needed:
        return 0.0
    for left, index, gpus in ends:
        free[index] += gpus
        if sum(f // per_member for f in free) >= needed:
            return left
    return math.inf


def tier_stretch(tight: int, loose: int, *, carried: Sequence[int], stretch_per_step: float) -> float:
    """The looser tier's run-time factor against the tight one: one step per tier in
    ``(tight, loose]`` that the offered nodes carry (``carried``: tier indexes), the whole offered
    set (``loose`` past every label) counting as one."""
    steps = sum(1 for t in set(carried) if tight < t <= loose)
    if loose not in carried:
        steps += 1
    return float(stretch_per_step ** max(1, steps))


@dataclass(frozen=True)
class TierChoice:
    """What the gang does, with the numbers that decided it (filter reasons, Events, metrics)."""

    wait: bool
    duration: Duration
    expected_wait_s: float
    stretch: float
    waited_s: float
    max_wait_s: float
    tight: str  # where it would wait: "LABEL=VALUE"
    loose: str  # where it would go now

    @property
    def wait_cost_s(self) -> float:
        return self.expected_wait_s + self.duration.seconds

    @property
    def looser_cost_s(self) -> float:
        return self.duration.seconds * self.stretch

    def describe(self) -> str:
        """The decision and its numbers, one line (its callers clip and escape it as a whole)."""
        verdict = f"waits for {self.tight}" if self.wait else f"takes the looser {self.loose} now"
        why = (
            "waiting costs less"
            if self.wait
            else (
                f"waiting would pass the {_span(self.max_wait_s)} maximum"
                if self.waited_s + self.expected_wait_s > self.max_wait_s
                else "the looser tier costs less"
            )
        )
        note = f"; {self.duration.note}" if self.duration.note else ""
        return (
            f"{verdict} ({why}): expected run {_span(self.duration.seconds)} ({self.duration.source}{note}), "
            f"expected wait {_span(self.expected_wait_s)} (waited {_span(self.waited_s)}), looser tier "
            f"x{self.stretch:.3f}: wait + run {_span(self.wait_cost_s)} vs looser run "
            f"{_span(self.looser_cost_s)}"
        )


def choose_tier(
    *,
    duration: Duration,
    expected_wait_s: float,
    stretch: float,
    waited_s: float,
    max_wait_s: float,
    tight: str,
    loose: str,
) -> TierChoice:
    """Wait when ``expected_wait < (stretch - 1) x duration`` and the wait stays within
    ``max_wait_s`` of the gang's first wait (module doc); else the looser tier now."""
    cheaper = expected_wait_s < (stretch - 1.0) * duration.seconds
    bounded = waited_s + expected_wait_s <= max_wait_s
    return TierChoice(
        wait=cheaper and bounded,
        duration=duration,
        expected_wait_s=expected_wait_s,
        stretch=stretch,
        waited_s=max(0.0, waited_s),
        max_wait_s=max_wait_s,
        tight=tight,
        loose=loose,
    )


def _span(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds >= 5400:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 90:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"
