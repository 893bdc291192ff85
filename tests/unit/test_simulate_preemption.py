"""The simulation's kube-scheduler preemption: which nodes are candidates, which priority a pod carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np

from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from gpuweave.simulate.cluster import Request
from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer, candidates_to_find
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.placers import Gang, PodPlacement
from gpuweave.simulate.state import GpuMode, RunningPod, SimState
from gpuweave.simulate.workload import (
    TRAINING_GANG_PRIORITY,
    TRAINING_POD_PRIORITY,
    Job,
    JobKind,
    WorkloadSettings,
    synthetic_jobs,
    trace_jobs,
)
from topology.fragmentation import FragmentModel, TaskShape, typical_workload


def _model() -> FragmentModel:
    return FragmentModel(typical_workload([TaskShape(12_000, 1000, 1)]), models=["p5.48xlarge"], max_gpus=8)


def test_a_node_short_of_cpu_is_a_preemption_candidate_beside_the_nodes_the_extender_refused() -> None:
    """Two p5 nodes: a priority-1000 job holds all 8 GPUs of one (it passes the CPU fit, the
    extender refuses it for GPUs, and nothing on it may be evicted); a priority-0 job holds 150
    of the other's 192 vCPUs. A priority-1000 ordinary pod (no gang) of 2 GPUs and 100 vCPUs fits
    only once that job is gone: kube-scheduler counts the node its own CPU fit refused as
    resolvable by preemption."""
    fleet = build_fleet(["p5.48xlarge"], nodes=2)
    blocker = Job("train-0", JobKind.GANG, 0.0, 7200.0, 1, 8, 1000, 1000, 65_536, priority=1000)
    filler = Job("single-1", JobKind.SINGLE, 0.0, 7200.0, 1, 1, 1000, 150_000, 65_536)
    wanted = Job("single-2", JobKind.SINGLE, 60.0, 600.0, 1, 2, 1000, 100_000, 65_536, priority=1000)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    sim = Simulation(
        fleet=fleet,
        jobs=[blocker, filler, wanted],
        placer=placer,
        metric_model=_model(),
        duration_s=3600.0,
        faults=(),
        share_nodes=frozenset(),
    )
    try:
        result = sim.run()
    finally:
        placer.close()
    assert result.pods_preempted == 1
    restarts = {c.job_id: c.restarts for c in result.ledger.completions}
    assert restarts == {"train-0": 0, "single-1": 1, "single-2": 0}  # the priority-0 job was the victim
    (done,) = [c for c in result.ledger.completions if c.job_id == "single-2"]
    assert done.end_s == 60.0 + 30.0 + 600.0  # in its arrival's tick, once the victim's grace is over


class _Recorder:
    """A placer that places nothing and records the gang each pod was sent with."""

    name = "recorder"
    transport = "in-process"

    def __init__(self) -> None:
        self.gangs: dict[str, Gang | None] = {}

    def place(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        rng: np.random.Generator,
        pod_id: str = "",
        gang: Gang | None = None,
    ) -> PodPlacement | None:
        self.gangs[pod_id] = gang
        return None

    def forget(self, pod_id: str) -> None: ...

    def gpu_failed(self, node: int, gpu: int, reason: str) -> None: ...

    def gpu_restored(self, node: int, gpu: int) -> None: ...

    def gpu_mode_changed(self, node: int, gpu: int, *, mig: bool) -> None: ...

    def close(self) -> None: ...


def test_a_one_pod_training_job_is_a_gang_of_one_and_any_other_job_carries_only_its_priority() -> None:
    fleet = build_fleet(["p5.48xlarge"], nodes=1)
    jobs = [
        Job("train-0", JobKind.GANG, 0.0, 600.0, 1, 16, 1000, 1000, 1024, priority=1000),
        Job("single-1", JobKind.SINGLE, 0.0, 600.0, 1, 16, 1000, 1000, 1024),
        Job("single-2", JobKind.SINGLE, 0.0, 600.0, 1, 16, 1000, 1000, 1024, priority=500),
    ]
    recorder = _Recorder()
    sim = Simulation(
        fleet=fleet, jobs=jobs, placer=recorder, metric_model=_model(), duration_s=60.0, faults=()
    )
    sim.run()
    assert recorder.gangs["train-0-0"] == Gang("train-0", 1, 1000, "", named=True, duration_s=600.0)
    assert recorder.gangs["single-1-0"] is None  # priority 0, one pod: no gang, no priority
    assert recorder.gangs["single-2-0"] == Gang("single-2", 1, 500, "", named=False, duration_s=600.0)


def test_the_extender_sees_a_one_pod_training_job_as_a_gang_of_one_under_its_job_name() -> None:
    """Its pod names the gang (size 1) under the job's name on every attempt, and carries its
    priority; a job that is not training names none."""
    fleet = build_fleet(["p5.48xlarge"], nodes=1)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    state = SimState.create(fleet, _model())
    seen: list[dict[str, object]] = []
    post = placer._post

    def record(verb: str, body: dict[str, object]) -> object:
        if verb == "filter":
            seen.append(body["Pod"])  # type: ignore[arg-type]
        return post(verb, body)

    placer._post = record  # type: ignore[method-assign]
    request = Request(1000, 1024, 8, 1000)
    allowed = np.ones(1, dtype=bool)
    rng = np.random.default_rng(0)
    try:
        for pod_id, gang in (
            ("train-0-0", Gang("train-0", 1, 1000)),
            ("single-1-0", Gang("single-1", 1, 500, named=False)),
        ):
            placement = placer.place(state, request, allowed=allowed, rng=rng, pod_id=pod_id, gang=gang)
            assert placement is not None
            placer.forget(pod_id)
    finally:
        placer.close()
    trained, single = (cast(dict[str, Any], pod) for pod in seen)
    assert trained["metadata"]["annotations"] == {ANNOTATION_GANG: "train-0", ANNOTATION_GANG_SIZE: "1"}
    assert trained["spec"]["priority"] == 1000
    assert not single["metadata"].get("annotations")
    assert single["spec"]["priority"] == 500


def test_preemption_collects_as_many_candidates_as_kube_schedulers_defaults_ask() -> None:
    # 10% of the potential nodes, at least 100, at most all of them (DefaultPreemptionArgs)
    assert [candidates_to_find(n) for n in (0, 16, 100, 500, 1000, 2500)] == [0, 16, 100, 100, 100, 250]


def test_a_nodes_version_changes_with_its_pods_and_gpu_modes_only() -> None:
    """What a cached dry run is keyed on: a pod started or stopped, or a GPU's mode, on that node."""
    fleet = build_fleet(["p5.48xlarge"], nodes=2)
    state = SimState.create(fleet, _model())
    job = Job("single-0", JobKind.SINGLE, 0.0, 600.0, 1, 1, 1000, 1000, 1024)
    pod = RunningPod("single-0-0", job, 1, (0,), Request(1000, 1024, 1, 1000), 0.0)
    state.start_pod(pod)
    assert (state.node_versions.get(0, 0), state.node_versions.get(1, 0)) == (0, 1)
    state.set_mode(1, 3, GpuMode.WITHHELD)
    state.stop_pod(pod.pod_id)
    assert (state.node_versions.get(0, 0), state.node_versions.get(1, 0)) == (0, 3)


