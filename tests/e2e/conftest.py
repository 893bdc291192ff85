"""Fixtures for the e2e suite: one real control plane per session, our processes on top.

Every test here is marked ``e2e``. The harness binary must be built first
(tests/e2e/harness/build.sh); without it the tests fail and say so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    Process,
    SimNode,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.pods import FAULT_NODE, FAULT_TAINT, HANDOFF_NODE, NUMA_NODE

# The nodes of the scheduling cluster: one without NVLink, one with the DGX-1 hybrid cube mesh,
# one that the fault tests damage, one for admission bursts.
PCIE_NODE, NVLINK_NODE = "e2e-l40s", "e2e-v100"
NODE_PROFILES = {
    PCIE_NODE: "l40s-pcie-8",
    NVLINK_NODE: "dgx1-v100",
    FAULT_NODE: "dgx-h100",
    HANDOFF_NODE: "dgx-a100",
    NUMA_NODE: "dgx1-v100",
}
TOPOLOGY_POLICIES = {NUMA_NODE: "best-effort"}
EVICTION_GRACE_S = 3


def base_plane(
    tmp_path_factory: pytest.TempPathFactory, *, name: str = "e2e", harness: Path | None = None
) -> Iterator[ControlPlane]:
    """kube-apiserver + etcd with the kustomize base (manifests/) applied as an admin would;
    ``harness``: the harness binary of the whole cluster (default: the newest minor's)."""
    control = ControlPlane(tmp_path_factory.mktemp(name), harness=harness)
    try:
        control.apply(control.kustomize(REPO / "manifests"))
        yield control
    finally:
        control.stop()


def own_plane_fixtures(name: str, *, harness: Callable[[], Path] | None = None) -> tuple[Any, Any]:
    """``plane`` and ``scheduler_kubeconfig`` for one module, on a control plane of its own: for
    tests that change the whole cluster (``gpuweave uninstall`` sweeps every Node, a previous
    release's chart replaces the base, Kueue checks that only the module's extenders may answer).
    In the module: ``plane, scheduler_kubeconfig = own_plane_fixtures("e2e-NAME")``; with
    ``harness=harness_k134_binary`` the module's whole cluster runs Kubernetes 1.34."""

    @pytest.fixture(scope="module")
    def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
        yield from base_plane(tmp_path_factory, name=name, harness=harness() if harness else None)

    @pytest.fixture(scope="module")
    def scheduler_kubeconfig(plane: ControlPlane) -> Path:
        return plane.service_account_kubeconfig("gpuweave-scheduler")

    return plane, scheduler_kubeconfig


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's control plane; a module whose tests change the whole cluster (``gpuweave
    uninstall`` sweeps every Node) overrides ``plane`` and ``scheduler_kubeconfig`` with its own."""
    yield from base_plane(tmp_path_factory)


@pytest.fixture(scope="session")
def agent_kubeconfig(plane: ControlPlane) -> Path:
    return plane.service_account_kubeconfig("gpuweave-node-agent")


@pytest.fixture(scope="session")
def scheduler_kubeconfig(plane: ControlPlane) -> Path:
    """The gpuweave-scheduler pod's identity: kube-scheduler and its extender sidecar share it."""
    return plane.service_account_kubeconfig("gpuweave-scheduler")


@pytest.fixture(scope="session")
def workload_namespace(plane: ControlPlane) -> str:
    plane.ensure_namespace("e2e-work")
    return "e2e-work"


def _health_config(work: Path) -> Path:
    path = work / "health.yaml"
    settings = {"round_interval_s": 1, "startup_rounds": 1, "eviction_grace_s": EVICTION_GRACE_S}
    path.write_text(yaml.safe_dump({"health": settings}))
    return path


@pytest.fixture(scope="session")
def nodes(plane: ControlPlane) -> Iterator[dict[str, SimNode]]:
    """The scheduling cluster's Nodes, each a harness node (kubelet device manager) with our
    simulated node agent, whose token names its node as the DaemonSet pod's does: the base's
    admission policies (manifests/admission-node-agent.yaml) hold every agent to its own node."""
    health = _health_config(plane.work)
    started: dict[str, SimNode] = {}
    try:
        for name, profile in NODE_PROFILES.items():
            started[name] = SimNode(
                plane,
                name=name,
                profile=profile,
                agent_kubeconfig=plane.node_agent_kubeconfig(name),
                health_config=health,
                topology_policy=TOPOLOGY_POLICIES.get(name, "none"),
            )
        for node in started.values():
            node.wait_resource("nvidia.com/gpu", allocatable=8, timeout=90)
        yield started
    finally:
        for node in started.values():
            node.stop()


@pytest.fixture(scope="session")
def scheduler(
    plane: ControlPlane, nodes: dict[str, SimNode], scheduler_kubeconfig: Path
) -> Iterator[Process]:
    """The gpuweave-scheduler: upstream kube-scheduler + our extender, as the Deployment runs them."""
    extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig)
    config_path = render_scheduler_config(plane, extender_url=url, kubeconfig=scheduler_kubeconfig)
    kube_scheduler = start_scheduler(plane, config_path=config_path)
    try:
        yield kube_scheduler
    finally:
        kube_scheduler.stop()
        extender.stop()


@pytest.fixture(scope="session")
def cluster(
    plane: ControlPlane, nodes: dict[str, SimNode], scheduler: Process, workload_namespace: str
) -> dict[str, SimNode]:
    """Keep the fault and handoff nodes out of the placement tests (a taint only their tests tolerate)."""
    for name in (FAULT_NODE, HANDOFF_NODE, NUMA_NODE):
        add_taint(plane, name, FAULT_TAINT)
    return nodes


def add_taint(plane: ControlPlane, node: str, taint: dict[str, str]) -> None:
    """Append a taint once the agent lifted its startup taint; an update, so a race is a conflict."""

    def startup_done() -> bool:
        taints = plane.core.read_node(node).spec.taints or []
        return not any(t.key == "gpuweave.io/health-pending" for t in taints)

    wait_for(f"{node}'s agent to finish its health start-up", startup_done, timeout=60)
    for _ in range(10):
        current = plane.core.read_node(node)
        current.spec.taints = [*(current.spec.taints or []), taint]
        try:
            plane.core.replace_node(node, current)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
    pytest.fail(f"could not taint {node}: it kept changing", pytrace=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that change the whole cluster (marker ``cluster_wide``: ``gpuweave uninstall`` sweeps
    every Node, a previous release's chart replaces the base) run after every other test, in their
    own order; the rest keep theirs."""
    items.sort(key=lambda item: item.get_closest_marker("cluster_wide") is not None)
