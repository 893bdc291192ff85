"""Active checks between jobs against the real node-agent process: the kubelet emulator admits and
ends pods (their devices listed by a pod-resources server, as the kubelet lists them) while the
agent checks idle GPUs, and no GPU is ever exercised while a pod holds it; a pod the kubelet
admits onto a GPU mid-check (it chose the GPU before the withholding reached it) gets it, and the
exerciser has let go of it before Allocate answers.

"Exercised" is read from the simulated exerciser's activity log (``sim-exerciser-activity.jsonl``
beside the agent's state: each check's begin and end on the system's monotonic clock), and a pod
holds its GPUs from its Allocate's answer (no container can use a GPU before it) until after the
pod-resources server stops listing it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devicemodel.contracts import RESOURCE_GPU
from hardware.profiles import load_profile
from hardware.simulated.node import ACTIVITY_FILE
from health.active_claims import CLAIMED_REASON
from nodeagent.control import call_agent
from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import REPO_ROOT, short_temp_dir
from tests.support.podresources_server import PodResourcesServer

WAIT = 30.0
Interval = tuple[float, float]


def health(idle: dict[str, Any]) -> dict[str, Any]:
    return {
        "health": {
            "round_interval_s": 0.05,
            "check_timeout_s": 0.4,
            "event_wait_ms": 50,
            "active_checks": {"burn_in_level": 0, "deadline_s": 20, "recheck_interval_s": 0, "idle": idle},
        }
    }


class Node(AgentNode):
    def __init__(self, idle: dict[str, Any]) -> None:
        root = short_temp_dir()
        (root / "health.yaml").write_text(yaml.safe_dump(health(idle)))
        self.pods = PodResourcesServer(root / "pr" / "kubelet.sock")
        self.pods.start()
        extra = (
            "--health-config",
            str(root / "health.yaml"),
            "--pod-resources-socket",
            str(self.pods.socket_path),
        )
        super().__init__("dgx-h100", extra=extra, root=root)

    def close(self) -> None:
        super().close()
        self.pods.stop()

    def status(self) -> dict[str, Any]:
        return dict(call_agent(self.state_dir, "health.status"))

    def exercised(self) -> dict[str, list[Interval]]:
        """GPU UUID -> when a check ran on it (begin, end; a check still running ends at +inf)."""
        uuids = dict(enumerate(sorted_uuids(self)))
        path = self.state_dir / ACTIVITY_FILE
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        open_: dict[tuple[int, str], float] = {}
        out: dict[str, list[Interval]] = {}
        for e in lines:
            key = (int(e["gpu"]), str(e["check"]))
            if e["begun"]:
                open_[key] = float(e["at"])
            elif key in open_:
                out.setdefault(uuids[key[0]], []).append((open_.pop(key), float(e["at"])))
        for (gpu, _), begun in open_.items():
            out.setdefault(uuids[gpu], []).append((begun, float("inf")))
        return out

    def wait(self, predicate: Any, what: str, timeout: float = WAIT) -> None:
        assert self.kubelet.wait_for(lambda: _quietly(predicate), timeout=timeout), (
            f"timed out waiting for {what}"
        )


def sorted_uuids(node: AgentNode) -> list[str]:
    """The node's GPU UUIDs by index (the agent derives them from the profile and the node name)."""
    inventory = load_profile("dgx-h100").to_inventory(node_name=node.node_name)
    return [g.uuid for g in sorted(inventory.gpus, key=lambda g: g.index)]


def _quietly(predicate: Any) -> bool:
    try:
        return bool(predicate())
    except Exception:
        return False


@pytest.fixture
def churn() -> Iterator[Node]:
    node = Node({"interval_s": 0.4, "settle_s": 0.1, "max_gpus": 2})
    try:
        node.wait(lambda: len(node.kubelet.healthy(RESOURCE_GPU)) == 8, "8 healthy GPUs")
        yield node
    finally:  # a setup that fails stops the agent too
        node.close()


