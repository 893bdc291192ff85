"""A kubelet restart: the device manager removes every plugin socket and restores its
checkpoint; our agent must register again, and pods keep the devices they had."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import ControlPlane, SimNode, wait_for
from tests.e2e.pods import (
    GPU,
    HANDOFF_NODE,
    allocated_gpus,
    assigned_devices,
    gpu_pod,
    wait_admitted,
)

pytestmark = pytest.mark.e2e


def test_agent_registers_again_and_pods_keep_their_devices(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    node = cluster[HANDOFF_NODE]
    wait_for(
        "the burst pods to be gone",
        lambda: (
            not plane.core.list_namespaced_pod(
                workload_namespace, field_selector=f"spec.nodeName={HANDOFF_NODE}"
            ).items
        ),
    )
    plane.core.create_namespaced_pod(
        workload_namespace, gpu_pod("survivor", 4, grace_s=0, only_on=HANDOFF_NODE)
    )
    _, before = wait_admitted(plane, workload_namespace, "survivor")
    sockets_before = {p.name for p in node.plugin_dir.glob("*.sock")} - {"kubelet.sock"}

    node.restart_kubelet()

    wait_for(
        "the agent's sockets to be back after the device manager removed them",
        lambda: sockets_before <= {p.name for p in node.plugin_dir.glob("*.sock")},
    )
    node.wait_resource(GPU, allocatable=8)
    # The restarted kubelet admits the running pod again: the checkpoint gives the same devices.
    wait_for(
        "survivor re-admitted", lambda: node.kubelet.alive_and(lambda: "survivor" in node.kubelet.tail(200))
    )
    assert plane.allocation_of(workload_namespace, "survivor") == before

    plane.core.create_namespaced_pod(
        workload_namespace, gpu_pod("after-restart", 4, grace_s=0, only_on=HANDOFF_NODE)
    )
    pod, after = wait_admitted(plane, workload_namespace, "after-restart")
    assert allocated_gpus(after) == assigned_devices(pod)[GPU]
    assert not set(allocated_gpus(after)) & set(allocated_gpus(before))
    for name in ("survivor", "after-restart"):  # free the node for the MIG test
        plane.core.delete_namespaced_pod(name, workload_namespace, grace_period_seconds=0)
