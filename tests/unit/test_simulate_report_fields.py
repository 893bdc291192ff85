"""The report's per-job figures: completion time, GPU-hours lost to faults, gang recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuweave.cli import main
from gpuweave.simulate.engine import RunResult, Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import FaultKind, FaultSpec
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.outcomes import JobCompletion
from gpuweave.simulate.placers import make_placer
from gpuweave.simulate.report import add_common_completion, summarize, summary_table
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel, TaskShape, typical_workload

NEW_FIELDS = (
    "job_completion_mean_min",
    "job_completion_p95_min",
    "gpu_hours_lost_to_faults",
    "gang_recovery_s",
)


def test_a_gang_evicted_by_an_efa_loss_recovers_on_spare_nodes_in_its_detection_time() -> None:
    fleet = build_fleet(["p5.48xlarge"], nodes=3, nodes_per_block=2)
    gang = Job("train-0", JobKind.GANG, 0.0, 3600.0, 2, 8, 1000, 88_000, 786_432)
    model = FragmentModel(typical_workload([TaskShape(88_000, 1000, 8)]), models=["p5.48xlarge"], max_gpus=8)
    sim = Simulation(
        fleet=fleet,
        jobs=[gang],
        placer=make_placer("random", node_count=3, seed=1),
        metric_model=model,
        duration_s=4 * 3600.0,
        faults=(FaultSpec(FaultKind.EFA_LINK, 0.15, 1800.0),),
        share_nodes=frozenset(),
    )
    result = sim.run()
    summary = summarize(result)
    fault_at = 0.15 * 4 * 3600.0
    assert summary["gang_recovery_s"] == [5.0]  # restarted in the fault's tick: EFA detection only
    assert summary["gang_recovery_median_s"] == 5.0 and summary["gangs_not_recovered"] == 0
    parts = {"detection": 5.0, "waiting": 0.0, "preemption_grace": 0.0}
    assert summary["gang_recovery_parts_median_s"] == parts
    assert summary["gpu_hours_lost_to_faults"] == pytest.approx(16 * fault_at / 3600.0)
    (done,) = result.ledger.completions
    assert done.restarts == 1
    first, again = result.ledger.training
    assert first.waited_s == 0.0  # placed in its arrival's tick
    assert again.waited_s == again.at_s - gang.arrival_s == fault_at  # restarted in the fault's tick
    assert summary["multi_node_gang_wait_mean_min"] == pytest.approx(
        (first.waited_s + again.waited_s) / 120.0
    )
    assert done.completion_s >= fault_at + 3600.0  # restarted from the beginning, no checkpoint
    assert summary["job_completion_mean_min"] == pytest.approx(done.completion_s / 60.0)


@pytest.mark.parametrize("policy", ["gpuweave", "random"])
def test_a_recovering_gang_preempts_lower_priority_work_through_the_extender(policy: str) -> None:
    """Three p5 nodes: the gang (priority 1000) runs on two, a priority-0 job on the third; the
    EFA loss under a member leaves one node's room free. Through the extender, kube-scheduler's
    preemption evicts the job and the gang runs again once it is gone (grace 30 s + detection 5 s);
    the random baseline has no preemption, and the gang waits for the link to come back."""
    fleet = build_fleet(["p5.48xlarge"], nodes=3, nodes_per_block=3)
    gang = Job("train-0", JobKind.GANG, 0.0, 3600.0, 2, 8, 1000, 88_000, 786_432, priority=1000)
    filler = Job("single-1", JobKind.SINGLE, 60.0, 7200.0, 1, 1, 1000, 12_000, 65_536)
    model = FragmentModel(typical_workload([TaskShape(88_000, 1000, 8)]), models=["p5.48xlarge"], max_gpus=8)
    placer = (
        ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
        if policy == "gpuweave"
        else make_placer(policy, node_count=3, seed=1)
    )
    sim = Simulation(
        fleet=fleet,
        jobs=[gang, filler],
        placer=placer,
        metric_model=model,
        duration_s=4 * 3600.0,
        faults=(FaultSpec(FaultKind.EFA_LINK, 0.15, 1800.0),),
        share_nodes=frozenset(),
    )
    try:
        result = sim.run()
    finally:
        placer.close()
    summary = summarize(result)
    (recovery,) = summary["gang_recovery_s"]
    (parts,) = [r.parts for r in result.ledger.recoveries]
    assert parts is not None and sum(parts.values()) == recovery
    if policy == "gpuweave":
        assert recovery == 35.0 and summary["pods_preempted"] == 1
        assert parts == {"detection": 5.0, "waiting": 0.0, "preemption_grace": 30.0}
        restarts = {c.job_id: c.restarts for c in result.ledger.completions}
        assert restarts == {"train-0": 1, "single-1": 1}  # the victim ran again from its start
    else:
        assert recovery > 1800.0 and summary["pods_preempted"] == 0  # back only with the link
        assert parts["preemption_grace"] == 0.0 and parts["waiting"] >= 1800.0  # waited for the link
    assert summary["jobs_unfinished"] == 0 and summary["jobs_completed"] == 2


def test_every_policy_reports_the_job_figures_in_json_and_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    args = ["simulate", "--nodes", "4", "--duration", "2h", "--no-agents", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    for summary in report["summaries"]:
        assert all(key in summary for key in NEW_FIELDS)
        assert summary["gpu_allocation_pct"] > 0 and "pending_p95_min" in summary  # kept fields
        recovered = summary["gang_recovery_s"]
        assert all(s >= 0 for s in recovered)
        assert len(recovered) + summary["gangs_not_recovered"] == len(
            report["gang_recoveries"][summary["policy"]]
        )
        for recovery in report["gang_recoveries"][summary["policy"]]:
            if recovery["seconds"] is not None:
                assert sum(recovery["parts"].values()) == pytest.approx(recovery["seconds"])
        assert summary["jobs_completed"] <= summary["jobs_started"]
        placed = report["training_placements"][summary["policy"]]
        assert all(p["stretch"] >= 1.0 and p["run_s"] > 0 and p["waited_s"] >= 0 for p in placed)
        assert "multi_node_gang_wait_mean_min" in summary
    assert all("labels" in node for node in report["cluster"])
    table = capsys.readouterr().out
    assert "job completion, mean (min)" in table and "GPU-hours lost to faults" in table
    assert summary_table(report["summaries"]) in table
    assert "gang recovery: median (back / evicted)" in table
    assert "  detection + waiting + grace (median s)" in table
    assert "  multi-node gangs' wait, mean (min)" in table


def test_the_common_mean_covers_only_the_jobs_every_run_finished() -> None:
    def run(policy: str, ends: dict[str, float]) -> RunResult:
        result = RunResult(policy=policy)
        for job_id, end in ends.items():
            result.ledger.completions.append(JobCompletion(job_id, "single-gpu", 0.0, end, 0))
        return result

    # b finishes a job the others never do: its own mean pays for it, the common mean does not
    results = [run("a", {"j1": 600.0, "j2": 1200.0}), run("b", {"j1": 600.0, "j2": 1800.0, "j3": 7200.0})]
    summaries = [{"policy": r.policy} for r in results]
    add_common_completion(results, summaries)
    assert [s["jobs_completed_by_all"] for s in summaries] == [2, 2]
    assert summaries[0]["job_completion_common_mean_min"] == pytest.approx(15.0)
    assert summaries[1]["job_completion_common_mean_min"] == pytest.approx(20.0)
