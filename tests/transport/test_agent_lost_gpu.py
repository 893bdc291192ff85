"""The real node-agent process with a GPU off the bus, seen from the kubelet emulator.

One lost GPU must never take the node down: at start the agent serves the seven GPUs that answer
and lists the lost one as Unhealthy; at run time re-discovery keeps working and the GPU that
stopped answering stays listed, Unhealthy, under the UUID pods hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from hardware.profiles import load_profile
from nodeagent.control import call_agent
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.waiting import wait_until


def lost_profile(directory: Path, *, lost: int) -> Path:
    document: dict[str, Any] = load_profile("p5.48xlarge").to_wire()
    document["spec"]["gpus"][lost]["lost"] = True
    path = directory / "p5-lost.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_agent_starts_with_a_lost_gpu_and_serves_the_other_seven(tmp_path: Path) -> None:
    profile = lost_profile(tmp_path, lost=3)
    lost_bus = load_profile(str(profile)).to_inventory(node_name="node-a").gpu(3).pci_bus_id
    node = AgentNode(str(profile))
    try:
        wait_until("8 GPUs and 32 EFA listed", lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8
                   and len(node.kubelet.devices(RESOURCE_EFA)) == 32, timeout=60)
        devices = node.kubelet.devices(RESOURCE_GPU)
        unhealthy = {d.id for d in devices.values() if d.health != "Healthy"}
        assert unhealthy == {f"unreachable-{lost_bus}"}
        assert len(node.kubelet.healthy(RESOURCE_GPU)) == 7
        chosen, _ = node.kubelet.allocate(RESOURCE_GPU, 7)
        assert set(chosen) == node.kubelet.healthy(RESOURCE_GPU)
    finally:
        node.close()


def test_a_gpu_lost_at_run_time_stays_listed_unhealthy_and_rediscovery_goes_on() -> None:
    node = AgentNode("dgx-h100", extra=("--rediscover-interval", "0.2"))
    try:
        wait_until("8 healthy GPUs", lambda: len(node.kubelet.healthy(RESOURCE_GPU)) == 8, timeout=60)
        ids = sorted(node.kubelet.devices(RESOURCE_GPU))
        status = json.loads((node.state_dir / "agent.json").read_text())
        assert status["resources"][RESOURCE_GPU]["devices"] == 8
        inject = run_sim_inject(node.state_dir, "--gpu", "2", "--xid", "79")
        assert inject.returncode == 0, inject.stderr
        lost_uuid = load_profile("dgx-h100").to_inventory(node_name="node-a").gpu(2).uuid
        wait_until("GPU 2 unhealthy", lambda: node.kubelet.healthy(RESOURCE_GPU) == set(ids) - {lost_uuid})
        refreshed = call_agent(node.state_dir, "agent.refresh")
        assert refreshed["resources"][RESOURCE_GPU] == 8
        health = call_agent(node.state_dir, "agent.health")
        listed = health["resources"][RESOURCE_GPU]
        reasons = {d["id"]: d["reason"] for d in listed if d["health"] != "Healthy"}
        assert set(reasons) == {lost_uuid}
        assert sorted(node.kubelet.devices(RESOURCE_GPU)) == ids
    finally:
        node.close()
