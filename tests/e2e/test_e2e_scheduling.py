"""GPU pods scheduled by the real kube-scheduler through our extender, admitted by the kubelet's
device manager through our node agent: placement follows topology and both sides agree."""

from __future__ import annotations

import itertools

import pytest

from tests.e2e.cluster import ControlPlane, SimNode, wait_for
from tests.e2e.conftest import NVLINK_NODE, PCIE_NODE
from tests.e2e.pods import (
    GPU,
    allocated_gpus,
    assigned_devices,
    gpu_field,
    gpu_indices,
    gpu_pod,
    nvlinked_pairs,
    scheduling_failure,
    wait_admitted,
)

pytestmark = pytest.mark.e2e


def test_nodes_advertise_devices_registered_with_the_device_manager(cluster: dict[str, SimNode]) -> None:
    for name in (PCIE_NODE, NVLINK_NODE):
        status = cluster[name].node().status
        assert status.capacity[GPU] == "8"
        assert status.allocatable[GPU] == "8"


def test_best_effort_multi_gpu_pod_prefers_the_nvlink_node(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    """Both nodes are empty: the extender's absolute set quality breaks the tie for the NVLink quad."""
    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("gang-4", 4, grace_s=0))
    pod, allocation = wait_admitted(plane, workload_namespace, "gang-4")
    plane.core.delete_namespaced_pod("gang-4", workload_namespace, grace_period_seconds=0)
    wait_for("gang-4 to be deleted", lambda: _gone(plane, workload_namespace, "gang-4"))
    assert pod.spec.node_name == NVLINK_NODE
    quad = gpu_indices(plane, NVLINK_NODE, allocated_gpus(allocation))
    links = nvlinked_pairs(plane, NVLINK_NODE)
    assert all(frozenset(pair) in links for pair in itertools.combinations(quad, 2)), quad


def _gone(plane: ControlPlane, namespace: str, name: str) -> bool:
    return not any(p.metadata.name == name for p in plane.core.list_namespaced_pod(namespace).items)


def test_nvlink_required_pods_take_the_nvlink_quads_and_nothing_else(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    links = nvlinked_pairs(plane, NVLINK_NODE)
    quads: list[set[int]] = []
    for name in ("quad-0", "quad-1"):
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, 4, placement="nvlink-required"))
        pod, allocation = wait_admitted(plane, workload_namespace, name)
        assert pod.spec.node_name == NVLINK_NODE
        assert allocated_gpus(allocation) == assigned_devices(pod)[GPU]
        quads.append(gpu_indices(plane, NVLINK_NODE, allocated_gpus(allocation)))
    for quad in quads:
        assert all(frozenset(pair) in links for pair in itertools.combinations(quad, 2)), quad
    assert quads[0] | quads[1] == set(range(8))

    # The PCIe node has four free GPUs but no NVLink: the extender's filter keeps the pod off it.
    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("quad-2", 4, placement="nvlink-required"))
    message = wait_for(
        "quad-2 to be declared unschedulable", lambda: scheduling_failure(plane, workload_namespace, "quad-2")
    )
    assert "NVLink" in message
    assert plane.core.read_namespaced_pod("quad-2", workload_namespace).spec.node_name is None
    plane.core.delete_namespaced_pod("quad-2", workload_namespace)


def test_best_effort_pods_take_the_closest_pcie_sets(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("socket-4", 4))
    pod, socket4 = wait_admitted(plane, workload_namespace, "socket-4")
    assert pod.spec.node_name == PCIE_NODE
    assert len(gpu_field(plane, PCIE_NODE, allocated_gpus(socket4), "numaNode")) == 1

    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("switch-2", 2))
    pod, pair = wait_admitted(plane, workload_namespace, "switch-2")
    assert pod.spec.node_name == PCIE_NODE
    assert len(gpu_field(plane, PCIE_NODE, allocated_gpus(pair), "pcieSwitch")) == 1
    assert not set(allocated_gpus(pair)) & set(allocated_gpus(socket4))


def test_device_manager_allocates_what_the_extender_assigned(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("single", 1))
    pod, allocation = wait_admitted(plane, workload_namespace, "single")
    allocated = allocation["containers"]["main"]["devices"]
    assert allocation["node"] == pod.spec.node_name
    assert allocated == assigned_devices(pod)
    assert len(allocated[GPU]) == 1
    visible = allocation["containers"]["main"]["env"].get("NVIDIA_VISIBLE_DEVICES", "")
    assert sorted(visible.split(",")) == allocated[GPU]
