"""The simulation's extender places fractional shares against the mix it is given or learns."""

from __future__ import annotations

from dataclasses import replace

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


def test_a_cpu_heavy_share_goes_where_its_cores_strand_no_gpu() -> None:
    """Two L40S nodes, one with 8 cores per GPU and one with 52; a few shares of the mix ask for
    200 cores, which only the CPU-rich node holds, so the reservation presses it. A 16-core share
    (53 cores per GPU, against the mix's 14) would leave the CPU-poor node's GPUs without the CPU
    their tasks need: it goes to the CPU-rich node, reservation or not. Charged per milli-GPU
    alone, the reservation sent it to the CPU-poor node."""
    fleet = build_fleet(["l40s-pcie-8"], nodes=2)
    fleet = (replace(fleet[0], cpu_milli=64_000), replace(fleet[1], cpu_milli=416_000))
    model = FragmentModel(typical_workload([TaskShape(0, 400, 1)]), models=["l40s-pcie-8"], max_gpus=8)
    state = SimState.create(fleet, model)
    mix = TargetWorkload(
        (TaskShape(200_000, 500, 1), TaskShape(16_000, 300, 1), TaskShape(2_000, 900, 1)), (0.02, 0.3, 0.68)
    )
    placer = ExtenderPlacer(fleet, share_nodes=frozenset({0, 1}), share_workload=mix)
    try:
        rng = np.random.default_rng(0)
        allowed = np.ones(2, dtype=bool)
        heavy = placer.place(state, Request(16_000, 1024, 1, 300), allowed=allowed, rng=rng, pod_id="heavy")
        light = placer.place(state, Request(2_000, 1024, 1, 900), allowed=allowed, rng=rng, pod_id="light")
    finally:
        placer.close()
    assert heavy is not None and heavy.node == 1
    assert light is not None and light.node == 0  # spends cores slower than GPU: spares the reserved node
