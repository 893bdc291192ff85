"""IMEX channels through the device-plugin API, over real unix sockets (the product's SimKubelet).

A node in a multi-node NVLink domain (a GB200 tray) serves ``gpuweave.io/imex-channel`` with one
device, channel 0; Allocate hands the channel's device node and ``NVIDIA_IMEX_CHANNELS``. A node
without a domain (an HGX board) serves no such resource.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import IMEX_CHANNELS_ENV, RESOURCE_GPU, RESOURCE_IMEX_CHANNEL
from gpuweave.node.builder import NodeAgentBuilder
from gpuweave.simulate.kubelet import SimKubelet
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.devices import IMEX_CHANNEL_ID


def _agent(tmp_path: Path, profile: str) -> Iterator[tuple[SimKubelet, NodeAgent, SimulatedBackend]]:
    kubelet = SimKubelet(tmp_path / "kubelet")
    kubelet.start()
    backend = SimulatedBackend(load_profile(profile), tmp_path / "hw", node_name="n0")
    builder = NodeAgentBuilder(backend, state_dir=tmp_path / "state", node_name="n0")
    agent = builder.agent(AgentConfig(kubelet_dir=tmp_path / "kubelet", state_dir=tmp_path / "state"))
    agent.start()
    try:
        yield kubelet, agent, backend
    finally:
        agent.stop()
        kubelet.stop()
        backend.close()


@pytest.fixture
def tray(tmp_path: Path) -> Iterator[tuple[SimKubelet, NodeAgent, SimulatedBackend]]:
    yield from _agent(tmp_path, "gb200-compute-tray")


def test_a_tray_serves_one_imex_channel_and_allocate_hands_its_node(
    tray: tuple[SimKubelet, NodeAgent, SimulatedBackend],
) -> None:
    kubelet, _, backend = tray
    assert kubelet.wait_for({RESOURCE_GPU, RESOURCE_IMEX_CHANNEL})
    assert kubelet.devices(RESOURCE_IMEX_CHANNEL) == {IMEX_CHANNEL_ID: "Healthy"}
    answer = kubelet.allocate(RESOURCE_IMEX_CHANNEL, [IMEX_CHANNEL_ID])
    assert dict(answer.envs) == {IMEX_CHANNELS_ENV: "0"}
    (device,) = answer.devices
    path = "/dev/nvidia-caps-imex-channels/channel0"
    assert (device.host_path, device.container_path, device.permissions) == (path, path, "rw")
    assert (backend.sysfs_root / path.lstrip("/")).exists()  # the simulated host has the node


def test_an_unknown_channel_is_refused(tray: tuple[SimKubelet, NodeAgent, SimulatedBackend]) -> None:
    kubelet, _, _ = tray
    assert kubelet.wait_for({RESOURCE_IMEX_CHANNEL})
    with pytest.raises(Exception, match="imex-channel-1"):
        kubelet.allocate(RESOURCE_IMEX_CHANNEL, ["imex-channel-1"])


def test_a_board_without_a_multi_node_domain_serves_no_channel(tmp_path: Path) -> None:
    for kubelet, agent, _ in _agent(tmp_path, "dgx-h100"):
        assert kubelet.wait_for({RESOURCE_GPU})
        assert RESOURCE_IMEX_CHANNEL not in agent.resource_names()
