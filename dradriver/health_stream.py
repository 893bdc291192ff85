"""Device health streamed to the kubelet: the optional ``v1.DRAResourceHealth`` service.

A kubelet with ``ResourceHealthStatus`` (beta, on by default since 1.36) calls
``NodeWatchResources`` once the plugin advertises ``v1.DRAResourceHealth`` and shows each allocated
device's health in the pod's ``status.containerStatuses[].allocatedResourcesStatus``. The stream
sends every device of the pool at once, again when a change (``changed()``) alters what it
reports, and at least every ``RESEND_S`` seconds: the kubelet reads a device it has not heard of
within the device's timeout as Unknown. A device is Unhealthy exactly when it carries a taint
(``taints``: Suspect, Probation, Failed, Retired, lost); the message says which.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from nodeagent.streams import StreamBudget
from proto.dra.health.v1 import api_pb2 as health_pb2

SERVICE = "v1.DRAResourceHealth"
RESEND_S = 10.0
TIMEOUT_S = 60  # what each device's report tells the kubelet to wait before calling it Unknown

# (device name, healthy, message) for every device of the pool
HealthReport = Callable[[], Sequence[tuple[str, bool, str]]]


class HealthStream:
    def __init__(self, report: HealthReport, *, pool: str, resend_s: float = RESEND_S) -> None:
        self._report = report
        self._pool = pool
        self._resend_s = resend_s
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = False
        self.streams = 0
        self._budget = StreamBudget("NodeWatchResources")

    def changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def _response(self, report: Sequence[tuple[str, bool, str]]) -> Any:
        now = int(time.time())
        return health_pb2.NodeWatchResourcesResponse(
            devices=[
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(pool_name=self._pool, device_name=name),
                    health=health_pb2.HEALTHY if healthy else health_pb2.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=TIMEOUT_S,
                    message=message,
                )
                for name, healthy, message in report
            ]
        )

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        with self._budget.slot(context):  # the plugin's other workers stay free for prepare calls
            yield from self._watch(context)

    def _watch(self, context: grpc.ServicerContext) -> Iterator[Any]:
        self.streams += 1
        seen, last = -1, 0.0
        sent: tuple[tuple[str, bool, str], ...] | None = None
        try:
            while context.is_active():
                with self._changed:
                    if self._stopping:
                        return
                    version = self._version
                if version != seen:
                    seen = version
                    report = tuple(self._report())
                    if report != sent or time.monotonic() - last >= self._resend_s:
                        yield self._response(report)
                        sent, last = report, time.monotonic()
                with self._changed:
                    self._changed.wait_for(
                        lambda wanted=seen: self._stopping or self._version != wanted,  # type: ignore[misc]
                        timeout=min(1.0, self._resend_s),
                    )
                if time.monotonic() - last >= self._resend_s:
                    seen = -1  # resend the unchanged list before the kubelet's timeout
        finally:
            self.streams -= 1

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        def parsed(raw: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
            return self.NodeWatchResources(health_pb2.NodeWatchResourcesRequest.FromString(raw), context)

        method = grpc.unary_stream_rpc_method_handler(
            parsed, response_serializer=lambda m: m.SerializeToString()
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"NodeWatchResources": method})
