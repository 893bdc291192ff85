"""Judging an active check: an exerciser's measurements against what the GPU model promises (pure).

Every finding has the signal ``active-check`` and a reason that starts with it, so the device's
state, its Events, ``health.status`` and ``gpuweave status`` all say a failed active check is why
the GPU is withheld. Grading, from the worst:

- memory that reads back other than written, with ECC not reporting it: hard memory failure,
  Failed straight to replacement (the bad-hardware list); DCGM's memory tests likewise;
- a wrong answer from the compute kernel, a check still running at the deadline (hung), double-bit
  ECC errors or an Xid while exercising an otherwise idle GPU: Failed (reset, then replace);
- copies below ``min_pcie_fraction`` of the PCIe link's rate (x8 on an x16 link), the compute
  kernel slower than ``compute_slack`` times the model's time, corrected ECC errors at
  ``sbe_limit`` or more, rows remapped or pages retired during the run, a check the driver
  refused: Suspect.

An NVLink pair's copies below ``min_nvlink_fraction`` of its lanes' rate fail neither GPU: the
link is slow, the GPUs are fine for any work that does not span it. ``judge_links`` says so per
measured pair (``LinkVerdict``), and the agent publishes the slow ones as degraded links
(``health.links``) for the scheduler to avoid; a peer copy that hung or could not run is still a
finding on both ends.

A GPU passes only when every check planned for it measured and none found anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from hardware.exerciser.model import Expectations
from hardware.exerciser.protocol import CheckKind, CheckResult, ExerciseReport, PeerPair, ResultStatus
from health.checks import Finding
from health.xid import Action, Cause, Severity

SIGNAL = "active-check"
REPLACE = (Action.REPLACE,)
RESET_THEN_REPLACE = (Action.RESET_GPU, Action.REPLACE)
HUNG_LADDER = (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE)
GIB = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    min_pcie_fraction: float = 0.55
    min_nvlink_fraction: float = 0.55
    compute_slack: float = 2.5
    sbe_limit: int = 10


@dataclass(frozen=True)
class CounterDelta:
    """What a GPU's counters did during the run (None: not readable before or after)."""

    dbe: int | None = None
    sbe: int | None = None
    remapped_rows: int | None = None
    pages_retired: bool = False  # a page retirement became pending (before Ampere)
    xids: int = 0


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"  # nothing found, but not every check ran (the run ended first)


def finding(
    severity: Severity,
    text: str,
    *,
    ladder: tuple[Action, ...] = RESET_THEN_REPLACE,
    cause: Cause = Cause.HARDWARE,
) -> Finding:
    return Finding(SIGNAL, severity, f"{SIGNAL}: {text}", cause, ladder)


def judge(
    report: ExerciseReport, expected: Expectations, *, thresholds: Thresholds
) -> dict[str, list[Finding]]:
    """GPU UUID -> findings for every GPU of the plan (an empty list: nothing found)."""
    found: dict[str, list[Finding]] = {g.uuid: [] for g in report.plan.gpus}
    pairs = {(p.src, p.dst): p for p in report.plan.pairs}
    for result in report.results:
        for uuid, item in _judge_one(result, expected, thresholds, pairs, report):
            found.setdefault(uuid, []).append(item)
    return found


def judge_deltas(deltas: Mapping[str, CounterDelta], *, thresholds: Thresholds) -> dict[str, list[Finding]]:
    """GPU UUID -> findings from what its counters did during the run."""
    return {uuid: _judge_delta(delta, thresholds) for uuid, delta in deltas.items()}


def verdicts(report: ExerciseReport, found: Mapping[str, list[Finding]]) -> dict[str, Verdict]:
    """Per GPU: failed (a finding), passed (every check of its own measured or skipped), incomplete."""
    out = {}
    for gpu in report.plan.gpus:
        own = report.for_gpu(gpu.uuid)
        if found.get(gpu.uuid):
            out[gpu.uuid] = Verdict.FAILED
        elif own and all(r.status in (ResultStatus.DONE, ResultStatus.SKIPPED) for r in own):
            out[gpu.uuid] = Verdict.PASSED
        else:
            out[gpu.uuid] = Verdict.INCOMPLETE
    return out


