"""A node removed by a scale-down: its GpuNodeInventory is owned by its Node, and until it is gone
neither the extender nor `gpuweave status` counts its GPUs.

The node agent's publisher (``deviceplugin.kube.Publisher``, with the agent's own node-bound
token, through the base's admission policies) writes an owner reference to its Node, so
kube-controller-manager's garbage collector deletes the inventory with the Node. The harness runs
no garbage collector, so here the inventory stays after the Node's delete, as it does in a
cluster for the moments before the collector runs (or with an agent that set no owner
reference): the extender's capacity metrics and its filter, and `gpuweave status` against the
same API server, must leave it out.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.sharing import SharingPlan
from deviceplugin.kube import Publisher
from gpuweave.cli import main
from gpuweave.simulate.cluster_objects import profile_inventory
from tests.e2e.cluster import ControlPlane, Process, start_extender, wait_for

pytestmark = pytest.mark.e2e

NODE = "e2e-scaled-down"
PROFILE = "p4d.24xlarge"  # a product no other e2e node has: the capacity metric is this node's alone
INVENTORIES = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


def _gpus_of_product(url: str, product: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpuweave_extender_gpus" and sample.labels.get("product") == product
    )


@pytest.fixture(scope="module")
def extender(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[tuple[Process, str]]:
    process, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="extender-scale-down")
    try:
        yield process, url
    finally:
        process.stop()
        plane.forget_node(NODE)


def _status(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["status", "--kubeconfig", str(plane.admin_kubeconfig), "--json"]) == 0
    loaded: dict[str, Any] = json.loads(capsys.readouterr().out)
    return loaded


def test_a_deleted_nodes_inventory_is_owned_by_it_and_counted_nowhere(
    plane: ControlPlane, extender: tuple[Process, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = extender
    inventory = profile_inventory(PROFILE, NODE)
    product = inventory.gpus[0].product
    node = plane.core.create_node({"metadata": {"name": NODE}})
    resources = {RESOURCE_GPU: "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    plane.core.patch_node_status(NODE, {"status": {"capacity": resources, "allocatable": resources}})
    agent = config.new_client_from_config(config_file=str(plane.node_agent_kubeconfig(NODE)))
    try:
        Publisher(agent, snapshot=lambda: (inventory, {}, {}), sharing=SharingPlan()).publish_once()
    finally:
        agent.close()
    custom = client.CustomObjectsApi(plane.api)
    published = custom.get_cluster_custom_object(*INVENTORIES, NODE)
    assert published["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node.metadata.uid}
    ]
    wait_for("the extender to count the node's GPUs", lambda: _gpus_of_product(url, product) == 8)
    assert NODE in {n["name"] for n in _status(plane, capsys)["nodes"]}

    plane.core.delete_node(NODE)  # a scale-down; no garbage collector runs here: the inventory stays
    assert custom.get_cluster_custom_object(*INVENTORIES, NODE)["metadata"]["name"] == NODE
    wait_for("the extender to drop the node's GPUs", lambda: _gpus_of_product(url, product) == 0)
    shown = _status(plane, capsys)
    assert NODE not in {n["name"] for n in shown["nodes"]}
    assert NODE not in shown["withoutInventory"]
