"""The timeline's samples say what waits, so an allocation dip can be told from idle capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.placers import make_placer
from gpuweave.simulate.report import plot_timeline
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel, TaskShape, typical_workload


def _simulation(profiles: list[str], jobs: list[Job], *, duration: float = 600.0) -> Simulation:
    fleet = build_fleet(profiles, nodes=len(profiles))
    workload = typical_workload([TaskShape(4000, 500, 1), TaskShape(12000, 1000, 1)])
    model = FragmentModel(workload, models=sorted(set(profiles)), max_gpus=8)
    return Simulation(
        fleet=fleet,
        jobs=jobs,
        placer=make_placer("best-fit", node_count=len(fleet), seed=0),
        metric_model=model,
        duration_s=duration,
        faults=(),
    )


def _job(job_id: str, kind: JobKind, *, pods: int = 1, gpus: int = 1, mig: str = "") -> Job:
    milli = 0 if kind is JobKind.MIG else 1000
    return Job(job_id, kind, 0.0, 3600.0, pods, gpus, milli, 4000 * gpus, 16_384 * gpus, mig)


def test_a_gang_waiting_for_two_whole_nodes_shows_as_waiting_demand_not_allocation() -> None:
    # Two 8-GPU EFA nodes; one GPU is taken, so the 2x8 gang waits with all 16 GPUs' worth of demand.
    jobs = [_job("single", JobKind.SINGLE), _job("gang", JobKind.GANG, pods=2, gpus=8)]
    last = _simulation(["p5.48xlarge", "p5.48xlarge"], jobs).run().samples[-1]
    assert last.allocation == pytest.approx(100 / 16)
    assert last.pending == 1
    assert last.waiting_demand == pytest.approx(100.0)


def test_waiting_mig_pods_count_by_compute_slices_and_started_work_is_not_waiting() -> None:
    # No MIG node: the 3g.40gb pod waits (3 of 7 slices); the single-GPU job starts.
    jobs = [_job("single", JobKind.SINGLE), _job("mig", JobKind.MIG, mig="3g.40gb")]
    last = _simulation(["p4d.24xlarge"], jobs).run().samples[-1]
    assert last.pending == 1
    assert last.waiting_demand == pytest.approx(100.0 * 3 / 7 / 8)


def test_the_timeline_plot_has_the_waiting_demand_panel(tmp_path: Path) -> None:
    jobs = [_job("gang", JobKind.GANG, pods=2, gpus=8), _job("single", JobKind.SINGLE)]
    result = _simulation(["p5.48xlarge", "p5.48xlarge"], jobs).run()
    path = plot_timeline([result], result, tmp_path / "timeline.png")
    assert path.stat().st_size > 0
