"""The node lifecycle in ``gpuweave simulate``: a broken node replaced after the boot time, pending
demand the autoscaler cannot read scaled up within its bound, and a fixed fleet without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devicemodel.contracts import VERDICT_REBOOT
from gpuweave.cli import main
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.engine import RunResult, Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import FaultKind, FaultSpec
from gpuweave.simulate.fleet import build_fleet, reserve_rows, share_pool
from gpuweave.simulate.lifecycle import LifecycleSettings, NodeLifecycle
from gpuweave.simulate.state import GpuMode
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel, TaskShape, typical_workload

BOOT_S = 600.0
XID_79_AT_30_MIN = (FaultSpec(FaultKind.XID_79, 0.25, 0.0),)  # of a 2 h window


def _jobs(kind: JobKind, count: int, *, milli: int = 1000, duration: float = 3600.0) -> list[Job]:
    return [Job(f"j{i}", kind, 0.0, duration, 1, 1, milli, 4000, 16_384) for i in range(count)]


def _simulation(
    profiles: list[str],
    jobs: list[Job],
    *,
    lifecycle: bool = True,
    max_new_nodes: int = 0,
    agents: bool = False,
    faults: tuple[FaultSpec, ...] = (),
) -> tuple[Simulation, ExtenderPlacer, NodeAgentPool | None]:
    base = build_fleet(profiles, nodes=len(profiles))
    reserve = reserve_rows(base, max_new_nodes) if lifecycle else ()
    fleet = base + reserve
    rows = tuple(range(len(base), len(fleet)))
    shares = share_pool(base)
    model = FragmentModel(
        typical_workload([TaskShape(4000, 1000, 1)]), models=sorted(set(profiles)), max_gpus=8
    )
    placer = ExtenderPlacer(fleet, share_nodes=shares, transport="in-process", absent=rows)
    pool = NodeAgentPool(fleet, share_nodes=shares, absent=rows) if agents else None
    settings = LifecycleSettings(boot_s=BOOT_S, max_new_nodes=max_new_nodes)
    node_lifecycle = (
        NodeLifecycle(fleet, reserve=rows, share_nodes=shares, settings=settings) if lifecycle else None
    )
    simulation = Simulation(
        fleet=fleet,
        jobs=jobs,
        placer=placer,
        metric_model=model,
        duration_s=7200.0,
        faults=faults,
        share_nodes=shares,
        agents=pool,
        lifecycle=node_lifecycle,
    )
    return simulation, placer, pool


def _finished(result: RunResult) -> set[str]:
    return {c.job_id for c in result.ledger.completions}


def test_a_gpu_whose_reset_fails_gets_a_new_node_after_the_boot_time_and_its_jobs_run_again() -> None:
    # One 8-GPU node full of 1-GPU jobs; GPU falls off the bus at 30 min and stays off.
    sim, placer, _ = _simulation(["p4d.24xlarge"], _jobs(JobKind.SINGLE, 8), faults=XID_79_AT_30_MIN)
    old = sim.state.fleet[0]
    try:
        result = sim.run()
    finally:
        placer.close()
    assert result.lifecycle is not None
    [replacement] = result.lifecycle.replacements
    assert replacement.node == old.name and replacement.verdict == VERDICT_REBOOT
    assert replacement.fault == FaultKind.XID_79.value
    assert replacement.handed_over_s == 1860.0  # one health round after the fault: the reset failed
    assert replacement.pods_drained == 7  # the other jobs' pods on the node, each with its grace
    assert replacement.ready_s == replacement.handed_over_s + BOOT_S
    # no other node: every job ran again on the new machine, as soon as it was ready
    assert replacement.running_again_s == replacement.ready_s
    assert _finished(result) == {f"j{i}" for i in range(8)}
    new = sim.state.fleet[0]
    assert new.name == replacement.new_node != old.name
    assert not {g.uuid for g in new.inventory.gpus} & {g.uuid for g in old.inventory.gpus}
    assert sim.state.modes[0] == [GpuMode.NORMAL] * 8  # the fresh machine's GPUs are all good
    lives = {life.name: life for life in [*result.lifecycle.gone, *result.lifecycle.lifetimes.values()]}
    assert lives[old.name].left_s == replacement.handed_over_s + 30.0  # drained for its grace
    assert lives[new.name].joined_s == replacement.handed_over_s  # paid from its launch


def test_the_replaced_node_is_the_agents_verdict_and_the_new_node_runs_an_agent() -> None:
    sim, placer, pool = _simulation(
        ["p4d.24xlarge"], _jobs(JobKind.SINGLE, 2), agents=True, faults=XID_79_AT_30_MIN
    )
    assert pool is not None
    try:
        result = sim.run()
        assert result.lifecycle is not None
        [replacement] = result.lifecycle.replacements
        # the agent tried the reset in one round (it failed) and asked for a reboot in the next
        assert replacement.verdict == VERDICT_REBOOT
        assert "reset" in replacement.detail
        assert pool.has(0)
        assert pool.inventory(0).name == replacement.new_node
        assert _finished(result) == {"j0", "j1"}
        assert result.admission_failures == 0
    finally:
        placer.close()
        pool.close()


def test_shares_that_fit_nowhere_get_a_bounded_scale_up_of_their_pool() -> None:
    # one shared l40s node holds 16 half-GPU shares; 40 are asked for, which need 12 more GPUs
    # (two more machines), and at most one machine may be added
    profiles = ["l40s-pcie-8", "p4d.24xlarge"]
    sim, placer, _ = _simulation(profiles, _jobs(JobKind.SHARE, 40, milli=500), max_new_nodes=1)
    try:
        result = sim.run()
    finally:
        placer.close()
    assert result.lifecycle is not None
    assert result.lifecycle.scale_ups, "pending shares asked for no machine"
    assert all(s.pool == "l40s-pcie-8" for s in result.lifecycle.scale_ups)
    first = result.lifecycle.scale_ups[0]
    assert first.machines == 1 and "capped at 1 of 2 machines" in first.reason
    assert first.ready_s == first.launched_s + BOOT_S
    lives = [*result.lifecycle.gone, *result.lifecycle.lifetimes.values()]
    added = [life for life in lives if life.origin == "scale-up"]
    for life in added:  # never more than one added machine at a time
        assert not [
            o for o in added if o is not life and o.joined_s < (life.left_s or 1e9) <= (o.left_s or 1e9)
        ]
    assert _finished(result) == {f"j{i}" for i in range(40)}
    assert result.gpu_hours_paid > 16 * 2.0  # the fleet's 16 GPUs for 2 h, and the added machine's


def test_without_the_lifecycle_a_broken_node_stays_and_nothing_is_added() -> None:
    sim, placer, _ = _simulation(
        ["p4d.24xlarge"], _jobs(JobKind.SINGLE, 8), lifecycle=False, faults=XID_79_AT_30_MIN
    )
    old = sim.state.fleet[0]
    try:
        result = sim.run()
    finally:
        placer.close()
    assert result.lifecycle is None
    assert sim.state.fleet == (old,)
    assert sim.state.modes[0].count(GpuMode.WITHHELD) == 1
    assert result.gpu_hours_paid == 8 * 2.0


def test_no_lifecycle_on_the_command_line_reproduces_the_fixed_fleet(tmp_path: Path) -> None:
    run = ["simulate", "--nodes", "4", "--duration", "2h", "--no-compare", "--no-progress", "--no-agents"]
    assert main([*run, "--out", str(tmp_path / "on"), "--node-boot-time", "10m"]) == 0
    assert main([*run, "--out", str(tmp_path / "off"), "--no-lifecycle"]) == 0
    on = json.loads((tmp_path / "on" / "report.json").read_text())
    off = json.loads((tmp_path / "off" / "report.json").read_text())
    [with_lifecycle], [fixed] = on["summaries"], off["summaries"]
    assert with_lifecycle["replacements"] == 1  # the Xid 79 node's reset fails: replaced
    assert with_lifecycle["node_boot_s"] == 600.0
    [record] = with_lifecycle["replacement_records"]
    assert record["new_node_ready_after_s"] >= 600.0
    assert "replacements" not in fixed and "scale_up_records" not in fixed
    assert fixed["gpu_hours_paid"] == sum(n["gpus"] for n in off["cluster"]) * 2.0
    assert off["options"]["lifecycle"] is False


def test_bad_lifecycle_options_are_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--max-new-nodes", "-1", "--out", str(tmp_path)]) == 2
    assert "--max-new-nodes -1: give 0 to 1000 machines" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--node-boot-time", "25h", "--out", str(tmp_path)])
    assert "give 0 to 24h" in capsys.readouterr().err
