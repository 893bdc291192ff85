"""Restoring journalled MIG layouts at start without holding up the GPUs that need nothing.

After a crash or a reboot the journal says what each reshaped GPU should look like. A GPU whose
layout NVML already shows (and with no reshape in flight) is known: it is served at once. A GPU
that must be restored is withheld before the agent's first device list (its whole-GPU ID and any
MIG devices it has now: what the kubelet would see of it is about to change), restored on a
background thread one GPU at a time, and released as soon as its own restore ends. So a slow
restore of GPU 3 (a slow driver makes it take tens of seconds) keeps only GPU 3 out of service.
A restore that fails (a process holds an instance, NVML errors) is logged and the GPU is released
as NVML has it, as a failed ``mig apply`` would; the journal keeps the target for the next apply.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from devicemodel.errors import GpuweaveError
from hardware.mig_ops import GpuInstanceRecord
from mig.journal import GpuRecord
from mig.planner import TargetEntry
from mig.reconciler import MigHooks, MigReconciler, ReshapeResult

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingRestore:
    """A GPU whose journalled layout NVML does not show, and the device IDs withheld until restored."""

    index: int
    target: tuple[TargetEntry, ...] | None  # None: whole GPU, MIG off
    device_ids: tuple[str, ...]


def recover(reconciler: MigReconciler) -> list[ReshapeResult]:
    """Converge every journalled GPU now, in the caller's thread (tools, tests, benchmarks).

    A GPU that cannot converge (a process holds a blocking instance, NVML fails) is logged and
    skipped: the other GPUs still converge; the journal keeps the target for the next apply.
    """
    results: list[ReshapeResult] = []
    for uuid, record in sorted(reconciler.journal.load().gpus.items()):
        gpu = reconciler.gpu_by_uuid(uuid)
        if gpu is None:
            LOG.warning("MIG journal names GPU %s, which this node does not have; skipping", uuid)
            continue
        target = None if record.target is None else [TargetEntry(p.profile, p.start) for p in record.target]
        try:
            results.append(reconciler.apply(gpu.index, target))
        except GpuweaveError as exc:
            LOG.warning("MIG layout of GPU %d not restored at start: %s", gpu.index, exc)
    return results


def pending_restores(reconciler: MigReconciler) -> list[PendingRestore]:
    """Journalled GPUs that need a restore (a reshape in flight, or NVML shows another layout)."""
    pending = []
    for uuid, record in sorted(reconciler.journal.load().gpus.items()):
        gpu = reconciler.gpu_by_uuid(uuid)
        if gpu is None:
            LOG.warning("MIG journal names GPU %s, which this node does not have; skipping", uuid)
            continue
        try:
            mode, records = reconciler.mig_mode(gpu.index), reconciler.records(gpu.index)
        except Exception as exc:  # NVML cannot say: restore it (the apply reports what fails)
            LOG.warning("cannot read the MIG layout of GPU %d (%s); restoring it", gpu.index, exc)
            mode, records = None, ()
        if not record.in_flight and _shows(record, mode, records):
            continue
        target = (
            None if record.target is None else tuple(TargetEntry(p.profile, p.start) for p in record.target)
        )
        mig_ids = tuple(c.mig_uuid for r in records for c in r.computes)
        pending.append(PendingRestore(gpu.index, target, (gpu.uuid, *mig_ids)))
    return pending


def _shows(record: GpuRecord, mode: tuple[bool, bool] | None, records: Sequence[GpuInstanceRecord]) -> bool:
    """NVML shows the journalled layout: the same placements, each with its compute instance."""
    if mode is None:
        return False
    if record.target is None:
        return not mode[0] and not mode[1]
    seen = sorted((r.start, r.size, len(r.computes)) for r in records)
    return mode[0] and seen == sorted((p.start, p.size, 1) for p in record.target)


class Restorer:
    """Withholds the GPUs to restore (before the agent serves), then restores them on a thread."""

    def __init__(self, reconciler: MigReconciler, hooks: MigHooks) -> None:
        self._reconciler = reconciler
        self._hooks = hooks
        self._lock = threading.Lock()
        self._pending: list[PendingRestore] = []
        self._thread: threading.Thread | None = None

    def withhold(self) -> list[int]:
        """Find and withhold the GPUs to restore; the indices, in the order they will be restored."""
        pending = pending_restores(self._reconciler)
        for item in pending:
            self._hooks.withhold(item.device_ids)
        with self._lock:
            self._pending = pending
        return [p.index for p in pending]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mig-restore", daemon=True)
        self._thread.start()

    def restoring(self) -> list[int]:
        """GPUs still withheld for their restore."""
        with self._lock:
            return [p.index for p in self._pending]

    def join(self, timeout_s: float) -> bool:
        """Wait for the restores (tests, orderly stop); True when none is left."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.restoring()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                item = self._pending[0]
            try:
                result = self._reconciler.apply(
                    item.index, None if item.target is None else list(item.target)
                )
                if result.changed:
                    LOG.warning("MIG layout of GPU %d restored from the journal", item.index)
            except Exception as exc:
                LOG.warning(
                    "MIG layout of GPU %d not restored at start: %s; serving it as it is", item.index, exc
                )
            finally:
                self._hooks.release(item.device_ids)
                with self._lock:
                    self._pending.remove(item)
