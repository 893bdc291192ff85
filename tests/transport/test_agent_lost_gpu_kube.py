"""The node agent with a GPU off the bus, publishing to a real kube-apiserver (tests/e2e/harness).

The published GpuNodeInventory lists the seven GPUs that answer (the lost one's index left out),
its status names the lost GPU Unhealthy, and the GFD-style count label says seven.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from devicemodel.contracts import RESOURCE_GPU
from hardware.profiles import load_profile
from tests.support.agent_node import AgentNode
from tests.support.control_plane import ControlPlane
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CRD = Path(__file__).parents[2] / "manifests" / "crds" / "gpunodeinventories.yaml"
NODE = "gpu-node-lost"
GROUP = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[str]:
    plane = ControlPlane(tmp_path / "control-plane")
    try:
        plane.apply([yaml.safe_load(CRD.read_text())])
        plane.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield str(plane.admin_kubeconfig)
    finally:
        plane.stop()


def test_agent_with_a_lost_gpu_publishes_the_other_seven_and_the_lost_one_unhealthy(
    kubeconfig: str, tmp_path: Path
) -> None:
    document: dict[str, Any] = load_profile("p5.48xlarge").to_wire()
    document["spec"]["gpus"][3]["lost"] = True
    profile = tmp_path / "p5-lost.yaml"
    profile.write_text(yaml.safe_dump(document))
    lost_bus = load_profile(str(profile)).to_inventory().gpu(3).pci_bus_id
    node = AgentNode(str(profile), extra=("--kubeconfig", kubeconfig), node=NODE)
    api = config.new_client_from_config(config_file=kubeconfig)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def published() -> dict[str, Any]:
        try:
            return dict(custom.get_cluster_custom_object(*GROUP, NODE))
        except client.ApiException:
            return {}

    try:
        wait_until("8 GPUs listed", lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8, timeout=60)
        lost_id = f"unreachable-{lost_bus}"
        wait_until(
            "the lost GPU in the published status",
            lambda: lost_id in (published().get("status", {}).get("unhealthyDevices") or []),
            timeout=60,
        )
        assert [g["index"] for g in published()["spec"]["gpus"]] == [0, 1, 2, 4, 5, 6, 7]
        assert core.read_node(NODE).metadata.labels["nvidia.com/gpu.count"] == "7"
    finally:
        api.close()
        node.close()
