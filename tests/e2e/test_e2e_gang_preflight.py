"""Gang preflight through the real kube-scheduler: a failed preflight puts the gang on other nodes.

Three harness nodes (the kubelet's device manager and admission) with the simulated node agent, 8
H100 each, in one network block, so a gang of two 8-GPU pods fits any two of them. Node ``pf-a``
(the plan's first choice: equal nodes go by name) has an NVLink pair at half its lanes, which NVML
does not report (every link active): passive health sees nothing, and the agents' burn-in ran
before it. A second kube-scheduler (profile ``gpuweave-preflight-scheduler``) calls its own
``gpuweave extender``: it plans the gang on pf-a and pf-b, asks both agents for a preflight
(``GpuPreflight`` objects), pf-a's agent finds the slow pair, publishes it as a degraded link (its
two GPUs stay in service) and answers Failed (the plan did not know the link), and the extender
plans the gang again without pf-a: it starts on pf-b and pf-c.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.contracts import LABEL_PREFLIGHT
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from nodeagent.control import call_agent
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    SimNode,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.conftest import add_taint
from tests.e2e.pods import GPU, wait_admitted
from topology.network import LABEL_AWS_LAYER_3

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-preflight"
SCHEDULER = "gpuweave-preflight-scheduler"
NODES = ("pf-a", "pf-b", "pf-c")
NODE_LABEL = "e2e.gpuweave.io/preflight-node"
TAINT = {"key": "e2e.gpuweave.io/preflight-tests", "value": "only", "effect": "NoSchedule"}


class PreflightCluster:
    def __init__(self, plane: ControlPlane, nodes: dict[str, SimNode], extender: Process, url: str) -> None:
        self.plane, self.nodes, self.extender, self.url = plane, nodes, extender, url

    def metric(self, name: str, labels: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


def _health(work: Path) -> Path:
    path = work / "health-preflight.yaml"
    settings = {"round_interval_s": 1, "startup_rounds": 1, "active_checks": {"deadline_s": 30}}
    path.write_text(yaml.safe_dump({"health": settings}))
    return path


@pytest.fixture(scope="module")
def preflight(
    plane: ControlPlane, agent_kubeconfig: Path, scheduler_kubeconfig: Path
) -> Iterator[PreflightCluster]:
    plane.ensure_namespace(NAMESPACE)
    health = _health(plane.work)
    started: list[Any] = []
    try:
        nodes = {}
        for name in NODES:
            nodes[name] = SimNode(
                plane, name=name, profile="dgx-h100", agent_kubeconfig=agent_kubeconfig, health_config=health
            )
            started.append(nodes[name])
        for name, node in nodes.items():
            node.wait_resource(GPU, allocatable=8, timeout=90)
            add_taint(plane, name, TAINT)
            plane.core.patch_node(
                name, {"metadata": {"labels": {NODE_LABEL: "true", LABEL_AWS_LAYER_3: "pf-block"}}}
            )
            wait_for(
                f"{name}'s agent to serve preflights",
                lambda n=name: (
                    (plane.core.read_node(n).metadata.labels or {}).get(LABEL_PREFLIGHT) == "agent"
                ),
                timeout=60,
            )
        extender, url = start_extender(
            plane, kubeconfig=scheduler_kubeconfig, extra_args=("--gang-ttl", "60"), name="preflight-extender"
        )
        started.append(extender)
        config = render_scheduler_config(
            plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
        )
        started.append(start_scheduler(plane, config_path=config, name="preflight-kube-scheduler"))
        yield PreflightCluster(plane, nodes, extender, url)
    finally:
        for thing in reversed(started):
            thing.stop()
        for name in NODES:
            plane.core.delete_node(name)


def _runs(node: SimNode) -> list[dict[str, Any]]:
    """Every active-check run the node's agent keeps (burn-in, preflight, re-checks), oldest first."""
    runs = []
    for run in range(1, 17):
        try:
            runs.append(call_agent(node.state_dir, "health.check.run", {"run": run}))
        except Exception:  # no such run: the agent numbers them from 1
            break
    return runs


def _member(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ANNOTATION_GANG: "train", ANNOTATION_GANG_SIZE: "2"}},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{**TAINT, "operator": "Equal"}],
            "nodeSelector": {NODE_LABEL: "true"},
            "containers": [{"name": "main", "image": "e2e/none", "resources": {"limits": {GPU: "8"}}}],
        },
    }


def test_a_failed_preflight_puts_the_gang_on_other_nodes(preflight: PreflightCluster) -> None:
    plane, first = preflight.plane, preflight.nodes["pf-a"]
    first.inject("--gpu", "0", "--slow-nvlink", "1")  # latent: NVML still reports every link active
    for name in ("train-0", "train-1"):
        plane.core.create_namespaced_pod(NAMESPACE, _member(name))
    placed = {wait_admitted(plane, NAMESPACE, name)[0].spec.node_name for name in ("train-0", "train-1")}
    assert placed == {"pf-b", "pf-c"}

    status = call_agent(first.state_dir, "health.status")
    assert all(g["state"] == "Healthy" for g in status["gpus"].values()), status["gpus"]  # the link is slow
    ((_, _, reason),) = status["degradedLinks"]
    assert reason.startswith("active-check: NVLink copies"), reason
    (found,) = [r for r in _runs(first) if r["trigger"] == "preflight"]
    assert {g["verdict"] for g in found["gpus"].values()} == {"passed"}
    assert len(found["gpus"]) == 8 and found["newLinks"] == [reason]  # the 8 GPUs the gang was planned on
    first.wait_resource(GPU, allocatable=8)  # the kubelet still places work on both GPUs of the pair
    assert preflight.metric("gpuweave_extender_gangs_total", 'outcome="preflight-failed"') >= 1
    for node in ("pf-b", "pf-c"):
        (passed,) = [r for r in _runs(preflight.nodes[node]) if r["trigger"] == "preflight"]
        assert {g["verdict"] for g in passed["gpus"].values()} == {"passed"}
        assert {r["check"] for r in passed["results"]} == {"h2d", "d2h", "p2p"}  # the copies only
