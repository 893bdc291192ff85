"""The simulation loop: gangs all-or-nothing, faults contained to their GPU, MIG follows demand."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuweave.cli import main
from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import FaultKind, FaultSpec
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.placers import make_placer
from gpuweave.simulate.workload import Job, JobKind
from scheduler_ext.serving.server import ExtenderHandler
from topology.fragmentation import FragmentModel, TaskShape, typical_workload


def _model(profiles: list[str]) -> FragmentModel:
    workload = typical_workload([TaskShape(4000, 500, 1), TaskShape(12000, 1000, 1)])
    return FragmentModel(workload, models=sorted(set(profiles)), max_gpus=8)


def _job(
    job_id: str,
    kind: JobKind,
    *,
    at: float = 0.0,
    pods: int = 1,
    gpus: int = 1,
    milli: int = 1000,
    duration: float = 3600.0,
    mig: str = "",
) -> Job:
    return Job(job_id, kind, at, duration, pods, gpus, milli, 4000 * gpus, 16_384 * gpus, mig)


def _simulation(
    profiles: list[str],
    jobs: list[Job],
    *,
    faults: tuple[FaultSpec, ...] = (),
    policy: str = "gpuweave",
    duration: float = 1800.0,
) -> Simulation:
    fleet = build_fleet(profiles, nodes=len(profiles))
    model = _model(profiles)
    placer = (
        ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
        if policy == "gpuweave"
        else make_placer(policy, node_count=len(fleet), seed=0)
    )
    return Simulation(
        fleet=fleet,
        jobs=jobs,
        placer=placer,
        metric_model=model,
        duration_s=duration,
        faults=faults,
    )


def test_a_gang_that_does_not_fit_whole_waits_and_holds_nothing() -> None:
    # Two 8-GPU EFA nodes; a single 1-GPU job takes one GPU, so a 2x8 gang cannot start.
    jobs = [_job("single", JobKind.SINGLE), _job("gang", JobKind.GANG, pods=2, gpus=8)]
    result = _simulation(["p5.48xlarge", "p5.48xlarge"], jobs).run()
    assert result.jobs_started == 1
    assert result.jobs_pending_at_end == 1
    assert result.samples[-1].allocation == pytest.approx(100 / 16)


def test_a_fatal_xid_evicts_only_the_pods_on_that_gpu() -> None:
    jobs = [_job(f"s{i}", JobKind.SINGLE) for i in range(8)]
    fault = (FaultSpec(FaultKind.XID_79, 0.5, 0.0),)
    sim = _simulation(["p4d.24xlarge"], jobs, faults=fault)
    result = sim.run()
    [record] = result.faults
    assert record.pods_evicted == 1
    assert record.gpus_withheld == 1
    assert record.other_pods_on_node_kept == 7
    assert result.samples[-1].withheld_gpus == 1
    # The evicted job waits: only 7 healthy GPUs are left for 8 jobs.
    assert result.jobs_pending_at_end == 1


def test_mig_demand_reshapes_an_idle_gpu_and_the_pod_starts() -> None:
    jobs = [_job("m", JobKind.MIG, milli=0, mig="1g.10gb")]
    result = _simulation(["dgx-a100"], jobs).run()
    assert len(result.reshapes) >= 1
    assert result.reshapes[0].created
    assert result.jobs_started == 1
    assert result.samples[-1].mig_gpus >= 1


def test_multi_gpu_pods_get_the_best_set_with_gpuweave() -> None:
    jobs = [_job(f"g{i}", JobKind.GANG, gpus=2, at=60.0 * i) for i in range(3)]
    result = _simulation(["dgx1-v100"], jobs).run()
    assert len(result.topology) == 3
    assert all(o.got_best for o in result.topology)


def test_cli_simulate_writes_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    code = main(["simulate", "--nodes", "4", "--duration", "1h", "--out", str(out), "--no-progress"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["policy"] for s in report["summaries"]] == [
        "gpuweave",
        "random",
        "best-fit",
        "go-gpuallocator-like",
    ]
    assert (out / "timeline.png").stat().st_size > 10_000
    assert (out / "policies.png").stat().st_size > 10_000
    assert "GPU allocation" in capsys.readouterr().out


def test_cli_simulate_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "first-fit", "--no-progress"]) == 2
    assert "unknown --policy" in capsys.readouterr().err


def test_the_real_extender_over_http_drives_the_loop_without_disagreements() -> None:
    profiles = ["p4d.24xlarge", "l40s-pcie-8"]
    fleet = build_fleet(profiles, nodes=2)
    jobs = [_job(f"s{i}", JobKind.SINGLE, at=60.0 * i) for i in range(4)]
    jobs += [_job(f"f{i}", JobKind.SHARE, milli=470, at=60.0 * i) for i in range(4)]
    jobs += [_job("g", JobKind.GANG, gpus=4, at=30.0)]
    fault = (FaultSpec(FaultKind.XID_79, 0.5, 0.0),)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset({1}))
    try:
        model = _model(profiles)
        sim = Simulation(
            fleet=fleet,
            jobs=jobs,
            placer=placer,
            metric_model=model,
            duration_s=1800.0,
            faults=fault,
            share_nodes=frozenset({1}),
        )
        share_nodes: set[int] = set()  # where share pods ran, seen at every tick of the window

        def look(_: int) -> None:
            share_nodes.update(p.node for p in sim.state.pods.values() if p.job.kind is JobKind.SHARE)

        result = sim.run(on_tick=look)
    finally:
        placer.close()
    assert placer.calls > 0
    assert result.transport == "extender over HTTP"
    assert result.placement_mismatches == 0
    assert result.jobs_started >= 8
    assert share_nodes == {1}
    assert result.jobs_unfinished == 0 and not sim.state.pods  # the drain ran every job to its end


def test_the_drain_reports_the_jobs_left_until_none() -> None:
    """After the arrival window the loop runs on until every job ended: its progress is jobs left."""
    jobs = [_job("long", JobKind.SINGLE, duration=3 * 3600.0), _job("short", JobKind.SINGLE, at=600.0)]
    left: list[int] = []
    result = _simulation(["p4d.24xlarge"], jobs, duration=1800.0).run(on_drain=left.append)
    assert left[0] == 2 and left[-1] == 0 and result.jobs_unfinished == 0
    assert left == sorted(left, reverse=True) and len(left) == int(result.drained_s // 60) + 1


def test_cli_simulate_shows_the_drain_on_the_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the bar stood at 100% while the drain ran on (here 2 simulated hours more than the
    1 h window: jobs that cannot all fit on 2 nodes run until the drain's limit)."""
    argv = ["simulate", "--nodes", "2", "--duration", "1h", "--no-compare", "--no-agents", "--in-process"]
    assert main([*argv, "--out", str(tmp_path / "sim")]) == 0
    bars = capsys.readouterr().err.replace("\r", "\n").splitlines()
    drain = [line for line in bars if "drain" in line]
    (summary,) = json.loads((tmp_path / "sim" / "report.json").read_text())["summaries"]
    assert summary["drained_min"] > 0 and drain, bars[-3:]
    total = int(drain[0].split("/")[1].split()[0])  # jobs queued or running as the drain began
    assert f"| {total - summary['jobs_unfinished']}/{total} [" in drain[-1] and "job" in drain[-1], drain[-1]


