"""Demand mode against a real kube-apiserver (tests/e2e/harness), as the node agent's ServiceAccount.

Two simulated DGX H100 nodes, each a node agent with its kubelet emulator and MIG service, follow
their Node through a watch (the declared layout turns MIG on for GPU 3) and watch pending pods.
A pod asking ``nvidia.com/mig-1g.10gb`` that the scheduler marked unschedulable is claimed by
exactly one node, which creates the MIG device; the kubelet emulator of that node sees it in
ListAndWatch, the other node changes nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION, RESOURCE_GPU, mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.mig import build_mig_service
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from mig.demand import CLAIM_ANNOTATION, CLAIM_TIME_ANNOTATION
from mig.kube import MigKube, start_mig_kube
from mig.service import MigService
from nodeagent.agent import AgentConfig, NodeAgent
from tests.support.agent_process import AgentProcess, remove_tree, short_temp_dir
from tests.support.control_plane import REPO, ControlPlane, wait_for
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.pods import pod_body

pytestmark = pytest.mark.e2e

MIG_1G = mig_resource_name("1g.10gb")
NODES = ("mig-a", "mig-b")
POOL = {"gpuweave.io/pool": "mig"}
NAMESPACE = "mig-work"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    control = ControlPlane(tmp_path_factory.mktemp("mig-demand"))
    try:
        control.apply(control.kustomize(REPO / "manifests"))
        control.apply(_docs(REPO / "manifests" / "rbac-node-agent-mig-demand.yaml"))
        control.ensure_namespace(NAMESPACE)
        for name in NODES:
            control.core.create_node({"metadata": {"name": name, "labels": POOL}})
        yield control
    finally:
        control.stop()


def _docs(path: Path) -> list[dict[str, Any]]:
    import yaml  # noqa: PLC0415

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class SimNode:
    name: str
    agent: NodeAgent
    kubelet: KubeletEmulator
    backend: SimulatedBackend
    service: MigService
    api: client.ApiClient
    kube: MigKube | None = None

    def mig_gpus(self) -> list[int]:
        return [s.index for s in self.service.demand_states()]

    def instances(self, gpu: int) -> int:
        return len(self.service.reconciler.current(gpu))


@pytest.fixture
def nodes(plane: ControlPlane) -> Iterator[dict[str, SimNode]]:
    kubeconfig = str(plane.service_account_kubeconfig("gpuweave-node-agent"))
    root = Path(tempfile.mkdtemp(prefix="gwd", dir="/tmp"))
    started: dict[str, SimNode] = {}
    try:
        for name in NODES:
            kubelet_dir, state_dir = root / name / "k", root / name / "s"
            kubelet = KubeletEmulator(kubelet_dir)
            kubelet.start()
            backend = SimulatedBackend(load_profile("dgx-h100"), root / name / "sysfs", node_name=name)
            config_ = AgentConfig(kubelet_dir=kubelet_dir, state_dir=state_dir)
            agent = device_plugin_agent(config_, discover=backend.discover)
            service = build_mig_service(
                agent, backend=backend, state_dir=state_dir, inventory=backend.discover()
            )
            service.start()
            agent.start()
            api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            started[name] = SimNode(name, agent, kubelet, backend, service, api)
        for node in started.values():  # the layout poll is a fallback only: the watch must do it
            node.kube = start_mig_kube(
                node.api, node.name, node.service, demand=True, timeout_s=1, fallback_poll_s=3600
            )
        yield started
    finally:
        plane.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        for node in started.values():
            if node.kube is not None:
                node.kube.stop()
            node.agent.stop()
            node.kubelet.stop()
            node.backend.close()
            node.api.close()
        shutil.rmtree(root, ignore_errors=True)


def _declare_mig_on_gpu3(plane: ControlPlane) -> None:
    layout = json.dumps({"gpus": {"3": []}})
    for name in NODES:
        plane.core.patch_node(name, {"metadata": {"annotations": {MIG_LAYOUT_ANNOTATION: layout}}})


def _pending_pod(plane: ControlPlane, name: str, *, selector: dict[str, str], resource: str = MIG_1G) -> None:
    body = pod_body(name, limits={resource: 1}, node_selector=selector, container="main", image="cuda")
    plane.core.create_namespaced_pod(NAMESPACE, body)
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": f"0/2 nodes are available: 2 Insufficient {MIG_1G}.",
    }
    plane.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"conditions": [condition]}})


def _annotations(plane: ControlPlane, name: str) -> dict[str, str]:
    return plane.core.read_namespaced_pod(name, NAMESPACE).metadata.annotations or {}


def test_exactly_one_node_claims_the_pod_and_creates_the_mig_device(
    plane: ControlPlane, nodes: dict[str, SimNode]
) -> None:
    _declare_mig_on_gpu3(plane)  # through the Node watch: the fallback poll is an hour away
    for node in nodes.values():
        wait_for(f"MIG mode on GPU 3 of {node.name}", lambda n=node: n.mig_gpus() == [3], timeout=60)
        assert node.instances(3) == 0
    _pending_pod(plane, "wants-1g", selector=POOL)

    claim = wait_for("a claim", lambda: _annotations(plane, "wants-1g").get(CLAIM_ANNOTATION), timeout=60)
    winner, loser = nodes[claim], next(n for n in nodes.values() if n.name != claim)
    assert _annotations(plane, "wants-1g")[CLAIM_TIME_ANNOTATION].endswith("Z")
    assert winner.kubelet.wait_for(lambda: len(winner.kubelet.healthy(MIG_1G)) == 1, timeout=60)
    assert winner.instances(3) == 1
    # the other node saw the same pod and stays as it was; the claim never changes hands
    assert loser.instances(3) == 0
    assert MIG_1G not in loser.kubelet.resources() or not loser.kubelet.healthy(MIG_1G)
    assert _annotations(plane, "wants-1g")[CLAIM_ANNOTATION] == claim


def test_a_node_selector_picks_the_node(plane: ControlPlane, nodes: dict[str, SimNode]) -> None:
    _declare_mig_on_gpu3(plane)
    for node in nodes.values():
        wait_for(f"MIG mode on GPU 3 of {node.name}", lambda n=node: n.mig_gpus() == [3], timeout=60)
    plane.core.patch_node("mig-b", {"metadata": {"labels": {"only": "b"}}})
    _pending_pod(plane, "wants-b", selector={"only": "b"})
    assert wait_for("claim", lambda: _annotations(plane, "wants-b").get(CLAIM_ANNOTATION)) == "mig-b"
    b = nodes["mig-b"]
    assert b.kubelet.wait_for(lambda: len(b.kubelet.healthy(MIG_1G)) >= 1, timeout=60)


def _claims_seen(plane: ControlPlane, name: str, *, since: str, until: list[str | None]) -> list[str | None]:
    """The claim values the pod's watch events show (repeats folded), until they end with ``until``."""
    seen: list[str | None] = []
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    for event in stream.stream(  # type: ignore[no-untyped-call]
        plane.core.list_namespaced_pod,
        NAMESPACE,
        field_selector=f"metadata.name={name}",
        resource_version=since,
        timeout_seconds=60,
    ):
        claim = (event["object"].metadata.annotations or {}).get(CLAIM_ANNOTATION)
        if not seen or seen[-1] != claim:
            seen.append(claim)
        if seen[-len(until) :] == until:
            stream.stop()  # type: ignore[no-untyped-call]
            break
    return seen


