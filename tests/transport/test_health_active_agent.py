"""Active checks against the real node-agent process: ``gpuweave check`` over the real control
socket, faults from ``gpuweave sim inject``, what the kubelet emulator then sees, and the burn-in
of a restarted agent (a bad memory cell is the hardware's: it survives the restart)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devicemodel.contracts import RESOURCE_GPU
from hardware.profiles import load_profile
from nodeagent.control import call_agent
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import REPO_ROOT, short_temp_dir

HEALTH = {
    "health": {
        "round_interval_s": 0.05,
        "check_timeout_s": 0.4,
        "event_wait_ms": 50,
        "active_checks": {"deadline_s": 5, "recheck_interval_s": 0},
    }
}
WAIT = 20.0


class Node(AgentNode):
    def __init__(self) -> None:
        root = short_temp_dir()
        (root / "health.yaml").write_text(yaml.safe_dump(HEALTH))
        super().__init__("dgx-h100", extra=("--health-config", str(root / "health.yaml")), root=root)
        self.inventory = load_profile("dgx-h100").to_inventory(node_name="node-a")

    def uuid(self, index: int) -> str:
        return self.inventory.gpu(index).uuid

    def status(self) -> dict[str, Any]:
        return call_agent(self.state_dir, "health.status")

    def inject(self, *args: str) -> None:
        done = run_sim_inject(self.state_dir, *args)
        assert done.returncode == 0, done.stderr

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "gpuweave", "check", "--state-dir", str(self.state_dir), *args]
        return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)

    def healthy(self) -> set[int]:
        by_uuid = {g.uuid: g.index for g in self.inventory.gpus}
        return {by_uuid[u] for u in self.kubelet.healthy(RESOURCE_GPU)}

    def wait(self, predicate: Any, what: str) -> None:
        assert self.kubelet.wait_for(lambda: _quietly(predicate), timeout=WAIT), (
            f"timed out waiting for {what}"
        )

    def started(self) -> bool:
        status = self.status()
        return not status["startupPending"] and status["activeChecks"]["lastRun"] is not None


def _quietly(predicate: Any) -> bool:
    try:
        return bool(predicate())
    except Exception:
        return False


@pytest.fixture
def node() -> Iterator[Node]:
    started = Node()
    started.wait(lambda: started.started() and started.healthy() == set(range(8)), "burn-in and two rounds")
    yield started
    started.close()


def test_gpuweave_check_finds_bad_memory_and_a_degraded_nvlink_pair_and_leaves_a_pods_gpu_alone(
    node: Node,
) -> None:
    burn_in = node.status()["activeChecks"]["lastRun"]
    assert burn_in["trigger"] == "burn-in" and "8 GPU(s) passed" in burn_in["summary"]
    (held,), _ = node.kubelet.allocate(RESOURCE_GPU, 1)  # a pod's GPU (the agent's recent grant)
    held_index = node.inventory.gpu_by_uuid(held).index
    a = next(i for i in range(7) if held_index not in (i, i + 1))  # a ring pair of the NVSwitch run
    bad = next(i for i in range(8) if i not in (held_index, a, a + 1))
    node.inject("--gpu", str(bad), "--bad-memory", "0x100000")
    node.inject("--gpu", str(a), "--slow-nvlink", str(a + 1))
    done = node.check("--json")
    assert done.returncode == 1, done.stderr
    outcome = json.loads(done.stdout)
    verdicts = {gpu["index"]: gpu["verdict"] for gpu in outcome["gpus"].values()}
    assert verdicts.pop(held_index) == "skipped"
    assert outcome["gpus"][held]["reasons"] == ["a pod holds it"]
    assert {i for i, v in verdicts.items() if v == "failed"} == {bad}  # a slow link fails neither end
    assert "hard memory failure" in outcome["gpus"][node.uuid(bad)]["reasons"][0]
    (slow,) = outcome["slowLinks"]
    assert slow.startswith("active-check: NVLink copies")
    node.wait(lambda: node.healthy() == set(range(8)) - {bad}, "the failed GPU withheld, the pair's kept")
    status = node.status()
    assert set(status["activeChecks"]["rechecks"]) == {node.uuid(bad)}
    assert status["degradedLinks"] == [[*sorted((node.uuid(a), node.uuid(a + 1))), slow]]


def test_gpuweave_check_of_one_gpu_prints_its_table_and_passes(node: Node) -> None:
    done = node.check("--gpu", "4", "--level", "2")
    assert done.returncode == 0, done.stderr
    assert "active check" in done.stdout and "level 2" in done.stdout
    assert "  4  passed" in done.stdout
    assert done.stdout.count("p2p") == 0  # a peer pair needs both GPUs in the run


def test_bad_check_requests_get_one_line_errors(node: Node) -> None:
    done = node.check("--gpu", "9")
    assert done.returncode == 2
    assert "no GPU 9 on this node (it has 8: 0-7)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    missing = node.check("--run", "999")
    assert missing.returncode == 2 and "no active-check run 999" in missing.stderr


def test_a_hung_check_fails_its_gpu_closed_within_the_deadline(node: Node) -> None:
    node.inject("--gpu", "6", "--check-hang", "120")
    done = node.check("--gpu", "6", "--gpu", "7", "--json")
    assert done.returncode == 1, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["seconds"] < 5 + 5  # the deadline, not the 120 s hang
    assert outcome["gpus"][node.uuid(6)]["verdict"] == "failed"
    assert "hung" in outcome["gpus"][node.uuid(6)]["reasons"][0]
    assert outcome["gpus"][node.uuid(7)]["verdict"] in ("passed", "incomplete")
    node.wait(lambda: 6 not in node.healthy(), "GPU 6 withheld")


def test_a_restarted_agent_burns_in_and_withholds_only_the_gpu_with_bad_memory(node: Node) -> None:
    node.inject("--gpu", "5", "--bad-memory", "64")
    assert node.agent.stop() == 0
    node.agent = node.start_agent()
    node.wait(node.started, "the restarted agent's burn-in and rounds")
    node.wait(lambda: node.healthy() == set(range(8)) - {5}, "every GPU but 5 served")
    status = node.status()
    assert status["gpus"][node.uuid(5)]["state"] in ("Failed", "Retired")
    assert status["activeChecks"]["lastRun"]["trigger"] == "burn-in"
    node.wait(lambda: node.status()["badHardware"] == [node.uuid(5)], "GPU 5 on the bad-hardware list")


def test_sim_inject_refuses_exerciser_faults_it_cannot_place(node: Node) -> None:
    for args, message in [
        (("--bad-memory", "0x10"), "need --gpu INDEX"),
        (("--gpu", "1", "--slow-nvlink", "1"), "needs two GPUs"),
        (("--gpu", "1", "--bad-memory", "lots"), "is not a byte offset"),
    ]:
        done = run_sim_inject(node.state_dir, *args)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
