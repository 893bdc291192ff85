"""The node-annotation reader uses the real kubernetes client over HTTP (127.0.0.1, port 0)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubernetes import client

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION
from mig.kube import node_annotation_reader
from tests.support.loopback_api import answer_json, loopback_api


def handler_for(nodes: dict[str, dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class NodeHandler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path.split("?")[0].removeprefix("/api/v1/nodes/")
            found = nodes.get(name)
            missing = {"kind": "Status", "code": 404, "reason": "NotFound"}
            answer_json(self, 200 if found else 404, found or missing)

    return NodeHandler


@pytest.fixture
def cluster() -> Iterator[tuple[client.ApiClient, dict[str, dict[str, Any]]]]:
    nodes: dict[str, dict[str, Any]] = {}
    with loopback_api(handler_for(nodes)) as api_client:
        yield api_client, nodes


def node(annotations: dict[str, str] | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "annotations": annotations}}


def test_reads_the_layout_annotation(cluster: tuple[client.ApiClient, dict[str, dict[str, Any]]]) -> None:
    api, nodes = cluster
    read = node_annotation_reader(api, "node-a")
    assert read() is None  # no Node object yet
    nodes["node-a"] = node(None)
    assert read() is None
    layout = json.dumps({"gpus": {"3": ["3g.40gb", "3g.40gb"]}})
    nodes["node-a"] = node({MIG_LAYOUT_ANNOTATION: layout, "other": "x"})
    assert read() == layout
