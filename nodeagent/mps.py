"""One supervised MPS control daemon per fractional GPU; a GPU's shares are served while it can run one.

A fractional share's limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
bind only inside MPS: a CUDA client that finds no daemon on its pipe directory runs outside MPS,
unlimited. So no share is granted without a live daemon. But every share tenant of a GPU has its
pipe directory mounted and can tell the daemon to ``quit``; what that costs the GPU's other tenants
is bounded here:

- ``wanted_daemons`` (pure) says which GPUs need a daemon: fractional, not MIG, not retired.
- A daemon that ran and then exits (its process ends: ``daemon_exited``) or stops answering is
  *restarting*: restarted at once by the restarter thread, one GPU's starts at least
  ``restart_spacing_s`` apart (which bounds what a tenant quitting in a loop costs the agent); a
  start that a ``quit`` cuts short is one more exit, not a failed start. Its shares stay offered
  meanwhile, and ``pipe_directory`` (Allocate) waits for the restart instead of refusing:
  Allocate only hands out environment and mounts, and a share is still granted only once the
  restarted daemon answered.
- A daemon that cannot be started puts its GPU under the ``mps`` gate (that GPU's shares
  Unhealthy, never a sibling's), and so does one restarting for ``allocate_wait_s`` without
  answering (quit again at every start: no pod should wait for it). A failed start is retried
  with exponential backoff; after ``failures_to_fault`` failed starts in a row it is handed to
  the health engine as a fault of that GPU (``check`` returns it for ``gpuweave.node.mps.MpsSignal``).
- ``check`` starts missing daemons, stops unwanted ones and queries every running one; in each
  health round (``in_round``) it leaves the starts to the restarter thread, so a round never
  waits for a daemon's start.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingMode, SharingPlan
from hardware.mps import MpsControlError, MpsDaemonQuitError, MpsDaemons, MpsDaemonSpec
from nodeagent.errors import AllocationRejectedError

log = logging.getLogger(__name__)

GATE = "mps"  # the agent gate holding GPUs whose daemon cannot be started
HOST_BASE_DIR = "/run/gpuweave/mps"
CONTROL_SOCKET = "control"  # the daemon's socket in its pipe directory
SOCKET_PATH_MAX = 107  # bytes in a unix socket path (sun_path holds 108 with the NUL)
MIN_WAIT_S = 0.01  # the restarter never spins faster than this


@dataclass(frozen=True)
class MpsSettings:
    base_dir: Path
    restart_base_s: float = 1.0  # a failed start is retried after this; each further one doubles it
    restart_cap_s: float = 60.0
    failures_to_fault: int = 3  # failed starts in a row before the GPU is faulted in health
    restart_spacing_s: float = 1.0  # one GPU's starts after an exit begin at least this far apart
    allocate_wait_s: float = 10.0  # how long an Allocate waits for a restart in progress


@dataclass(frozen=True)
class DaemonRecord:
    spec: MpsDaemonSpec
    up: bool = False
    restarting: bool = False  # it ran, then exited or stopped answering: restart due, shares offered
    failures: int = 0  # failed starts since it last answered
    retry_at: float = 0.0  # when the next start is due
    reason: str = "MPS daemon not started yet"
    run: int = 0  # which start (unique per supervisor), so a stale exit cannot mark a newer daemon down
    started_at: float = -math.inf  # when the last start began (one that a quit cut short too)
    down_since: float | None = None  # when it last stopped answering (None: up, or never started)
    faulted: bool = False  # handed to the health engine since it last answered
    restarts: int = 0

    @property
    def withheld(self) -> bool:
        """Its shares are held from the kubelet: not answering, and no restart under way."""
        return not self.up and not self.restarting

    def held_at(self, now: float, *, restart_wait_s: float) -> bool:
        """Withheld, or restarting for ``restart_wait_s`` without answering (quit again at every
        start): no pod should wait for it to come back."""
        down_for = now - self.down_since if self.down_since is not None else 0.0
        return self.withheld or (self.restarting and down_for >= restart_wait_s)


def spec_for(uuid: str, base_dir: Path, *, percentage: int | None, pinned_mib: int | None) -> MpsDaemonSpec:
    gpu_dir = base_dir / uuid
    return MpsDaemonSpec(uuid, gpu_dir / "pipe", gpu_dir / "log", percentage, pinned_mib)


def check_pipe_paths(wanted: Mapping[str, MpsDaemonSpec]) -> None:
    """Refuse pipe directories whose control socket no daemon could create (one clear line, not a
    daemon that never answers and shares withheld for ever)."""
    sockets = sorted(str(s.pipe_dir / CONTROL_SOCKET) for s in wanted.values())
    longest = max(sockets, key=lambda p: len(p.encode()), default="")
    if len(longest.encode()) > SOCKET_PATH_MAX:
        raise InvalidInputError(
            f"the MPS control socket {longest} is {len(longest.encode())} bytes long and a unix socket "
            f"path holds at most {SOCKET_PATH_MAX}: give a shorter mpsPipeDirectory in the sharing "
            "configuration (each GPU adds /<uuid>/pipe/control, 54 bytes)"
        )


def wanted_daemons(
    inventory: NodeInventory, plan: SharingPlan, *, base_dir: Path, retired: Collection[str] = ()
) -> dict[str, MpsDaemonSpec]:
    """GPU UUID -> its daemon, for every fractional GPU that is not MIG-enabled or retired."""
    wanted = {}
    for gpu in inventory.gpus:
        sharing = plan.for_gpu(gpu)
        if gpu.mig_enabled or gpu.uuid in retired or sharing.mode is not SharingMode.FRACTIONAL:
            continue
        wanted[gpu.uuid] = spec_for(
            gpu.uuid,
            base_dir,
            percentage=sharing.mps.thread_percentage,
            pinned_mib=sharing.mps.pinned_memory_mib,
        )
    return wanted


def restart_delay(failures: int, settings: MpsSettings) -> float:
    """Seconds before the next start after ``failures`` failed ones (0 for the first restart)."""
    if failures <= 0:
        return 0.0
    return float(min(settings.restart_cap_s, settings.restart_base_s * 2 ** (failures - 1)))


class MpsSupervisor:
    """Keeps one daemon per wanted GPU, publishes the GPUs that cannot have one to ``gate``."""

    def __init__(
        self,
        daemons: MpsDaemons,
        settings: MpsSettings,
        *,
        gate: Callable[[Mapping[str, str]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.daemons = daemons
        self.settings = settings
        self._gate = gate
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified on every record change
        self._ops = threading.Lock()  # one start/stop/check pass at a time
        self._publishing = threading.Lock()  # the gate is computed and set as one step
        self._records: dict[str, DaemonRecord] = {}
        self._runs = itertools.count(1)
        self._exited_early: set[int] = set()  # runs whose process ended before their start returned
        self._stopping = threading.Event()
        self._restarter: threading.Thread | None = None

    def records(self) -> dict[str, DaemonRecord]:
        with self._lock:
            return dict(self._records)

    def check(self, wanted: Mapping[str, MpsDaemonSpec], *, in_round: bool = False) -> list[DaemonRecord]:
        """One supervision pass; returns the records that just crossed ``failures_to_fault``.
        ``in_round``: a health round's pass, which never waits for a daemon's start: it passes at
        once while a restart is under way and leaves due starts to the restarter thread."""
        if not self._ops.acquire(blocking=not in_round):
            return []
        try:
            self._reconcile(wanted)
            for record in self.records().values():
                if record.up:
                    self._query(record)
            if not in_round:
                self._start_due()
            self._publish()
            to_fault = [r for r in self.records().values() if self._due_fault(r)]
            with self._lock:
                for record in to_fault:
                    self._records[record.spec.gpu_uuid] = replace(record, faulted=True)
            return to_fault
        finally:
            self._ops.release()

    def restart_due(self, *, timeout: float = -1) -> None:
        """Start every daemon whose start is due: a restart after an exit, a failed start's retry
        (``timeout``: give up waiting for a pass under way after that many seconds)."""
        if not self._ops.acquire(timeout=timeout):
            return
        try:
            self._start_due()
            self._publish()
        finally:
            self._ops.release()

    def start_restarter(self) -> None:
        """Run ``restart_due`` in a thread whenever a start falls due, until ``stop_all``."""
        self._restarter = threading.Thread(target=self._restart_loop, name="mps-restarter", daemon=True)
        self._restarter.start()

    def stop_all(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._restarter is not None:
            self._restarter.join(30)
        with self._ops:
            self._reconcile({})
            self._publish()

    def kill(self, gpu_uuid: str) -> str:
        """Kill one GPU's daemon as a crash would (fault injection)."""
        record = self.records().get(gpu_uuid)
        if record is None:
            raise MpsControlError(f"GPU {gpu_uuid} has no MPS daemon: it is not fractional")
        return self.daemons.kill(record.spec)

    def daemon_exited(self, gpu_uuid: str, run: int) -> None:
        """The process of start ``run`` ended (a tenant's ``quit``, a crash): restart it at once."""
        if self._restart_needed(gpu_uuid, run, "MPS daemon exited"):
            log.warning(
                "GPU %s: its MPS control daemon exited (quit from a share tenant?); restarting it", gpu_uuid
            )

    def pipe_directory(self, gpu_uuid: str) -> str:
        """The pipe directory of the GPU's live daemon (queried now, waiting for a restart under
        way), else ``AllocationRejectedError``."""
        record = self._settled(gpu_uuid)
        if record is not None and record.up:
            try:
                self.daemons.query(record.spec)
                return str(record.spec.pipe_dir)
            except MpsControlError as exc:
                self._stopped_answering(record, exc)
                record = self._settled(gpu_uuid)
        if record is None or not record.up:
            why = record.reason if record else "no MPS daemon is supervised for it yet"
            raise AllocationRejectedError(
                f"GPU {gpu_uuid}: no live MPS control daemon ({why}); shares on it are withheld "
                "until the node agent restarts the daemon"
            )
        return str(record.spec.pipe_dir)

    # ---- restarts -------------------------------------------------------------------------------
    def _restart_needed(self, gpu_uuid: str, run: int, reason: str) -> bool:
        """Mark start ``run`` of the GPU's daemon down with a restart due; False when it is not
        the current run (stopped, or already restarted)."""
        with self._changed:
            current = self._records.get(gpu_uuid)
            if current is not None and run > current.run:  # its start has not returned yet
                self._exited_early.add(run)
            if current is None or current.run != run or not current.up:
                return False
            due = max(self._clock(), current.started_at + self.settings.restart_spacing_s)
            self._records[gpu_uuid] = replace(
                current,
                up=False,
                restarting=True,
                retry_at=due,
                reason=f"{reason}; restarting it",
                down_since=self._clock(),
            )
            self._changed.notify_all()
        return True

    def _stopped_answering(self, record: DaemonRecord, exc: MpsControlError) -> None:
        uuid = record.spec.gpu_uuid
        if self._restart_needed(uuid, record.run, f"MPS daemon stopped answering: {exc}"):
            log.error("GPU %s: its MPS daemon stopped answering (%s); restarting it", uuid, exc)

    def _settled(self, gpu_uuid: str) -> DaemonRecord | None:
        """The GPU's record once no restart of it is under way, up to ``allocate_wait_s``: a
        restart that is due is run here, one not yet due (restarts spaced) is waited for."""
        deadline = time.monotonic() + self.settings.allocate_wait_s
        while True:
            record = self.records().get(gpu_uuid)
            left = deadline - time.monotonic()
            if record is None or not record.restarting or left <= 0:
                return record
            due_in = record.retry_at - self._clock()
            if due_in <= 0:
                self.restart_due(timeout=left)
                continue
            with self._changed:
                self._changed.wait(timeout=min(due_in, left))

    def _restart_loop(self) -> None:
        while not self._stopping.is_set():
            self.restart_due()
            with self._changed:
                if self._stopping.is_set():
                    return
                self._changed.wait(timeout=self._next_due_in())

    def _next_due_in(self) -> float | None:
        """Seconds until the next start falls due (None: none is due); called under ``_lock``."""
        due = [r.retry_at for r in self._records.values() if not r.up]
        return max(MIN_WAIT_S, min(due) - self._clock()) if due else None

    # ---- one pass -----------------------------------------------------------------------------
    def _reconcile(self, wanted: Mapping[str, MpsDaemonSpec]) -> None:
        for uuid, record in self.records().items():
            if wanted.get(uuid) == record.spec:
                continue
            self._stop(record)  # its exit is not reported (``stop``), so no restart follows
            with self._lock:
                del self._records[uuid]
        with self._changed:  # a new record is a start due now: the restarter wakes for it
            for uuid, spec in wanted.items():
                self._records.setdefault(uuid, DaemonRecord(spec))
            self._changed.notify_all()

    def _stop(self, record: DaemonRecord) -> None:
        try:
            self.daemons.stop(record.spec)
            log.info(
                "stopped the MPS daemon of GPU %s (no longer fractional, now MIG or retired, or the agent "
                "stops)",
                record.spec.gpu_uuid,
            )
        except MpsControlError as exc:
            log.warning("cannot stop the MPS daemon of GPU %s: %s", record.spec.gpu_uuid, exc)

    def _query(self, record: DaemonRecord) -> None:
        try:
            self.daemons.query(record.spec)
        except MpsControlError as exc:
            self._stopped_answering(record, exc)

    def _start_due(self) -> None:
        for record in self.records().values():
            if not record.up and self._clock() >= record.retry_at:
                self._start(record)

    def _start(self, record: DaemonRecord) -> None:
        uuid, run = record.spec.gpu_uuid, next(self._runs)
        record = replace(record, started_at=self._clock())
        try:
            self.daemons.start(record.spec, on_exit=lambda: self.daemon_exited(uuid, run))
        except MpsControlError as exc:
            quit_in_start = isinstance(exc, MpsDaemonQuitError)
            self._put(self._quit_in_start(record, exc) if quit_in_start else self._failed(record, exc))
            with self._lock:
                self._exited_early.discard(run)
            return
        restarted = record.run > 0
        self._put(
            replace(
                record,
                up=True,
                restarting=False,
                failures=0,
                retry_at=0.0,
                reason="",
                run=run,
                down_since=None,
                faulted=False,
                restarts=record.restarts + int(restarted),
            )
        )
        level = logging.WARNING if restarted else logging.INFO  # a restart follows an exit or failure
        verb = "restarted" if restarted else "started"
        log.log(level, "GPU %s: MPS control daemon %s on %s", uuid, verb, record.spec.pipe_dir)
        with self._lock:
            exited = run in self._exited_early
            self._exited_early.discard(run)
        if exited:
            self.daemon_exited(uuid, run)

    def _quit_in_start(self, record: DaemonRecord, exc: MpsControlError) -> DaemonRecord:
        """The record after a start that a ``quit`` cut short: another exit, not a failed start
        (it neither withholds the GPU nor counts toward its fault), restarted after the spacing."""
        log.warning("GPU %s: %s; restarting it", record.spec.gpu_uuid, exc)
        due = max(self._clock(), record.started_at + self.settings.restart_spacing_s)
        return replace(record, up=False, restarting=True, retry_at=due, reason=f"{exc}; restarting it")

    def _failed(self, record: DaemonRecord, exc: MpsControlError) -> DaemonRecord:
        """The record after a failed start: withheld, next try after the backoff."""
        failures = record.failures + 1
        delay = restart_delay(failures, self.settings)
        reason = f"MPS daemon failed to start {failures} time(s): {exc}"
        log.error(
            "GPU %s: %s; its shares are withheld; next try in %.1f s", record.spec.gpu_uuid, reason, delay
        )
        return replace(
            record, restarting=False, failures=failures, retry_at=self._clock() + delay, reason=reason
        )

    def _put(self, record: DaemonRecord) -> None:
        with self._changed:
            if record.spec.gpu_uuid in self._records:
                self._records[record.spec.gpu_uuid] = record
                self._changed.notify_all()

    def _due_fault(self, record: DaemonRecord) -> bool:
        return not record.up and not record.faulted and record.failures >= self.settings.failures_to_fault

    def _publish(self) -> None:
        """Set the gate from the records as they are now; serialised, so two passes never
        overwrite each other with an older view."""
        with self._publishing:
            now, wait_s = self._clock(), self.settings.allocate_wait_s
            held = {uuid: r for uuid, r in self.records().items() if r.held_at(now, restart_wait_s=wait_s)}
            self._gate({uuid: _held_reason(r, now) for uuid, r in held.items()})


def _held_reason(record: DaemonRecord, now: float) -> str:
    if record.withheld or record.down_since is None:
        return record.reason
    return f"MPS daemon down for {now - record.down_since:.0f} s, quit again as it restarts ({record.reason})"


def status(supervisor: MpsSupervisor) -> dict[str, object]:
    """Per GPU: the daemon's directories and pid (the agent's own record), whether it answers or
    is being restarted, restarts, and why it is down."""
    return {
        uuid: {
            "pipeDirectory": str(r.spec.pipe_dir),
            "logDirectory": str(r.spec.log_dir),
            "pid": supervisor.daemons.pid(r.spec),
            "up": r.up,
            "restarting": r.restarting,
            "restarts": r.restarts,
            "failures": r.failures,
            "reason": r.reason,
        }
        for uuid, r in supervisor.records().items()
    }
