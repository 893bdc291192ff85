"""A budget of long-lived server streams, so they never hold every worker of a gRPC server.

gRPC's threaded server runs each RPC on a worker thread for as long as it lasts, and a watch
stream (the device plugin's ListAndWatch, the DRA plugin's NodeWatchResources) lasts as long as
its client stays. With a fixed pool, a few extra streams from any client on the socket would leave
no worker for Allocate or NodePrepareResources. A server gives its streams one ``StreamBudget``
smaller than its pool: a stream past it is refused at once (RESOURCE_EXHAUSTED) and its thread
freed, and the rest of the pool always answers the unary calls. The kubelet keeps one stream per
service, and gRPC ends a stream whose client went, which frees its place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

log = logging.getLogger(__name__)

MAX_STREAMS = 4  # streams at once per service; servers keep at least as many workers besides


class StreamBudget:
    def __init__(self, what: str, *, limit: int = MAX_STREAMS) -> None:
        self.what = what
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    @contextmanager
    def slot(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Hold one place for the stream's life; refuse the stream when none is free."""
        if not self._slots.acquire(blocking=False):
            log.warning("refused a %s stream: %d are open (the kubelet keeps one)", self.what, self.limit)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.limit} {self.what} streams are open already"
            )
        try:
            yield
        finally:
            self._slots.release()
