"""Polling until a condition holds, for tests that watch another thread or process make progress.

``poll_until`` answers whether the condition came true in time; ``wait_until`` fails the test
naming what it waited for. (tests/support/control_plane.py's ``wait_for`` returns the value a
check produced, for the e2e suite.)
"""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(check: Callable[[], object], *, timeout: float, every: float = 0.1) -> bool:
    """Call ``check`` every ``every`` seconds until it is truthy (True) or ``timeout`` passed (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def wait_until(what: str, check: Callable[[], object], *, timeout: float = 60.0, every: float = 0.1) -> None:
    """``poll_until``, raising AssertionError("timed out waiting for WHAT") when time runs out."""
    if not poll_until(check, timeout=timeout, every=every):
        raise AssertionError(f"timed out waiting for {what}")
