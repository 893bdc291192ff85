"""A second, read-only HTTP listener for the kubelet's probes and metrics scrapes.

The protocol listener serves ``/bind`` and ``/preempt``, so in the sidecar deployment it stays on
loopback. The kubelet's httpGet probes come from the node, not from inside the pod, and cannot
reach loopback; this listener answers only ``GET /healthz``, ``/readyz`` and ``/metrics`` and can
be bound to the pod's address (``--probe-listen``) without exposing any verb that changes state.
Bound there, any client on the pod network can reach it, so it runs under the gate's bounds
(``netio.probe_http.PROBE_LIMITS``): slow clients hold no thread, a request head has a deadline,
and open connections are capped without keeping a probe out. The chart's NetworkPolicy (value
``scheduler.probeNetworkPolicy``) narrows who may connect at all.
"""

from __future__ import annotations

from netio.gate import GateLimits
from netio.probe_http import PROBE_LIMITS, TEXT, Answer, ProbeListener
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.serving.metrics import ExtenderMetrics

NOT_FOUND = b"not found: this port serves GET /healthz, /readyz, /metrics\n"
NO_VERBS = b"the probe port serves no extender verbs; use the --listen address\n"


def probe_listener(
    address: tuple[str, int],
    *,
    cache: ClusterCache,
    metrics: ExtenderMetrics,
    limits: GateLimits = PROBE_LIMITS,
) -> ProbeListener:
    """The listener, bound and not yet started."""

    def healthz() -> Answer:
        return 200, b"ok\n", TEXT

    def readyz() -> Answer:
        ready = cache.synced.is_set()
        return (200, b"ok\n", TEXT) if ready else (503, b"cache not synced\n", TEXT)

    def metrics_text() -> Answer:
        metrics.scraped(nodes=len(cache.node_names()), ready=cache.synced.is_set())
        return 200, metrics.render(), "text/plain; version=0.0.4"

    routes = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics_text}
    return ProbeListener(
        address,
        routes,
        name="gpuweave-extender-probes",
        not_found=NOT_FOUND,
        wrong_method=NO_VERBS,
        limits=limits,
    )
