"""The running health monitor: event listener, periodic check rounds, watchdog, change push.

Three threads feed one ``HealthEngine`` under one lock:

- the **event listener** waits on NVML Xid/DBE events (``event_wait_ms`` at a time, its heartbeat)
  and applies each at once, so a fatal Xid withholds the device within one wait period;
- the **round loop** every ``round_interval_s`` reads every health signal in order
  (``health.signals.protocol.HealthSignal``: the kernel log, each GPU's counters in parallel
  under ``check_timeout_s`` (a hung read fails that GPU closed: Suspect, "check timed out", while
  the others go on), EFA, then the node's own, such as MPS supervision), hands what they saw to
  the engine, runs the round hooks (remediation, active re-checks), and closes the round;
- the **watchdog** supervises both: it restarts a loop that died and, while a loop is dead or its
  heartbeat is older than ``stall_threshold_s``, withholds every GPU (their health is unknown
  while events or checks are not read), so checking never silently stops. The round loop in
  turn restarts a dead watchdog, and every watchdog pass runs under its own guard.

After every change the devices whose health flipped are pushed to the ``HealthSink`` (the device
plugin) and every ``on_change`` callback gets the new snapshot. A push the sink refuses is not
remembered as pushed, so the next publish sends it again; no failure of a sink or listener
reaches a loop.

A signal that raises is logged and the round does not count as complete. The kernel log is
applied line by line: a line that cannot be parsed or applied is counted
(``gpuweave_health_kernel_log_bad_lines``) and skipped, the rest of the batch is still acted on,
and the saved cursor moves only past lines handled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from hardware.health_probe import XidEvent
from health.checks import Finding
from health.engine import Clock, HealthEngine
from health.metrics import HealthMetrics
from health.policy import DeviceState, Fault
from health.runner import TimeoutRunner
from health.scope import HealthSnapshot
from health.signals.efa import EfaCheck
from health.signals.gpu_checks import GpuChecks
from health.signals.kernel_log import KernelLogSignal
from health.signals.kmsg import KernelLogTail
from health.signals.protocol import HealthProbe, HealthSignal, KernelEntry, Observations, RoundContext
from health.xid import Severity

__all__ = ["HealthMonitor", "HealthProbe", "HealthSink", "RoundHook", "builtin_signals"]

log = logging.getLogger(__name__)
# Health states whose arrival is logged at INFO: steps on the way back, after the WARNING that
# announced the fault
QUIET_STATES = frozenset({DeviceState.REMEDIATING, DeviceState.PROBATION})


class HealthSink(Protocol):
    """Where per-device health goes (the node agent's ``set_device_health``)."""

    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None: ...


class RoundHook(Protocol):
    """Acts at the end of each round with the monitor (remediation, active re-checks); evidence
    about a device is a ``HealthSignal`` instead."""

    def __call__(self, monitor: HealthMonitor) -> None: ...


def builtin_signals(kernel_log: KernelLogTail | None) -> tuple[HealthSignal, ...]:
    """The signals every node reads, in round order: the kernel log (when there is one), each
    GPU's counters, the EFA adapters."""
    kernel = (KernelLogSignal(kernel_log),) if kernel_log is not None else ()
    return (*kernel, GpuChecks(), EfaCheck())


class HealthMonitor:
    def __init__(
        self,
        engine: HealthEngine,
        probe: HealthProbe,
        *,
        clock: Clock,
        sink: HealthSink | None = None,
        kernel_log: KernelLogTail | None = None,
        signals: tuple[HealthSignal, ...] = (),
        round_hooks: tuple[RoundHook, ...] = (),
        metrics: HealthMetrics | None = None,
    ) -> None:
        """``signals`` are read each round after the built-in ones (``builtin_signals``)."""
        self.engine = engine
        self.metrics = metrics or HealthMetrics()
        self.settings = engine.settings
        self._probe = probe
        self._clock = clock
        self._sink = sink
        self._signals = (*builtin_signals(kernel_log), *signals)
        self._round_hooks = round_hooks
        self._listeners: list[Callable[[HealthSnapshot], None]] = []
        self.lock = threading.RLock()
        self._publishing = threading.RLock()  # re-entered when a push makes the agent call back
        self._pushed: dict[str, tuple[bool, str]] = {}
        self._logged: dict[str, DeviceState] = {}  # device -> the state last logged (``_log_transitions``)
        self._efa_logged: dict[str, bool] = {}
        self._stop = threading.Event()
        self._runner = TimeoutRunner()
        self._threads: dict[str, threading.Thread] = {}
        self._beats: dict[str, float] = {}
        self.rounds_completed = 0

    # --- lifecycle ------------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[HealthSnapshot], None]) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        failed = self._probe_register()
        with self.lock:
            for uuid in failed:  # no Xid events from this GPU: fail closed until checks say otherwise
                self.engine.apply(
                    uuid, Fault(self._clock(), "events", Severity.SUSPECT, "Xid event registration failed")
                )
        self.publish()
        self._spawn("events", self._event_loop)
        self._spawn("rounds", self._round_loop)
        self._spawn("watchdog", self._watchdog_loop)

    def stop(self) -> None:
        """Stop the loops; a check still hung in the driver is left behind (its thread is a daemon)."""
        self._stop.set()
        for thread in list(self._threads.values()):
            thread.join(timeout=5)
        self._runner.close()

    def _probe_register(self) -> list[str]:
        try:
            return self._probe.register_events([g.uuid for g in self.engine.inventory.gpus])
        except Exception as exc:
            log.warning("cannot register for NVML events (%s); relying on the kernel log and checks", exc)
            return [g.uuid for g in self.engine.inventory.gpus]

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        self._beats[name] = self._clock()
        thread = threading.Thread(target=self._guard(name, target), name=f"health-{name}", daemon=True)
        thread.start()  # registered once started: a loop that looks it up never sees it not yet alive
        self._threads[name] = thread

    def _guard(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException:  # whatever ends a loop, it is logged here and the loop restarted
                log.exception("health %s loop died; it is restarted and the GPUs withheld meanwhile", name)

        return run

    def _respawn(self, name: str, target: Callable[[], None]) -> None:
        """Start a dead loop again (the watchdog does it for the loops, the round loop for the watchdog)."""
        if self._stop.is_set() or self._threads[name].is_alive():
            return
        log.error("restarting the health %s loop", name)
        self.metrics.loop_restarts.labels(name).inc()
        self._spawn(name, target)

    # --- change push ----------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def snapshot(self) -> HealthSnapshot:
        with self.lock:
            return self.engine.snapshot()

    def publish(self) -> None:
        """Push devices whose health changed to the sink and the snapshot to every listener.

        Never raises: a push the sink refuses stays unpushed (sent again next time), a listener
        that fails is logged, so a failing sink cannot stop the loop that called this. Publishes
        are serialised (the event and round loops both publish), so an older state is never
        pushed after a newer one; the engine lock is only taken inside, never held around this.
        """
        with self._publishing:
            self._publish()

    def _publish(self) -> None:
        with self.lock:
            snap = self.engine.snapshot()
            changes = []
            for device in [*snap.gpus, *snap.migs, *snap.efa_up]:
                state = snap.state_of(device)
                reason = self._reason(snap, device)
                now = (snap.is_healthy(device), f"{state}: {reason}" if reason else str(state))
                if self._pushed.get(device, (None, ""))[0] != now[0]:  # the kubelet only sees the flip
                    changes.append((device, *now))
            transitions = self._transitions(snap)
        for level, line in transitions:
            log.log(level, "%s", line)
        for device, healthy, reason in changes:
            if self._push(device, healthy, reason):
                with self.lock:
                    self._pushed[device] = (healthy, reason)
        for listener in self._listeners:
            try:
                listener(snap)
            except Exception:
                log.exception("health listener failed")

    def _push(self, device: str, healthy: bool, reason: str) -> bool:
        if self._sink is not None:
            try:
                self._sink.set_device_health(device, healthy, "" if healthy else reason)
            except Exception:
                log.exception("cannot push the health of %s to the device plugin; retrying", device)
                return False
        return True

    def _transitions(self, snap: HealthSnapshot) -> list[tuple[int, str]]:
        """Log lines (level, text) for each device whose own health state changed since the last
        publish; called with the lock held, logged after it is released.

        A device leaving Healthy, failing or retiring is a WARNING, so the default log level shows
        it; its return to Healthy is a WARNING too, closing what the first one opened; the steps in
        between (Remediating, Probation) are INFO. A device's first state is logged only when it
        is not Healthy (a GPU on the bad-hardware list at start). A MIG device's line is about its
        own record: its GPU's line covers a fault that fans out to it."""
        lines = []
        for device, record in [*snap.gpus.items(), *snap.migs.items()]:
            before, state = self._logged.get(device), record.state
            self._logged[device] = state
            if before is state or (before is None and state is DeviceState.HEALTHY):
                continue
            level = logging.INFO if state in QUIET_STATES else logging.WARNING
            was = f"was {before}" if before is not None else "at start"
            reason = f": {record.reason}" if record.reason and state is not DeviceState.HEALTHY else ""
            lines.append((level, f"device {device} is {state} ({was}){reason}"))
        for adapter, up in snap.efa_up.items():
            if self._efa_logged.get(adapter, True) != up:
                lines.append((logging.WARNING, f"EFA adapter {adapter} is {'up again' if up else 'down'}"))
            self._efa_logged[adapter] = up
        return lines

    @staticmethod
    def _reason(snap: HealthSnapshot, device: str) -> str:
        record = snap.migs.get(device) or snap.gpus.get(device)
        return record.reason if record else ""

    # --- event listener -------------------------------------------------------------------------

    def _event_loop(self) -> None:
        while not self._stop.is_set():
            self._beats["events"] = self._clock()
            try:
                event = self._probe.wait_event(self.settings.event_wait_ms)
            except Exception as exc:
                log.warning("NVML event wait failed: %s; retrying", exc)
                self._stop.wait(self.settings.event_wait_ms / 1000)
                continue
            if event is not None:
                self.on_event(event)

    def on_event(self, event: XidEvent) -> None:
        with self.lock:
            if event.is_dbe:
                self.engine.on_xid(event.gpu_uuid, 48)  # a DBE event grades as the DBE Xid
            elif event.is_recovery_action:
                self.engine.on_recovery_action(event.gpu_uuid, event.xid)
            else:
                self.engine.on_xid(
                    event.gpu_uuid,
                    event.xid,
                    gpu_instance=event.gpu_instance,
                    compute_instance=event.compute_instance,
                )
        self.publish()

    # --- rounds ---------------------------------------------------------------------------------

    def _round_loop(self) -> None:
        while not self._stop.is_set():
            self._beats["rounds"] = self._clock()
            self.run_round()
            if "watchdog" in self._threads:
                self._respawn("watchdog", self._watchdog_loop)
            self._stop.wait(self.settings.round_interval_s)

    def run_round(self) -> None:
        """One round: every signal in order (kernel log, GPU checks, EFA, the node's own), their
        GPU findings, hooks, close the round."""
        context = self._context()
        findings: dict[str, list[Finding]] = {}
        complete = True
        for signal in self._signals:
            seen = self._observe(signal, context)
            self._apply(seen)
            for uuid, found in seen.findings.items():
                findings.setdefault(uuid, []).extend(found)
            complete = complete and seen.complete
        with self.lock:
            clean = {uuid for uuid, found in findings.items() if self.engine.on_findings(uuid, found)}
        self.publish()
        for hook in self._round_hooks:
            try:
                hook(self)
            except Exception:
                log.exception("health round hook failed")
        with self.lock:
            self.engine.end_round(clean, all_checks_completed=complete)
            self.rounds_completed += 1
        self.publish()

    def read_kernel_log(self) -> None:
        """Act on new kernel-log lines now. Each round starts with it; the simulation calls it
        right after an Xid it injects, as a round would read the line within ``round_interval_s``."""
        context = self._context()
        for signal in self._signals:
            if isinstance(signal, KernelLogSignal):
                self._apply(self._observe(signal, context))

    def _context(self) -> RoundContext:
        return RoundContext(
            inventory=self.engine.inventory,
            settings=self.settings,
            probe=self._probe,
            runner=self._runner,
            clock=self._clock,
            gpu_states=self._gpu_states,
        )

    def _gpu_states(self) -> dict[str, DeviceState]:
        with self.lock:
            return {uuid: record.state for uuid, record in self.engine.gpus.items()}

    @staticmethod
    def _observe(signal: HealthSignal, context: RoundContext) -> Observations:
        """A signal's observations; one that fails is logged and makes the round incomplete."""
        try:
            return signal.observe(context)
        except Exception:
            log.exception("health signal %s failed; the round does not count as complete", signal.name)
            return Observations(complete=False)

    def _apply(self, seen: Observations) -> None:
        """Hand a signal's kernel lines, faults and EFA state to the engine (findings wait for
        the round's end)."""
        for entry in seen.kernel:
            self._kernel_entry(entry, at_boot=seen.at_boot)
        if seen.handled is not None:
            seen.handled()
        with self.lock:
            for device, fault in seen.faults:
                self.engine.apply(device, fault)
            if seen.efa is not None:
                self.engine.efa_up = dict(seen.efa.up)
                self.engine.set_checked_node_faults(set(seen.efa.kinds), seen.efa.faults)

    def _kernel_entry(self, entry: KernelEntry, *, at_boot: bool) -> None:
        """Apply one line's record; a line that fails is counted and skipped, never fatal."""
        try:
            if entry.problem:
                raise ValueError(entry.problem)
            if entry.record is not None:
                with self.lock:
                    self.engine.on_kernel_record(entry.record, at_boot=at_boot)
        except Exception as exc:
            self.metrics.kernel_log_bad_lines.inc()
            log.warning("skipping kernel-log line %.160r: %s", entry.line.text, str(exc)[:200])

    # --- watchdog -------------------------------------------------------------------------------

    def _watchdog_loop(self) -> None:
        period = min(self.settings.round_interval_s, 1.0)
        while not self._stop.wait(period):
            self._beats["watchdog"] = self._clock()
            try:
                self._supervise()
            except Exception:
                log.exception("health watchdog pass failed; next pass in %.1f s", period)

    def _supervise(self) -> None:
        """Withhold every GPU while a loop is dead or silent; restart the dead ones."""
        now = self._clock()
        for name, target in (("events", self._event_loop), ("rounds", self._round_loop)):
            stale = now - self._beats.get(name, now)
            alive = self._threads[name].is_alive()
            if alive and stale <= self.settings.stall_threshold_s:
                continue
            self._stalled(name, stale if alive else None)
            self._respawn(name, target)

    def _stalled(self, name: str, stale: float | None) -> None:
        """Withhold what the silent loop watches: every GPU, and the EFA adapters for the rounds
        (their next completed check brings them back)."""
        what = "died" if stale is None else f"stalled for {stale:.1f} s"
        log.error("health %s loop %s; withholding every GPU until it runs again", name, what)
        reason = f"health {name} loop {what}: device health unknown"
        with self.lock:
            for uuid in self.engine.gpus:
                self.engine.apply(uuid, Fault(self._clock(), "watchdog", Severity.SUSPECT, reason))
            if name == "rounds":
                self.engine.efa_up = dict.fromkeys(self.engine.efa_up, False)
        self.publish()
