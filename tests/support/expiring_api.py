"""A loopback API server whose watches expire: every watch from an old resourceVersion gets 410 Gone.

It answers list and watch the way kube-apiserver does for a resourceVersion compacted away: the
watch stream carries one ERROR event with a Status of code 410. Each collection serves successive
list answers (the last one repeats), so a test sees what a watcher makes of the list it gets after
the 410: what it learns from it, and what it drops because the new list no longer has it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

from tests.support.loopback_api import answer_json, loopback_api

GONE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version: 5 (9)",
        "reason": "Expired",
        "code": 410,
    },
}


@dataclass
class Collection:
    """Successive list answers (the last one repeats) and what the clients asked."""

    kind: str
    lists: list[tuple[str, list[dict[str, Any]]]]  # (resourceVersion, items)
    asked: list[dict[str, str]] = field(default_factory=list)

    def answer(self, query: dict[str, str]) -> list[bytes]:
        """A list body, or the lines of a watch stream (410 Gone unless from the latest list)."""
        self.asked.append(query)
        if query.get("watch") == "true":
            latest = self.lists[0][0]
            return [json.dumps(GONE).encode() + b"\n"] if query.get("resourceVersion") != latest else []
        version, items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        body = {"kind": f"{self.kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": version}}
        return [json.dumps(body | {"items": items}).encode()]

    def lists_asked(self) -> list[dict[str, str]]:
        return [q for q in self.asked if q.get("watch") != "true"]

    def watches_asked(self) -> list[dict[str, str]]:
        return [q for q in self.asked if q.get("watch") == "true"]


def handler_for(paths: dict[str, Collection]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            found = paths.get(url.path)
            if found is None:
                self.send_response(404)
                self.end_headers()
                return
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            lines = found.answer(query)
            if query.get("watch") == "true" and not lines:
                threading.Event().wait(0.2)  # an idle watch: nothing happens until it ends
            answer_json(self, 200, b"".join(lines))

    return Handler


@contextlib.contextmanager
def expiring_api() -> Iterator[tuple[client.ApiClient, dict[str, Collection]]]:
    """A client, and the collections it serves by path (``/api/v1/nodes``): fill them in."""
    paths: dict[str, Collection] = {}
    with loopback_api(handler_for(paths)) as api:
        yield api, paths
