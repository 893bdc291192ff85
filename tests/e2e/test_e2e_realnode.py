"""One real node: the full kubelet, containerd and runc start containers with the devices gpuweave
allocated, and each test asserts what the process inside the container saw.

Real parts: ``harness realnode`` (k8s.io/kubernetes/cmd/kubelet at the pinned version, containerd
2.x with CDI, runc; tests/e2e/realnode), the e2e control plane, upstream kube-scheduler with the
gpuweave-scheduler profile and ``gpuweave extender``, and ``gpuweave node-agent --simulate``
serving the kubelet over its real device-plugin socket and writing the CDI specs containerd
reads. The GPUs are simulated (no NVIDIA driver here), so their device nodes are created by runc
from the CDI specs' numbers; the container reports them with their major:minor and the device
cgroup's allow list. See docs/e2e.md ("realnode").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import (
    ControlPlane,
    Process,
    free_port,
    gpuweave_command,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.pods import inventory
from tests.e2e.realnode import REALNODE_TAINT, SEER_IMAGE, RealNode

pytestmark = pytest.mark.realnode

NODE = "e2e-realnode"
PROFILE = "dgx-h100"
SCHEDULER = "gpuweave-realnode"
NAMESPACE = "e2e-realnode"
NVIDIA_MAJOR = 195


@pytest.fixture(scope="module")
def realnode(plane: ControlPlane, agent_kubeconfig: Path, scheduler_kubeconfig: Path) -> Iterator[RealNode]:
    """The real node with the simulated node agent on its kubelet socket, and a scheduler of its own
    (the gpuweave-scheduler profile renamed, with its own extender)."""
    plane.ensure_namespace(NAMESPACE)
    node = RealNode(plane, name=NODE, kubelet_port=free_port(), taints=REALNODE_TAINT)
    started: list[Any] = [node]
    try:
        state = node.dir / "agent-state"
        state.mkdir()
        agent = Process(
            f"node-agent-{NODE}",
            [
                *gpuweave_command(),
                "node-agent",
                "--simulate",
                PROFILE,
                "--node-name",
                NODE,
                "--kubelet-dir",
                str(node.plugin_dir),
                "--state-dir",
                str(state),
                "--cdi-spec-dir",
                str(node.cdi_dir),
                "--kubeconfig",
                str(agent_kubeconfig),
            ],
            log_dir=plane.work,
        )
        started.append(agent)
        extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="extender-realnode")
        started.append(extender)
        config = render_scheduler_config(
            plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
        )
        started.append(start_scheduler(plane, config_path=config, name="kube-scheduler-realnode"))

        def gpus_allocatable() -> bool:
            n = plane.core.read_node(NODE)
            return (n.status.allocatable or {}).get("nvidia.com/gpu") == "8"

        wait_for(
            f"{NODE} allocatable nvidia.com/gpu=8", lambda: agent.alive_and(gpus_allocatable), timeout=120
        )

        def health_done() -> bool:
            taints = plane.core.read_node(NODE).spec.taints or []
            return not any(t.key == "gpuweave.io/health-pending" for t in taints)

        wait_for(f"{NODE}'s agent health start-up", lambda: agent.alive_and(health_done), timeout=60)
        node.agent = agent
        yield node
    finally:
        for thing in reversed(started):
            thing.stop()


def seer_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    toleration = {**REALNODE_TAINT, "operator": "Equal"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "tolerations": [toleration],
            "containers": [
                {
                    "name": "main",
                    "image": SEER_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def run_seer(node: RealNode, name: str, limits: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """Create the pod, wait until it runs and its container has reported; (pod, report)."""
    node.plane.core.create_namespaced_pod(NAMESPACE, seer_pod(name, limits))

    def reported() -> tuple[Any, dict[str, Any]] | None:
        node.process.check_alive()
        pod = node.plane.core.read_namespaced_pod(name, NAMESPACE)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod.status.reason}: {pod.status.message}", pytrace=False)
        if pod.status.phase != "Running":
            return None
        seen = node.seen(pod)
        return (pod, seen) if seen is not None else None

    return wait_for(f"pod {name} running and its container's report", reported, timeout=120)


def nvidia_gpu_nodes(seen: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """/dev/nvidia<N> nodes the container has, with their device numbers."""
    out = {}
    for device in seen["devices"]:
        tail = device["path"].removeprefix("/dev/nvidia")
        if device["path"].startswith("/dev/nvidia") and tail.isdigit():
            out[device["path"]] = (device["major"], device["minor"])
    return out


def test_two_gpu_pod_sees_exactly_its_two_gpus(realnode: RealNode) -> None:
    pod, seen = run_seer(realnode, "seer-2gpu", {"nvidia.com/gpu": "2"})
    assert pod.spec.node_name == NODE
    gpus = {g["uuid"]: g for g in inventory(realnode.plane, NODE)["spec"]["gpus"]}
    visible = seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2 and set(visible) <= set(gpus), visible
    minors = sorted(int(gpus[u]["minor"]) for u in visible)
    assert nvidia_gpu_nodes(seen) == {f"/dev/nvidia{m}": (NVIDIA_MAJOR, m) for m in minors}
    allowed = set(seen["deviceCgroup"])
    for m in minors:
        assert f"c {NVIDIA_MAJOR}:{m} rwm" in allowed or f"c {NVIDIA_MAJOR}:{m} rw" in allowed, allowed
    others = set(range(8)) - set(minors)
    assert not any(f"c {NVIDIA_MAJOR}:{m} " in " ".join(allowed) + " " for m in others)