def test_training_jobs_carry_the_training_priorities_and_every_other_job_zero(tmp_path: Path) -> None:
    """Multi-node gangs at 1000, one-pod training jobs (gangs of one) at 500, below them: a
    recovering multi-node gang may displace a one-pod job; every other job at 0."""
    jobs = synthetic_jobs(WorkloadSettings(duration_s=3 * 3600.0, capacity_gpus=128), seed=42)
    by_kind = {(j.kind, j.pods > 1): j.priority for j in jobs}
    assert by_kind == {
        (JobKind.GANG, True): TRAINING_GANG_PRIORITY,
        (JobKind.GANG, False): TRAINING_POD_PRIORITY,
        (JobKind.SINGLE, False): 0,
        (JobKind.SHARE, False): 0,
        (JobKind.MIG, False): 0,
    }
    assert 0 < TRAINING_POD_PRIORITY < TRAINING_GANG_PRIORITY
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "train,64000,262144,8,1000,0,3600\nbig,64000,262144,16,1000,0,3600\none,8000,65536,1,1000,0,3600\n"
    )
    traced = trace_jobs(csv, WorkloadSettings(duration_s=7200.0, capacity_gpus=128), seed=1)
    assert {(j.pods, j.gpus_per_pod, j.priority) for j in traced} == {
        (1, 8, TRAINING_POD_PRIORITY),
        (2, 8, TRAINING_GANG_PRIORITY),
        (1, 1, 0),
    }