def merged_verdicts(
    reports: Iterable[ExerciseReport], found: Mapping[str, list[Finding]]
) -> dict[str, Verdict]:
    """Per GPU over every batch of a run: failed beats incomplete beats passed."""
    rank = {Verdict.PASSED: 0, Verdict.INCOMPLETE: 1, Verdict.FAILED: 2}
    merged: dict[str, Verdict] = {}
    for report in reports:
        for uuid, verdict in verdicts(report, found).items():
            if uuid not in merged or rank[verdict] > rank[merged[uuid]]:
                merged[uuid] = verdict
    return merged


def _judge_one(
    result: CheckResult,
    expected: Expectations,
    thresholds: Thresholds,
    pairs: Mapping[tuple[str, str], PeerPair],
    report: ExerciseReport,
) -> Iterable[tuple[str, Finding]]:
    ends = [result.gpu] + ([result.peer] if result.peer else [])
    what = _name(result)
    if result.status is ResultStatus.TIMEOUT:
        hung = finding(Severity.FATAL, f"{what} hung: {result.detail}", ladder=HUNG_LADDER)
        return [(uuid, hung) for uuid in ends]
    if result.status is ResultStatus.ERROR:
        refused = finding(Severity.SUSPECT, f"{what} could not run: {result.detail}", cause=Cause.PLATFORM)
        return [(uuid, refused) for uuid in ends]
    if result.status is not ResultStatus.DONE:
        return []
    if result.check is CheckKind.PEER:  # a slow pair is a degraded link (``judge_links``), no finding
        return []
    checks = {
        CheckKind.MEMORY: lambda: _memory(result),
        CheckKind.COMPUTE: lambda: _compute(result, expected, thresholds, report),
        CheckKind.HOST_TO_DEVICE: lambda: _pcie(result, expected, thresholds),
        CheckKind.DEVICE_TO_HOST: lambda: _pcie(result, expected, thresholds),
        CheckKind.DCGM: lambda: _dcgm(result),
    }
    item = checks[result.check]()
    return [(result.gpu, item)] if item else []


def _name(result: CheckResult) -> str:
    names = {
        CheckKind.MEMORY: "memory pattern",
        CheckKind.COMPUTE: "compute kernel",
        CheckKind.HOST_TO_DEVICE: "host-to-device copies",
        CheckKind.DEVICE_TO_HOST: "device-to-host copies",
        CheckKind.PEER: f"NVLink copies to {result.peer}",
        CheckKind.DCGM: f"DCGM {result.test or 'diagnostic'}",
    }
    return names[result.check]


def _memory(result: CheckResult) -> Finding | None:
    if not result.mismatches:
        return None
    first = f", first at byte {result.first_bad_byte:#x}" if result.first_bad_byte is not None else ""
    text = (
        f"memory pattern read back {result.mismatches} wrong word(s) in {result.bytes / GIB:.2f} GiB{first} "
        "with no ECC error reported: hard memory failure"
    )
    return finding(Severity.FATAL, text, ladder=REPLACE)


def _compute(
    result: CheckResult, expected: Expectations, thresholds: Thresholds, report: ExerciseReport
) -> Finding | None:
    if result.answer_ok is False:
        return finding(Severity.FATAL, f"compute kernel returned a wrong answer ({result.detail})")
    plan = report.plan
    model_s = expected.compute_seconds(
        result.gpu, threads=plan.threads_for(result.gpu), iterations=plan.compute_iterations
    )
    if model_s > 0 and result.seconds > model_s * thresholds.compute_slack:
        text = (
            f"compute kernel took {result.seconds:.3f} s, {result.seconds / model_s:.1f} times the "
            f"{expected.model(result.gpu).name}'s {model_s:.3f} s (limit {thresholds.compute_slack:g}x)"
        )
        return finding(Severity.SUSPECT, text)
    return None


