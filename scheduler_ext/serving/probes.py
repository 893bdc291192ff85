"""A second, read-only HTTP listener for the kubelet's probes and metrics scrapes.

The protocol listener serves ``/bind`` and ``/preempt``, so in the sidecar deployment it stays on
loopback. The kubelet's httpGet probes come from the node, not from inside the pod, and cannot
reach loopback; this listener answers only ``GET /healthz``, ``/readyz`` and ``/metrics`` and can
be bound to the pod's address (``--probe-listen``) without exposing any verb that changes state.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.serving.metrics import ExtenderMetrics

LOG = logging.getLogger(__name__)


class ProbeHTTPServer(ThreadingHTTPServer):
    """Health, readiness and metrics over plain HTTP; nothing else."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], *, cache: ClusterCache, metrics: ExtenderMetrics) -> None:
        self.cache = cache
        self.metrics = metrics
        super().__init__(address, ProbeHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="gpuweave-extender-probes", daemon=True)
        thread.start()
        return thread


class ProbeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProbeHTTPServer
    server_version = "gpuweave-extender-probes"
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready = self.server.cache.synced.is_set()
            self._send(200 if ready else 503, b"ok\n" if ready else b"cache not synced\n", "text/plain")
        elif path == "/metrics":
            self.server.metrics.cached_nodes.set(len(self.server.cache.node_names()))
            self._send(200, self.server.metrics.render(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"not found: this port serves GET /healthz, /readyz, /metrics\n", "text/plain")

    def do_POST(self) -> None:
        self.close_connection = True  # the body is not read; do not parse it as the next request
        self._send(405, b"the probe port serves no extender verbs; use the --listen address\n", "text/plain")

    def do_PUT(self) -> None:
        self.do_POST()

    def do_DELETE(self) -> None:
        self.do_POST()

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if status == 405:
            self.send_header("Allow", "GET")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
