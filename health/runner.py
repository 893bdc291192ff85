"""Time-boxed device reads: one long-lived worker thread per key (a GPU, EFA), a deadline per call.

A hung NVML call must fail its GPU closed within ``check_timeout_s`` without holding up the other
GPUs' checks, and without piling up a thread per round while the driver stays wedged: a key whose
previous call is still hung is not given another one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class _Worker:
    """One long-lived thread running the calls of one key (a GPU), one at a time."""

    def __init__(self, key: str) -> None:
        self.requests: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event] | None] = (
            queue.SimpleQueue()
        )
        self.busy = False
        self.thread = threading.Thread(target=self._loop, name=f"health-check-{key}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.requests.get()) is not None:
            fn, box, done = item
            try:
                box.append(("ok", fn()))
            except Exception as exc:
                box.append(("error", exc))
            finally:
                self.busy = False
                done.set()


class TimeoutRunner:
    """Runs calls on one worker thread per key and stops waiting at a deadline.

    A key whose previous call is still hung is not given another one (``start`` says False), so a
    wedged driver costs one stuck thread per GPU, not one per round.
    """

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        self._pending: dict[str, tuple[list[Any], threading.Event]] = {}

    def start(self, key: str, fn: Callable[[], Any]) -> bool:
        """Start ``fn`` for ``key``; False when the previous call for ``key`` is still running."""
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(key)
        if worker.busy:
            return False
        worker.busy = True
        box: list[Any] = []
        done = threading.Event()
        self._pending[key] = (box, done)
        worker.requests.put((fn, box, done))
        return True

    def collect(self, key: str, deadline_s: float) -> tuple[str, Any]:  # status, value
        """("ok", value) | ("error", exception) | ("timeout", None) within ``deadline_s``."""
        box, done = self._pending[key]
        done.wait(max(deadline_s, 0.0))
        return box[0] if box else ("timeout", None)

    def idle(self, timeout_s: float) -> bool:
        """Wait until no call is running (tests); True when idle."""
        return all(done.wait(timeout_s) for _, done in self._pending.values())

    def close(self) -> None:
        """Let idle workers exit; a worker stuck in a hung call exits when the call returns."""
        for worker in self._workers.values():
            worker.requests.put(None)
        for worker in self._workers.values():
            worker.thread.join(0.5 if not worker.busy else 0.0)
