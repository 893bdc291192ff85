"""The node agent against a real kube-apiserver (tests/e2e/harness): publishing and the handoff.

The agent process runs with ``--kubeconfig``: it must create its GpuNodeInventory (spec + status),
label its Node as GPU Feature Discovery does, keep the status in step with health, and, for a
Pending pod on its node carrying the extender's assignment, answer GetPreferredAllocation with
exactly the assigned devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from nodeagent.control import call_agent
from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode
from tests.support.control_plane import ControlPlane
from tests.support.waiting import wait_until as wait

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
CRD = ROOT / "manifests" / "crds" / "gpunodeinventories.yaml"
NODE = "gpu-node-1"
GROUP = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        plane.apply([yaml.safe_load(CRD.read_text())])  # waits until the CRD is established
        plane.core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        plane.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield str(plane.admin_kubeconfig)
    finally:
        plane.stop()


class Running(AgentNode):
    def __init__(self, kubeconfig: str) -> None:
        super().__init__("p5.48xlarge", extra=("--kubeconfig", kubeconfig), node=NODE)
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    def inventory(self) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_cluster_custom_object(*GROUP, NODE))
        except client.ApiException:
            return None

    def close(self) -> None:
        self.api.close()
        super().close()


@pytest.fixture
def running(kubeconfig: str) -> Iterator[Running]:
    node = Running(kubeconfig)
    try:
        wait("GPUs registered", lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8)
        yield node
    finally:  # a setup that fails stops the agent too
        node.close()


def test_publishes_inventory_labels_and_health(running: Running) -> None:
    wait("GpuNodeInventory with status", lambda: bool((running.inventory() or {}).get("status")))
    published = running.inventory()
    assert published is not None
    assert len(published["spec"]["gpus"]) == 8
    # one publish writes the inventory, then its status, then the Node's labels
    wait("Node labels", lambda: bool(running.core.read_node(NODE).metadata.labels))
    labels = running.core.read_node(NODE).metadata.labels
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["gpuweave.io/topology"] == "nvswitch-8"
    gpu = published["spec"]["gpus"][3]["uuid"]
    call_agent(running.agent.state_dir, "device.withhold", {"devices": [gpu], "reason": "suspect"})
    wait(
        "withheld GPU in the published status",
        lambda: gpu in ((running.inventory() or {}).get("status", {}).get("unhealthyDevices") or []),
    )


def test_the_inventory_is_owned_by_the_node_and_follows_a_recreated_one(running: Running) -> None:
    """The garbage collector deletes an inventory with the Node its owner reference names; a Node
    deleted and created again under the name (a new UID) is named at the agent's next publish."""

    def owners() -> list[dict[str, Any]]:
        return list(((running.inventory() or {}).get("metadata") or {}).get("ownerReferences") or [])

    def node_ref() -> list[dict[str, Any]]:
        uid = running.core.read_node(NODE).metadata.uid
        return [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}]

    wait("the inventory owned by its Node", lambda: owners() == node_ref())
    running.core.delete_node(NODE)
    running.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    gpu = (running.inventory() or {})["spec"]["gpus"][1]["uuid"]
    call_agent(running.agent.state_dir, "device.withhold", {"devices": [gpu], "reason": "suspect"})
    wait("the owner reference to the new Node", lambda: owners() == node_ref())


def test_preferred_allocation_follows_the_extenders_assignment(running: Running) -> None:
    gpus = sorted(running.kubelet.devices(RESOURCE_GPU))
    chosen = [gpus[1], gpus[6]]  # not what the local topology optimum would pick first
    assignment = PodAssignment(
        node=NODE, containers={"main": ContainerAssignment(devices={RESOURCE_GPU: chosen})}
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "annotations": {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {RESOURCE_GPU: "2"}}}
            ],
        },
    }
    running.core.create_namespaced_pod("default", pod)
    stub = running.kubelet.stub(RESOURCE_GPU)
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=gpus, allocation_size=2)
        ]
    )

    def answered_with_assignment() -> bool:
        response = stub.GetPreferredAllocation(request, timeout=5)
        return sorted(response.container_responses[0].deviceIDs) == sorted(chosen)

    wait("the assigned devices as the preference", answered_with_assignment, timeout=30)
    ids, _ = running.kubelet.allocate(RESOURCE_GPU, 2)
    assert len(ids) == 2  # the pod was served once; the next request gets the local optimum
    running.core.delete_namespaced_pod("trainer", "default", grace_period_seconds=0)
