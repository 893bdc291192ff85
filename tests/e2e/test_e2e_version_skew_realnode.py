"""The real-node tier's smoke test on Kubernetes 1.34: the full kubelet of k8s.io/kubernetes v1.34
(``harness-k134 kubelet``, run by ``harness-k134 realnode`` with containerd and runc) against a
1.34 control plane, kube-scheduler and ``gpuweave extender``; a pod asking two GPUs runs and its
container sees exactly the two GPUs the node agent allocated through the kubelet's device
manager. The module's fixtures are ``test_e2e_realnode.py``'s, on a control plane of its own
whose harness is the 1.34 build (``own_plane_fixtures(harness=...)``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import ControlPlane, harness_k134_binary
from tests.e2e.conftest import own_plane_fixtures
from tests.e2e.realnode import RealNode
from tests.e2e.test_e2e_realnode import (  # noqa: F401 (fixtures and the test, run here at 1.34)
    no_pods_left,
    realnode,
    test_two_gpu_pod_sees_exactly_its_two_gpus,
)

pytestmark = pytest.mark.realnode

plane, scheduler_kubeconfig = own_plane_fixtures("e2e-k134-realnode", harness=harness_k134_binary)


@pytest.fixture(scope="module")
def agent_kubeconfig(plane: ControlPlane) -> Path:
    return plane.service_account_kubeconfig("gpuweave-node-agent")


def test_the_real_node_runs_the_kubelet_of_1_34(realnode: RealNode) -> None:  # noqa: F811
    info = realnode.plane.core.read_node(realnode.name).status.node_info
    assert info.kubelet_version.startswith("v1.34."), info.kubelet_version
