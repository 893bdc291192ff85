"""Scenario: GPU 3 of a simulated DGX H100 is reshaped while the other GPUs stay allocated.

Real parts: the node agent's gRPC servers on unix sockets, the kubelet emulator, the control
socket (``mig.apply`` as ``gpuweave mig apply`` sends it), the production NVML reader over the
simulated pynvml library. GPU 3 goes whole -> 3g+3g -> 3g + 3x1g (the busy 3g kept) -> 7x1g.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.cli import main
from gpuweave.node.mig import build_mig_service, register_mig_routes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.control import call_agent
from nodeagent.errors import ControlError
from proto.v1beta1 import api_pb2
from tests.support.kubelet_emulator import KubeletEmulator, SeenDevice

MIG_3G = mig_resource_name("3g.40gb")
MIG_1G = mig_resource_name("1g.10gb")


@dataclass
class Node:
    agent: NodeAgent
    kubelet: KubeletEmulator
    backend: SimulatedBackend
    state_dir: Path


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="gwm", dir="/tmp"))
    kubelet_dir, state_dir = root / "k", root / "s"
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs")
    agent = device_plugin_agent(
        AgentConfig(kubelet_dir=kubelet_dir, state_dir=state_dir), discover=backend.discover
    )
    service = build_mig_service(agent, backend=backend, state_dir=state_dir, inventory=backend.discover())
    service.start()
    agent.start()
    register_mig_routes(agent, service)
    try:
        yield Node(agent, kubelet, backend, state_dir)
    finally:
        agent.stop()
        kubelet.stop()
        backend.close()
        shutil.rmtree(root, ignore_errors=True)


def apply(node: Node, gpu: int, profiles: list[str]) -> dict[str, object]:
    return call_agent(node.state_dir, "mig.apply", {"gpu": gpu, "profiles": profiles}, timeout=60)


def snapshot(devices: dict[str, SeenDevice], ids: list[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {i: (devices[i].health, devices[i].numa_nodes) for i in ids}


def test_reshape_one_gpu_in_place_while_the_others_stay_allocated(node: Node) -> None:
    kubelet, inventory = node.kubelet, node.backend.inventory
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 8)
    gpu3 = inventory.gpu(3).uuid
    others = [g.uuid for g in inventory.gpus if g.index != 3]
    response = kubelet.stub(RESOURCE_GPU).Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=others)]),
        timeout=10,
    )
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(others)
    before = snapshot(kubelet.devices(RESOURCE_GPU), others)
    assert all(health == "Healthy" for health, _ in before.values())

    # whole -> 3g + 3g: the GPU leaves nvidia.com/gpu in place, a MIG resource appears
    result = apply(node, 3, ["3g.40gb", "3g.40gb"])
    assert result["modeChange"] == "enabled"
    assert [(c["start"], c["size"]) for c in result["created"]] == [(0, 4), (4, 4)]  # type: ignore[index]
    assert kubelet.wait_for(
        lambda: len(kubelet.healthy(MIG_3G)) == 2 and gpu3 not in kubelet.devices(RESOURCE_GPU)
    )
    assert snapshot(kubelet.devices(RESOURCE_GPU), others) == before
    assert sorted(kubelet.devices(RESOURCE_GPU)) == sorted(others)

    # a pod runs on the 3g at slots 0-3; 3g + 3x1g keeps it and destroys only the idle 3g
    busy = next(c["uuid"] for c in result["created"] if c["start"] == 0)  # type: ignore[union-attr]
    idle = next(c["uuid"] for c in result["created"] if c["start"] == 4)  # type: ignore[union-attr]
    node.backend.node.mig.gpus[3].set_busy(busy)
    result = apply(node, 3, ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"])
    assert result["created"] and len(result["destroyed"]) == 1 and idle in result["destroyed"][0]  # type: ignore[index]
    assert kubelet.wait_for(
        lambda: set(kubelet.devices(MIG_3G)) == {busy} and len(kubelet.healthy(MIG_1G)) == 3
    )
    assert kubelet.devices(MIG_3G)[busy].health == "Healthy"

    # the busy 3g blocks 7x1g; the refusal names it and nothing changes
    with pytest.raises(ControlError, match=r"busy instance 3g.40gb at slots 0-3"):
        apply(node, 3, ["1g.10gb"] * 7)
    assert set(kubelet.devices(MIG_3G)) == {busy}

    # the pod ends: 7x1g; the 1g resource grows, the 3g resource empties, both in place
    node.backend.node.mig.gpus[3].set_busy(busy, busy=False)
    apply(node, 3, ["1g.10gb"] * 7)
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_1G)) == 7 and kubelet.devices(MIG_3G) == {})
    assert MIG_3G in kubelet.resources()  # still registered, streaming an empty list

    assert snapshot(kubelet.devices(RESOURCE_GPU), others) == before
    assert kubelet.registrations.count(RESOURCE_GPU) == 1
    assert kubelet.registrations.count(MIG_3G) == 1 and kubelet.registrations.count(MIG_1G) == 1
    assert node.agent.health_report()["withheld"] == {}


def test_bad_requests_get_a_clear_answer(node: Node) -> None:
    with pytest.raises(ControlError, match="bad MIG request"):
        call_agent(node.state_dir, "mig.apply", {"gpu": 3})
    with pytest.raises(ControlError, match="no GPU with index 11"):
        apply(node, 11, ["1g.10gb"])
    with pytest.raises(ControlError, match="max count 1"):
        apply(node, 3, ["4g.40gb", "4g.40gb"])
    status = call_agent(node.state_dir, "mig.status")
    assert set(status["gpus"]) == {str(i) for i in range(8)}  # type: ignore[arg-type]


def test_cli_apply_goes_through_the_agent(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mig", "apply", "--state-dir", str(node.state_dir), "--gpu", "5"]
    assert main([*argv, "--profiles", "4g.40gb,3g.40gb"]) == 0
    out = capsys.readouterr().out
    assert "MIG mode enabled" in out
    assert "created   4g.40gb      start 0 size 4  MIG-" in out
    assert "final layout: [0-3] 4g.40gb [4-7] 3g.40gb" in out
    assert main([*argv, "--profiles", "4g.40gb,3g.40gb"]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert main([*argv, "--whole"]) == 0
    assert "MIG mode disabled" in capsys.readouterr().out
    assert node.kubelet.wait_for(
        lambda: node.backend.inventory.gpu(5).uuid in node.kubelet.devices(RESOURCE_GPU)
    )


def test_declared_layout_then_demand(node: Node) -> None:
    kubelet = node.kubelet
    layout = {"gpus": {"1": ["3g.40gb", "3g.40gb"], "2": ["1g.10gb@0"]}}
    results = call_agent(node.state_dir, "mig.declare", {"layout": layout})["results"]
    assert [r["gpu"] for r in results] == [1, 2]  # type: ignore[index]
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2 and len(kubelet.healthy(MIG_1G)) == 1)
    pending = [{"nvidia.com/mig-1g.10gb": 2}, {"nvidia.com/mig-1g.10gb": 1, "cpu": 2}]
    results = call_agent(node.state_dir, "mig.demand", {"pending": pending})["results"]
    assert [(r["gpu"], len(r["created"])) for r in results] == [(2, 2)]  # type: ignore[index]
    assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_1G)) == 3)
    with pytest.raises(ControlError, match=r"bad gpuweave\.io/mig-layout annotation"):
        call_agent(node.state_dir, "mig.declare", {"layout": "{}"})
