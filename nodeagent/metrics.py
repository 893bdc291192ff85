"""Prometheus metrics of one node agent, in the agent's own registry (no global state)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from netio.gate import GateLimits
from netio.probe_http import PROBE_LIMITS, TEXT, Answer, ProbeListener


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


def metrics_listener(
    registry: CollectorRegistry, *, host: str, port: int, limits: GateLimits = PROBE_LIMITS
) -> ProbeListener:
    """``GET /metrics`` (and ``/healthz``) on the node's address, bound, not yet started. It listens
    on the host network, where no NetworkPolicy applies, so its bounds are the gate's: slow
    clients hold no thread, a request head has a deadline, open connections are capped."""

    def render() -> Answer:
        return 200, generate_latest(registry), CONTENT_TYPE_LATEST

    def healthz() -> Answer:
        return 200, b"ok\n", TEXT

    routes = {"/metrics": render, "/healthz": healthz}
    return ProbeListener(
        (host, port),
        routes,
        name="gpuweave-node-agent-metrics",
        not_found=b"not found: this port serves GET /metrics, /healthz\n",
        limits=limits,
    )


def serve_metrics(registry: CollectorRegistry, *, host: str, port: int) -> Callable[[], None]:
    """Serve ``/metrics`` over HTTP; returns the function that stops the server."""
    listener = metrics_listener(registry, host=host, port=port)
    listener.start()
    return listener.stop
