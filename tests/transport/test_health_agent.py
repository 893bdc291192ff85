"""Health scenarios against the real node-agent process, observed through the kubelet emulator.

Faults are injected with ``gpuweave sim inject`` into the running agent's simulated hardware; what
the kubelet sees (ListAndWatch health) and what it can allocate is the outcome under test. Check
rounds run every 50 ms so the scenarios are quick; waits have generous deadlines (latency is
measured in benchmarks/health.py, not asserted here).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_SHARED, mig_resource_name
from devicemodel.spec import NodeProfile
from hardware.profiles import load_profile
from nodeagent.control import call_agent
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import short_temp_dir
from tests.support.small_inventory import small_inventory

HEALTH_CONFIG = {"health": {"round_interval_s": 0.05, "check_timeout_s": 0.4, "event_wait_ms": 50}}
WAIT = 15.0


class Node(AgentNode):
    def __init__(self, profile: str, *, root: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        root = root or short_temp_dir()
        (root / "health.yaml").write_text(yaml.safe_dump(HEALTH_CONFIG))
        super().__init__(profile, extra=("--health-config", str(root / "health.yaml"), *extra), root=root)
        self.inventory = load_profile(profile).to_inventory(node_name="node-a")

    def restart_agent(self) -> None:
        assert self.agent.stop() == 0, getattr(self.agent, "stderr", "")
        self.agent = self.start_agent()

    def inject(self, *args: str) -> str:
        done = run_sim_inject(self.state_dir, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def status(self) -> dict[str, Any]:
        return call_agent(self.root / "s", "health.status")

    def gpu_state(self, index: int) -> str:
        return str(self.status()["gpus"][self.inventory.gpu(index).uuid]["state"])

    def healthy_gpus(self) -> set[str]:
        return self.kubelet.healthy(RESOURCE_GPU)

    def uuid(self, index: int) -> str:
        return self.inventory.gpu(index).uuid

    def wait(self, predicate: Any, what: str) -> None:
        assert self.kubelet.wait_for(predicate, timeout=WAIT), (
            f"timed out waiting for {what}: {self.status()}"
        )


def ready(node: Node) -> bool:
    try:
        started = not node.status()["startupPending"]
    except Exception:
        return False
    return started and len(node.healthy_gpus()) == len(node.inventory.gpus)


@pytest.fixture
def p5() -> Iterator[Node]:
    node = Node("p5.48xlarge")
    try:
        node.wait(lambda: ready(node), "the agent to pass two check rounds")
        yield node
    finally:  # a setup that fails stops the agent too
        node.close()


def test_xid_79_withholds_only_that_gpu_and_a_reset_brings_it_back(p5: Node) -> None:
    gpu5 = p5.uuid(5)
    p5.inject("--gpu", "5", "--busy", "4242")  # a process holds the GPU: the reset must wait
    p5.inject("--gpu", "5", "--xid", "79")
    p5.wait(lambda: gpu5 not in p5.healthy_gpus(), "GPU 5 to go Unhealthy")
    others = {g.uuid for g in p5.inventory.gpus} - {gpu5}
    assert p5.healthy_gpus() == others
    assert len(p5.kubelet.healthy(RESOURCE_EFA)) == 32
    ids, _ = p5.kubelet.allocate(RESOURCE_GPU, 7)
    assert set(ids) == others
    # the reset is tried every round and refused while pid 4242 runs
    assert p5.gpu_state(5) in ("Failed", "Remediating")
    p5.inject("--gpu", "5", "--busy", "")
    p5.wait(lambda: gpu5 in p5.healthy_gpus(), "GPU 5 to be Healthy after the reset and probation")
    assert p5.status()["gpus"][gpu5]["strikes"] == 1


@pytest.mark.parametrize("xid", ["13", "31", "43", "45"])
def test_application_xids_change_nothing(p5: Node, xid: str) -> None:
    p5.inject("--gpu", "5", "--xid", xid)
    rounds = p5.status()["rounds"]
    p5.wait(lambda: p5.status()["gpus"][p5.uuid(5)]["lastXid"] == int(xid), f"Xid {xid} to be seen")
    p5.wait(lambda: p5.status()["rounds"] >= rounds + 3, "three more check rounds")
    assert len(p5.healthy_gpus()) == 8
    assert p5.gpu_state(5) == "Healthy"


def fail_and_recover(node: Node, index: int) -> None:
    node.inject("--gpu", str(index), "--xid", "79")
    node.wait(lambda: node.uuid(index) not in node.healthy_gpus(), f"GPU {index} to fail")
    node.wait(lambda: node.uuid(index) in node.healthy_gpus(), f"GPU {index} to recover")


def test_third_failure_puts_the_gpu_on_the_bad_list_across_restarts(p5: Node) -> None:
    fail_and_recover(p5, 5)
    fail_and_recover(p5, 5)
    p5.inject("--gpu", "5", "--xid", "79")
    p5.wait(lambda: p5.status()["badHardware"] == [p5.uuid(5)], "GPU 5 on the bad-hardware list")
    assert p5.gpu_state(5) == "Retired"
    p5.restart_agent()
    p5.wait(lambda: started(p5), "the restarted agent to run two check rounds")
    p5.wait(lambda: ready_except(p5, 5), "the restarted agent to serve without GPU 5")
    assert p5.gpu_state(5) == "Retired"
    assert p5.uuid(5) not in p5.healthy_gpus()


def started(node: Node) -> bool:
    try:
        return not node.status()["startupPending"]
    except Exception:
        return False


def ready_except(node: Node, index: int) -> bool:
    try:
        return node.healthy_gpus() == {g.uuid for g in node.inventory.gpus} - {node.uuid(index)}
    except Exception:
        return False


def test_bad_injections_get_one_line_errors(p5: Node) -> None:
    for args, message in [
        (("--xid", "79"), "need --gpu INDEX"),
        (("--gpu", "9", "--xid", "79"), "no GPU 9"),
        (("--efa-down", "rdmap79s0"), "no netdev"),
    ]:
        done = run_sim_inject(p5.state_dir, *args)
        assert done.returncode == 2
        assert message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert len(p5.healthy_gpus()) == 8


def test_nvml_hang_fails_closed_while_other_resources_serve(p5: Node) -> None:
    p5.inject("--gpu", "2", "--nvml-hang", "3")
    p5.wait(lambda: p5.uuid(2) not in p5.healthy_gpus(), "GPU 2 to be withheld")
    assert "timed out" in p5.status()["gpus"][p5.uuid(2)]["reason"]
    assert len(p5.healthy_gpus()) == 7
    p5.kubelet.allocate(RESOURCE_GPU, 1)
    p5.inject("--nvml-hang", "2")  # the whole driver hangs: every GPU withheld, EFA keeps serving
    p5.wait(lambda: not p5.healthy_gpus(), "every GPU to be withheld")
    efa, _ = p5.kubelet.allocate(RESOURCE_EFA, 4)
    assert len(efa) == 4
    p5.wait(lambda: len(p5.healthy_gpus()) == 8, "every GPU back after the hang")


@pytest.fixture
def shared_node() -> Iterator[Node]:
    root = short_temp_dir()
    profile = NodeProfile.from_inventory(small_inventory(gpus=8, mig_on=(6,))).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    (root / "node.yaml").write_text(yaml.safe_dump(profile))
    sharing = {
        "apiVersion": "gpuweave.io/v1alpha1",
        "kind": "SharingConfig",
        "gpus": {"5": {"mode": "time-sliced", "replicas": 4}},
    }
    (root / "sharing.yaml").write_text(yaml.safe_dump(sharing))
    node = Node(str(root / "node.yaml"), root=root, extra=("--sharing-config", str(root / "sharing.yaml")))
    try:
        node.wait(lambda: ready_shared(node), "the shared node to be ready")
        yield node
    finally:  # a setup that fails stops the agent too
        node.close()


def ready_shared(node: Node) -> bool:
    """Every resource listed healthy: 4 replicas of GPU 5, GPU 6's two MIG devices and the six
    other GPUs whole (the kubelet's lists fill one resource at a time)."""
    try:
        return (
            not node.status()["startupPending"]
            and len(node.kubelet.healthy(RESOURCE_GPU_SHARED)) == 4
            and len(node.kubelet.healthy(mig_resource_name("3g.40gb"))) == 2
            and len(node.kubelet.healthy(RESOURCE_GPU)) == 6
        )
    except Exception:
        return False


def test_gpu_fault_fans_out_to_replicas_and_mig_devices_only(shared_node: Node) -> None:
    node = shared_node
    mig = mig_resource_name("3g.40gb")
    assert len(node.kubelet.healthy(mig)) == 2
    whole = node.healthy_gpus()
    node.inject("--gpu", "5", "--busy", "1", "--xid", "79")
    node.wait(lambda: not node.kubelet.healthy(RESOURCE_GPU_SHARED), "GPU 5's replicas to go Unhealthy")
    node.inject("--gpu", "6", "--busy", "1", "--xid", "48")
    node.wait(lambda: not node.kubelet.healthy(mig), "GPU 6's MIG devices to go Unhealthy")
    assert node.healthy_gpus() == whole


def test_mig_attributed_xid_marks_that_mig_device_alone_then_recreates_it(shared_node: Node) -> None:
    node = shared_node
    mig = mig_resource_name("3g.40gb")
    first, second = node.inventory.mig_devices_of(6)
    instance = f"{first.gpu_instance_id}:0"
    node.inject("--gpu", "6", "--mig-instance", instance, "--busy", "1")  # a process holds it
    node.inject("--gpu", "6", "--xid", "95", "--mig-instance", instance)
    node.wait(lambda: node.kubelet.healthy(mig) == {second.uuid}, "only the attributed MIG device Unhealthy")
    assert node.gpu_state(6) == "Healthy"
    assert node.status()["migs"][first.uuid]["state"] in ("Failed", "Remediating")  # waits for the process
    node.inject("--gpu", "6", "--mig-instance", instance, "--busy", "")  # the process ends
    node.wait(lambda: first.uuid not in node.kubelet.devices(mig), "the failed instance to be destroyed")
    node.wait(lambda: len(node.kubelet.healthy(mig)) == 2, "the instance to be recreated (a new MIG device)")
    assert second.uuid in node.kubelet.healthy(mig)
