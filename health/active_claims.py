"""A pod that claims a GPU mid-check wins: the run lets go of it before the pod gets it.

An active check withholds its GPUs (the agent's ``active-check`` gate) before it confirms they are
idle, then exercises them. The kubelet chooses devices from the list it last received, so a pod it
admitted just before the withholding reached it still asks for one of them: in Allocate (device
plugin) or at prepare (DRA), after the check began. ``RunClaims`` makes that safe:

- the runner names every GPU of a run here (``begin``) *before* it withholds them and before it
  asks whether a pod holds one; Allocate records its grant (the agent's ``AllocationLog``) *before*
  it calls ``claim``. So either the runner's check of who holds the GPU sees the grant (the GPU is
  skipped), or ``claim`` sees the GPU in the run;
- ``claim`` marks the GPU claimed, cancels the batch exercising it (the exerciser stops and
  returns; its checks are ``not-run``, never hung) and waits for that batch to end, at most
  ``wait_s``; a batch not yet begun leaves the GPU out. Then the GPU's hold is lifted and Allocate
  goes on: the pod gets the GPU, and the exerciser no longer touches it.

Thread-safe: ``claim`` runs on the kubelet's gRPC threads, the rest on the run's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from devicemodel.inventory import Gpu

log = logging.getLogger(__name__)
CLAIM_WAIT_S = 10.0  # the longest Allocate waits for a cancelled batch to stop
CLAIMED_REASON = "a pod claimed it during the check"

Hold = Callable[[Mapping[str, str]], None]


@dataclass
class _Batch:
    gpus: frozenset[str]
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class RunClaims:
    def __init__(self, hold: Hold | None, *, reason: str, wait_s: float = CLAIM_WAIT_S) -> None:
        self._hold = hold
        self._reason = reason
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()  # pushes apply in the order their contents were read
        self._run: set[str] = set()  # GPUs of the run now (UUIDs), claimed ones taken out
        self._held = False  # whether the run withholds its GPUs (the burn-in does not)
        self._claimed: set[str] = set()
        self._batch: _Batch | None = None

    def begin(self, gpus: Sequence[Gpu], *, hold: bool) -> None:
        """Name the run's GPUs, then withhold them (``hold``); in this order (module docstring)."""
        with self._lock:
            self._run = {g.uuid for g in gpus}
            self._claimed = set()
            self._held = hold
        self._push()

    def keep(self, gpus: Sequence[Gpu]) -> None:
        """Narrow the run to ``gpus`` (the others were busy): their holds are lifted."""
        with self._lock:
            self._run &= {g.uuid for g in gpus}
        self._push()

    def end(self) -> None:
        with self._lock:
            self._run = set()
            self._batch = None
        self._push()

    @property
    def claimed(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._claimed)

    def start_batch(self, gpus: Collection[str]) -> threading.Event | None:
        """The batch's cancel event, or None when a pod claimed one of its GPUs already (the caller
        leaves those out first, with ``unclaimed``)."""
        with self._lock:
            if set(gpus) & self._claimed:
                return None
            self._batch = _Batch(frozenset(gpus))
            return self._batch.cancel

    def unclaimed(self, gpus: Collection[str]) -> set[str]:
        with self._lock:
            return set(gpus) - self._claimed

    def end_batch(self) -> None:
        with self._lock:
            batch, self._batch = self._batch, None
        if batch is not None:
            batch.done.set()

    def claim(self, gpus: Collection[str]) -> None:
        """A pod was granted ``gpus`` (UUIDs): any of them in the run leaves it first (see above)."""
        with self._lock:
            hit = set(gpus) & self._run
            if not hit:
                return
            self._claimed |= hit
            batch = self._batch if self._batch is not None and hit & self._batch.gpus else None
            if batch is not None:
                batch.cancel.set()
        log.warning("a pod claimed GPU(s) %s during an active check: the check lets go of them", sorted(hit))
        if batch is not None and not batch.done.wait(self.wait_s):
            log.error(
                "the exerciser did not stop within %.0f s of a cancel; the pod gets the GPU anyway",
                self.wait_s,
            )
        with self._lock:
            self._run -= hit
        self._push()

    def _push(self) -> None:
        """Withhold exactly the run's GPUs now (none when the run does not hold)."""
        if self._hold is None:
            return
        with self._push_lock:
            with self._lock:
                reasons = {uuid: self._reason for uuid in sorted(self._run)} if self._held else {}
            try:
                self._hold(reasons)
            except Exception:
                log.exception("cannot withhold the GPUs under an active check")
