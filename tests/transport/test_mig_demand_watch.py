"""The Node and pending-pod watches relist after 410 Gone (real kubernetes client, 127.0.0.1 port 0).

A small API server (tests/support/expiring_api.py) answers every watch from an old resourceVersion
with the ERROR event kube-apiserver sends for one compacted away. The watchers (kubeio's
``ListWatch``) must list again and carry on from the new list: the Node's new labels and declared
layout are picked up, a pod that only the second list shows is added, and one that only the first
showed is dropped (the relist hands it on as DELETED).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION
from kubeio.listwatch import ListWatch
from mig.kube import NodeWatch
from mig.kube_demand import PodCache
from mig.service import LayoutFollower, MigService
from tests.support.expiring_api import Collection, expiring_api
from tests.support.pods import pod_body
from tests.support.sim_mig import sim_mig_service
from tests.support.waiting import poll_until

QUIET = ("kubeio.listwatch", "mig.kube", "mig.kube_demand")  # a relist after 410 warns nobody


@pytest.fixture
def serve() -> Iterator[tuple[client.ApiClient, dict[str, Collection]]]:
    with expiring_api() as served:
        yield served


def node(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "node-a", "labels": labels, "annotations": annotations or {}}}


def mig_service(tmp_path: Path) -> MigService:
    return sim_mig_service(tmp_path)[0]


def wait(check: Any) -> bool:
    return poll_until(check, timeout=10, every=0.05)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in QUIET and r.levelno >= logging.WARNING]


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
    watches = nodes.watches_asked()
    assert len(nodes.lists_asked()) == 2 and watch.watch.relists == 2
    assert all(q["fieldSelector"] == "metadata.name=node-a" for q in nodes.asked)
    assert watches[0]["resourceVersion"] == "5" and watches[-1]["resourceVersion"] == "9"
    assert relabelled.is_set()
    assert not warnings(caplog)


def pod(name: str) -> dict[str, Any]:
    limits = {"nvidia.com/mig-1g.10gb.me": "1", "cpu": "500m"}
    body = pod_body(name, namespace="w", uid=f"uid-{name}", limits=limits, node_selector={"a": "b"})
    body["metadata"]["resourceVersion"] = "3"
    body["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    return body


def test_pod_watch_relists_after_410_and_reads_pods_as_demand_mode_sees_them(serve, caplog):
    api, paths = serve
    pods = paths["/api/v1/pods"] = Collection("Pod", [("5", [pod("old")]), ("9", [pod("new")])])
    changes = threading.Event()
    cache = PodCache(changes.set)
    pods_watch = ListWatch(  # as DemandDriver builds it
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        on_event=cache.event,
        what="pending pods",
        timeout_s=1,
        field_selector="status.phase=Pending",
    )
    pods_watch.start()
    try:
        assert wait(lambda: [p.name for p in cache.pods()] == ["new"])  # "old": a synthesised DELETED
    finally:
        pods_watch.stop()
    [seen] = cache.pods()
    assert seen.requests == {"1g.10gb+me": 1} and seen.unschedulable and seen.phase == "Pending"
    assert dict(seen.node_selector) == {"a": "b"} and seen.claim is None and seen.resource_version == "3"
    assert {q["fieldSelector"] for q in pods.asked} == {"status.phase=Pending"}
    assert changes.is_set()
    assert not warnings(caplog)
