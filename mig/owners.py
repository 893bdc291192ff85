"""One owner per GPU at a time: a MIG reshape or a health remediation, never both.

A reshape destroys and creates instances that a remediation would reset or recreate; run together
they undo each other (a recreate after an operator's reshape puts the old layout back, a GPU
reset in the middle of a reshape wipes half-made instances). Every action that changes a GPU
therefore holds that GPU's lock here for its whole duration: the MIG reconciler for each apply
(a recreate holds it across its destroy and its create), the health remediation for each reset.
Locks are per GPU, so a remediation stuck on GPU 3 holds up GPU 3 only.

The MIG reconciler owns the table; the node agent's composition root hands it to health, so
``health/`` and ``mig/`` stay independent of each other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class GpuOwners:
    """Per-GPU locks (by GPU UUID), with who holds each, for logs and status."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._holders: dict[str, str] = {}

    @contextlib.contextmanager
    def hold(self, gpu_uuid: str, *, who: str) -> Iterator[None]:
        """Own ``gpu_uuid`` for the block, waiting for the current owner to finish first."""
        with self._guard:
            lock = self._locks.setdefault(gpu_uuid, threading.Lock())
        with lock:
            with self._guard:
                self._holders[gpu_uuid] = who
            try:
                yield
            finally:
                with self._guard:
                    self._holders.pop(gpu_uuid, None)

    def holder(self, gpu_uuid: str) -> str | None:
        """What owns the GPU now ("MIG reshape", "health reset"), or None."""
        with self._guard:
            return self._holders.get(gpu_uuid)
