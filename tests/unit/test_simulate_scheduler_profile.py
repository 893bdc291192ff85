"""The simulation breaks extender ties as the gpuweave-scheduler profile does (MostAllocated)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from gpuweave.simulate.cluster import Request
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.scheduler_profile import (
    SCHEDULER_CONFIG,
    ProfileScoring,
    SchedulerProfileError,
    load_profile_scoring,
)
from gpuweave.simulate.state import SimState
from topology.fragmentation import FragmentModel, TaskShape, typical_workload

GPU = "nvidia.com/gpu"
SCORING = ProfileScoring(
    extender_weight=12,
    fit_weight=1,
    fit_strategy="MostAllocated",
    fit_resources=((GPU, 10), ("cpu", 1), ("memory", 1)),
)


def test_the_shipped_profile_is_read_and_fill_level_only_breaks_extender_ties() -> None:
    scoring = load_profile_scoring()
    assert scoring == SCORING
    # NodeResourcesFit's most (100 x its weight) stays below one extender score step
    assert 100 * scoring.fit_weight < scoring.node_total(extender_score=1, fit_score=0)
    assert scoring.node_total(extender_score=7, fit_score=0) > scoring.node_total(
        extender_score=6, fit_score=100
    )


def test_most_allocated_follows_kube_schedulers_integer_arithmetic() -> None:
    allocatable = {GPU: 8, "cpu": 96_000, "memory": 1_179_648}
    requested = {GPU: 4, "cpu": 50_000, "memory": 400_000}
    pod = {GPU: 1, "cpu": 4_000, "memory": 16_384}
    # gpu 5*100//8 = 62, cpu 54000*100//96000 = 56, memory 416384*100//1179648 = 35
    assert (
        SCORING.most_allocated(requested=requested, allocatable=allocatable, pod=pod)
        == (62 * 10 + 56 + 35) // 12
    )
    # a pod asking for no nvidia.com/gpu is scored on cpu and memory only (extended resource skipped)
    no_gpu = {"cpu": 4_000, "memory": 16_384}
    assert SCORING.most_allocated(requested=requested, allocatable=allocatable, pod=no_gpu) == (56 + 35) // 2
    # requests beyond allocatable count as full; a node with none of a resource is skipped
    assert SCORING.most_allocated(requested={GPU: 9}, allocatable={GPU: 8}, pod={GPU: 1}) == 100
    assert SCORING.most_allocated(requested={}, allocatable={}, pod={GPU: 1}) == 0


def _write_profile(tmp_path: Path, strategy: str) -> Path:
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]["type"] = strategy
    config["profiles"][0]["plugins"] = {"score": {"enabled": [{"name": "NodeResourcesFit", "weight": 3}]}}
    path = tmp_path / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_plugin_weight_is_read_and_other_strategies_are_refused(tmp_path: Path) -> None:
    assert load_profile_scoring(_write_profile(tmp_path, "MostAllocated")).fit_weight == 3
    with pytest.raises(SchedulerProfileError, match="LeastAllocated"):
        load_profile_scoring(_write_profile(tmp_path, "LeastAllocated"))
    with pytest.raises(SchedulerProfileError, match="cannot read"):
        load_profile_scoring(tmp_path / "missing.yaml")


def _nodes_of_two_pods(scoring: ProfileScoring, seed: int) -> tuple[int, int]:
    """Two 1-GPU pods on two identical empty nodes: the extender scores them alike for the first
    pod only; for the second, the node holding the first is the scorer's best (packing)."""
    fleet = build_fleet(["p4d.24xlarge"], nodes=2)
    model = FragmentModel(typical_workload([TaskShape(0, 1000, 1)]), models=["p4d.24xlarge"], max_gpus=8)
    state = SimState.create(fleet, model)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), scoring=scoring)
    request, rng, allowed = Request(4000, 16_384, 1, 1000), np.random.default_rng(seed), np.ones(2, bool)
    nodes = []
    try:
        for pod in ("first", "second"):
            placement = placer.place(state, request, allowed=allowed, rng=rng, pod_id=pod)
            assert placement is not None
            state.cluster.place(placement.node, placement.gpus, request)
            nodes.append(placement.node)
        assert placer.tie_counts["extender_tied"] == 1
    finally:
        placer.close()
    return nodes[0], nodes[1]


def test_the_scorers_best_node_wins_with_or_without_most_allocated() -> None:
    """Prioritize gives 10 only to the scorer's best node, so the second pod packs onto the first
    pod's node even when the profile's own plugins score every node alike (flat)."""
    flat = ProfileScoring(extender_weight=12, fit_weight=1, fit_strategy="MostAllocated", fit_resources=())
    for scoring in (flat, SCORING):
        assert all(first == second for first, second in (_nodes_of_two_pods(scoring, s) for s in range(6)))
