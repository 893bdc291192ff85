"""The extender -> kubelet handoff when several GPU pods are bound to one node at once.

The kubelet's GetPreferredAllocation carries no pod identity, so the node agent must tell the
pods apart by their recorded assignments (deviceplugin/handoff.py). A burst of equal requests is
the hard case: every pending assignment fits the offer. The kubelet (here the harness node, whose
pod informer feeds one admission worker as the kubelet's config source feeds its sync loop) admits
them in the order they became bound, which need not be creation order when the scheduler binds in
parallel; the agent ranks candidates by the resourceVersion at which its own watch first saw each
pod bound.
"""

from __future__ import annotations

import pytest

from tests.e2e.cluster import ControlPlane, SimNode
from tests.e2e.pods import GPU, HANDOFF_NODE, allocated_gpus, assigned_devices, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e


def test_a_burst_of_equal_pods_gets_the_assigned_devices(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    names = [f"burst-{i}" for i in range(4)]
    for name in names:
        plane.core.create_namespaced_pod(
            workload_namespace, gpu_pod(name, 2, grace_s=0, only_on=HANDOFF_NODE)
        )
    mismatched = []
    for name in names:
        pod, allocation = wait_admitted(plane, workload_namespace, name)
        if allocated_gpus(allocation) != assigned_devices(pod)[GPU]:
            mismatched.append(name)
    for name in names:  # free the node for the kubelet-restart test
        plane.core.delete_namespaced_pod(name, workload_namespace, grace_period_seconds=0)
    assert not mismatched, f"device manager allocated other devices than the extender assigned: {mismatched}"
