"""The real node-agent process on an NVSwitch board whose fabric is not ready, seen from the kubelet.

Every CUDA context fails (error 802) until the fabric is trained, so the agent must list the GPUs
but report each one Unhealthy from its first list on, and offer them once the fabric completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from devicemodel.contracts import RESOURCE_GPU
from hardware.profiles import load_profile
from nodeagent.control import call_agent
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.waiting import wait_until


def fabric_profile(directory: Path, name: str, state: str) -> Path:
    document: dict[str, Any] = load_profile(name).to_wire()
    document["spec"]["nvswitch"]["fabricState"] = state
    path = directory / f"{name}-fabric.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_fabric_not_ready_withholds_every_gpu_from_the_first_list_until_it_completes(tmp_path: Path) -> None:
    profile = fabric_profile(tmp_path, "dgx-h100", "in-progress")
    node = AgentNode(str(profile), extra=("--fabric-check-interval", "0.2"))
    try:
        wait_until("8 GPUs listed", lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8, timeout=60)
        endpoint = node.kubelet.endpoint(RESOURCE_GPU)
        assert node.kubelet.healthy(RESOURCE_GPU) == set()
        assert endpoint.updates == 1  # the very first list already withheld them
        health = call_agent(node.state_dir, "agent.health")
        assert all("NVSwitch fabric in-progress" in d["reason"] for d in health["resources"][RESOURCE_GPU])
        inject = run_sim_inject(node.state_dir, "--fabric-state", "completed")
        assert inject.returncode == 0, inject.stderr
        wait_until("8 healthy GPUs", lambda: len(node.kubelet.healthy(RESOURCE_GPU)) == 8, timeout=30)
    finally:
        node.close()


def test_ampere_fabric_manager_stopping_withholds_every_gpu(tmp_path: Path) -> None:
    node = AgentNode("dgx-a100", extra=("--fabric-check-interval", "0.2"))
    try:
        wait_until("8 healthy GPUs", lambda: len(node.kubelet.healthy(RESOURCE_GPU)) == 8, timeout=60)
        inject = run_sim_inject(node.state_dir, "--fabric-state", "not-started")
        assert inject.returncode == 0, inject.stderr
        wait_until("no healthy GPU", lambda: node.kubelet.healthy(RESOURCE_GPU) == set(), timeout=30)
        assert len(node.kubelet.devices(RESOURCE_GPU)) == 8
    finally:
        node.close()
