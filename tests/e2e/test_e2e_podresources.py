"""The kubelet's pod-resources API, served by the node from its device manager, names the same
devices as the allocation the pods were admitted with (what a monitor or health reads)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.e2e.cluster import ControlPlane, SimNode, harness_binary
from tests.e2e.pods import HANDOFF_NODE, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e


def pod_resources(node: SimNode) -> dict[str, Any]:
    socket = node.kubelet_dir / "pod-resources" / "kubelet.sock"
    out = subprocess.run(
        [str(harness_binary()), "podresources", str(socket)], check=True, capture_output=True, text=True
    ).stdout
    return dict(json.loads(out))


def devices_by_resource(entries: list[dict[str, Any]]) -> dict[str, list[str]]:
    grouped: dict[str, set[str]] = {}
    for entry in entries:
        grouped.setdefault(entry["resource_name"], set()).update(entry["device_ids"])
    return {resource: sorted(ids) for resource, ids in grouped.items()}


def test_list_matches_the_admitted_allocations(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    node = cluster[HANDOFF_NODE]
    plane.core.create_namespaced_pod(
        workload_namespace, gpu_pod("listed", 1, grace_s=0, only_on=HANDOFF_NODE)
    )
    wait_admitted(plane, workload_namespace, "listed")
    answer = pod_resources(node)
    listed = {(p["namespace"], p["name"]): p for p in answer["list"].get("pod_resources") or []}
    running = plane.core.list_namespaced_pod(
        workload_namespace, field_selector=f"spec.nodeName={HANDOFF_NODE},status.phase=Running"
    ).items
    assert "listed" in {pod.metadata.name for pod in running}
    for pod in running:
        allocation = plane.allocation_of(workload_namespace, pod.metadata.name)
        assert allocation is not None
        containers = {c["name"]: c for c in listed[(workload_namespace, pod.metadata.name)]["containers"]}
        for name, got in allocation["containers"].items():
            assert devices_by_resource(containers[name].get("devices") or []) == got["devices"]

    allocatable = devices_by_resource(answer["allocatable"]["devices"])
    node_allocatable = node.node().status.allocatable
    for resource, ids in allocatable.items():
        assert str(len(ids)) == node_allocatable[resource]
    plane.core.delete_namespaced_pod("listed", workload_namespace, grace_period_seconds=0)
