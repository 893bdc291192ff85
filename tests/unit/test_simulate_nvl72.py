"""An NVL72 pool in the simulation: the workload sized to 4-GPU trays, gangs bound to one NVLink
clique (the required tier reaching the extender), NVLink between the trays of one clique in the
job-time model, the report's clique counts, and the NVLink tray fault."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devicemodel.gangs import ANNOTATION_GANG_TIER
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.cluster import Request
from gpuweave.simulate.engine import RunResult, Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import DEFAULT_FAULTS, TRAY_FAULT, FaultKind, FaultSpec, faults_for
from gpuweave.simulate.fleet import FleetNode, build_fleet, clique_name, nvlink_pool_gpus, share_pool
from gpuweave.simulate.jobtime import NVLINK_DOMAIN_GBPS, SlowestLink, job_timing
from gpuweave.simulate.outcomes import PlacedTraining
from gpuweave.simulate.placers import Gang, Placer, make_placer
from gpuweave.simulate.report import (
    add_common_completion,
    clique_figures,
    fault_table,
    summarize,
    summary_table,
)
from gpuweave.simulate.runner import workload_settings
from gpuweave.simulate.state import SimState
from gpuweave.simulate.workload import (
    GANG_SIZES,
    GANG_TIER_CLIQUE,
    GANG_WEIGHTS,
    TRAINING_GANG_PRIORITY,
    Job,
    JobKind,
    WorkloadSettings,
    pods_of,
    synthetic_jobs,
    trace_jobs,
)
from topology.fragmentation import FragmentModel, TaskShape, typical_workload
from topology.network import LABEL_GPU_CLIQUE

TRAY = (0, 1, 2, 3)
DEFAULT_PROFILES = ["p5.48xlarge", "p4d.24xlarge", "dgx-a100", "l40s-pcie-8"]


def _racks(nodes: int = 36) -> tuple[FleetNode, ...]:
    return build_fleet(["gb200-nvl72-degraded", "gb200-nvl72"], nodes=nodes)


def _model() -> FragmentModel:
    shapes = [TaskShape(11_000, 1000, 1), TaskShape(44_000, 1000, 4)]
    return FragmentModel(typical_workload(shapes), models=["gb200-compute-tray"], max_gpus=4)


def _gang(job_id: str, pods: int, *, at: float = 0.0, duration: float = 3600.0) -> Job:
    return Job(
        job_id,
        JobKind.GANG,
        at,
        duration,
        pods,
        4,
        1000,
        44_000,
        393_216,
        priority=TRAINING_GANG_PRIORITY,
        gang_tier=GANG_TIER_CLIQUE,
    )


# ---- the workload -----------------------------------------------------------------------------


def test_a_job_larger_than_a_node_becomes_node_sized_pods() -> None:
    assert pods_of(16, 4) == (4, 4) and pods_of(8, 4) == (2, 4) and pods_of(64, 4) == (16, 4)
    assert pods_of(4, 4) == (1, 4) and pods_of(2, 4) == (1, 2)
    assert pods_of(16, 8) == (2, 8) and pods_of(8, 8) == (1, 8)  # the default fleet, as before
    assert pods_of(6, 4) == (2, 3)  # the largest divisor a node holds


def test_the_workload_is_shaped_to_the_fleet() -> None:
    racks = _racks()
    settings = workload_settings(racks, duration_s=3600.0, load=0.95)
    assert (settings.node_gpus, settings.mig, settings.clique_gpus) == (4, False, 72)
    default = workload_settings(build_fleet(DEFAULT_PROFILES, nodes=16), duration_s=3600.0, load=0.95)
    assert (default.node_gpus, default.mig, default.clique_gpus) == (8, True, 0)
    assert default.gang_mix() == (GANG_SIZES, GANG_WEIGHTS)


def test_on_4_gpu_trays_no_pod_is_larger_than_a_tray_and_no_mig_is_drawn() -> None:
    settings = WorkloadSettings(
        duration_s=6 * 3600.0, capacity_gpus=144, node_gpus=4, mig=False, clique_gpus=72
    )
    jobs = synthetic_jobs(settings, seed=42)
    assert jobs and all(j.gpus_per_pod <= 4 for j in jobs)
    assert not [j for j in jobs if j.kind is JobKind.MIG]
    gangs = [j for j in jobs if j.kind is JobKind.GANG and j.pods > 1]
    sizes = {j.pods * j.gpus_per_pod for j in gangs}
    assert {8, 16} <= sizes <= {8, 16, 32, 64}
    assert all(j.gang_tier == GANG_TIER_CLIQUE and j.priority == TRAINING_GANG_PRIORITY for j in gangs)
    assert all(not j.gang_tier for j in jobs if j.pods == 1)


def test_gang_sizes_stop_at_what_the_largest_clique_holds() -> None:
    sizes, weights = WorkloadSettings(duration_s=1.0, capacity_gpus=1, node_gpus=4, clique_gpus=36).gang_mix()
    assert sizes == (2, 4, 8, 16, 32) and sum(weights) == pytest.approx(1.0)
    jobs = synthetic_jobs(
        WorkloadSettings(duration_s=6 * 3600.0, capacity_gpus=144, node_gpus=4, mig=False, clique_gpus=36),
        seed=7,
    )
    assert max(j.pods * j.gpus_per_pod for j in jobs) <= 32


def test_the_default_fleet_draws_the_same_workload_as_before() -> None:
    settings = WorkloadSettings(duration_s=3 * 3600.0, capacity_gpus=128)
    jobs = synthetic_jobs(settings, seed=42)
    assert {j.pods * j.gpus_per_pod for j in jobs if j.kind is JobKind.GANG} <= set(GANG_SIZES)
    assert all(j.gpus_per_pod <= 8 and not j.gang_tier for j in jobs)
    assert [j.job_id for j in jobs if j.kind is JobKind.MIG]  # the MIG demand shift is still there


def test_a_trace_pod_larger_than_a_tray_is_reshaped_into_a_gang(tmp_path: Path) -> None:
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "big,64000,262144,8,1000,0,3600\n"
    )
    settings = WorkloadSettings(duration_s=600.0, capacity_gpus=144, node_gpus=4, clique_gpus=72)
    job = trace_jobs(csv, settings, seed=1)[0]
    assert (job.pods, job.gpus_per_pod, job.cpu_milli, job.memory_mib) == (2, 4, 32_000, 131_072)
    assert job.gang_tier == GANG_TIER_CLIQUE and job.priority == TRAINING_GANG_PRIORITY
    default = trace_jobs(csv, WorkloadSettings(duration_s=600.0, capacity_gpus=128), seed=1)[0]
    assert (default.pods, default.gpus_per_pod, default.gang_tier) == (1, 8, "")


def test_the_inference_pool_of_a_rack_fleet_is_a_whole_small_clique() -> None:
    racks = _racks()
    pool = share_pool(racks)
    assert pool == frozenset(range(9, 18))  # the degraded rack's second partition
    assert {clique_name(racks[i]) for i in pool} == {"gb200-nvl72-degraded-r0 clique 2"}
    assert nvlink_pool_gpus(racks, pool) == 72  # the whole rack's clique
    assert share_pool(build_fleet(DEFAULT_PROFILES, nodes=16)) == frozenset({3, 7, 11, 15})
    one_rack = build_fleet(["gb200-nvl72"], nodes=18)  # one clique: no whole clique fits a quarter
    assert share_pool(one_rack) == frozenset(i for i in range(18) if i % 4 == 3)


# ---- job time -------------------------------------------------------------------------------


def test_trays_of_one_clique_talk_over_nvlink_not_the_network() -> None:
    racks = _racks()
    inside = job_timing([(racks[0], TRAY), (racks[1], TRAY)])
    assert inside.slowest is SlowestLink.NVLINK_DOMAIN and inside.gbps == NVLINK_DOMAIN_GBPS
    assert inside.stretch == 1.0  # NVLink 5 beats the reference (p5 nodes in one block)
    across = job_timing([(racks[0], TRAY), (racks[9], TRAY)])  # the degraded rack's two cliques
    other_rack = job_timing([(racks[0], TRAY), (racks[20], TRAY)])
    assert across.slowest is SlowestLink.NET_LAYER2 and other_rack.slowest is SlowestLink.NET_LAYER2
    assert across.gbps == pytest.approx(0.7 * 4 * 50.0)  # four NDR InfiniBand NICs, one layer up
    assert across.stretch > 1.02
    big = job_timing([(racks[i], TRAY) for i in range(18, 34)])  # 16 trays of the full rack
    assert big.slowest is SlowestLink.NVLINK_DOMAIN and big.stretch == 1.0


def test_a_node_outside_the_clique_puts_the_job_back_on_the_network() -> None:
    tray = _racks(1)[0]
    (p5,) = build_fleet(["p5.48xlarge"], nodes=1)
    mixed = job_timing([(tray, TRAY), (p5, TRAY)])
    assert mixed.slowest is not SlowestLink.NVLINK_DOMAIN and mixed.stretch > 1.0


# ---- the gang tier reaches the extender ---------------------------------------------------------


def test_the_required_tier_reaches_the_extender_on_the_gangs_pods() -> None:
    racks = _racks(18)
    placer = ExtenderPlacer(racks, share_nodes=frozenset(), transport="in-process")
    try:
        state = SimState.create(racks, _model())
        rng = np.random.default_rng(0)
        request = Request(44_000, 393_216, 4, 1000)
        gang = Gang("train-1", 2, TRAINING_GANG_PRIORITY, GANG_TIER_CLIQUE)
        placer.created(["train-1-0", "train-1-1"], request, gang)  # both pods exist, as the engine says
        placement = placer.place(
            state,
            request,
            allowed=np.ones(len(racks), dtype=bool),
            rng=rng,
            pod_id="train-1-0",
            gang=gang,
        )
        assert placement is not None
        pod = placer._extender.cache.pod_object(uid="train-1-0") or {}
        assert pod["metadata"]["annotations"][ANNOTATION_GANG_TIER] == LABEL_GPU_CLIQUE
    finally:
        placer.close()


def _run(placer: Placer, jobs: list[Job], *, faults: tuple[FaultSpec, ...] = ()) -> RunResult:
    racks = _racks(18)
    try:
        return Simulation(
            fleet=racks,
            jobs=jobs,
            placer=placer,
            metric_model=_model(),
            duration_s=4 * 3600.0,
            seed=3,
            faults=faults,
            share_nodes=frozenset(),
        ).run()
    finally:
        placer.close()


def test_with_the_tier_every_gang_runs_inside_one_clique_and_the_report_counts_them() -> None:
    # two cliques of 9 trays, three gangs of 4 trays, 1-GPU pods on five trays: the extender keeps
    # every gang inside one clique (waiting if it must); a placer that does not read the tier crosses
    jobs = [_gang("g0", 4), _gang("g1", 4, at=60.0), _gang("g2", 4, at=120.0)]
    jobs += [Job(f"s{i}", JobKind.SINGLE, 0.0, 7200.0, 1, 1, 1000, 11_000, 65_536) for i in range(5)]
    racks = _racks(18)
    result = _run(ExtenderPlacer(racks, share_nodes=frozenset(), transport="in-process"), jobs)
    summary = summarize(result)
    assert summary["multi_node_gangs_across_cliques"] == 0
    assert summary["multi_node_gangs_in_one_clique"] == 3
    assert sum(summary["multi_node_gangs_per_clique"].values()) == 3
    assert set(summary["multi_node_gangs_per_clique"]) == {
        "gb200-nvl72-degraded-r0 clique 1",
        "gb200-nvl72-degraded-r0 clique 2",
    }
    assert summary["multi_node_gang_starts_by_gpus"] == {"16": 3}
    add_common_completion([result], [summary])
    table = summary_table([summary])
    assert "multi-node gangs inside one clique / across" in table and "3 / 0" in table
    baseline = summarize(_run(make_placer("random", node_count=18, seed=1), jobs))
    assert baseline["multi_node_gangs_across_cliques"] > 0


def test_clique_counts_from_placements() -> None:
    result = RunResult(policy="x", cliques=("A", "B"))
    result.ledger.training += [
        PlacedTraining("g0", 2, 8, 0.0, "nvlink-domain", 900.0, 1.0, 3600.0, 60.0, ("A",)),
        PlacedTraining("g1", 4, 16, 0.0, "network-layer-2", 70.0, 1.1, 3960.0, 180.0, ("A", "B")),
        PlacedTraining("g2", 2, 8, 0.0, "nvlink-domain", 900.0, 1.0, 3600.0, 120.0, ("A",)),
        PlacedTraining("s0", 1, 4, 0.0, "nvlink", 900.0, 1.0, 3600.0, 0.0, ("B",)),  # one pod: not a gang
    ]
    figures = clique_figures(result)
    assert figures["multi_node_gangs_in_one_clique"] == 2
    assert figures["multi_node_gangs_across_cliques"] == 1
    assert figures["multi_node_gangs_per_clique"] == {"A": 2, "B": 0}
    assert figures["multi_node_gang_wait_by_gpus_mean_min"] == {"8": 1.5, "16": 3.0}
    assert clique_figures(RunResult(policy="x")) == {}  # no cliques: nothing added


def test_the_default_report_has_no_clique_rows() -> None:
    result = RunResult(policy="x")
    summary = summarize(result)
    add_common_completion([result], [summary])
    assert "multi_node_gangs_per_clique" not in summary
    assert "clique" not in summary_table([summary])


# ---- the NVLink tray fault ----------------------------------------------------------------------


def test_the_tray_fault_is_planned_only_on_a_fleet_with_cliques() -> None:
    assert faults_for(build_fleet(DEFAULT_PROFILES, nodes=4)) == DEFAULT_FAULTS
    assert faults_for(_racks(18)) == (*DEFAULT_FAULTS, TRAY_FAULT)


def test_a_tray_fault_evicts_the_gang_on_it_which_is_placed_again_inside_one_clique() -> None:
    jobs = [_gang("g0", 4), Job("s0", JobKind.SINGLE, 0.0, 7200.0, 1, 1, 1000, 11_000, 65_536)]
    racks = _racks(18)
    result = _run(
        ExtenderPlacer(racks, share_nodes=frozenset(), transport="in-process"),
        jobs,
        faults=(FaultSpec(FaultKind.NVLINK_TRAY, 0.1, 1800.0),),
    )
    (fault,) = result.faults
    assert fault.kind == FaultKind.NVLINK_TRAY.value and fault.gpus_withheld == 4
    assert fault.pods_evicted == 4 and fault.jobs_requeued == 1  # the whole gang, not the 1-GPU pod
    assert fault.restored_at_s == fault.at_s + 1800.0
    (recovery,) = result.ledger.recoveries
    assert recovery.seconds == 10.0  # the fabric gate's check, then spare trays in the fault's tick
    assert len(recovery.cliques_before) == 1 and len(recovery.cliques) == 1
    summary = summarize(result)
    assert summary["gangs_recovered_in_one_clique"] == 1 and summary["gangs_recovered"] == 1
    assert "4 GPUs withheld until the fabric completes" in fault_table(summary)


def test_a_tray_fault_leaves_single_gpu_pods_running_and_keeps_new_pods_off_the_tray() -> None:
    jobs = [Job("s0", JobKind.SINGLE, 0.0, 7200.0, 1, 1, 1000, 11_000, 65_536)]
    jobs += [Job(f"t{i}", JobKind.SINGLE, 3000.0, 600.0, 1, 1, 1000, 11_000, 65_536) for i in range(40)]
    result = _run(
        make_placer("random", node_count=18, seed=1),
        jobs,
        faults=(FaultSpec(FaultKind.NVLINK_TRAY, 0.15, 3600.0),),
    )
    (fault,) = result.faults
    assert fault.pods_evicted == 0  # a single-GPU pod uses no NVLink peer
    assert fault.gpus_withheld == 4


def test_the_agent_withholds_a_trays_gpus_while_its_fabric_is_failed() -> None:
    racks = _racks(1)
    uuids = sorted(g.uuid for g in racks[0].inventory.gpus)
    pool = NodeAgentPool(racks, share_nodes=frozenset())
    try:
        assert pool.set_fabric_state(0, "failed") is not None  # the kubelet saw all four Unhealthy
        status = pool.published(0)["status"]
        assert sorted(status["withheld"]) == uuids  # what the extender learns from
        assert not pool.gpu_healthy(0, 0)
        assert pool.set_fabric_state(0, "completed") is not None
        assert pool.gpu_healthy(0, 0) and pool.gpu_healthy(0, 3)
        assert pool.published(0)["status"]["withheld"] == []
    finally:
        pool.close()
