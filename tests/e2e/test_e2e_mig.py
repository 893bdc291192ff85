"""MIG through the real device manager: a declared layout becomes new kubelet resources, and a
MIG pod is scheduled by the extender and admitted with the MIG device it was assigned."""

from __future__ import annotations

import json

import pytest

from tests.e2e.cluster import ControlPlane, SimNode, wait_for
from tests.e2e.pods import GPU, HANDOFF_NODE, assigned_devices, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e

MIG_3G = "nvidia.com/mig-3g.40gb"


def test_declared_layout_is_served_and_allocated(
    plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    node = cluster[HANDOFF_NODE]
    wait_for(
        f"{HANDOFF_NODE} to be free of earlier test pods",
        lambda: (
            not plane.core.list_namespaced_pod(
                workload_namespace, field_selector=f"spec.nodeName={HANDOFF_NODE}"
            ).items
        ),
    )
    layout = {"gpus": {"7": ["3g.40gb", "3g.40gb"]}}
    plane.core.patch_node(
        HANDOFF_NODE, {"metadata": {"annotations": {"gpuweave.io/mig-layout": json.dumps(layout)}}}
    )

    node.wait_resource(MIG_3G, allocatable=2, timeout=90)
    status = node.wait_resource(GPU, allocatable=7).status
    assert status.capacity[MIG_3G] == "2"

    plane.core.create_namespaced_pod(
        workload_namespace, gpu_pod("mig-slice", 1, resource=MIG_3G, grace_s=0, only_on=HANDOFF_NODE)
    )
    pod, allocation = wait_admitted(plane, workload_namespace, "mig-slice")
    allocated = allocation["containers"]["main"]["devices"]
    assert list(allocated) == [MIG_3G]
    assert allocated[MIG_3G][0].startswith("MIG-")
    assert allocated == assigned_devices(pod)
