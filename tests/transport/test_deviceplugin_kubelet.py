"""The node agent against the kubelet's own device manager (tests/e2e/harness node).

The harness node runs ``k8s.io/kubernetes/pkg/kubelet/cm/devicemanager`` and the kubelet's
admission path with a single-numa-node Topology Manager. The agent must register every resource,
show up in the Node's capacity, have pods admitted with topology-aligned devices, and come back
after the kubelet (the harness node process) restarts, with the same device IDs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from hardware.profiles import load_profile
from tests.support.agent_process import AgentProcess, remove_tree, short_temp_dir
from tests.support.control_plane import ControlPlane, harness_binary
from tests.support.pods import pod_body
from tests.support.waiting import wait_until as wait

pytestmark = pytest.mark.e2e

NODE = "gpu-node-k"


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        plane.core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        yield plane
    finally:
        plane.stop()


class Node:
    """A harness node (the kubelet's device manager) plus our agent serving its plugin directory."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.plane = control_plane
        self.root = short_temp_dir()
        self.kubelet_dir = self.root / "kubelet"
        self.plugins = self.kubelet_dir / "device-plugins"
        self.kubelet: subprocess.Popen[bytes] | None = None
        self.start_kubelet()
        wait("kubelet.sock", (self.plugins / "kubelet.sock").exists)
        self.agent = AgentProcess(self.plugins, self.root / "s", profile="p5.48xlarge", node=NODE)
        self.api = config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
        self.core = client.CoreV1Api(self.api)

    def start_kubelet(self) -> None:
        log = (self.root / "node.log").open("ab")
        command = [str(harness_binary()), "node", "--name", NODE, "--kubelet-dir", str(self.kubelet_dir)]
        command += ["--control-plane-dir", str(self.plane.dir), "--topology-policy", "single-numa-node"]
        self.kubelet = subprocess.Popen(command, stdout=log, stderr=log)
        log.close()

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            stop_process(self.kubelet)
            self.kubelet = None

    def registrations(self, resource: str) -> int:
        status = self.agent.status() or {}
        counts = status.get("registration_counts")
        return int(counts.get(resource, 0)) if isinstance(counts, dict) else 0

    def checkpointed(self, resource: str, *, since: float) -> int:
        """Devices of ``resource`` in the device manager's checkpoint, if written after ``since``."""
        path = self.plugins / "kubelet_internal_checkpoint"
        try:
            if path.stat().st_mtime < since:
                return 0
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return 0
        return len(data.get("Data", {}).get("RegisteredDevices", {}).get(resource, []))

    def capacity(self, resource: str) -> str | None:
        try:
            node = self.core.read_node(NODE)
        except client.ApiException:
            return None
        return dict(node.status.allocatable or {}).get(resource)

    def allocation(self, name: str) -> dict[str, Any] | None:
        return self.plane.allocation_of("default", name)

    def close(self) -> None:
        rc = self.agent.stop()
        self.stop_kubelet()
        self.api.close()
        log = (self.root / "node.log").read_text(errors="replace")[-3000:]
        remove_tree(self.root)
        assert rc == 0, f"{getattr(self.agent, 'stderr', '')}\n{log}"


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[Node]:
    running = Node(control_plane)
    try:
        # The Node object outlives a test (one control plane per module): its allocatable may be a
        # previous agent's, so wait for this agent's registration with this kubelet first.
        wait("GPUs registered with this kubelet", lambda: running.registrations(RESOURCE_GPU) >= 1)
        wait("GPUs in node allocatable", lambda: running.capacity(RESOURCE_GPU) == "8", timeout=90)
        yield running
    finally:
        running.close()


def pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return pod_body(name, node=NODE, limits=limits, container="main")


def test_kubelet_admits_a_numa_aligned_gpu_and_efa_pod(node: Node) -> None:
    inventory = load_profile("p5.48xlarge").to_inventory(node_name=NODE)
    assert node.capacity(RESOURCE_EFA) == str(len(inventory.nics))
    node.core.create_namespaced_pod("default", pod("trainer", {RESOURCE_GPU: "4", RESOURCE_EFA: "4"}))
    wait("allocation recorded", lambda: node.allocation("trainer") is not None, timeout=60)
    allocation = node.allocation("trainer")
    assert allocation is not None
    devices = allocation["containers"]["main"]["devices"]
    gpus = {g.uuid: g for g in inventory.gpus}
    nics = {n.name: n for n in inventory.nics}
    assert len(devices[RESOURCE_GPU]) == 4 and len(devices[RESOURCE_EFA]) == 4
    numa = {gpus[d].numa_node for d in devices[RESOURCE_GPU]} | {
        nics[d].numa_node for d in devices[RESOURCE_EFA]
    }
    assert len(numa) == 1  # single-numa-node policy with our TopologyInfo
    node.core.delete_namespaced_pod("trainer", "default", grace_period_seconds=0)


def test_kubelet_restart_reregisters_with_the_same_devices(node: Node) -> None:
    node.stop_kubelet()
    restarted = time.time()
    node.start_kubelet()
    wait("re-registered with the new kubelet", lambda: node.registrations(RESOURCE_GPU) >= 2, timeout=30)
    wait(
        "the new kubelet's checkpoint lists the GPUs",
        lambda: node.checkpointed(RESOURCE_GPU, since=restarted) == 8,
    )
    wait("GPUs back in node allocatable", lambda: node.capacity(RESOURCE_GPU) == "8", timeout=90)
    node.core.create_namespaced_pod("default", pod("after-restart", {RESOURCE_GPU: "1"}))
    wait("allocation after restart", lambda: node.allocation("after-restart") is not None, timeout=60)
    allocation = node.allocation("after-restart")
    assert allocation is not None
    uuids = {g.uuid for g in load_profile("p5.48xlarge").to_inventory(node_name=NODE).gpus}
    assert set(allocation["containers"]["main"]["devices"][RESOURCE_GPU]) <= uuids
    node.core.delete_namespaced_pod("after-restart", "default", grace_period_seconds=0)