def _pcie(result: CheckResult, expected: Expectations, thresholds: Thresholds) -> Finding | None:
    rate, link = expected.pcie.get(result.gpu), expected.pcie_link.get(result.gpu)
    if rate is None or link is None or result.gbps is None:
        return None
    if result.gbps >= rate * thresholds.min_pcie_fraction:
        return None
    text = (
        f"{_name(result)} at {result.gbps:.1f} GB/s, below {thresholds.min_pcie_fraction:.0%} of the "
        f"PCIe gen{link[0]} x{link[1]} link's {rate:.1f} GB/s (a link trained narrower or slower)"
    )
    return finding(Severity.SUSPECT, text)


@dataclass(frozen=True)
class LinkVerdict:
    """One measured NVLink pair (GPU UUIDs): its copy rate against its lanes' rate."""

    src: str
    dst: str
    gbps: float
    expected_gbps: float
    slow: bool  # below ``min_nvlink_fraction`` of the expected rate
    text: str

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.src, self.dst))

    @property
    def fraction(self) -> float:
        """The share of the expected rate measured, 0..1."""
        return min(1.0, max(0.0, self.gbps / self.expected_gbps)) if self.expected_gbps > 0 else 1.0


def judge_links(
    reports: Iterable[ExerciseReport], expected: Expectations, *, thresholds: Thresholds
) -> dict[frozenset[str], LinkVerdict]:
    """Per NVLink pair measured in these reports (UUID pair): slow or not; a pair measured twice
    (both directions, several batches) is as slow as its slowest copy."""
    out: dict[frozenset[str], LinkVerdict] = {}
    for report in reports:
        pairs = {(p.src, p.dst): p for p in report.plan.pairs}
        for result in report.results:
            if result.check is not CheckKind.PEER or result.status is not ResultStatus.DONE:
                continue
            verdict = _peer(result, expected, thresholds, pairs.get((result.gpu, result.peer or "")))
            if verdict is not None and (verdict.pair not in out or verdict.gbps < out[verdict.pair].gbps):
                out[verdict.pair] = verdict
    return out


def _peer(
    result: CheckResult, expected: Expectations, thresholds: Thresholds, pair: PeerPair | None
) -> LinkVerdict | None:
    if pair is None or result.gbps is None:
        return None
    rate = expected.peer_gbps(pair)
    if rate <= 0:
        return None
    slow = result.gbps < rate * thresholds.min_nvlink_fraction
    text = (
        f"{SIGNAL}: NVLink copies {pair.src} -> {pair.dst} at {result.gbps:.1f} GB/s, below "
        f"{thresholds.min_nvlink_fraction:.0%} of its {pair.lanes} lanes' {rate:.1f} GB/s"
        if slow
        else f"{SIGNAL}: NVLink copies {pair.src} -> {pair.dst} at {result.gbps:.1f} GB/s of {rate:.1f} GB/s"
    )
    return LinkVerdict(pair.src, pair.dst, result.gbps, rate, slow, text)


def _dcgm(result: CheckResult) -> Finding | None:
    if result.verdict != "fail":
        return None
    test = result.test.lower()
    if test.startswith(("deployment", "software")):
        return finding(Severity.SUSPECT, f"DCGM {result.detail}", cause=Cause.PLATFORM)
    if "memory" in test or "memtest" in test:
        return finding(Severity.FATAL, f"DCGM {result.detail}: hard memory failure", ladder=REPLACE)
    return finding(Severity.FATAL, f"DCGM {result.detail}")


def _judge_delta(delta: CounterDelta, thresholds: Thresholds) -> list[Finding]:
    items = []
    if delta.dbe:
        items.append(finding(Severity.FATAL, f"{delta.dbe} double-bit ECC error(s) during the check"))
    if delta.xids:
        items.append(finding(Severity.FATAL, f"{delta.xids} Xid(s) while exercising the idle GPU"))
    if delta.sbe is not None and delta.sbe >= thresholds.sbe_limit:
        items.append(finding(Severity.SUSPECT, f"{delta.sbe} corrected ECC errors during the check"))
    if delta.remapped_rows:
        items.append(finding(Severity.SUSPECT, f"{delta.remapped_rows} row(s) remapped during the check"))
    if delta.pages_retired:
        items.append(finding(Severity.SUSPECT, "a page retirement became pending during the check"))
    return items
