"""One supervised MPS control daemon per fractional GPU; a GPU's shares are served only while it answers.

A fractional share's limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
bind only inside MPS: a CUDA client that finds no daemon on its pipe directory runs outside MPS,
unlimited. So supervision fails closed:

- ``wanted_daemons`` (pure) says which GPUs need a daemon: fractional, not MIG, not retired.
- ``MpsSupervisor.check`` (each health round) starts missing daemons, stops unwanted ones and
  queries every running one; a daemon that does not answer puts its GPU under the ``mps`` gate at
  once (that GPU's shares Unhealthy, never a sibling's) and is restarted, immediately the first
  time, then with exponential backoff. After ``failures_to_fault`` failed starts in a row it is
  handed to the health engine as a fault of that GPU (``MpsRoundHook``).
- ``pipe_directory`` answers Allocate: the GPU's own pipe directory after a live query, or a
  rejection, so no share is granted on a GPU whose daemon is down, even between rounds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingMode, SharingPlan
from deviceplugin.errors import AllocationRejectedError
from hardware.mps import MpsControlError, MpsDaemons, MpsDaemonSpec

log = logging.getLogger(__name__)

GATE = "mps"  # the agent gate holding GPUs whose daemon is down
HOST_BASE_DIR = "/run/gpuweave/mps"


@dataclass(frozen=True)
class MpsSettings:
    base_dir: Path
    restart_base_s: float = 1.0  # the second restart waits this; each further one doubles it
    restart_cap_s: float = 60.0
    failures_to_fault: int = 3  # failed starts in a row before the GPU is faulted in health


@dataclass(frozen=True)
class DaemonRecord:
    spec: MpsDaemonSpec
    up: bool = False
    failures: int = 0  # failed starts since it last answered
    retry_at: float = 0.0
    reason: str = "MPS daemon not started yet"
    generation: int = 0  # successful starts, so a stale failed query cannot mark a new daemon down
    faulted: bool = False  # handed to the health engine since it last answered
    restarts: int = 0


def spec_for(uuid: str, base_dir: Path, *, percentage: int | None, pinned_mib: int | None) -> MpsDaemonSpec:
    gpu_dir = base_dir / uuid
    return MpsDaemonSpec(uuid, gpu_dir / "pipe", gpu_dir / "log", percentage, pinned_mib)


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
    """Keeps one daemon per wanted GPU, publishes the GPUs without one to ``gate``."""

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
        self._ops = threading.Lock()  # one start/stop/check pass at a time
        self._publishing = threading.Lock()  # the gate is computed and set as one step
        self._records: dict[str, DaemonRecord] = {}

    def records(self) -> dict[str, DaemonRecord]:
        with self._lock:
            return dict(self._records)

    def check(self, wanted: Mapping[str, MpsDaemonSpec]) -> list[DaemonRecord]:
        """One supervision pass; returns the records that just crossed ``failures_to_fault``."""
        with self._ops:
            self._reconcile(wanted)
            for uuid in list(self.records()):
                self._check_one(uuid)
            self._publish()
            to_fault = [r for r in self.records().values() if self._due_fault(r)]
            with self._lock:
                for record in to_fault:
                    self._records[record.spec.gpu_uuid] = replace(record, faulted=True)
            return to_fault

    def stop_all(self) -> None:
        with self._ops:
            self._reconcile({})
            self._publish()

    def kill(self, gpu_uuid: str) -> str:
        """Kill one GPU's daemon as a crash would (fault injection)."""
        record = self.records().get(gpu_uuid)
        if record is None:
            raise MpsControlError(f"GPU {gpu_uuid} has no MPS daemon: it is not fractional")
        return self.daemons.kill(record.spec)

    def pipe_directory(self, gpu_uuid: str) -> str:
        """The pipe directory of the GPU's live daemon (queried now), else ``AllocationRejectedError``."""
        record = self.records().get(gpu_uuid)
        if record is None or not record.up:
            why = record.reason if record else "no MPS daemon is supervised for it yet"
            raise AllocationRejectedError(
                f"GPU {gpu_uuid}: no live MPS control daemon ({why}); shares on it are withheld "
                "until the node agent restarts the daemon"
            )
        try:
            self.daemons.query(record.spec)
        except MpsControlError as exc:
            self._mark_down(record, f"MPS daemon stopped answering: {exc}")
            self._publish()
            raise AllocationRejectedError(
                f"GPU {gpu_uuid}: its MPS control daemon does not answer ({exc}); share withheld"
            ) from exc
        return str(record.spec.pipe_dir)

    # ---- one pass -----------------------------------------------------------------------------
    def _reconcile(self, wanted: Mapping[str, MpsDaemonSpec]) -> None:
        for uuid, record in self.records().items():
            if wanted.get(uuid) == record.spec:
                continue
            self._stop(record)
            with self._lock:
                del self._records[uuid]
        with self._lock:
            for uuid, spec in wanted.items():
                self._records.setdefault(uuid, DaemonRecord(spec))

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

    def _check_one(self, uuid: str) -> None:
        record = self.records()[uuid]
        if record.up:
            try:
                self.daemons.query(record.spec)
                return
            except MpsControlError as exc:
                record = self._mark_down(record, f"MPS daemon stopped answering: {exc}")
                self._publish()  # withheld now, before the restart is tried
        if self._clock() >= record.retry_at:
            self._start(record)

    def _start(self, record: DaemonRecord) -> None:
        uuid = record.spec.gpu_uuid
        try:
            self.daemons.start(record.spec)
        except MpsControlError as exc:
            failures = record.failures + 1
            retry = self._clock() + restart_delay(failures, self.settings)
            reason = f"MPS daemon failed to start {failures} time(s): {exc}"
            log.error("GPU %s: %s; next try in %.1f s", uuid, reason, retry - self._clock())
            self._put(replace(record, failures=failures, retry_at=retry, reason=reason))
            return
        restarted = record.generation > 0
        up = replace(
            record,
            up=True,
            failures=0,
            retry_at=0.0,
            reason="",
            generation=record.generation + 1,
            faulted=False,
            restarts=record.restarts + int(restarted),
        )
        self._put(up)
        level = logging.WARNING if restarted else logging.INFO  # a restart follows a failure
        log.log(
            level,
            "GPU %s: MPS control daemon %s on %s",
            uuid,
            "restarted" if restarted else "started",
            record.spec.pipe_dir,
        )

    def _mark_down(self, record: DaemonRecord, reason: str) -> DaemonRecord:
        with self._lock:
            current = self._records.get(record.spec.gpu_uuid)
            if current is None or current.generation != record.generation or not current.up:
                return current or record
            down = replace(current, up=False, reason=reason)
            self._records[record.spec.gpu_uuid] = down
        log.error("GPU %s: %s; its shares are withheld", record.spec.gpu_uuid, reason)
        return down

    def _put(self, record: DaemonRecord) -> None:
        with self._lock:
            if record.spec.gpu_uuid in self._records:
                self._records[record.spec.gpu_uuid] = record

    def _due_fault(self, record: DaemonRecord) -> bool:
        return not record.up and not record.faulted and record.failures >= self.settings.failures_to_fault

    def _publish(self) -> None:
        """Set the gate from the records as they are now; serialised, so an Allocate that just
        found a daemon dead and a round pass never overwrite each other with an older view."""
        with self._publishing:
            self._gate({uuid: r.reason for uuid, r in self.records().items() if not r.up})


def status(supervisor: MpsSupervisor) -> dict[str, object]:
    """Per GPU: the daemon's directories, whether it answers, restarts and the reason it is down."""
    return {
        uuid: {
            "pipeDirectory": str(r.spec.pipe_dir),
            "logDirectory": str(r.spec.log_dir),
            "up": r.up,
            "restarts": r.restarts,
            "failures": r.failures,
            "reason": r.reason,
        }
        for uuid, r in supervisor.records().items()
    }
