"""A change counter a reconciler can wait on: the base of the views the node agent's loops follow
(the pod view of device-plugin hand-off, the node's IMEX domain in DRA mode)."""

from __future__ import annotations

import threading


class VersionedState:
    """A lock, a version that every change moves, and a condition to wait for the next change.

    Subclasses change their state under ``self._changed`` (which holds ``self._lock``) and call
    ``_touch`` there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 0

    def _touch(self) -> None:
        """Count one change and wake the waiters; call with ``self._changed`` held."""
        self._version += 1
        self._changed.notify_all()

    def version(self) -> int:
        with self._lock:
            return self._version

    def wait_for_change(self, version: int, *, timeout: float) -> bool:
        """Block until the state moves past ``version`` or ``timeout`` seconds pass; True if it moved."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version != version, timeout=timeout)