def overlaps(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_checks_between_jobs_never_run_on_a_gpu_a_pod_holds(churn: Node) -> None:
    rng = random.Random(7)
    held: dict[str, list[Interval]] = {}
    running: list[tuple[str, list[str], float, float]] = []  # pod, GPUs, since, until
    deadline = time.monotonic() + 8.0
    n = 0
    while time.monotonic() < deadline:
        now = time.monotonic()
        for pod in [p for p in running if p[3] <= now]:
            churn.pods.remove("ml", pod[0])
            churn.kubelet.release(RESOURCE_GPU, pod[1])
            ended = time.monotonic()
            for gpu in pod[1]:
                held.setdefault(gpu, []).append((pod[2], ended))
            running.remove(pod)
        free = len(churn.kubelet.healthy(RESOURCE_GPU) - churn.kubelet.allocated(RESOURCE_GPU))
        if free and rng.random() < 0.5:
            n += 1
            try:
                ids, _ = churn.kubelet.allocate(RESOURCE_GPU, rng.randint(1, min(free, 3)))
            except Exception:  # a GPU withheld meanwhile: as the kubelet, try again later
                continue
            since = time.monotonic()
            churn.pods.admit("ml", f"pod-{n}", {"main": {RESOURCE_GPU: ids}})
            running.append((f"pod-{n}", ids, since, since + rng.uniform(0.2, 1.2)))
        time.sleep(0.05)
    for pod in running:
        for gpu in pod[1]:
            held.setdefault(gpu, []).append((pod[2], float("inf")))
    exercised = churn.exercised()
    assert sum(len(v) for v in exercised.values()) >= 8, "too few checks ran to show anything"
    assert sum(len(v) for v in held.values()) >= 8, "too few pods ran to show anything"
    for gpu, checks in exercised.items():
        for check in checks:
            clash = [pod for pod in held.get(gpu, []) if overlaps(check, pod)]
            assert not clash, f"GPU {gpu} exercised {check} while a pod held it {clash}"
    last = churn.status()["activeChecks"]["lastRun"]
    assert last["trigger"] == "idle"


def test_a_pod_admitted_onto_a_gpu_mid_check_gets_it_and_the_check_lets_go_first() -> None:
    node = Node({"interval_s": 0})  # no checks between jobs: this one is asked for
    try:
        node.wait(lambda: len(node.kubelet.healthy(RESOURCE_GPU)) == 8, "8 healthy GPUs")
        uuids = sorted_uuids(node)
        assert run_sim_inject(node.state_dir, "--gpu", "2", "--check-hang", "60").returncode == 0
        command = [sys.executable, "-m", "gpuweave", "check", "--state-dir", str(node.state_dir)]
        check = subprocess.Popen(
            [*command, "--gpu", "2", "--gpu", "3", "--json"], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
        )
        node.wait(
            lambda: any(c[1] == float("inf") for c in node.exercised().get(uuids[2], [])), "GPU 2's check"
        )
        node.wait(lambda: uuids[2] not in node.kubelet.healthy(RESOURCE_GPU), "GPU 2 withheld")
        # The kubelet chose GPU 2 before the withholding reached it: its Allocate comes now.
        asked = time.monotonic()
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[uuids[2]])]
        )
        response = node.kubelet.stub(RESOURCE_GPU).Allocate(request, timeout=20)
        answered = time.monotonic()
        assert len(response.container_responses) == 1  # the pod got its GPU
        assert answered - asked < 8  # not the 60 s hang, nor the 20 s deadline
        (check_on_2,) = node.exercised()[uuids[2]]
        assert check_on_2[1] <= answered  # the exerciser let go before Allocate answered
        out, _ = check.communicate(timeout=30)
        outcome = json.loads(out)
        assert outcome["gpus"][uuids[2]]["verdict"] == "skipped"
        assert outcome["gpus"][uuids[2]]["reasons"] == [CLAIMED_REASON]
        node.wait(lambda: uuids[2] in node.kubelet.healthy(RESOURCE_GPU), "GPU 2 served again")
        assert node.status()["gpus"][uuids[2]]["state"] == "Healthy"
    finally:
        node.close()
