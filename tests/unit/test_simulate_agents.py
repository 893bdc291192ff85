"""The simulation's node agents: real device plugins over unix sockets, driven by SimKubelet."""

from __future__ import annotations

import json
from pathlib import Path

from devicemodel.assignment import device_id_share
from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from gpuweave.cli import main
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.fleet import build_fleet
from hardware.simulated.backend import scratch_parent
from health.policy import DeviceState


def test_agents_register_admit_and_report_a_failed_gpu() -> None:
    fleet = build_fleet(["p4d.24xlarge", "l40s-pcie-8"], nodes=2)
    pool = NodeAgentPool(fleet, share_nodes=frozenset({1}))
    try:
        assert pool.resources(0)[RESOURCE_GPU] == 8
        assert pool.resources(1)[RESOURCE_GPU_COMPUTE] == 800
        whole = fleet[0].inventory.gpus[2].uuid
        assert pool.admit(0, {RESOURCE_GPU: [whole]})
        share = [device_id_share(fleet[1].inventory.gpus[0].uuid, "compute", u) for u in range(47)]
        assert pool.admit(1, {RESOURCE_GPU_COMPUTE: share})
        assert not pool.admit(0, {RESOURCE_GPU: ["GPU-not-on-this-node"]})
        assert pool.admitted == 2 and len(pool.admission_failures) == 1
        seen = pool.inject_xid(0, 3, 79)
        assert seen is not None and seen < 10.0
        assert pool.resources(0)[RESOURCE_GPU] == 7
        assert not pool.gpu_healthy(0, 3) and pool.gpu_healthy(0, 2)
    finally:
        pool.close()


def test_simulate_runs_the_agents_and_the_extender(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--nodes",
                "4",
                "--duration",
                "2h",
                "--out",
                str(out),
                "--no-progress",
                "--no-compare",
            ]
        )
        == 0
    )
    [summary] = json.loads((out / "report.json").read_text())["summaries"]
    assert summary["scheduler"] == "extender over HTTP"
    assert summary["node_agents"] == "4 agents (gRPC)"
    assert summary["admission_failures"] == 0 and summary["placement_mismatches"] == 0


def test_closing_the_pool_stops_every_agent_and_removes_its_files() -> None:
    fleet = build_fleet(["p4d.24xlarge", "l40s-pcie-8", "p4d.24xlarge"], nodes=3)
    pool = NodeAgentPool(fleet, share_nodes=frozenset({1}))
    root = pool._root
    nodes = list(pool._nodes.values())
    try:
        assert str(root.parent) == (scratch_parent() or "/tmp")  # memory-backed where there is one
        assert {p.name for p in root.iterdir()} == {"n0", "n1", "n2"}
    finally:
        pool.close()
    assert not root.exists()
    assert not any(pool.has(i) for i in range(3))
    assert all(n.health is not None and n.health.monitor._stop.is_set() for n in nodes)


def test_the_agents_health_runs_on_the_simulated_clock() -> None:
    """A fault, its reset and the probation after it are stamped with the simulation's time, so
    the agents' health windows and steps follow simulated minutes, not the machine's speed."""
    fleet = build_fleet(["p4d.24xlarge"], nodes=1)
    pool = NodeAgentPool(fleet, share_nodes=frozenset())
    uuid = fleet[0].inventory.gpus[3].uuid
    try:
        pool.set_time(5400.0)
        pool.inject_xid(0, 3, 48)  # ECC double-bit: Failed, reset first
        snapshot = pool.health_snapshot(0)
        assert snapshot is not None
        assert (snapshot.gpus[uuid].state, snapshot.gpus[uuid].since) == (DeviceState.FAILED, 5400.0)
        assert snapshot.gpus[uuid].strikes == 1  # its kernel-log line was read as the same Xid
        steps = ((91, DeviceState.PROBATION), (92, DeviceState.PROBATION), (93, DeviceState.HEALTHY))
        for minute, state in steps:
            pool.set_time(minute * 60.0)
            pool.health_round(0)
            snapshot = pool.health_snapshot(0)
            assert snapshot is not None and snapshot.gpus[uuid].state is state, minute
        assert snapshot.gpus[uuid].since == 93 * 60.0 and pool.gpu_served(0, 3)
    finally:
        pool.close()


def test_a_check_slowed_by_machine_load_is_not_a_failed_gpu() -> None:
    """A GPU read that takes 2.5 s (a loaded machine; the agent's own limit is 2 s) fails closed in
    a deployed agent, but the simulation injects no hang: its agents wait for the read, so the
    same seed gives the same health under any load."""
    fleet = build_fleet(["p4d.24xlarge"], nodes=1)
    pool = NodeAgentPool(fleet, share_nodes=frozenset())
    try:
        pool._nodes[0].backend.node.health.hang(2.5, index=2)  # reads of GPU 2 take 2.5 s
        pool.health_round(0)
        assert pool.published(0)["status"]["unhealthyDevices"] == []  # what the extender would see
    finally:
        pool.close()
