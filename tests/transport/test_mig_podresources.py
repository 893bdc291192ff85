"""Scenario: a MIG device the kubelet gave a pod whose container has not started is kept by a reshape.

Real parts: the node agent's gRPC servers and the kubelet emulator on unix sockets, the kubelet's
pod-resources API (``v1.PodResourcesLister``) on ``<kubelet root>/pod-resources/kubelet.sock``,
the control socket (``mig.apply``), the production NVML reader over the simulated pynvml library.
NVML sees no process on the allocated device: only the kubelet knows it is taken. When the
pod-resources API cannot be read every reshape is refused (fail closed), and a device this agent
granted in Allocate moments ago is kept even before the kubelet lists it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devicemodel.contracts import mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.mig import build_mig_service, register_mig_routes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.control import call_agent
from nodeagent.errors import ControlError
from nodeagent.podresources import AllocationLog, PodResourcesClient, default_socket_for
from tests.support.agent_process import short_temp_dir
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.podresources_server import PodResourcesServer

MIG_3G = mig_resource_name("3g.40gb")
MIG_1G = mig_resource_name("1g.10gb")


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    agent: NodeAgent
    kubelet: KubeletEmulator
    pod_resources: PodResourcesServer
    backend: SimulatedBackend
    state_dir: Path
    clock: FakeClock


@pytest.fixture
def node() -> Iterator[Node]:
    root = short_temp_dir()
    plugin_dir, state_dir = root / "kubelet" / "device-plugins", root / "s"
    socket_path = default_socket_for(plugin_dir)
    assert socket_path == root / "kubelet" / "pod-resources" / "kubelet.sock"
    kubelet, pod_resources = KubeletEmulator(plugin_dir), PodResourcesServer(socket_path)
    kubelet.start()
    pod_resources.start()
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs")
    clock = FakeClock()
    agent = device_plugin_agent(
        AgentConfig(kubelet_dir=plugin_dir, state_dir=state_dir),
        discover=backend.discover,
        allocations=AllocationLog(clock),
    )
    client = PodResourcesClient(socket_path, timeout=2)
    service = build_mig_service(
        agent, backend=backend, state_dir=state_dir, inventory=backend.discover(), pod_resources=client
    )
    service.start()
    agent.start()
    register_mig_routes(agent, service)
    try:
        yield Node(agent, kubelet, pod_resources, backend, state_dir, clock)
    finally:
        agent.stop()
        pod_resources.stop()
        kubelet.stop()
        backend.close()
        shutil.rmtree(root, ignore_errors=True)


def apply(node: Node, gpu: int, profiles: list[str]) -> dict[str, object]:
    return call_agent(node.state_dir, "mig.apply", {"gpu": gpu, "profiles": profiles}, timeout=60)


def admit(node: Node, pod: str, resource: str) -> str:
    """The kubelet admits a pod: Allocate through the device plugin, then lists it in pod-resources."""
    (device,), _ = node.kubelet.allocate(resource, 1)
    node.pod_resources.admit("ml", pod, {"main": {resource: [device]}})
    return device


def test_allocated_but_idle_mig_device_is_not_destroyed(node: Node) -> None:
    kubelet = node.kubelet
    apply(node, 3, ["3g.40gb", "3g.40gb"])
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2)
    held = admit(node, "waiting", MIG_3G)
    (idle,) = kubelet.healthy(MIG_3G) - {held}
    node.clock.now += 60  # the grant is old, no process runs: only the kubelet's list says it is taken

    status = call_agent(node.state_dir, "mig.status")["gpus"]["3"]
    assert sorted(i["busy"] for i in status) == [False, True]
    with pytest.raises(ControlError, match=r"busy instance 3g.40gb"):
        apply(node, 3, ["1g.10gb"] * 7)
    assert set(kubelet.devices(MIG_3G)) == {held, idle}

    result = apply(node, 3, ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"])
    assert [d for d in result["destroyed"] if held in d] == []  # type: ignore[attr-defined]
    assert [d for d in result["destroyed"] if idle in d]  # type: ignore[attr-defined]
    assert kubelet.wait_for(
        lambda: set(kubelet.devices(MIG_3G)) == {held} and len(kubelet.healthy(MIG_1G)) == 3
    )

    node.pod_resources.remove("ml", "waiting")  # the pod ended: the kubelet lists it no more
    apply(node, 3, ["1g.10gb"] * 7)
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_1G)) == 7 and kubelet.devices(MIG_3G) == {})


def test_unreadable_pod_resources_blocks_every_reshape(node: Node) -> None:
    kubelet = node.kubelet
    apply(node, 3, ["3g.40gb", "3g.40gb"])
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2)
    before = set(kubelet.devices(MIG_3G))
    node.pod_resources.stop()
    with pytest.raises(ControlError, match=r"cannot tell which MIG devices pods hold.*pod-resources"):
        apply(node, 3, ["1g.10gb"] * 7)
    with pytest.raises(ControlError, match=r"cannot tell which MIG devices pods hold"):
        apply(node, 4, ["7g.80gb"])  # no destroy at all: still refused, nothing is known
    assert set(kubelet.devices(MIG_3G)) == before
    assert node.agent.health_report()["withheld"] == {}
    node.pod_resources.start()
    apply(node, 3, ["1g.10gb"] * 7)
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_1G)) == 7)


def test_a_device_granted_moments_ago_is_kept_before_the_kubelet_lists_it(node: Node) -> None:
    kubelet = node.kubelet
    apply(node, 3, ["3g.40gb", "3g.40gb"])
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2)
    (granted,), _ = kubelet.allocate(MIG_3G, 1)  # Allocate answered; pod-resources does not list it yet
    with pytest.raises(ControlError, match=r"busy instance 3g.40gb"):
        apply(node, 3, ["1g.10gb"] * 7)
    assert granted in kubelet.devices(MIG_3G)
    node.clock.now += 60  # the admission failed after all: nothing lists the device, the grant is old
    apply(node, 3, ["1g.10gb"] * 7)
    assert kubelet.wait_for(lambda: kubelet.devices(MIG_3G) == {})
