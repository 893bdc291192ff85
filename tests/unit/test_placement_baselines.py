"""The FGD artifact's baselines, stream and node order, and the offline bound of the placement benchmark."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.placement import HELD_OUT_SEEDS, TUNING_SEEDS, build_parser, parse_seeds
from benchmarks.upper_bound import flow_bound, offline_pack
from devicemodel.errors import InvalidInputError
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.artifact import artifact_model, artifact_run
from gpuweave.simulate.fgd.baselines import (
    ArtifactBestFit,
    ArtifactDotProduct,
    ArtifactFgd,
    ArtifactRandom,
    make_baseline,
    pick_by_rank,
    random_node_rank,
)
from gpuweave.simulate.fgd.packing import run_packing
from gpuweave.simulate.fgd.trace import TracePod
from topology.fragmentation import FragmentModel, TaskShape

T4 = NodeSpec("n0", 32000, 131072, 2, "T4")
NODES = (T4, NodeSpec("n1", 32000, 131072, 2, "T4"), NodeSpec("n2", 32000, 131072, 2, "T4"))
PODS = (
    *(TracePod(f"p{i}", 4000, 8192, 1, 500) for i in range(6)),
    TracePod("w", 8000, 8192, 1, 1000),
    TracePod("c", 2000, 4096, 0, 0),
)


def _model(nodes: tuple[NodeSpec, ...] = NODES) -> FragmentModel:
    return artifact_model(PODS, models=sorted({n.model for n in nodes}), max_gpus=2)


def _all(cluster: ClusterState) -> np.ndarray:
    return np.arange(cluster.size)


def test_ties_go_to_the_lowest_rank_not_the_lowest_index() -> None:
    scores = np.asarray([50.0, 70.0, 70.0, 70.0])
    candidates = np.asarray([0, 1, 2, 3])
    assert pick_by_rank(scores, candidates, np.asarray([0, 3, 1, 2])) == 2
    assert pick_by_rank(scores, candidates, np.asarray([0, 1, 2, 3])) == 1


def test_best_fit_scores_as_the_artifact_and_breaks_ties_by_rank() -> None:
    cluster = ClusterState(NODES, _model())
    cluster.place(1, (0,), Request(0, 0, 1, 1000))  # n1: one GPU left, the best fit for a share
    request = Request(4000, 8192, 1, 500)
    policy = ArtifactBestFit(np.asarray([0, 1, 2]))
    assert policy.choose(cluster, request, _all(cluster), np.random.default_rng(0)).node == 1
    even = ClusterState(NODES, _model())
    # trunc(100 x (1 - (28000/128000 x 0.5 + 1500/8000 x 0.5))) = 79 on every node: rank decides
    ranked = ArtifactBestFit(np.asarray([2, 0, 1]))
    assert ranked.choose(even, request, _all(even), np.random.default_rng(0)).node == 1


def test_dot_product_prefers_the_smallest_product_and_the_tightest_share_gpu() -> None:
    cluster = ClusterState(NODES, _model())
    cluster.place(2, (1,), Request(1000, 0, 1, 700))  # n2: 1300 milli-GPU free, GPU 1 has 300
    policy = ArtifactDotProduct(np.asarray([0, 1, 2]))
    # n0: trunc(100 x (1 - (32/128 x 30/128 + 2/8 x 1/8) / 2)) = 95; n2: 31/128 and 1.3/8 give 96
    big = policy.choose(cluster, Request(30000, 0, 1, 1000), _all(cluster), np.random.default_rng(0))
    assert big.node == 2
    # a small share scores 99 everywhere (integer scores): the rank decides, then the tightest GPU
    share = ArtifactDotProduct(np.asarray([2, 1, 0]))
    placement = share.choose(cluster, Request(1000, 0, 1, 300), _all(cluster), np.random.default_rng(0))
    assert (placement.node, placement.gpus) == (2, (1,))


def test_fgd_packs_a_share_beside_a_share_and_ties_by_rank() -> None:
    cluster = ClusterState(NODES, _model())
    cluster.place(2, (0,), Request(4000, 8192, 1, 500))
    policy = ArtifactFgd(np.asarray([0, 1, 2]), _model())
    placement = policy.choose(cluster, Request(4000, 8192, 1, 500), _all(cluster), np.random.default_rng(0))
    assert (placement.node, placement.gpus) == (2, (0,))
    empty = ClusterState(NODES, _model())
    ranked = ArtifactFgd(np.asarray([1, 2, 0]), _model())
    assert ranked.choose(empty, Request(8000, 8192, 1, 1000), _all(empty), np.random.default_rng(0)).node == 2


def test_random_takes_a_random_gpu_that_fits_for_a_share() -> None:
    cluster = ClusterState(NODES[:1], _model(NODES[:1]))
    gpus = {
        ArtifactRandom()
        .choose(cluster, Request(1000, 0, 1, 300), np.asarray([0]), np.random.default_rng(s))
        .gpus
        for s in range(20)
    }
    assert gpus == {(0,), (1,)}


def test_a_pod_without_memory_room_fails_whatever_the_gpus() -> None:
    pods = [TracePod("big", 1000, 200_000, 1, 500)]
    curves = run_packing(
        nodes=NODES, pods=pods, fragment_model=_model(), policy=ArtifactBestFit(np.arange(3)), seed=1
    )
    assert (curves.placed, curves.failed) == (0, 1)


def test_unknown_baseline_is_named() -> None:
    with pytest.raises(InvalidInputError, match="unknown baseline 'tetris'"):
        make_baseline("tetris", rank=np.arange(3), fgd_model=_model())


def test_stream_shuffles_the_trace_then_appends_clones() -> None:
    run = artifact_run(PODS, capacity_gpus=6, node_count=3, seed=7)
    head, tail = run.pods[: len(PODS)], run.pods[len(PODS) :]
    assert sorted(p.name for p in head) == sorted(p.name for p in PODS)
    assert [p.name for p in head] != sorted(p.name for p in PODS)  # seed 7 moves them
    assert tail and all("-tuned-" in p.name for p in tail)
    requested = sum(p.total_gpu_milli for p in run.pods)
    assert requested <= 1.3 * 6000  # stops before the next clone's per-GPU request passes 130%
    assert requested > 1.3 * 6000 - 1000
    assert sorted(run.node_rank.tolist()) == [0, 1, 2]
    again = artifact_run(PODS, capacity_gpus=6, node_count=3, seed=7)
    assert [p.name for p in again.pods] == [p.name for p in run.pods]


def test_stream_above_the_target_loses_random_pods() -> None:
    pods = tuple(TracePod(f"g{i}", 1000, 1024, 2, 1000) for i in range(10))
    run = artifact_run(pods, capacity_gpus=4, node_count=2, seed=3)
    assert sum(p.total_gpu_milli for p in run.pods) <= 1.3 * 4000
    assert len(run.pods) == 2 and all("-tuned-" not in p.name for p in run.pods)


def test_target_workload_keeps_the_popular_shapes_up_to_95_percent() -> None:
    pods = [TracePod(f"a{i}", 1000, 0, 1, 500) for i in range(19)] + [TracePod("rare", 9000, 0, 1, 1000)]
    model = artifact_model(pods, models=["T4"], max_gpus=2)
    assert model.workload.shapes == (TaskShape(1000, 500, 1),)
    assert model.workload.probabilities == (1.0,)


def test_report_seeds_are_held_out_from_tuning_seeds() -> None:
    held_out = set(parse_seeds(HELD_OUT_SEEDS))
    assert held_out == set(range(1000, 1010))
    assert not held_out & set(parse_seeds(TUNING_SEEDS))
    assert build_parser().parse_args([]).seeds == HELD_OUT_SEEDS


def test_flow_bound_counts_only_gpus_a_task_can_reach() -> None:
    nodes = (NodeSpec("t", 32000, 65536, 2, "T4"), NodeSpec("v", 32000, 65536, 2, "V100"))
    typed = [TracePod(f"t{i}", 1000, 1024, 1, 1000, "T4") for i in range(4)]
    too_big = [TracePod("huge", 64000, 1024, 1, 1000)]
    assert flow_bound(nodes, typed + too_big) == 2000
    anywhere = [TracePod(f"a{i}", 1000, 1024, 1, 1000) for i in range(3)]
    assert flow_bound(nodes, typed + anywhere) == 4000
    assert offline_pack(nodes, typed + anywhere) <= flow_bound(nodes, typed + anywhere)


def test_offline_pack_places_whole_gpus_before_shares() -> None:
    nodes = (NodeSpec("a", 32000, 65536, 1, "T4"),)
    pods = [TracePod("s", 1000, 1024, 1, 600), TracePod("w", 1000, 1024, 1, 1000)]
    assert offline_pack(nodes, pods) == 1000


def test_simulate_best_fit_ties_follow_one_seeded_node_order() -> None:
    rank = random_node_rank(8, seed=5)
    assert sorted(rank.tolist()) == list(range(8))
    assert random_node_rank(8, seed=5).tolist() == rank.tolist()
    assert random_node_rank(8, seed=6).tolist() != rank.tolist()
    nodes = tuple(NodeSpec(f"n{i}", 32000, 131072, 2, "T4") for i in range(8))
    cluster = ClusterState(nodes, artifact_model(PODS, models=["T4"], max_gpus=2))
    placed = ArtifactBestFit(rank).choose(
        cluster, Request(8000, 8192, 1, 1000), np.arange(8), np.random.default_rng(0)
    )
    assert placed.node == int(np.argmin(rank))  # every empty node scores alike: the lowest rank wins
