"""GPU pods scheduled by the real kube-scheduler through our extender, admitted by the kubelet's
device manager through our node agent: placement follows topology and both sides agree."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.cluster import ControlPlane, Process, SimNode, wait_for
from tests.e2e.conftest import FAULT_NODE, NVLINK_NODE, PCIE_NODE

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
SCHEDULER_NAME = "gpuweave-scheduler"
FAULT_TAINT = {"key": "e2e.gpuweave.io/fault-tests", "value": "only", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int, *, grace_s: int = 30, fault_node: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "terminationGracePeriodSeconds": grace_s,
        "containers": [{"name": "main", "image": "e2e/none", "resources": {"limits": {GPU: str(gpus)}}}],
    }
    if fault_node:
        spec["tolerations"] = [{**FAULT_TAINT, "operator": "Equal"}]
        spec["nodeSelector"] = {"kubernetes.io/hostname": FAULT_NODE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_admitted(plane: ControlPlane, namespace: str, name: str) -> tuple[Any, dict[str, Any]]:
    """The pod once the device manager admitted it, and the allocation it recorded."""

    def admitted() -> tuple[Any, dict[str, Any]] | None:
        pod = plane.core.read_namespaced_pod(name, namespace)
        allocation = plane.allocation_of(namespace, name)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed admission: {pod.status.reason}: {pod.status.message}")
        return (pod, allocation) if allocation else None

    return wait_for(f"pod {namespace}/{name} admitted with devices", admitted, timeout=90)


def assigned_devices(pod: Any) -> dict[str, list[str]]:
    """The extender's choice (gpuweave.io/assignment) for the pod's only container."""
    annotation = (pod.metadata.annotations or {}).get("gpuweave.io/assignment")
    assert annotation, f"pod {pod.metadata.name} has no gpuweave.io/assignment annotation"
    containers = json.loads(annotation)["containers"]
    return {resource: sorted(ids) for resource, ids in containers["main"]["devices"].items()}


def inventory(plane: ControlPlane, node: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(plane.api)
    return dict(custom.get_cluster_custom_object("gpuweave.io", "v1alpha1", "gpunodeinventories", node))


def gpu_indices(plane: ControlPlane, node: str, uuids: list[str]) -> set[int]:
    by_uuid = {g["uuid"]: int(g["index"]) for g in inventory(plane, node)["spec"]["gpus"]}
    return {by_uuid[u] for u in uuids}


def nvlinked_pairs(plane: ControlPlane, node: str) -> set[frozenset[int]]:
    return {frozenset(link["gpus"]) for link in inventory(plane, node)["spec"].get("nvlinks", [])}


@pytest.fixture(scope="module")
def cluster(
    plane: ControlPlane, nodes: dict[str, SimNode], scheduler: Process, workload_namespace: str
) -> dict[str, SimNode]:
    """Keep the fault node out of the placement tests (a taint only the fault tests tolerate)."""
    plane.core.patch_node(FAULT_NODE, {"spec": {"taints": [FAULT_TAINT]}})
    return nodes


def test_nodes_advertise_devices_registered_with_the_device_manager(cluster: dict[str, SimNode]) -> None:
    for node in cluster.values():
        status = node.node().status
        assert status.capacity[GPU] == "8"
        assert status.allocatable[GPU] == "8"


def test_four_gpu_pods_take_the_nvlink_quads_then_the_pcie_node(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    placed: list[tuple[str, set[int]]] = []
    for i in range(3):
        name = f"quad-{i}"
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, 4))
        pod, allocation = wait_admitted(plane, workload_namespace, name)
        uuids = allocation["containers"]["main"]["devices"][GPU]
        placed.append((pod.spec.node_name, gpu_indices(plane, pod.spec.node_name, uuids)))
    links = nvlinked_pairs(plane, NVLINK_NODE)
    assert [node for node, _ in placed] == [NVLINK_NODE, NVLINK_NODE, PCIE_NODE]
    for _, quad in placed[:2]:
        assert all(frozenset(pair) in links for pair in itertools.combinations(quad, 2)), quad
    assert placed[0][1] | placed[1][1] == set(range(8))


def test_device_manager_allocates_what_the_extender_assigned(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    for name, gpus in [("pair", 2), ("single", 1)]:
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, gpus))
        pod, allocation = wait_admitted(plane, workload_namespace, name)
        allocated = allocation["containers"]["main"]["devices"]
        assert allocation["node"] == pod.spec.node_name
        assert allocated == assigned_devices(pod)
        assert len(allocated[GPU]) == gpus
        visible = allocation["containers"]["main"]["env"].get("NVIDIA_VISIBLE_DEVICES", "")
        assert sorted(visible.split(",")) == allocated[GPU]
