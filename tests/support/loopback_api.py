"""The real ``kubernetes`` client against a test's HTTP handler on 127.0.0.1 port 0.

Transport tests that fake an API server's few paths serve them with ``ThreadingHTTPServer`` and
talk to it through ``client.ApiClient``, so requests, serialisation and errors are the client's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
