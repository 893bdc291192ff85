"""A resource kind added by registering one module, scheduled and allocated end to end: the
extender's filter, prioritize and bind over HTTP on loopback, then the node agent's
GetPreferredAllocation and Allocate over gRPC on a unix socket, on the same node profile.

The kind (``tests/support/widget_kind.py``) is known to nothing but the registry
(``devicekinds.registry.KINDS``): unregistered, the same pod is refused and the agent serves no
such resource."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from deviceplugin.frontend import device_plugin_agent
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from nodeagent.agent import AgentConfig, NodeAgent
from proto.v1beta1 import api_pb2
from scheduler_ext.app import Extender, build_snapshot_extender
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.widget_kind import RESOURCE_WIDGET, WIDGETS_ENV, TestWidget, registered_widget
from tests.transport.test_extender_http import Client

PROFILES = {"big": "p5.48xlarge", "small": "dgx1-v100"}  # 32 NICs, 4 NICs
NODES = ["big", "small", "cpu-only"]


@pytest.fixture
def widgets() -> Iterator[TestWidget]:
    with registered_widget() as kind:
        yield kind


def _extender(tmp_path: Path) -> Extender:
    items: list[dict[str, Any]] = []
    for name, profile in PROFILES.items():
        inventory = profile_inventory(profile, name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    items.append(node_object("cpu-only"))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    built = build_snapshot_extender(path)
    built.serve(host="127.0.0.1", port=0)
    return built


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Extender, Client]]:
    built = _extender(tmp_path)
    assert built.server is not None
    host, port = built.server.server_address[:2]
    client = Client(f"{host!s}:{port}")
    try:
        yield built, client
    finally:
        client.close()
        built.close()


@pytest.fixture
def agent_and_kubelet() -> Iterator[tuple[NodeAgent, KubeletEmulator]]:
    root = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    inventory = profile_inventory(PROFILES["big"], "big")
    config = AgentConfig(kubelet_dir=root / "k", state_dir=root / "s")
    agent = device_plugin_agent(config, discover=lambda: inventory)
    agent.start()
    try:
        yield agent, kubelet
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def _args(pod: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": NODES}


def _bind(client: Client, name: str, node: str) -> dict[str, Any]:
    status, result = client.post(
        "bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}", "Node": node}
    )
    assert status == 200
    return dict(result)


def _scheduled(served: tuple[Extender, Client]) -> list[str]:
    """Filter, prioritize and bind a pod asking 6 widgets; the widget IDs its assignment names."""
    built, client = served
    pod = pod_object("w6", uid="uid-default-w6", limits={RESOURCE_WIDGET: 6})
    status, result = client.post("filter", _args(pod))
    assert status == 200 and result["Error"] == ""
    assert result["NodeNames"] == ["big"]
    assert "4 healthy of 4" in result["FailedAndUnresolvableNodes"]["small"]
    assert "cpu-only" in result["FailedAndUnresolvableNodes"]
    status, scores = client.post("prioritize", {**_args(pod), "NodeNames": ["big"]})
    assert status == 200 and [s["Host"] for s in scores] == ["big"]
    assert _bind(client, "w6", "big") == {"Error": ""}
    stored = built.cache.pod_object(key="default/w6")
    assert stored is not None
    assignment = PodAssignment.from_annotation(stored["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])
    ids = assignment.containers["main"].devices[RESOURCE_WIDGET]
    assert assignment.node == "big" and len(set(ids)) == 6
    assert all(i.startswith("widget-") for i in ids)
    return ids


@pytest.mark.usefixtures("widgets")
def test_a_registered_kind_is_scheduled_counted_and_allocated_end_to_end(
    served: tuple[Extender, Client], agent_and_kubelet: tuple[NodeAgent, KubeletEmulator]
) -> None:
    built, client = served
    ids = _scheduled(served)
    holding = built.cache.holding("uid-default-w6")
    assert holding is not None and holding.record.devices == frozenset(ids)
    # counted against the node: 26 of big's 32 widgets are left
    greedy = pod_object("w27", uid="uid-default-w27", limits={RESOURCE_WIDGET: 27})
    status, result = client.post("filter", _args(greedy))
    assert status == 200 and result["NodeNames"] == []
    assert "node has 26 free" in result["FailedNodes"]["big"]
    fits = pod_object("w26", uid="uid-default-w26", limits={RESOURCE_WIDGET: 26})
    assert client.post("filter", _args(fits))[1]["NodeNames"] == ["big"]
    assert _bind(client, "w26", "big") == {"Error": ""}
    holding = built.cache.holding("uid-default-w26")
    assert holding is not None and not holding.record.devices & frozenset(ids)

    # the node agent of the same profile serves the kind and allocates the extender's IDs
    _, kubelet = agent_and_kubelet
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_WIDGET)) == 32)
    assert set(ids) <= set(kubelet.devices(RESOURCE_WIDGET))
    response = kubelet.stub(RESOURCE_WIDGET).Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]),
        timeout=10,
    )
    (granted,) = response.container_responses
    assert granted.envs[WIDGETS_ENV] == ",".join(ids)
    assert granted.annotations["gpuweave.io/devices"] == ",".join(ids)
    chosen, preferred = kubelet.allocate(RESOURCE_WIDGET, 2)  # GetPreferredAllocation, then Allocate
    assert len(chosen) == 2 and preferred.envs[WIDGETS_ENV] == ",".join(chosen)
    bad = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["widget-nope"])]
    )
    with pytest.raises(grpc.RpcError) as info:
        kubelet.stub(RESOURCE_WIDGET).Allocate(bad, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_without_the_registry_line_the_kind_is_unknown_to_both_sides(
    served: tuple[Extender, Client], agent_and_kubelet: tuple[NodeAgent, KubeletEmulator]
) -> None:
    _, client = served
    pod = pod_object("w1", uid="uid-default-w1", limits={RESOURCE_WIDGET: 1})
    status, result = client.post("filter", _args(pod))
    assert status == 200 and result["NodeNames"] == []
    assert all(
        "unknown resource 'gpuweave.io/test-widget'" in r
        for r in result["FailedAndUnresolvableNodes"].values()
    )
    _, kubelet = agent_and_kubelet
    assert kubelet.wait_for(lambda: len(kubelet.devices("nvidia.com/gpu")) == 8)
    assert RESOURCE_WIDGET not in kubelet.resources()
