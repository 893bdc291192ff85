"""The kubelet's Topology Manager (policy best-effort) between the extender and the plugin.

With a NUMA hint, the device manager takes the devices on the hinted NUMA node first and asks the
plugin's GetPreferredAllocation only among those (or not at all when they are exactly enough), so
the extender's choice survives only if it lies on the NUMA node the kubelet picks.
"""

from __future__ import annotations

import pytest

from tests.e2e.cluster import ControlPlane, SimNode
from tests.e2e.pods import GPU, NUMA_NODE, allocated_gpus, assigned_devices, gpu_field, gpu_pod, wait_admitted

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("gpus", [2, 4])
def test_best_effort_numa_hint_keeps_the_assignment(
    gpus: int, plane: ControlPlane, cluster: dict[str, SimNode], workload_namespace: str
) -> None:
    name = f"numa-{gpus}"
    plane.core.create_namespaced_pod(workload_namespace, gpu_pod(name, gpus, grace_s=0, only_on=NUMA_NODE))
    pod, allocation = wait_admitted(plane, workload_namespace, name)
    assert len(gpu_field(plane, NUMA_NODE, allocated_gpus(allocation), "numaNode")) == 1
    assert allocated_gpus(allocation) == assigned_devices(pod)[GPU]
