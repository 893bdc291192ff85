"""The real node-agent process refuses a node where another device plugin serves our resources.

Another plugin is a live unix socket in the kubelet's device-plugin directory, named as the NVIDIA
device plugin or the EKS EFA device plugin names theirs; the kubelet emulator runs as the kubelet.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU
from deviceplugin.coexistence import foreign_plugins
from tests.support.agent_process import AgentProcess, remove_tree, short_temp_dir
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.waiting import wait_until


@pytest.fixture
def kubelet() -> Iterator[KubeletEmulator]:
    root = short_temp_dir()
    emulator = KubeletEmulator(root / "k")
    emulator.start()
    yield emulator
    emulator.stop()
    remove_tree(root)


def listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def run_agent(kubelet: KubeletEmulator, profile: str) -> tuple[int, str]:
    agent = AgentProcess(kubelet.plugin_dir, kubelet.plugin_dir.parent / "s", profile=profile)
    try:
        rc = agent.process.wait(timeout=60)
    finally:
        agent.stop()
    return rc, agent.stderr


@pytest.mark.parametrize(
    ("profile", "socket_name", "resource", "component"),
    [
        ("dgx-h100", "nvidia-gpu.sock", RESOURCE_GPU, "devicePlugin.enabled=false"),
        ("dgx-h100", "nvidia-mig-1g.10gb.sock", "nvidia.com/mig-1g.10gb", "devicePlugin.enabled=false"),
        ("p5.48xlarge", "aws-efa-device-plugin.sock", "vpc.amazonaws.com/efa", "aws-efa-k8s-device-plugin"),
    ],
)
def test_agent_refuses_to_start_beside_a_plugin_serving_our_resource(
    kubelet: KubeletEmulator, profile: str, socket_name: str, resource: str, component: str
) -> None:
    with listen(kubelet.plugin_dir / socket_name):
        rc, stderr = run_agent(kubelet, profile)
    last = stderr.strip().splitlines()[-1]
    assert rc != 0
    assert f"another device plugin already serves {resource}" in last and component in last
    assert kubelet.resources() == []  # nothing of ours was registered
    assert not list(kubelet.plugin_dir.glob("gpuweave-*.sock"))


def test_an_efa_plugin_on_a_node_without_efa_and_a_stale_socket_do_not_stop_the_agent(
    kubelet: KubeletEmulator,
) -> None:
    (kubelet.plugin_dir / "nvidia-gpu.sock").touch()  # a plugin that exited: nobody listens
    with listen(kubelet.plugin_dir / "aws-efa-device-plugin.sock"):
        assert [p.resource for p in foreign_plugins(kubelet.plugin_dir)] == ["vpc.amazonaws.com/efa"]
        agent = AgentProcess(kubelet.plugin_dir, kubelet.plugin_dir.parent / "s", profile="dgx-h100")
        try:
            wait_until("8 GPUs", lambda: len(kubelet.devices(RESOURCE_GPU)) == 8, timeout=60)
        finally:
            assert agent.stop() == 0, agent.stderr
