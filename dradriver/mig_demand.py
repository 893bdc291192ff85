"""MIG instances made at NodePrepareResources and removed at NodeUnprepareResources (``--dra-mig dynamic``).

With partitionable devices the scheduler allocates a MIG *placement* (profile + first memory slot)
whose counters were free; the instance may not exist yet. ``MigOnDemand`` makes it through the MIG
manager's reconciler (plan, journal, NVML, verify: ``mig.reconciler``) and destroys it when its
claim is unprepared. Each reshape's target is the GPU's current instances plus (or minus) exactly
that placement, so no other instance, busy or idle, is touched; one lock serialises them, so two
claims preparing placements on one GPU never plan from the same stale layout. A GPU left with no
instance goes back to MIG off, so a whole-GPU claim can have it again. The reconciler refuses a
placement that overlaps an instance; the claim then fails with that message and the kubelet retries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mig.planner import Instance, TargetEntry


class MigReshaper(Protocol):
    """The part of ``mig.reconciler.MigReconciler`` used here."""

    def current(self, index: int) -> tuple[Instance, ...]: ...

    def apply(self, index: int, target: Sequence[TargetEntry] | None) -> Any: ...


class MigOnDemand:
    def __init__(self, reshaper: MigReshaper, *, refresh: Callable[[], object]) -> None:
        self._reshaper = reshaper
        self._refresh = refresh  # re-discover, so the new instance's UUID is in the device model
        self._lock = threading.Lock()

    def create(self, gpu_index: int, profile: str, start: int) -> bool:
        """Make the instance; False when it exists already."""
        with self._lock:
            current = self._reshaper.current(gpu_index)
            if any(i.profile == profile and i.start == start for i in current):
                return False
            target = [TargetEntry(i.profile, i.start) for i in current] + [TargetEntry(profile, start)]
            self._reshaper.apply(gpu_index, target)
            self._refresh()
            return True

    def destroy(self, gpu_index: int, profile: str, start: int) -> bool:
        """Remove the instance (MIG off when it was the last); False when it is not there."""
        with self._lock:
            current = self._reshaper.current(gpu_index)
            kept = [
                TargetEntry(i.profile, i.start) for i in current if (i.profile, i.start) != (profile, start)
            ]
            if len(kept) == len(current):
                return False
            self._reshaper.apply(gpu_index, kept or None)
            self._refresh()
            return True
