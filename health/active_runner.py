"""Active checks on a node: which GPUs, one run at a time, results into the health engine.

``ActiveCheckRunner`` is what every trigger calls: the burn-in at start, ``gpuweave check`` through
the control socket, and the re-check of GPUs a failed check withholds (a round hook, every
``recheck_interval_s``); a scheduler of checks on idle GPUs between jobs calls ``start`` the same
way. Its rules hold for every caller:

- **never under a pod**: a GPU something holds (``busy``: a pod's allocation, a compute process)
  is skipped, and the GPUs being exercised are withheld (``hold``) for the run, so no pod lands on
  one mid-check; MIG-enabled, retired and remediating GPUs are skipped too;
- **at most ``max_gpus`` GPUs at once** (``hardware.exerciser.levels.plans`` cuts the batches);
- **every batch has a deadline**; the exerciser fails a hung check closed, and a backend that does
  not return at all is a hung check for every GPU of the batch;
- **one run at a time** per node; another request is refused while one runs.

Around the run each GPU's counters are read (double- and single-bit ECC, remapped rows) and the
Xids the engine saw are counted, so errors the exercise provoked are findings too. A failed GPU
gets its findings as faults (``health.active``) and is held for a re-check: no round is clean for
it until a check passes again, then it goes through probation back to Healthy.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.inventory import Gpu, NodeInventory
from hardware.exerciser.levels import level as level_spec
from hardware.exerciser.levels import plans
from hardware.exerciser.model import expectations
from hardware.exerciser.protocol import (
    CheckResult,
    ExercisePlan,
    Exerciser,
    ExerciseReport,
    ResultStatus,
    unfinished,
)
from hardware.health_probe import GpuReadings
from health.active import CounterDelta, Thresholds, Verdict, judge, judge_deltas, verdicts
from health.active_book import RunBook, RunOutcome, ordered
from health.checks import Finding
from health.config import ActiveSettings
from health.monitor import HealthMonitor, nvlinks_per_gpu
from health.policy import DeviceState, Fault
from health.runner import TimeoutRunner
from health.xid import Severity

log = logging.getLogger(__name__)
HOLD_REASON = "active check running"
BURN_IN = "burn-in"
BACKSTOP_GRACE_S = 5.0  # past a batch's deadline before the runner stops waiting for its backend
SKIPPED_STATES = (DeviceState.RETIRED, DeviceState.REMEDIATING)
_COUNTED = (Severity.APPLICATION, Severity.SUSPECT, Severity.FATAL)

Hold = Callable[[Mapping[str, str]], None]  # withhold exactly these GPUs (UUID -> reason); {} releases
Busy = Callable[[str], str | None]  # why a GPU cannot be exercised now (a pod holds it), None when idle
EventSink = Callable[[str, str, bool], None]  # reason, message, warning


class Readings(Protocol):
    def read_gpu(self, uuid: str, *, expected_nvlinks: int) -> GpuReadings: ...


class ActiveCheckBusyError(GpuweaveError):
    """A run is already going on this node."""


@dataclass
class ActiveParts:
    exerciser: Exerciser
    probe: Readings
    settings: ActiveSettings
    hold: Hold | None = None
    busy: Busy | None = None
    events: EventSink | None = None
    runs: RunBook = field(default_factory=RunBook)
    backstop_grace_s: float = BACKSTOP_GRACE_S


class ActiveCheckRunner:
    def __init__(self, monitor: HealthMonitor, parts: ActiveParts) -> None:
        self.monitor, self.parts, self.settings = monitor, parts, parts.settings
        self.runs = parts.runs
        self._lock = threading.Lock()  # held for the whole of a run
        self._ids = itertools.count(1)
        self._reads = TimeoutRunner()
        self._xids: dict[str, int] = {}
        self._last_recheck: dict[str, float] = {}
        monitor.engine.fault_observers.append(self._count_xid)

    # --- triggers -----------------------------------------------------------------------------

    def begin_burn_in(self) -> None:
        """Before the monitor starts: the startup gate waits for the burn-in."""
        if self.settings.burn_in_level > 0:
            with self.monitor.lock:
                self.monitor.engine.gate = self.monitor.engine.gate.burn_in_started()

    def start_burn_in(self) -> RunOutcome | None:
        """The burn-in in the background: every GPU at ``burn_in_level``; the gate opens at its end
        whatever happened (a failed GPU is withheld on its own)."""
        if self.settings.burn_in_level <= 0:
            return None
        return self.start(
            None, level=self.settings.burn_in_level, trigger="burn-in", after=self._burn_in_ended
        )

    def _burn_in_ended(self) -> None:
        with self.monitor.lock:
            self.monitor.engine.gate = self.monitor.engine.gate.burn_in_ended()
        self.monitor.publish()

    def start(
        self,
        gpus: Sequence[int] | None,
        *,
        level: int | None = None,
        trigger: str = "on-demand",
        after: Callable[[], None] | None = None,
    ) -> RunOutcome:
        """Start a run in the background; its outcome (``running``) at once, ``runs.get`` later."""
        number = level or self.settings.burn_in_level or 1
        level_spec(number)  # a bad level or GPU is refused here, not in the thread
        for index in gpus or ():
            _gpu(self.monitor.engine.inventory, index)
        if not self._lock.acquire(blocking=False):
            if after is not None:
                after()
            raise ActiveCheckBusyError(
                f"an active check is already running ({self.runs.running_text()}); "
                "wait for it, or read it with gpuweave check --run ID"
            )
        run = next(self._ids)
        first = self.runs.started(
            run, trigger=trigger, level=number, backend=self.parts.exerciser.name, at=self.monitor.now()
        )

        def work() -> None:
            try:
                self._run(run, gpus, level=number, trigger=trigger)
            except Exception as exc:
                log.exception("active check run %d failed", run)
                self.runs.failed(run, f"{type(exc).__name__}: {exc}", at=self.monitor.now())
            finally:
                self._lock.release()
                if after is not None:
                    after()

        threading.Thread(target=work, name=f"active-check-{run}", daemon=True).start()
        return first

    def run(self, gpus: Sequence[int] | None, *, level: int, trigger: str = "on-demand") -> RunOutcome:
        """One run, synchronously (tests, tools); ``ActiveCheckBusyError`` while another runs."""
        if not self._lock.acquire(blocking=False):
            raise ActiveCheckBusyError(f"an active check is already running ({self.runs.running_text()})")
        try:
            run = next(self._ids)
            self.runs.started(
                run, trigger=trigger, level=level, backend=self.parts.exerciser.name, at=self.monitor.now()
            )
            return self._run(run, gpus, level=level, trigger=trigger)
        finally:
            self._lock.release()

    def __call__(self, monitor: HealthMonitor) -> None:
        """Round hook: re-check GPUs a failed check withholds, every ``recheck_interval_s``."""
        interval = self.settings.recheck_interval_s
        if interval <= 0 or self._lock.locked():
            return
        now = monitor.now()
        with monitor.lock:
            due = [
                uuid
                for uuid in monitor.engine.rechecks
                if monitor.engine.gpus.get(uuid) is not None
                and monitor.engine.gpus[uuid].state in (DeviceState.SUSPECT, DeviceState.PROBATION)
                and now - self._last_recheck.get(uuid, -interval) >= interval
            ]
        indexes = [i for i in (monitor.engine.gpu_index(u) for u in due) if i is not None]
        if indexes:
            self._last_recheck.update(dict.fromkeys(due, now))
            with contextlib.suppress(ActiveCheckBusyError):  # a run began meanwhile: next round
                self.start(indexes, level=self.settings.burn_in_level or 1, trigger="recheck")

    # --- one run ------------------------------------------------------------------------------

    def _run(self, run: int, indexes: Sequence[int] | None, *, level: int, trigger: str) -> RunOutcome:
        """One run. The burn-in holds nothing: the startup taint keeps new work off the whole node
        while it runs, and the agent's first device list stays as the rounds make it."""
        started = self.monitor.now()
        hold = trigger != BURN_IN
        chosen, skipped = self._select(indexes)
        self._hold({g.uuid: HOLD_REASON for g in chosen} if hold else {})
        try:
            chosen, skipped = self._still_idle(chosen, skipped, hold=hold)
            reports, found, deltas = self._exercise_all(chosen, level)
        finally:
            self._hold({})
        outcome = self.runs.finished(
            run,
            reports=reports,
            findings=found,
            skipped=skipped,
            deltas=deltas,
            verdicts=_merged_verdicts(reports, found),
            seconds=self.monitor.now() - started,
            indexes={g.uuid: g.index for g in self.monitor.engine.inventory.gpus},
        )
        self._apply(outcome)
        self._announce(outcome)
        return outcome

    def _select(self, indexes: Sequence[int] | None) -> tuple[list[Gpu], dict[str, str]]:
        engine = self.monitor.engine
        inventory = engine.inventory
        wanted = list(inventory.gpus) if indexes is None else [_gpu(inventory, i) for i in indexes]
        chosen, skipped = [], {}
        with self.monitor.lock:
            states = {uuid: record.state for uuid, record in engine.gpus.items()}
        for gpu in wanted:
            if gpu.mig_enabled:
                skipped[gpu.uuid] = "MIG mode is on: its MIG devices are not exercised"
            elif states.get(gpu.uuid) in SKIPPED_STATES:
                skipped[gpu.uuid] = f"{states[gpu.uuid]}: not exercised"
            else:
                chosen.append(gpu)
        return chosen, skipped

    def _still_idle(
        self, chosen: list[Gpu], skipped: dict[str, str], *, hold: bool
    ) -> tuple[list[Gpu], dict[str, str]]:
        """After the hold (no new pod can land): the GPUs nothing holds; the rest are skipped."""
        busy = self.parts.busy
        idle = []
        for gpu in chosen:
            why = _busy(busy, gpu.uuid)
            if why:
                skipped[gpu.uuid] = why
            else:
                idle.append(gpu)
        if hold:
            self._hold({g.uuid: HOLD_REASON for g in idle})
        return idle, skipped

    def _exercise_all(
        self, gpus: list[Gpu], level: int
    ) -> tuple[list[ExerciseReport], dict[str, list[Finding]], dict[str, CounterDelta]]:
        if not gpus:
            return [], {}, {}
        inventory = self.monitor.engine.inventory
        before, xids = self._read_all(gpus), dict(self._xids)
        links = {
            u: (r.pcie_generation[1], r.pcie_width[1]) if r and r.pcie_generation and r.pcie_width else None
            for u, r in before.items()
        }
        expected = expectations(inventory, links)
        deadline = self.settings.deadline_s or level_spec(level).deadline_s
        batches = plans(
            inventory,
            gpus,
            level_number=level,
            max_gpus=self.settings.max_gpus,
            memory_fraction=self.settings.memory_fraction,
        )
        reports = [self._exercise(plan, deadline) for plan in batches]
        deltas = _deltas(before, self._read_all(gpus), xids, self._xids)
        thresholds = Thresholds(
            self.settings.min_pcie_fraction,
            self.settings.min_nvlink_fraction,
            self.settings.compute_slack,
            self.settings.sbe_limit,
        )
        found: dict[str, list[Finding]] = {}
        for report in reports:
            for uuid, items in judge(report, expected, thresholds=thresholds).items():
                found.setdefault(uuid, []).extend(items)
        for uuid, items in judge_deltas(deltas, thresholds=thresholds).items():
            found.setdefault(uuid, []).extend(items)
        return reports, found, deltas

    def _exercise(self, plan: ExercisePlan, deadline_s: float) -> ExerciseReport:
        """The backend's run; one that does not return past its deadline hangs every check."""
        box: list[ExerciseReport | BaseException] = []

        def work() -> None:
            try:
                box.append(self.parts.exerciser.run(plan, deadline_s=deadline_s))
            except Exception as exc:
                box.append(exc)

        thread = threading.Thread(target=work, name="exerciser", daemon=True)
        thread.start()
        thread.join(deadline_s + self.parts.backstop_grace_s)
        name = self.parts.exerciser.name
        if box and isinstance(box[0], ExerciseReport):
            return box[0]
        if box:
            detail = f"the {name} exerciser failed: {box[0]}"
            rest = unfinished(plan, [], hung=(), detail=detail)
            errors = tuple(
                CheckResult(r.check, r.gpu, ResultStatus.ERROR, peer=r.peer, detail=detail) for r in rest
            )
            return ExerciseReport(name, plan, errors, 0.0)
        detail = f"the {name} exerciser did not return within its {deadline_s:g} s deadline"
        return ExerciseReport(
            name, plan, tuple(unfinished(plan, [], hung=set(plan.checks()), detail=detail)), deadline_s
        )

    def _read_all(self, gpus: list[Gpu]) -> dict[str, GpuReadings | None]:
        """Each GPU's counters, time-boxed like a round's reads; None where a read failed or hung."""
        links = nvlinks_per_gpu(self.monitor.engine.inventory)
        started = {
            g.uuid: self._reads.start(
                f"active/{g.uuid}", _reader(self.parts.probe, g.uuid, links.get(g.index, 0))
            )
            for g in gpus
        }
        out: dict[str, GpuReadings | None] = {}
        for uuid, fresh in started.items():
            status, value = (
                self._reads.collect(f"active/{uuid}", self.monitor.settings.check_timeout_s)
                if fresh
                else ("timeout", None)
            )
            out[uuid] = value if status == "ok" and isinstance(value, GpuReadings) else None
        return out

    # --- results ------------------------------------------------------------------------------

    def _apply(self, outcome: RunOutcome) -> None:
        engine = self.monitor.engine
        with self.monitor.lock:
            for uuid, gpu in outcome.gpus.items():
                if gpu.verdict == Verdict.FAILED.value:
                    items = ordered(outcome.findings.get(uuid, []))
                    engine.on_findings(uuid, items)
                    engine.rechecks[uuid] = items[0].reason if items else "active check failed"
                elif gpu.verdict == Verdict.PASSED.value:
                    engine.rechecks.pop(uuid, None)
        self.monitor.publish()

    def _announce(self, outcome: RunOutcome) -> None:
        metrics = self.monitor.metrics
        for result in outcome.results:
            metrics.active_checks.labels(result.check.value, result.status.value).inc()
            if result.gbps is not None:
                metrics.active_bandwidth.labels(result.gpu, result.check.value, result.peer or "").set(
                    result.gbps
                )
        for gpu in outcome.gpus.values():
            metrics.active_gpus.labels(outcome.trigger, gpu.verdict).inc()
        failed = {u: g for u, g in outcome.gpus.items() if g.verdict == Verdict.FAILED.value}
        summary = outcome.summary()
        log.log(logging.WARNING if failed else logging.INFO, "%s", summary)
        if self.parts.events is not None:
            reason = "GpuweaveActiveCheckFailed" if failed else "GpuweaveActiveCheckPassed"
            try:
                self.parts.events(reason, summary, bool(failed))
            except Exception as exc:
                log.warning("cannot post the active-check event: %s", exc)

    def _hold(self, reasons: Mapping[str, str]) -> None:
        if self.parts.hold is not None:
            try:
                self.parts.hold(dict(reasons))
            except Exception:
                log.exception("cannot withhold the GPUs under an active check")

    def _count_xid(self, device: str, fault: Fault) -> None:
        """Count the Xids graded application-level or worse (informational ones are the driver's notes)."""
        if fault.signal in ("xid", "recovery-action") and fault.severity in _COUNTED:
            gpu = self.monitor.engine.mig_parent.get(device, device)
            self._xids[gpu] = self._xids.get(gpu, 0) + 1

    def status(self) -> dict[str, Any]:
        with self.monitor.lock:
            rechecks = dict(self.monitor.engine.rechecks)
            burn_in = self.monitor.engine.gate.burn_in_pending
        return {
            "running": self.runs.running(),
            "burnInPending": burn_in,
            "rechecks": rechecks,
            "lastRun": self.runs.last_json(),
        }