def test_a_node_too_small_for_the_pod_is_no_preemption_candidate() -> None:
    """kube-scheduler (>= 1.34) calls NodeResourcesFit's refusal unresolvable where the node's
    allocatable cannot hold the pod at all: with every CPU taken, a pod of 1.8 TiB is a candidate
    for the p5 (2 TiB) only, not the l40s node (1.5 TiB)."""
    fleet = build_fleet(["p5.48xlarge", "l40s-pcie-8"], nodes=2)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    model = FragmentModel(
        typical_workload([TaskShape(12_000, 1000, 1)]), models=["p5.48xlarge", "l40s-pcie-8"], max_gpus=8
    )
    state = SimState.create(fleet, model)
    state.cluster.cpu_free[:] = 0
    request = Request(1000, 1_900_000, 8, 1000)
    try:
        allowed = np.ones(2, dtype=bool)
        rng = np.random.default_rng(0)
        assert placer.place(state, request, allowed=allowed, rng=rng, pod_id="train-0-0") is None
        assert placer._unplaced is not None and placer._unplaced[1] == ["p5.48xlarge-00"]
    finally:
        placer.close()


def test_a_preemption_victims_eviction_says_so_and_leaves_its_gang_of_one_not_recovering() -> None:
    """The loop's eviction of a pod marks it as its writer would: kube-scheduler's preemption
    with ``PreemptionByScheduler``, a fault's or a drain's eviction with ``EvictionByEvictionAPI``.
    The extender reads the difference: a gang of one evicted by a fault is recovering (it may
    preempt on its next attempt), one preempted for a higher priority is not."""
    fleet = build_fleet(["p5.48xlarge"], nodes=1)
    request = Request(1000, 1024, 8, 1000)
    for preempted in (False, True):
        placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
        state = SimState.create(fleet, _model())
        try:
            gang = Gang("train-0", 1, TRAINING_POD_PRIORITY)
            placement = placer.place(
                state,
                request,
                allowed=np.ones(1, dtype=bool),
                rng=np.random.default_rng(0),
                pod_id="train-0-0",
                gang=gang,
            )
            assert placement is not None
            placer.evicted("train-0-0", preempted=preempted)
            marked = placer._extender.cache.pod_object(uid="train-0-0")
            assert marked is not None
            (condition,) = marked["status"]["conditions"]
            assert condition["reason"] == ("PreemptionByScheduler" if preempted else "EvictionByEvictionAPI")
            placer.forget("train-0-0")
            gangs = placer._extender.gangs
            assert gangs is not None
            assert bool(gangs.book.recovering_nodes("default/gang:train-0#1@")) is not preempted
        finally:
            placer.close()


class _FailingPreflight:
    """Latent faults whose gang preflight fails on its second call (a node found bad)."""

    def __init__(self) -> None:
        self.calls = 0

    def preflight(self, state: SimState, placed: object, now: float) -> bool:
        self.calls += 1
        return self.calls != 2

    def pods_started(self, pods: object, now: float) -> None: ...

    def slow_pairs(self) -> dict[str, dict[frozenset[int], float]]:
        return {}  # no slow NVLink pair: job times as placed


def test_a_failed_gang_preflight_leaves_a_gang_re_created_after_a_fault_recovering() -> None:
    """The loop binds a gang's members before its preflight (the deployed extender checks before
    it binds), and a failed preflight deletes them. The gang ran, a fault evicted it (recovering:
    it may preempt); its next try fails its preflight, and the deletes are evictions, so the
    extender still counts it recovering. A gang that never ran stays a new gang."""
    fleet = build_fleet(["p5.48xlarge"], nodes=2)
    job = Job("train-0", JobKind.GANG, 0.0, 600.0, 2, 8, 1000, 1000, 1024, priority=TRAINING_GANG_PRIORITY)
    family = "default/gang:train-0#2@"
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    latent = _FailingPreflight()
    sim = Simulation(
        fleet=fleet,
        jobs=[],
        placer=placer,
        metric_model=_model(),
        duration_s=600.0,
        faults=(),
        latent=cast(Any, latent),
    )
    try:
        gangs = placer._extender.gangs
        assert gangs is not None
        assert sim._start(job, 0.0)
        assert not gangs.book.recovering_nodes(family)  # it runs
        sim._evict_job(sim.state.pods["train-0-0"])  # a fault's eviction
        assert gangs.book.recovering_nodes(family)
        assert not sim._start(job, 60.0) and latent.calls == 2  # placed, preflight failed
        assert gangs.book.recovering_nodes(family)  # still recovering
        assert sim._start(job, 120.0)
        assert not gangs.book.recovering_nodes(family)
    finally:
        placer.close()
