"""Active checks on a node: which GPUs, one run at a time, results into the health engine.

``ActiveCheckRunner`` is what every trigger calls: the burn-in at start, ``gpuweave check`` through
the control socket, the re-check of GPUs a failed check withholds (a round hook, every
``recheck_interval_s``), the checks on idle GPUs between jobs (``health.active_idle``) and a gang's
preflight (``gpuweave.node.preflight``). Its rules hold for every caller:

- **never under a pod**: the run's GPUs are named first, then withheld (``hold``) so no new pod
  lands on one, then every GPU something holds (``busy``: a pod's allocation, the agent's recent
  grants, a compute process) is skipped; a pod the kubelet admitted before the withholding reached
  it, and that claims a GPU mid-run, wins: the batch exercising it is cancelled and the GPU let go
  before its Allocate (or DRA prepare) returns (``health.active_claims``). MIG-enabled, retired
  and remediating GPUs are skipped too;
- **at most ``max_gpus`` GPUs at once** (``hardware.exerciser.levels.plans`` cuts the batches);
- **every batch has a deadline**; the exerciser fails a hung check closed, and a backend that does
  not return at all is a hung check for every GPU of the batch;
- **one run at a time** per node; another request is refused while one runs.

Around the run each GPU's counters are read (double- and single-bit ECC, remapped rows) and the
Xids the engine saw are counted, so errors the exercise provoked are findings too. A failed GPU
gets its findings as faults (``health.active``) and is held for a re-check: no round is clean for
it until a check passes again, then it goes through probation back to Healthy. An NVLink pair
measured below threshold fails neither GPU: the run's pair measurements go to ``ActiveParts.links``
(the health service keeps the slow ones as degraded links, ``health.links``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import Gpu, NodeInventory
from hardware.exerciser.levels import level as level_spec
from hardware.exerciser.levels import plans
from hardware.exerciser.model import Expectations, expectations
from hardware.exerciser.protocol import GPU_CHECKS, CheckKind, ExercisePlan, Exerciser, ExerciseReport
from health.active import (
    CounterDelta,
    LinkVerdict,
    Thresholds,
    Verdict,
    judge,
    judge_deltas,
    judge_links,
    merged_verdicts,
)
from health.active_book import RunBook, RunOutcome, ordered
from health.active_claims import CLAIMED_REASON, RunClaims
from health.active_io import CounterReader, Readings, deltas, pcie_links, run_with_backstop, without_gpus
from health.checks import Finding
from health.config import ActiveSettings
from health.errors import ActiveCheckBusyError
from health.monitor import HealthMonitor
from health.policy import DeviceState, Fault
from health.xid import Severity

log = logging.getLogger(__name__)
HOLD_REASON = "active check running"
BURN_IN = "burn-in"
BACKSTOP_GRACE_S = 5.0  # past a batch's deadline before the runner stops waiting for its backend
SKIPPED_STATES = (DeviceState.RETIRED, DeviceState.REMEDIATING)
_COUNTED = (Severity.APPLICATION, Severity.SUSPECT, Severity.FATAL)

Hold = Callable[[Mapping[str, str]], None]  # withhold exactly these GPUs (UUID -> reason); {} releases
Busy = Callable[[str], str | None]  # why a GPU cannot be exercised now (a pod holds it), None when idle
Held = Callable[[], Collection[str]]  # the device IDs pods hold now, GPU UUIDs among them (raises: unknown)
EventSink = Callable[[str, str, bool], None]  # reason, message, warning
# the NVLink pairs a run measured -> those it newly found slow (degraded links now)
LinkSink = Callable[[Mapping[frozenset[str], LinkVerdict]], Collection[frozenset[str]]]
_Links = dict[frozenset[str], LinkVerdict]


@dataclass
class ActiveParts:
    exerciser: Exerciser
    probe: Readings
    settings: ActiveSettings
    hold: Hold | None = None
    busy: Busy | None = None
    held: Held | None = None  # for the checks between jobs: which GPUs pods hold, in one call
    events: EventSink | None = None
    links: LinkSink | None = None  # told every run's NVLink pair measurements (``health.links``)
    runs: RunBook = field(default_factory=RunBook)
    backstop_grace_s: float = BACKSTOP_GRACE_S


class ActiveCheckRunner:
    def __init__(self, monitor: HealthMonitor, parts: ActiveParts) -> None:
        self.monitor, self.parts, self.settings = monitor, parts, parts.settings
        self.runs = parts.runs
        self._lock = threading.Lock()  # held for the whole of a run
        self._ids = itertools.count(1)
        self._counters = CounterReader(parts.probe, timeout_s=monitor.settings.check_timeout_s)
        self._xids: dict[str, int] = {}
        self._last_recheck: dict[str, float] = {}
        self.last_checked: dict[str, float] = {}  # GPU UUID -> when a run last judged it (monitor clock)
        self.claims = RunClaims(parts.hold, reason=HOLD_REASON)
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
        return self.start(None, level=self.settings.burn_in_level, trigger=BURN_IN, after=self._burn_in_ended)

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
        checks: tuple[CheckKind, ...] = GPU_CHECKS,
        max_gpus: int | None = None,
    ) -> RunOutcome:
        """Start a run in the background; its outcome (``running``) at once, ``runs.get`` later.
        ``checks``: the per-GPU checks (a preflight's are the copies only); ``max_gpus``: fewer GPUs
        at once than the settings' (the checks between jobs)."""
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
        shape = _Shape(number, trigger, checks, max_gpus or self.settings.max_gpus)

        def work() -> None:
            try:
                self._run(run, gpus, shape)
            except Exception as exc:
                log.exception("active check run %d failed", run)
                self.runs.failed(run, f"{type(exc).__name__}: {exc}", at=self.monitor.now())
            finally:
                self._lock.release()
                if after is not None:
                    after()

        threading.Thread(target=work, name=f"active-check-{run}", daemon=True).start()
        return first

    def run(
        self,
        gpus: Sequence[int] | None,
        *,
        level: int,
        trigger: str = "on-demand",
        checks: tuple[CheckKind, ...] = GPU_CHECKS,
        max_gpus: int | None = None,
    ) -> RunOutcome:
        """One run, synchronously (tests, tools, the simulation); ``ActiveCheckBusyError`` while
        another runs."""
        if not self._lock.acquire(blocking=False):
            raise ActiveCheckBusyError(f"an active check is already running ({self.runs.running_text()})")
        try:
            run = next(self._ids)
            self.runs.started(
                run, trigger=trigger, level=level, backend=self.parts.exerciser.name, at=self.monitor.now()
            )
            return self._run(run, gpus, _Shape(level, trigger, checks, max_gpus or self.settings.max_gpus))
        finally:
            self._lock.release()

    @property
    def running(self) -> bool:
        return self._lock.locked()

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

    def _run(self, run: int, indexes: Sequence[int] | None, shape: _Shape) -> RunOutcome:
        """One run: name the GPUs, withhold them, confirm nothing holds them, exercise (in this order:
        ``health.active_claims``). The burn-in holds nothing: the startup taint keeps new work off
        the whole node while it runs, and the agent's first device list stays as the rounds make it."""
        started = self.monitor.now()
        chosen, skipped = self._select(indexes)
        self.claims.begin(chosen, hold=shape.trigger != BURN_IN)
        try:
            chosen, skipped = self._still_idle(chosen, skipped)
            reports, found, changed, links = self._exercise_all(chosen, shape)
        finally:
            claimed = self.claims.claimed
            self.claims.end()
        verdicts = merged_verdicts(reports, found)
        for uuid in (u for u in claimed if not found.get(u)):  # nothing found before the pod took it
            verdicts.pop(uuid, None)
            skipped[uuid] = CLAIMED_REASON
        outcome = self.runs.finished(
            run,
            reports=reports,
            findings=found,
            skipped=skipped,
            deltas=changed,
            verdicts=verdicts,
            seconds=self.monitor.now() - started,
            indexes={g.uuid: g.index for g in self.monitor.engine.inventory.gpus},
            slow_links=tuple(v.text for _, v in sorted(links.items(), key=lambda i: sorted(i[0])) if v.slow),
        )
        self._apply(outcome)
        if links and self.parts.links is not None:
            new = self.parts.links(links)
            outcome = self.runs.with_new_links(run, tuple(v.text for pair, v in links.items() if pair in new))
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

    def _still_idle(self, chosen: list[Gpu], skipped: dict[str, str]) -> tuple[list[Gpu], dict[str, str]]:
        """After the hold (no new pod can land): the GPUs nothing holds; the rest are skipped."""
        busy = self.parts.busy
        idle = []
        for gpu in chosen:
            why = _busy(busy, gpu.uuid)
            if why:
                skipped[gpu.uuid] = why
            else:
                idle.append(gpu)
        self.claims.keep(idle)
        return idle, skipped

    def _exercise_all(
        self, gpus: list[Gpu], shape: _Shape
    ) -> tuple[list[ExerciseReport], dict[str, list[Finding]], dict[str, CounterDelta], _Links]:
        if not gpus:
            return [], {}, {}, {}
        inventory = self.monitor.engine.inventory
        before, xids = self._counters.read_all(inventory, gpus), dict(self._xids)
        deadline = self.settings.deadline_s or level_spec(shape.level).deadline_s
        batches = plans(
            inventory,
            gpus,
            level_number=shape.level,
            max_gpus=shape.max_gpus,
            memory_fraction=self.settings.memory_fraction,
            gpu_checks=shape.checks,
        )
        reports = [r for r in (self._batch(plan, deadline) for plan in batches) if r is not None]
        changed = deltas(before, self._counters.read_all(inventory, gpus), xids, self._xids)
        expected = expectations(inventory, pcie_links(before))
        links = judge_links(reports, expected, thresholds=self._thresholds())
        return reports, self._judge(reports, changed, expected), changed, links

    def _batch(self, plan: ExercisePlan, deadline: float) -> ExerciseReport | None:
        """One batch, without the GPUs a pod claimed meanwhile (None: nothing left of it)."""
        kept = self.claims.unclaimed([g.uuid for g in plan.gpus])
        plan = without_gpus(plan, kept)
        if not plan.gpus or (plan.peer_only and not plan.pairs):
            return None
        cancel = self.claims.start_batch(kept)
        if cancel is None:  # claimed between the two calls: the next try leaves it out
            return self._batch(plan, deadline)
        try:
            return run_with_backstop(
                self.parts.exerciser,
                plan,
                deadline_s=deadline,
                grace_s=self.parts.backstop_grace_s,
                cancel=cancel,
            )
        finally:
            self.claims.end_batch()

    def _judge(
        self, reports: list[ExerciseReport], changed: dict[str, CounterDelta], expected: Expectations
    ) -> dict[str, list[Finding]]:
        thresholds = self._thresholds()
        found: dict[str, list[Finding]] = {}
        for report in reports:
            for uuid, items in judge(report, expected, thresholds=thresholds).items():
                found.setdefault(uuid, []).extend(items)
        for uuid, items in judge_deltas(changed, thresholds=thresholds).items():
            found.setdefault(uuid, []).extend(items)
        return found

    def _thresholds(self) -> Thresholds:
        settings = self.settings
        return Thresholds(
            settings.min_pcie_fraction,
            settings.min_nvlink_fraction,
            settings.compute_slack,
            settings.sbe_limit,
        )

    # --- results ------------------------------------------------------------------------------

    def _apply(self, outcome: RunOutcome) -> None:
        engine = self.monitor.engine
        now = self.monitor.now()
        with self.monitor.lock:
            for uuid, gpu in outcome.gpus.items():
                if gpu.verdict in (Verdict.FAILED.value, Verdict.PASSED.value):
                    self.last_checked[uuid] = now
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
        log.log(logging.WARNING if failed or outcome.new_links else logging.INFO, "%s", summary)
        if self.parts.events is not None:
            reason = "GpuweaveActiveCheckFailed" if failed else "GpuweaveActiveCheckPassed"
            try:
                self.parts.events(reason, summary, bool(failed))
            except Exception as exc:
                log.warning("cannot post the active-check event: %s", exc)

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


@dataclass(frozen=True)
class _Shape:
    """What a run does: its level, what triggered it, the per-GPU checks, GPUs exercised at once."""

    level: int
    trigger: str
    checks: tuple[CheckKind, ...]
    max_gpus: int


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
