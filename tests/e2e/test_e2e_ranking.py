"""The real kube-scheduler follows the extender's ranking where NodeResourcesFit alone would not.

Under the gpuweave-scheduler profile a node's total is extender score x 12 x 10 plus
NodeResourcesFit's MostAllocated (0..100). For a 1-GPU pod with the DGX-1 node already holding a
2-GPU pod, MostAllocated prefers the DGX-1 (fuller), and the extender's own 0..10 node scores tie
(7 and 7); the scorer prefers the PCIe node (a single GPU keeps the NVLink node's pairs whole).
Prioritize answers the rank, 10 for the scorer's best and at most 9 elsewhere, so kube-scheduler
binds the pod to the PCIe node.
"""

from __future__ import annotations

import pytest

from gpuweave.simulate.scheduler_profile import load_profile_scoring
from tests.e2e.cluster import ControlPlane, SimNode, wait_for
from tests.e2e.conftest import NVLINK_NODE, PCIE_NODE
from tests.e2e.pods import GPU, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e


def _requested_gpus(plane: ControlPlane, node: str) -> int:
    pods = plane.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sum(
        int((c.resources.limits or {}).get(GPU, 0))
        for p in pods
        if p.status.phase not in ("Succeeded", "Failed")
        for c in p.spec.containers
    )


def _most_allocated(plane: ControlPlane, node: str) -> int:
    """NodeResourcesFit's MostAllocated for one more 1-GPU pod, with the profile's weights."""
    allocatable = plane.core.read_node(node).status.allocatable
    scoring = load_profile_scoring()
    return scoring.most_allocated(
        requested={GPU: _requested_gpus(plane, node)},
        allocatable={GPU: int(allocatable[GPU])},
        pod={GPU: 1},
    )


def _delete(plane: ControlPlane, namespace: str, *names: str) -> None:
    for name in names:
        plane.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for(
        "ranking pods to be deleted",
        lambda: not {p.metadata.name for p in plane.core.list_namespaced_pod(namespace).items} & set(names),
    )


def test_kube_scheduler_follows_the_scorer_where_most_allocated_prefers_another_node(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    try:
        plane.core.create_namespaced_pod(
            workload_namespace, gpu_pod("rank-filler", 2, only_on=NVLINK_NODE, grace_s=0)
        )
        wait_admitted(plane, workload_namespace, "rank-filler")
        assert _most_allocated(plane, NVLINK_NODE) > _most_allocated(plane, PCIE_NODE)  # the fuller node
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod("rank-probe", 1, grace_s=0))
        pod, _ = wait_admitted(plane, workload_namespace, "rank-probe")
        assert pod.spec.node_name == PCIE_NODE
    finally:
        _delete(plane, workload_namespace, "rank-filler", "rank-probe")
