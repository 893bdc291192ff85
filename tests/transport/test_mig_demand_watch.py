"""The Node and pending-pod watches relist after 410 Gone (real kubernetes client, 127.0.0.1 port 0).

A small API server answers list and watch the way the kube-apiserver does for a resourceVersion
that has been compacted away: the watch stream carries one ERROR event with a Status of code 410.
The watchers must list again and carry on from the new list: the Node's new labels and declared
layout are picked up, and so is a pod that only the second list shows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from deviceplugin.listwatch import ListWatch
from gpuweave.node_mig import NodeWatch
from gpuweave.node_mig_demand import PodCache
from mig.service import LayoutFollower, MigService
from tests.support.loopback_api import loopback_api
from tests.support.sim_mig import sim_mig_service
from tests.support.waiting import poll_until
from topology.contracts import MIG_LAYOUT_ANNOTATION

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
        """A list body, or the lines of a watch stream."""
        self.asked.append(query)
        if query.get("watch") == "true":
            latest = self.lists[0][0]
            return [json.dumps(GONE).encode() + b"\n"] if query.get("resourceVersion") != latest else []
        version, items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        body = {"kind": f"{self.kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": version}}
        return [json.dumps(body | {"items": items}).encode()]


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
            data = b"".join(lines)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def serve() -> Iterator[tuple[client.ApiClient, dict[str, Collection]]]:
    paths: dict[str, Collection] = {}
    with loopback_api(handler_for(paths)) as api:
        yield api, paths


def node(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "node-a", "labels": labels, "annotations": annotations or {}}}


def mig_service(tmp_path: Path) -> MigService:
    return sim_mig_service(tmp_path)[0]


def wait(check: Any) -> bool:
    return poll_until(check, timeout=10, every=0.05)


def test_node_watch_relists_after_410_and_applies_the_new_layout(serve, tmp_path, caplog):
    api, paths = serve
    layout = json.dumps({"gpus": {"3": ["3g.40gb", "3g.40gb"]}})
    nodes = paths["/api/v1/nodes"] = Collection(
        "Node", [("5", [node({"gen": "1"})]), ("9", [node({"gen": "2"}, {MIG_LAYOUT_ANNOTATION: layout})])]
    )
    service = mig_service(tmp_path)
    follower = LayoutFollower(lambda: None, service, interval_s=3600)  # only the watch feeds it
    relabelled = threading.Event()
    watch = NodeWatch(api, "node-a", follower=follower, on_labels=relabelled.set, timeout_s=1)
    follower.start()
    watch.start()
    try:
        assert wait(lambda: watch.labels() == {"gen": "2"})
        assert wait(lambda: len(service.reconciler.current(3)) == 2)
    finally:
        watch.stop()
        follower.stop()
    lists = [q for q in nodes.asked if q.get("watch") != "true"]
    watches = [q for q in nodes.asked if q.get("watch") == "true"]
    assert len(lists) == 2 and all(q["fieldSelector"] == "metadata.name=node-a" for q in nodes.asked)
    assert watches[0]["resourceVersion"] == "5" and watches[-1]["resourceVersion"] == "9"
    assert relabelled.is_set()
    assert not [r for r in caplog.records if r.name == "gpuweave.node_mig" and r.levelname == "WARNING"]


def pod(name: str) -> dict[str, Any]:
    limits = {"nvidia.com/mig-1g.10gb.me": "1", "cpu": "500m"}
    return {
        "metadata": {"name": name, "namespace": "w", "uid": f"uid-{name}", "resourceVersion": "3"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], "nodeSelector": {"a": "b"}},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def test_pod_watch_relists_after_410_and_reads_pods_as_demand_mode_sees_them(serve, caplog):
    api, paths = serve
    pods = paths["/api/v1/pods"] = Collection("Pod", [("5", [pod("old")]), ("9", [pod("new")])])
    changes = threading.Event()
    cache = PodCache(changes.set)
    pods_watch = ListWatch(
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        on_list=cache.replace,
        on_event=cache.event,
        what="pods",
        timeout_s=1,
        field_selector="status.phase=Pending",
    )
    thread = threading.Thread(target=pods_watch.run)
    thread.start()
    try:
        assert wait(lambda: [p.name for p in cache.pods()] == ["new"])
    finally:
        pods_watch.stop()
        thread.join(timeout=10)
    [seen] = cache.pods()
    assert seen.requests == {"1g.10gb+me": 1} and seen.unschedulable and seen.phase == "Pending"
    assert dict(seen.node_selector) == {"a": "b"} and seen.claim is None and seen.resource_version == "3"
    assert {q["fieldSelector"] for q in pods.asked} == {"status.phase=Pending"}
    assert changes.is_set()
    assert not [r for r in caplog.records if r.name == "gpuweave.node_mig" and r.levelname == "WARNING"]
