"""A read-only HTTP/1.x listener for probes and metrics scrapes, over the ``gate``.

The kubelet's httpGet probes and Prometheus' scrapes are GETs of one path each, sent at once on a
fresh connection; nothing else needs these ports. So the listener answers ``GET`` and ``HEAD`` of
the paths it is given, one request per connection (``Connection: close``), and refuses anything
else in one line: an unknown path 404, another method 405 (its body is never read), a request
line that is not HTTP/1.x 400. Its limits are the gate's (``PROBE_LIMITS``): a port that listens on
the pod's or the node's address may meet any client on the network.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from netio.gate import Gate, GateLimits, Refusal, http_head_end

Answer = tuple[int, bytes, str]  # status, body, content type
Route = Callable[[], Answer]

# 512 heads in flight: a probe's request is read the moment it arrives, and at the cap a new
# connection displaces the oldest one still sending, so slow clients cannot keep a probe out.
PROBE_LIMITS = GateLimits(
    max_connections=512, deadline_s=5.0, max_head_bytes=32 * 1024, workers=2, displace=True
)
TEXT = "text/plain; charset=utf-8"
_PHRASES = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class ProbeListener:
    """``GET`` of a few paths (``routes``: path without a trailing slash -> its answer)."""

    def __init__(
        self,
        address: tuple[str, int],
        routes: Mapping[str, Route],
        *,
        name: str,
        not_found: bytes = b"not found\n",
        wrong_method: bytes = b"this port serves GET only\n",
        limits: GateLimits = PROBE_LIMITS,
    ) -> None:
        self._routes = dict(routes)
        self._name = name
        self._not_found, self._wrong_method = not_found, wrong_method
        self._socket = socket.create_server(address, backlog=1024)
        try:
            self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
            self._gate = Gate(
                self._socket,
                name=name,
                limits=limits,
                head_end=http_head_end,
                serve=self.answer,
                refuse=self._refusal,
            )
        except BaseException:
            self._socket.close()
            raise

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}"

    def open_connections(self) -> int:
        return self._gate.open_connections()

    def start(self) -> None:
        self._gate.start()

    def stop(self) -> None:
        self._gate.stop(wait=False)
        self._socket.close()

    def answer(self, head: bytes) -> bytes:
        """The whole answer to one request head."""
        words = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(words) != 3:
            return self._encode(400, b"bad request line\n", head=False)
        method, target, version = words
        if not version.startswith("HTTP/1."):
            return self._encode(505, b"HTTP/1.x only\n", head=False)
        if method not in ("GET", "HEAD"):
            return self._encode(405, self._wrong_method, head=False)
        route = self._routes.get(target.split("?", 1)[0].rstrip("/"))
        status, body, content_type = route() if route is not None else (404, self._not_found, TEXT)
        return self._encode(status, body, head=method == "HEAD", content_type=content_type)

    def _refusal(self, why: Refusal) -> bytes:
        if why is Refusal.BUSY:
            return self._encode(503, b"too many connections; retry\n", head=False)
        if why is Refusal.LATE:
            limit = self._gate.limits.deadline_s
            return self._encode(408, f"no whole request head within {limit:g} s\n".encode(), head=False)
        return self._encode(431, b"request head too large\n", head=False)

    def _encode(self, status: int, body: bytes, *, head: bool, content_type: str = TEXT) -> bytes:
        allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
        text = (
            f"HTTP/1.1 {status} {_PHRASES.get(status, 'Unknown')}\r\nServer: {self._name}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n"
        )
        return text.encode("latin-1") + (b"" if head else body)
