"""The simulation's extender places fractional shares against the mix it is given or learns."""

from __future__ import annotations

import numpy as np

from gpuweave.simulate.cluster import Request
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.state import SimState
from topology.fragmentation import FragmentModel, TargetWorkload, TaskShape, typical_workload


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
