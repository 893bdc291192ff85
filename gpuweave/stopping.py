"""How a long-running command waits for SIGTERM or SIGINT on its main thread.

CPython runs a Python signal handler on the main thread, between bytecodes. When the kernel
delivers the signal to another thread (gRPC's, health's), a main thread blocked in a lock
acquire without a timeout is not woken, so the handler, and the shutdown it starts, waits until
something else wakes it: a node agent was seen still serving 30 s after SIGTERM, then aborted.
Waiting in short slices lets the handler run within ``POLL_S`` whichever thread got the signal.
"""

from __future__ import annotations

import signal
import threading

POLL_S = 0.5


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (call on the main thread, before the wait)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def wait_for(stop: threading.Event) -> None:
    """Block the main thread until ``stop`` is set, waking every ``POLL_S`` so handlers can run."""
    while not stop.wait(POLL_S):
        pass
