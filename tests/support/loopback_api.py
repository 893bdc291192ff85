"""The real ``kubernetes`` client against a test's HTTP handler on 127.0.0.1 port 0.

Transport tests that fake an API server's few paths serve them with ``ThreadingHTTPServer`` and
talk to it through ``client.ApiClient``, so requests, serialisation and errors are the client's own.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client


@contextlib.contextmanager
def loopback_api(handler: type[BaseHTTPRequestHandler]) -> Iterator[client.ApiClient]:
    """An ApiClient for ``handler`` served on a thread; the server and client close on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    api = client.ApiClient(config)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]
        server.shutdown()
        server.server_close()
        thread.join()


def answer_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Send ``body`` (JSON-encoded unless it is bytes already) with ``status`` and its length."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
