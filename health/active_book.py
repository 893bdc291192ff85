"""The record of active-check runs: what ran, what each GPU got, as values and as JSON.

``RunBook`` keeps the last ``KEEP`` runs (the control socket's ``health.check`` answers from it,
``health.status`` shows the last one); a run is ``running`` until its outcome is written once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hardware.exerciser.protocol import CheckResult, ExerciseReport
from hardware.exerciser.wire import result_to_dict
from health.active import CounterDelta, Verdict
from health.checks import Finding
from health.xid import Action, Severity

KEEP = 16


@dataclass(frozen=True)
class GpuOutcome:
    index: int
    verdict: str  # passed, failed, incomplete, skipped
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunOutcome:
    run: int
    trigger: str  # burn-in, on-demand, recheck
    level: int
    backend: str
    state: str = "running"  # running, done, failed (the run itself broke: ``error``)
    started_at: float = 0.0
    seconds: float = 0.0
    gpus: Mapping[str, GpuOutcome] = field(default_factory=dict)
    findings: Mapping[str, list[Finding]] = field(default_factory=dict)
    results: tuple[CheckResult, ...] = ()
    deltas: Mapping[str, CounterDelta] = field(default_factory=dict)
    error: str = ""
    slow_links: tuple[str, ...] = ()  # NVLink pairs measured below threshold (degraded links, no GPU fails)
    new_links: tuple[str, ...] = ()  # those of them not degraded before this run (a gang's preflight fails)

    def summary(self) -> str:
        """One line: the run, each failed GPU with its first reason, the passed count."""
        failed = {u: g for u, g in self.gpus.items() if g.verdict == Verdict.FAILED.value}
        passed = sum(1 for g in self.gpus.values() if g.verdict == Verdict.PASSED.value)
        head = f"active check {self.run} ({self.trigger}, level {self.level}, {self.backend})"
        if self.error:
            return f"{head} broke: {self.error}"
        parts = [f"{passed} GPU(s) passed"] + [
            f"{u} failed: {g.reasons[0]}" for u, g in sorted(failed.items())
        ]
        other = len(self.gpus) - passed - len(failed)
        if other:
            parts.append(f"{other} skipped or incomplete")
        parts += [
            f"{'newly ' if text in self.new_links else ''}degraded link: {text}" for text in self.slow_links
        ]
        return f"{head} in {self.seconds:.1f} s: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "trigger": self.trigger,
            "level": self.level,
            "backend": self.backend,
            "state": self.state,
            "seconds": round(self.seconds, 3),
            "gpus": {
                u: {"index": g.index, "verdict": g.verdict, "reasons": list(g.reasons)}
                for u, g in sorted(self.gpus.items(), key=lambda item: item[1].index)
            },
            "results": [result_to_dict(r) for r in self.results],
            "error": self.error,
            "slowLinks": list(self.slow_links),
            "newLinks": list(self.new_links),
        }


class RunBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, RunOutcome] = {}

    def started(self, run: int, *, trigger: str, level: int, backend: str, at: float) -> RunOutcome:
        outcome = RunOutcome(run, trigger, level, backend, started_at=at)
        with self._lock:
            self._runs[run] = outcome
            for old in sorted(self._runs)[:-KEEP]:
                del self._runs[old]
        return outcome

    def finished(
        self,
        run: int,
        *,
        reports: Iterable[ExerciseReport],
        findings: Mapping[str, list[Finding]],
        verdicts: Mapping[str, Verdict],
        skipped: Mapping[str, str],
        deltas: Mapping[str, CounterDelta],
        seconds: float,
        indexes: Mapping[str, int],
        slow_links: tuple[str, ...] = (),
    ) -> RunOutcome:
        gpus = {uuid: GpuOutcome(indexes.get(uuid, -1), "skipped", (why,)) for uuid, why in skipped.items()}
        for uuid, verdict in verdicts.items():
            reasons = tuple(f.reason for f in ordered(findings.get(uuid, [])))
            gpus[uuid] = GpuOutcome(indexes.get(uuid, -1), verdict.value, reasons)
        results = tuple(r for report in reports for r in report.results)
        backend = next((r.backend for r in reports if r.backend), None)
        with self._lock:
            first = self._runs[run]
            outcome = replace(
                first,
                state="done",
                seconds=seconds,
                gpus=gpus,
                findings=dict(findings),
                results=results,
                deltas=dict(deltas),
                backend=backend or first.backend,
                slow_links=slow_links,
            )
            self._runs[run] = outcome
        return outcome

    def with_new_links(self, run: int, texts: tuple[str, ...]) -> RunOutcome:
        """The run's outcome with the slow links it newly found (``RunOutcome.new_links``)."""
        with self._lock:
            self._runs[run] = replace(self._runs[run], new_links=texts)
            return self._runs[run]

    def failed(self, run: int, error: str, *, at: float) -> None:
        with self._lock:
            first = self._runs[run]
            self._runs[run] = replace(first, state="failed", error=error[:400], seconds=at - first.started_at)

    def get(self, run: int) -> RunOutcome | None:
        with self._lock:
            return self._runs.get(run)

    def running(self) -> int | None:
        with self._lock:
            return next((r for r, o in self._runs.items() if o.state == "running"), None)

    def running_text(self) -> str:
        with self._lock:
            busy = next((o for o in self._runs.values() if o.state == "running"), None)
        return "none" if busy is None else f"run {busy.run}, {busy.trigger}, level {busy.level}"

    def last_json(self) -> dict[str, Any] | None:
        with self._lock:
            done = [o for o in self._runs.values() if o.state != "running"]
        if not done:
            return None
        last = max(done, key=lambda o: o.run)
        return {**{k: v for k, v in last.to_json().items() if k != "results"}, "summary": last.summary()}


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first: a fault to replace the GPU, then other fatal ones, then suspect ones; the engine
    keeps the first fatal fault's ladder, so the order decides what remediation does."""
    return sorted(findings, key=lambda f: (f.severity is not Severity.FATAL, f.ladder != (Action.REPLACE,)))
