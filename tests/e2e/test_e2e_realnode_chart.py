"""The chart's node agent on the real node: the DaemonSet the Helm chart renders is created by the
DaemonSet controller, the kubelet starts the agent's container from its own image (built here
from the Dockerfile's inputs), and the agent registers; a GPU pod then sees its GPUs, and a new
agent container registers the same device IDs.

Real parts: as tests/e2e/test_e2e_realnode.py, plus Helm's renderer (opscheck) for the chart,
``harness controllers --daemonsets`` (the DaemonSet controller and the root CA publisher) and the
agent image ``gpuweave.test/gpuweave:dev`` (tests/e2e/realnode.py: build_agent_image). The agent
runs with the chart's own arguments, privileges and host paths, plus ``nodeAgent.extraArgs``
``--simulate=p5.48xlarge``; it reaches the API server in-cluster, through the kubernetes Service's
address (the harness routes it: no kube-proxy runs here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    free_port,
    render_scheduler_config,
    start_controllers,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.realnode import (
    AGENT_IMAGE,
    NVIDIA_MAJOR,
    REALNODE_TAINT,
    SEER_SCHEDULER,
    RealNode,
    allocatable_ids,
    allowed_gpu_minors,
    container_id,
    delete_all_pods,
    gpu_nodes,
    gpus_by_uuid,
    run_seer,
)
from tests.e2e.realnode import SEER_NAMESPACE as NAMESPACE
from tests.support.opscheck import render_chart

pytestmark = pytest.mark.realnode

NODE = "e2e-realnode-chart"
SCHEDULER = SEER_SCHEDULER
AGENT_NAMESPACE = "gpuweave-system"
AGENT_LABELS = "app.kubernetes.io/name=gpuweave-node-agent"


def chart_values(repository: str, tag: str) -> dict[str, Any]:
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeAgent": {
            # a simulated node writes CDI specs under its state unless told: here, where the chart mounts them
            "extraArgs": ["--simulate=p5.48xlarge", "--cdi-spec-dir=/var/run/cdi"],
            "health": {"round_interval_s": 1, "startup_rounds": 1},
            "tolerations": [
                {"key": "gpuweave.io/gpu-unhealthy", "operator": "Exists"},
                {"key": "gpuweave.io/health-pending", "operator": "Exists"},
                {**REALNODE_TAINT, "operator": "Equal"},
            ],
        },
    }


def agent_pod(plane: ControlPlane) -> Any:
    pods = plane.core.list_namespaced_pod(AGENT_NAMESPACE, label_selector=AGENT_LABELS).items
    running = [p for p in pods if p.spec.node_name == NODE and p.metadata.deletion_timestamp is None]
    return running[0] if running else None


@pytest.fixture(scope="module")
def realnode(
    plane: ControlPlane, scheduler_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNode]:
    """The chart (rendered by Helm with test values) applied over the base; the real node labelled
    for the DaemonSet, with the agent image; the DaemonSet controller; a scheduler of its own."""
    repository, tag = AGENT_IMAGE.rsplit(":", 1)
    work = tmp_path_factory.mktemp("chart")
    objects = render_chart(chart_values(repository, tag), work=work)
    plane.apply(objects)
    plane.apply(
        [
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            }
        ]
    )
    plane.ensure_namespace(NAMESPACE)
    started: list[Any] = []
    try:
        node = RealNode(
            plane,
            name=NODE,
            kubelet_port=free_port(),
            profile="p5.48xlarge",
            taints=REALNODE_TAINT,
            labels={"gpuweave.io/gpu-node": "true"},
            agent_image=True,
        )
        started.append(node)
        started.append(start_controllers(plane, daemonsets=True))
        extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="extender-realnode-chart")
        started.append(extender)
        config = render_scheduler_config(
            plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
        )
        started.append(start_scheduler(plane, config_path=config, name="kube-scheduler-realnode-chart"))
        # DaemonSet pods go through the default scheduler (node affinity on the node's name)
        default = render_scheduler_config(
            plane, extender_url=None, kubeconfig=scheduler_kubeconfig, scheduler_name="default-scheduler"
        )
        started.append(start_scheduler(plane, config_path=default, name="kube-scheduler-default"))
        wait_for_agent_serving(node)
        yield node
    finally:
        for thing in reversed(started):
            thing.stop()
        plane.apply(plane.kustomize(REPO / "manifests"))  # the session's base again


def wait_for_agent_serving(node: RealNode) -> None:
    def serving() -> bool:
        node.process.check_alive()
        allocatable = node.plane.core.read_node(NODE).status.allocatable or {}
        return allocatable.get(RESOURCE_GPU) == "8" and allocatable.get(RESOURCE_EFA) == "32"

    wait_for(f"the chart's agent on {NODE} serving 8 GPUs and 32 EFA", serving, timeout=180)


@pytest.fixture(autouse=True)
def no_pods_left(realnode: RealNode) -> Iterator[None]:
    """Each test starts on an empty node, whatever the previous one left."""
    yield
    delete_all_pods(realnode)


def test_chart_agent_container_registers_and_a_pod_sees_its_gpus(realnode: RealNode) -> None:
    pod = agent_pod(realnode.plane)
    assert pod is not None and pod.status.phase == "Running"
    (container,) = pod.status.container_statuses
    assert container.image.endswith(AGENT_IMAGE) and container.ready is not False
    assert pod.spec.host_network and pod.spec.host_pid and pod.spec.runtime_class_name == "nvidia"
    _, seen = run_seer(realnode, "seer-chart-2gpu", {RESOURCE_GPU: "2"})
    gpus = gpus_by_uuid(realnode)
    visible = seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    minors = {int(gpus[u]["minor"]) for u in visible}
    assert len(minors) == 2
    assert gpu_nodes(seen) == {f"/dev/nvidia{m}": (NVIDIA_MAJOR, m) for m in minors}
    assert allowed_gpu_minors(seen) == minors


def test_a_new_agent_container_registers_the_same_ids(realnode: RealNode) -> None:
    plane = realnode.plane
    before = {r: allocatable_ids(realnode, r) for r in (RESOURCE_GPU, RESOURCE_EFA)}
    old = agent_pod(plane)
    plane.core.delete_namespaced_pod(old.metadata.name, AGENT_NAMESPACE)

    def replaced() -> bool:
        new = agent_pod(plane)
        return new is not None and new.metadata.uid != old.metadata.uid and new.status.phase == "Running"

    wait_for("the DaemonSet's new agent pod running", replaced, timeout=120)

    def same_ids() -> bool:
        return {r: allocatable_ids(realnode, r) for r in (RESOURCE_GPU, RESOURCE_EFA)} == before

    wait_for("the new agent container's registration with the same IDs", same_ids, timeout=120)


def test_a_kubelet_restart_keeps_the_pod_and_the_chart_agent_registers_again(realnode: RealNode) -> None:
    """The chart mounts the kubelet's device-plugins directory, not its socket, so the agent's
    container sees the restarted kubelet's new socket and registers again."""
    running, seen = run_seer(realnode, "seer-chart-kept", {RESOURCE_GPU: "2"})
    kept = set(seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(","))
    before = {r: allocatable_ids(realnode, r) for r in (RESOURCE_GPU, RESOURCE_EFA)}
    agent = agent_pod(realnode.plane)
    realnode.restart_kubelet()

    def registered_again() -> bool:
        return {r: allocatable_ids(realnode, r) for r in (RESOURCE_GPU, RESOURCE_EFA)} == before

    wait_for("the chart's agent registered with the restarted kubelet", registered_again, timeout=120)
    assert agent_pod(realnode.plane).metadata.uid == agent.metadata.uid  # the same agent container
    still = realnode.plane.core.read_namespaced_pod("seer-chart-kept", NAMESPACE)
    assert container_id(still) == container_id(running)
    _, second = run_seer(realnode, "seer-chart-after", {RESOURCE_GPU: "2"})
    assert not set(second["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) & kept


def test_an_active_check_runs_in_a_container_with_the_gpus_the_agent_gave_it(realnode: RealNode) -> None:
    """``gpuweave exercise`` in a pod of the agent's image: the check runs on the two GPUs the
    agent's Allocate gave the container (NVIDIA_VISIBLE_DEVICES, device nodes from its CDI spec),
    with the simulated exerciser, and nothing of the host beyond them."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "check-in-container"},
        "spec": {
            "schedulerName": SCHEDULER,
            "restartPolicy": "Never",
            "hostNetwork": True,  # no CNI on the real node: every test pod uses the host's network
            "automountServiceAccountToken": False,
            "tolerations": [{**REALNODE_TAINT, "operator": "Equal"}],
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "main",
                    "image": AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/local/bin/gpuweave", "exercise", "--simulate", "p5.48xlarge", "--json"],
                    "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                    "resources": {"limits": {RESOURCE_GPU: "2"}},
                }
            ],
        },
    }
    plane = realnode.plane
    plane.core.create_namespaced_pod(NAMESPACE, pod)

    def finished() -> Any:
        realnode.process.check_alive()
        done = plane.core.read_namespaced_pod("check-in-container", NAMESPACE)
        return done if done.status.phase in ("Succeeded", "Failed") else None

    done = wait_for("the check's container to finish", finished, timeout=180)
    output = "\n".join(realnode.container_output(done, "main"))
    assert done.status.phase == "Succeeded", output
    outcome = json.loads(output[output.index("{") :])
    assigned = json.loads(done.metadata.annotations["gpuweave.io/assignment"])
    given = set(assigned["containers"]["main"]["devices"][RESOURCE_GPU])
    assert set(outcome["gpus"]) == given and len(given) == 2  # exactly the container's GPUs
    assert {g["verdict"] for g in outcome["gpus"].values()} == {"passed"}
    assert {r["check"] for r in outcome["results"]} == {"memory", "compute", "h2d", "d2h", "p2p"}
    assert outcome["trigger"] == "container" and outcome["backend"] == "simulated"
