"""The extender places fractional shares against the simulated workload's own mix of shares."""

from __future__ import annotations

import numpy as np

from gpuweave.simulate.cluster import Request
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.runner import share_workload
from gpuweave.simulate.state import SimState
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel, TargetWorkload, TaskShape, typical_workload


def _job(job_id: str, kind: JobKind, milli: int) -> Job:
    return Job(job_id, kind, 0.0, 600.0, 1, 1, milli, 4000, 16_384)


def test_the_share_mix_comes_from_the_fractional_pods_only() -> None:
    jobs = [_job("a", JobKind.SHARE, 810), _job("b", JobKind.SHARE, 810), _job("c", JobKind.SHARE, 475)]
    jobs += [_job("d", JobKind.SINGLE, 1000), _job("e", JobKind.MIG, 0)]
    mix = share_workload(jobs)
    assert mix is not None
    weights = dict(zip(mix.shapes, mix.probabilities, strict=True))
    assert weights == {TaskShape(0, 810, 1): 2 / 3, TaskShape(0, 470, 1): 1 / 3}
    assert share_workload([_job("d", JobKind.SINGLE, 1000)]) is None


def _second_share_gpu(mix: TargetWorkload) -> tuple[int, int]:
    """GPUs of two 400-milli shares placed one after the other on one fractional node."""
    fleet = build_fleet(["l40s-pcie-8"], nodes=1)
    model = FragmentModel(typical_workload([TaskShape(0, 400, 1)]), models=["l40s-pcie-8"], max_gpus=8)
    state = SimState.create(fleet, model)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset({0}), share_workload=mix)
    try:
        request = Request(1000, 1024, 1, 400)
        rng = np.random.default_rng(0)
        allowed = np.ones(1, dtype=bool)
        first = placer.place(state, request, allowed=allowed, rng=rng, pod_id="first")
        second = placer.place(state, request, allowed=allowed, rng=rng, pod_id="second")
    finally:
        placer.close()
    assert first is not None and second is not None
    return first.gpus[0], second.gpus[0]


def test_the_extender_packs_or_spreads_shares_as_the_mix_expects() -> None:
    small = TargetWorkload(shapes=(TaskShape(0, 200, 1),), probabilities=(1.0,))
    large = TargetWorkload(shapes=(TaskShape(0, 600, 1),), probabilities=(1.0,))
    first, second = _second_share_gpu(small)
    assert first == second  # 200 left on the GPU still serves the expected 200-milli shares
    first, second = _second_share_gpu(large)
    assert first != second  # 200 left could serve no expected 600-milli share: a fresh GPU instead