def test_busy_instances_in_the_way_release_the_claim(plane: ControlPlane, nodes: dict[str, SimNode]) -> None:
    plane.core.patch_node("mig-b", {"metadata": {"labels": {"busy": "b"}}})
    layout = json.dumps({"gpus": {"3": ["3g.40gb", "3g.40gb"]}})
    plane.core.patch_node("mig-b", {"metadata": {"annotations": {MIG_LAYOUT_ANNOTATION: layout}}})
    b = nodes["mig-b"]
    wait_for("3g+3g on mig-b", lambda: b.instances(3) == 2, timeout=60)
    for record in b.service.reconciler.snapshot(3).records:
        b.backend.node.mig.gpus[3].set_busy(record.computes[0].mig_uuid)
    container = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": {mig_resource_name("7g.80gb"): "1"}},
    }
    body = {
        "metadata": {"name": "wants-7g"},
        "spec": {"containers": [container], "nodeSelector": {"busy": "b"}},
    }
    since = plane.core.create_namespaced_pod(NAMESPACE, body).metadata.resource_version
    seen: list[list[str | None]] = []
    watcher = threading.Thread(
        target=lambda: seen.append(_claims_seen(plane, "wants-7g", since=since, until=["mig-b", None]))
    )
    watcher.start()
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    plane.core.patch_namespaced_pod_status("wants-7g", NAMESPACE, {"status": {"conditions": [condition]}})
    watcher.join(timeout=90)
    assert seen and seen[0][-2:] == ["mig-b", None]  # claimed, then released
    assert sorted(i.start for i in b.service.reconciler.current(3)) == [0, 4]  # busy instances kept
    assert CLAIM_TIME_ANNOTATION not in _annotations(plane, "wants-7g")


def test_the_node_agent_process_serves_demand_with_the_flag(plane: ControlPlane) -> None:
    """``gpuweave node-agent --kubeconfig K --mig-demand`` as its own process, as the DaemonSet runs it."""
    kubeconfig = plane.service_account_kubeconfig("gpuweave-node-agent")
    layout = json.dumps({"gpus": {"5": []}})
    meta = {"name": "mig-p", "labels": {"proc": "p"}, "annotations": {MIG_LAYOUT_ANNOTATION: layout}}
    plane.core.create_node({"metadata": meta})
    root = short_temp_dir()
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    mig_2g = mig_resource_name("2g.20gb")
    extra = ("--kubeconfig", str(kubeconfig), "--mig-demand", "--rediscover-interval", "0")
    try:
        with AgentProcess(root / "k", root / "s", profile="dgx-h100", node="mig-p", extra=extra) as agent:
            # MIG on for GPU 5 (declared): the whole-GPU list drops to 7 before any demand is served
            assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 7, timeout=90)
            _pending_pod(plane, "wants-2g", selector={"proc": "p"}, resource=mig_2g)
            served = kubelet.wait_for(lambda: len(kubelet.healthy(mig_2g)) == 1, timeout=90)
            assert served, f"no {mig_2g} device; agent log: {agent.stop() and ''}{agent.stderr[-3000:]}"
            assert _annotations(plane, "wants-2g")[CLAIM_ANNOTATION] == "mig-p"
        assert agent.process.returncode == 0, agent.stderr
    finally:
        plane.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        kubelet.stop()
        remove_tree(root)
