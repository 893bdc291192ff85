"""Latent faults in the simulation: drawn the same way for every policy, hit by the jobs placed on
them, and found by the node agents' own active checks (between jobs, gang preflight) on the
simulated clock."""

from __future__ import annotations

from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.latent import (
    DEFAULT_LATENT,
    LatentFaults,
    LatentKind,
    LatentSpec,
    draw_targets,
)
from gpuweave.simulate.state import GpuMode, RunningPod, SimState
from gpuweave.simulate.workload import Job, JobKind
from health.config import IdleSettings
from topology.fragmentation import FragmentModel, TaskShape, typical_workload

PROFILES = ["p5.48xlarge", "dgx-a100"]
IDLE = IdleSettings(interval_s=3600, after_job=True, settle_s=60, max_gpus=8)


def state_of(profiles: list[str], nodes: int) -> SimState:
    fleet = build_fleet(profiles, nodes=nodes)
    model = FragmentModel(typical_workload([TaskShape(4000, 1000, 1)]), models=profiles, max_gpus=8)
    return SimState.create(fleet, model)


def job(name: str, gpus: int, pods: int = 1) -> Job:
    kind = JobKind.GANG if pods > 1 else JobKind.SINGLE
    return Job(name, kind, 0.0, 3600.0, pods, gpus, gpus * 1000, 4000, 16_384)


def pod(name: str, node: int, gpus: tuple[int, ...], *, pods: int = 1) -> RunningPod:
    return RunningPod(f"{name}-0", job(name, len(gpus), pods), node, gpus, None, 0.0)


def test_targets_are_the_same_for_every_policy_and_leave_mig_managed_nodes_out() -> None:
    fleet = build_fleet(PROFILES, nodes=4)
    first = draw_targets(fleet, DEFAULT_LATENT, seed=42)
    assert first == draw_targets(fleet, DEFAULT_LATENT, seed=42)
    assert first != draw_targets(fleet, DEFAULT_LATENT, seed=7)
    assert all(not fleet[node].mig_managed for node, _ in first)
    for spec, (_, gpus) in zip(DEFAULT_LATENT, first, strict=True):
        assert len(gpus) == (2 if spec.kind is LatentKind.SLOW_NVLINK else 1)


def test_without_checks_every_job_on_a_fault_is_hit_and_nothing_is_found() -> None:
    state = state_of(["p5.48xlarge"], 1)
    latent = LatentFaults(
        state.fleet, duration_s=100.0, seed=1, specs=[LatentSpec(LatentKind.BAD_MEMORY, 0.5)]
    )
    ((node, (gpu,)),) = draw_targets(state.fleet, [LatentSpec(LatentKind.BAD_MEMORY, 0.5)], seed=1)
    latent.fire(state, 50.0)
    for n in range(3):
        latent.pods_started([pod(f"j{n}", node, (gpu,))], 60.0 + n)
    latent.pods_started([pod("other", node, ((gpu + 1) % 8,))], 70.0)
    (record,) = latent.records
    assert record.jobs_hit == ["j0", "j1", "j2"] and record.first_hit_s == 60.0
    assert record.outcome == "not found" and latent.check_idle(state, 80.0) == []


def test_an_idle_check_finds_a_bad_cell_before_a_job_and_the_gpu_leaves_the_state() -> None:
    state = state_of(["p5.48xlarge"], 1)
    spec = LatentSpec(LatentKind.BAD_MEMORY, 0.1)
    ((node, (gpu,)),) = draw_targets(state.fleet, [spec], seed=3)
    pool = NodeAgentPool(state.fleet, share_nodes=frozenset())
    try:
        latent = LatentFaults(state.fleet, duration_s=1000.0, seed=3, specs=[spec], agents=pool, idle=IDLE)
        latent.check_idle(state, 0.0)  # first look: every GPU idle from now
        latent.fire(state, 100.0)
        assert latent.check_idle(state, 120.0) == [node]  # idle past settle_s, never checked: due
        (record,) = latent.records
        assert record.outcome == "caught before a job" and record.caught_by == "idle"
        assert state.modes[node][gpu] is GpuMode.WITHHELD
        assert not pool.gpu_healthy(node, gpu)  # the agent withholds it: the extender learns it
        latent.pods_started([pod("later", node, ((gpu + 1) % 8,))], 200.0)
        assert record.jobs_hit == []
    finally:
        pool.close()


def test_a_gang_preflight_finds_a_slow_nvlink_pair_a_job_already_ran_on_and_keeps_its_gpus() -> None:
    state = state_of(["p5.48xlarge"], 2)
    spec = LatentSpec(LatentKind.SLOW_NVLINK, 0.1)
    ((node, pair),) = draw_targets(state.fleet, [spec], seed=5)
    pool = NodeAgentPool(state.fleet, share_nodes=frozenset())
    try:
        latent = LatentFaults(state.fleet, duration_s=1000.0, seed=5, specs=[spec], agents=pool, idle=IDLE)
        latent.fire(state, 100.0)
        latent.pods_started([pod("single", node, (pair[0],))], 110.0)  # one end only: not hit
        latent.pods_started([pod("pair", node, pair)], 120.0)  # both ends: hit
        (record,) = latent.records
        assert record.jobs_hit == ["pair"]
        whole = tuple(range(8))
        assert latent.slow_pairs() == {state.fleet[node].name: {frozenset(pair): 0.5}}  # truth, found or not
        # a slow link fails no GPU, but the plan did not know it: the gang is placed again knowing it
        assert latent.preflight(state, [(0, whole), (1, whole)], 200.0) is False
        assert record.outcome == "found after a job hit it" and record.caught_by == "preflight"
        assert {state.modes[node][g] for g in pair} == {GpuMode.NORMAL}
        assert pool.degraded_pairs(node) == {frozenset(pair)}
        status = pool.published(node)["status"]
        uuids = {state.fleet[node].inventory.gpus[g].uuid for g in pair}
        assert not uuids & set(status["unhealthyDevices"])  # what the extender reads: both in service
        (published,) = status["degradedLinks"]
        assert sorted(published["gpus"]) == sorted(pair) and published["fraction"] == 0.425
        assert latent.preflight(state, [(0, whole), (1, whole)], 205.0) is True  # known now: it passes
        other = 1 - node
        assert latent.preflight(state, [(other, whole)], 210.0) is True  # one node: nothing to prove
    finally:
        pool.close()