def _gpu(inventory: NodeInventory, index: int) -> Gpu:
    try:
        return inventory.gpu(int(index))
    except KeyError as exc:
        count = len(inventory.gpus)
        raise InvalidInputError(f"no GPU {index} on this node (it has {count}: 0-{count - 1})") from exc


def _busy(busy: Busy | None, uuid: str) -> str | None:
    if busy is None:
        return None
    try:
        return busy(uuid)
    except Exception as exc:  # cannot tell who holds it: do not exercise it
        return f"cannot tell whether a pod holds it ({exc})"


def _reader(probe: Readings, uuid: str, links: int) -> Callable[[], GpuReadings]:
    return lambda: probe.read_gpu(uuid, expected_nvlinks=links)


def _deltas(
    before: Mapping[str, GpuReadings | None],
    after: Mapping[str, GpuReadings | None],
    xids_before: Mapping[str, int],
    xids_after: Mapping[str, int],
) -> dict[str, CounterDelta]:
    out = {}
    for uuid, first in before.items():
        last = after.get(uuid)
        xids = xids_after.get(uuid, 0) - xids_before.get(uuid, 0)
        if first is None or last is None:
            out[uuid] = CounterDelta(xids=xids)
            continue
        out[uuid] = CounterDelta(
            dbe=_minus(last.volatile_dbe, first.volatile_dbe),
            sbe=_minus(last.volatile_sbe, first.volatile_sbe),
            remapped_rows=_minus(_rows(last), _rows(first)),
            xids=xids,
        )
    return out


def _minus(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else max(after - before, 0)


def _rows(readings: GpuReadings) -> int | None:
    rows = readings.remapped_rows
    return None if rows is None else rows[0] + rows[1]


def _merged_verdicts(reports: list[ExerciseReport], found: Mapping[str, list[Finding]]) -> dict[str, Verdict]:
    """Per GPU over every batch: failed beats incomplete beats passed."""
    rank = {Verdict.PASSED: 0, Verdict.INCOMPLETE: 1, Verdict.FAILED: 2}
    merged: dict[str, Verdict] = {}
    for report in reports:
        for uuid, verdict in verdicts(report, found).items():
            if uuid not in merged or rank[verdict] > rank[merged[uuid]]:
                merged[uuid] = verdict
    return merged
