"""The extender over real HTTP on 127.0.0.1: kube-scheduler-shaped JSON in, protocol JSON out."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, ANNOTATION_PLACEMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender


def _snapshot(tmp_path: Path) -> Path:
    items: list[dict[str, Any]] = []
    for name, profile in (("h100-a", "p5.48xlarge"), ("h100-b", "p5.48xlarge"), ("v100-a", "dgx1-v100")):
        inventory = profile_inventory(profile, name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    items.append(node_object("cpu-only"))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return path


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[tuple[Extender, str]]:
    built = build_snapshot_extender(_snapshot(tmp_path))
    built.serve(host="127.0.0.1", port=0)
    assert built.server is not None
    host, port = built.server.server_address[:2]
    try:
        yield built, f"{host!s}:{port}"
    finally:
        built.close()


class Client:
    """One keep-alive connection, as kube-scheduler's HTTP client keeps one."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=10)

    def post(self, verb: str, body: object | bytes) -> tuple[int, Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.connection.request("POST", f"/{verb}", body=raw, headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if response.status == 200 else data.decode()

    def get(self, path: str) -> tuple[int, str]:
        self.connection.request("GET", path)
        response = self.connection.getresponse()
        return response.status, response.read().decode()

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def client(extender: tuple[Extender, str]) -> Iterator[Client]:
    made = Client(extender[1])
    try:
        yield made
    finally:
        made.close()


NODES = ["h100-a", "h100-b", "v100-a", "cpu-only"]


def _args(pod: dict[str, Any], names: list[str] = NODES) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def test_filter_passes_fitting_nodes_and_marks_hopeless_ones_unresolvable(client: Client) -> None:
    pod = pod_object("train", limits={RESOURCE_GPU: 8}, annotations={ANNOTATION_PLACEMENT: "nvlink-required"})
    status, result = client.post("filter", _args(pod))
    assert status == 200
    assert result["NodeNames"] == ["h100-a", "h100-b"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"v100-a", "cpu-only"}
    assert "NVLink" in result["FailedAndUnresolvableNodes"]["v100-a"]
    assert result["Error"] == ""


def test_pass_through_pod_gets_every_node_and_is_steered_off_idle_gpus(client: Client) -> None:
    """A pod asking for no device passes every node; if a profile sends it to prioritize, the node
    without GPUs ranks best (its CPU strands no GPU there) and a pod asking nothing gets no opinion."""
    pod = pod_object("web", limits={"cpu": "2"})
    status, result = client.post("filter", _args(pod))
    assert status == 200 and result["NodeNames"] == NODES and not result["FailedNodes"]
    status, scores = client.post("prioritize", _args(pod))
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert status == 200 and by_host["cpu-only"] == 10 and max(by_host.values()) == 10
    empty = pod_object("sleeper")
    empty["spec"]["containers"][0]["resources"] = {}
    status, scores = client.post("prioritize", _args(empty))
    assert status == 200 and {s["Score"] for s in scores} == {0}


def test_bind_records_assignment_and_blocks_double_booking(
    extender: tuple[Extender, str], client: Client
) -> None:
    built, _ = extender
    first = pod_object("a", limits={RESOURCE_GPU: 8})
    second = pod_object("b", limits={RESOURCE_GPU: 1})
    assert client.post("filter", _args(first))[0] == 200
    assert client.post("filter", _args(second))[0] == 200
    status, result = client.post(
        "bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-default-a", "Node": "h100-a"}
    )
    assert status == 200 and result == {"Error": ""}
    holding = built.cache.holding("uid-default-a")
    assert holding is not None and len(holding.record.devices) == 8
    status, result = client.post(
        "bind", {"PodName": "b", "PodNamespace": "default", "PodUID": "uid-default-b", "Node": "h100-a"}
    )
    assert status == 200 and "no longer fits" in result["Error"]
    assert built.cache.holding("uid-default-b") is None
    status, result = client.post("filter", _args(second))
    assert "h100-a" in result["FailedNodes"] and "h100-b" in result["NodeNames"]


def test_prioritize_scores_are_within_0_and_10(client: Client) -> None:
    pod = pod_object("pair", limits={RESOURCE_GPU: 2})
    status, scores = client.post("prioritize", _args(pod))
    assert status == 200
    assert [s["Host"] for s in scores] == NODES
    assert all(0 <= s["Score"] <= 10 for s in scores)
    assert {s["Host"]: s["Score"] for s in scores}["cpu-only"] == 0


def test_the_learned_workload_is_readable_and_counts_each_pod_once(client: Client) -> None:
    for name in ("w1", "w2", "w1"):  # w1 filtered twice, as a retried pod is
        client.post("filter", _args(pod_object(name, limits={RESOURCE_GPU: 1})))
    status, body = client.get("/workload")
    document = json.loads(body)
    assert status == 200 and document["kind"] == "Workload"
    assert document["status"] == {"version": 0, "podsSeen": 2, "pinned": False}
    assert {s["gpuCount"] for s in document["shapes"]} >= {1, 8}  # the cold-start prior, until refresh


def test_assignment_annotation_round_trips(extender: tuple[Extender, str], client: Client) -> None:
    built, _ = extender
    pod = pod_object("quad", limits={RESOURCE_GPU: 4})
    client.post("filter", _args(pod))
    status, result = client.post(
        "bind", {"PodName": "quad", "PodNamespace": "default", "PodUID": "", "Node": "h100-b"}
    )
    assert status == 200 and result["Error"] == ""
    stored = built.cache.pod_object(key="default/quad")
    assert stored is not None
    assignment = PodAssignment.from_annotation(stored["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
    assert assignment.node == "h100-b"
    assert len(assignment.containers["main"].devices[RESOURCE_GPU]) == 4
