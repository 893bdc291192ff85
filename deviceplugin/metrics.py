"""Prometheus metrics of one node agent, in the agent's own registry (no global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.registrations = Counter(
            "gpuweave_deviceplugin_registrations",
            "Successful Register calls to the kubelet, per resource",
            ["resource"],
            registry=self.registry,
        )
        self.allocations = Counter(
            "gpuweave_deviceplugin_allocations",
            "Allocate container requests answered, per resource and outcome",
            ["resource", "outcome"],
            registry=self.registry,
        )
        self.preferred_fallbacks = Counter(
            "gpuweave_deviceplugin_preferred_allocation_errors",
            "GetPreferredAllocation calls answered empty because of an internal error",
            ["resource"],
            registry=self.registry,
        )
        self.handoff = Counter(
            "gpuweave_deviceplugin_handoff",
            "Handoff outcomes: at GetPreferredAllocation followed, followed_earliest, mismatch, "
            "no_assignment, waited (for the pod watch); after admission admitted_mismatch, corrected",
            ["resource", "outcome"],
            registry=self.registry,
        )
        self.unhealthy_devices = Gauge(
            "gpuweave_deviceplugin_unhealthy_devices",
            "Devices reported Unhealthy to the kubelet, per resource",
            ["resource"],
            registry=self.registry,
        )


def serve_metrics(registry: CollectorRegistry, *, host: str, port: int) -> Callable[[], None]:
    """Serve ``/metrics`` over HTTP; returns the function that stops the server."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop
