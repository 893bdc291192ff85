"""Single-flight: one call per key at a time; callers that come while it runs get its answer.

kube-scheduler retries a bind whose HTTP call timed out while the first call may still be writing
the Binding. Answering the retry on its own would either take a second device set or (worse)
report success for a bind that then fails. The retry instead waits for the first call and gets
its result, so the scheduler hears what really happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from devicemodel.errors import GpuweaveError

T = TypeVar("T")


class FlightTimeoutError(GpuweaveError):
    """The call in flight did not finish within the follower's wait."""


@dataclass
class _Flight(Generic[T]):
    tag: str
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    failure: BaseException | None = None
    waiters: int = 0


class SingleFlight(Generic[T]):
    """Runs ``call`` once per key at a time (thread-safe)."""

    def __init__(self, *, wait_s: float) -> None:
        self.wait_s = wait_s
        self._flights: dict[str, _Flight[T]] = {}
        self._lock = threading.Lock()

    def waiting(self, key: str) -> int:
        """Callers now waiting on ``key``'s call in flight (for tests and metrics)."""
        with self._lock:
            flight = self._flights.get(key)
            return flight.waiters if flight is not None else 0

    def run(self, key: str, call: Callable[[], T], *, tag: str = "") -> tuple[T, str]:
        """(result, tag of the call that produced it). A follower gets the leader's result and
        the leader's tag (for a bind: the node the first call binds to), so it can tell whether
        the answer is for what it asked. Raises ``FlightTimeoutError`` past ``wait_s``."""
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight(tag=tag)
            else:
                flight.waiters += 1
        if not leader:
            return self._follow(flight)
        try:
            flight.result = call()
        except BaseException as exc:
            flight.failure = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return flight.result, flight.tag

    def _follow(self, flight: _Flight[T]) -> tuple[T, str]:
        finished = flight.done.wait(self.wait_s)
        with self._lock:
            flight.waiters -= 1
        if not finished:
            raise FlightTimeoutError(f"the call in flight did not finish within {self.wait_s:g} s")
        if flight.failure is not None:
            raise flight.failure
        return cast(T, flight.result), flight.tag