def test_cli_simulate_refuses_an_out_it_cannot_write_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    assert main(["simulate", "--no-progress", "--out", str(blocker / "report")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran: no setup line, no table
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gpuweave simulate: --out {blocker / 'report'}: cannot write the report there")


def test_the_loop_goes_on_when_the_extender_dropped_an_idle_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extender closes a keep-alive connection idle past its read timeout; the simulation's
    client opens a new one and sends the call again, as kube-scheduler's does, and the run goes on."""
    monkeypatch.setattr(ExtenderHandler, "timeout", 0.05)
    profiles = ["p4d.24xlarge"]
    fleet = build_fleet(profiles, nodes=1)
    jobs = [_job(f"s{i}", JobKind.SINGLE, at=60.0 * i) for i in range(4)]
    placer = ExtenderPlacer(fleet, share_nodes=frozenset())
    idle = {"ticks": 0}

    def pause(_: int) -> None:  # the loop busy elsewhere, past the server's timeout, on a few ticks
        if idle["ticks"] < 3:
            idle["ticks"] += 1
            time.sleep(0.2)

    try:
        sim = Simulation(
            fleet=fleet, jobs=jobs, placer=placer, metric_model=_model(profiles), duration_s=600.0
        )
        result = sim.run(on_tick=pause)
    finally:
        placer.close()
    assert placer.reconnects > 0
    assert result.placement_mismatches == 0 and result.jobs_unfinished == 0  # every job ran to its end
