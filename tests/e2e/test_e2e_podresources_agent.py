"""The node agent's pod-resources client reads, from the socket its default rule derives, the same
devices the kubelet's device manager admitted a pod with (what MIG busy checks and health use)."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodeagent.podresources import PodRef, PodResourcesClient, default_socket_for
from tests.e2e.cluster import ControlPlane, SimNode, harness_binary
from tests.e2e.pods import GPU, HANDOFF_NODE, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e


def test_agent_client_reads_the_devices_the_kubelet_admitted(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    node = cluster[HANDOFF_NODE]
    socket = default_socket_for(node.plugin_dir)
    assert socket == node.kubelet_dir / "pod-resources" / "kubelet.sock"  # where the harness serves it
    plane.core.create_namespaced_pod(
        workload_namespace, gpu_pod("agent-view", 2, grace_s=0, only_on=HANDOFF_NODE)
    )
    try:
        _, allocation = wait_admitted(plane, workload_namespace, "agent-view")
        admitted = allocation["containers"]["main"]["devices"][GPU]
        held = PodResourcesClient(socket, timeout=10).list_devices()
        for device in admitted:
            assert held[device] == PodRef(workload_namespace, "agent-view", "main", GPU)

        kubelet_tool = subprocess.run(
            [str(harness_binary()), "podresources", str(socket)], check=True, capture_output=True, text=True
        ).stdout
        listed = json.loads(kubelet_tool)["list"].get("pod_resources") or []
        tool_ids = {
            device
            for pod in listed
            for container in pod.get("containers") or []
            for entry in container.get("devices") or []
            for device in entry["device_ids"]
        }
        assert set(held) == tool_ids  # the Python client and the kubelet's own Go client agree
    finally:
        plane.core.delete_namespaced_pod("agent-view", workload_namespace, grace_period_seconds=0)
