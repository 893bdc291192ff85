"""A GPU fault on a node: the real Node status and the real API server's eviction path."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.e2e.cluster import ControlPlane, SimNode, wait_for
from tests.e2e.conftest import EVICTION_GRACE_S
from tests.e2e.pods import (
    FAULT_NODE,
    GPU,
    allocated_gpus,
    assigned_devices,
    gpu_indices,
    gpu_pod,
    wait_admitted,
)

pytestmark = pytest.mark.e2e


def _pod_or_none(plane: ControlPlane, namespace: str, name: str) -> Any:
    try:
        return plane.core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_xid_79_withholds_only_that_gpu_and_evicts_only_its_pod(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    node = cluster[FAULT_NODE]
    allocations = {}
    for name in ("victim", "bystander"):  # one at a time: see test_e2e_handoff for bursts
        plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, 2, grace_s=600, fault_node=True))
        pod, allocations[name] = wait_admitted(plane, workload_namespace, name)
        assert allocated_gpus(allocations[name]) == assigned_devices(pod)[GPU]
    victim_alloc, bystander_alloc = allocations["victim"], allocations["bystander"]
    failed_uuid = victim_alloc["containers"]["main"]["devices"][GPU][0]
    (failed_index,) = gpu_indices(plane, FAULT_NODE, [failed_uuid])

    node.inject("--gpu", str(failed_index), "--xid", "79")

    status = node.wait_resource(GPU, allocatable=7).status
    assert status.capacity[GPU] == "8"
    evicted = wait_for(
        "the victim pod to be evicted",
        lambda: (
            (p := _pod_or_none(plane, workload_namespace, "victim")) is None or p.metadata.deletion_timestamp
        ),
        timeout=60,
    )
    if evicted is not True:  # still terminating: its grace period is the health policy's, not 600 s
        pod = plane.core.read_namespaced_pod("victim", workload_namespace)
        assert pod.metadata.deletion_grace_period_seconds == EVICTION_GRACE_S
    wait_for("the victim pod to be gone", lambda: _pod_or_none(plane, workload_namespace, "victim") is None)
    bystander = plane.core.read_namespaced_pod("bystander", workload_namespace)
    assert bystander.metadata.deletion_timestamp is None
    assert bystander.status.phase == "Running"

    plane.core.create_namespaced_pod(workload_namespace, gpu_pod("after-fault", 2, fault_node=True))
    _, after = wait_admitted(plane, workload_namespace, "after-fault")
    taken = set(after["containers"]["main"]["devices"][GPU])
    assert failed_uuid not in taken
    assert not taken & set(bystander_alloc["containers"]["main"]["devices"][GPU])
