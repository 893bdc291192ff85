"""The go-gpuallocator baseline: its pair weights, its NVSwitch blind spot, its partitions and ties."""

from __future__ import annotations

import itertools

import pytest

from devicemodel.errors import TopologyError
from devicemodel.inventory import NodeInventory, NvLink, NvSwitchFabric, PcieSwitch
from tests.unit.topology_nodes import dgx1_v100, make_gpu, nvswitch_node, p4d
from topology.baselines import go_gpuallocator_like, go_gpuallocator_pair_score
from topology.go_gpuallocator import best_effort, partitions
from topology.graph import TopologyGraph
from topology.search import best_set

ALL8 = frozenset(range(8))
DGX1 = TopologyGraph.from_inventory(dgx1_v100())


@pytest.mark.parametrize(
    ("inventory", "a", "b", "score"),
    [
        (dgx1_v100(), 0, 3, 40 + 200),  # two switches under one host bridge + two NVLinks
        (dgx1_v100(), 0, 1, 50 + 100),  # one switch + one NVLink
        (dgx1_v100(), 0, 5, 10),  # across sockets, no NVLink
        (nvswitch_node(), 0, 1, 40),  # NVSwitch pair: no NVLink credit at all
        (nvswitch_node(), 0, 2, 20),
        (nvswitch_node(), 0, 4, 10),
    ],
)
def test_pair_scores(inventory: NodeInventory, a: int, b: int, score: int) -> None:
    assert go_gpuallocator_pair_score(TopologyGraph.from_inventory(inventory), a, b) == score


@pytest.mark.parametrize(
    ("available", "size", "must", "expected"),
    [
        (ALL8, 2, frozenset(), (0, 3)),  # the partition {0,3},{1,2},{4,7},{5,6} of its static table
        (ALL8, 4, frozenset(), (0, 1, 2, 3)),
        (ALL8, 2, frozenset({5}), (5, 6)),
        (ALL8, 8, frozenset(), tuple(range(8))),
        (frozenset({1, 2, 3, 4, 5}), 2, frozenset(), (2, 3)),  # partition {2,3},{1,5}, 4 spare
        (frozenset({0, 1}), 3, frozenset(), None),
        (ALL8, 2, frozenset({0, 1, 2}), None),
    ],
)
def test_dgx1_choices(available: frozenset[int], size: int, must: frozenset[int],
                      expected: tuple[int, ...] | None) -> None:
    assert go_gpuallocator_like(DGX1, available=available, size=size, must_include=must) == expected


def test_nvswitch_blind_spot_prefers_a_pcie_pair_over_an_nvswitch_pair() -> None:
    # GPUs 0 and 1 share a PCIe switch but sit outside the NVSwitch fabric; 2 and 3 are on it.
    gpus = (make_gpu(0, switch="sw0"), make_gpu(1, switch="sw0"), make_gpu(2, switch="sw2", root="r1"),
            make_gpu(3, switch="sw3", root="r2"))
    node = NodeInventory(name="partial-fabric", numa_nodes=1, gpus=gpus,
                         nvswitch=NvSwitchFabric(gpus=(2, 3), links_per_gpu=18))
    graph = TopologyGraph.from_inventory(node)
    available = frozenset(range(4))
    assert go_gpuallocator_like(graph, available=available, size=2) == (0, 1)
    ours = best_set(graph, available=available, size=2)
    assert ours is not None and ours.gpus == (2, 3)


def test_nic_pairs_on_p4d_follow_pcie_switches() -> None:
    graph = TopologyGraph.from_inventory(p4d())
    assert go_gpuallocator_like(graph, available=ALL8 - {0}, size=2) == (2, 3)


def test_sixteen_gpus_are_tractable() -> None:
    graph = TopologyGraph.from_inventory(nvswitch_node(gpus=16))
    chosen = go_gpuallocator_like(graph, available=frozenset(range(16)) - {0, 9}, size=8)
    assert chosen is not None and len(chosen) == 8


def test_size_below_one_is_an_error() -> None:
    with pytest.raises(TopologyError, match="ask for 1 or more"):
        go_gpuallocator_like(DGX1, available=ALL8, size=0)


def test_leftover_gpus_score_together_and_ties_go_to_the_first_partition_listed() -> None:
    # GPUs 0-3 of the DGX-1: {0,2,3} and {1,2,3} both score 610 (the leftover alone scores 0);
    # go-gpuallocator lists {0,2,3},{1} before {0},{1,2,3} and keeps the first.
    assert go_gpuallocator_like(DGX1, available=frozenset(range(4)), size=3) == (0, 2, 3)


def test_a_padded_best_set_is_no_answer() -> None:
    """Where the best partition's best set is the one holding the padding, go-gpuallocator returns
    it with nil devices; the baseline answers None (the simulator then takes the lowest free GPUs)."""
    # GPUs 0-2 joined by six lanes each (1950 as a set), 3-6 on one switch of the other socket (300):
    # {0,1,2,pad},{3,4,5,6} (2250) beats every partition that splits 3-6, and its best set is padded.
    side = [0, 0, 0, 1, 1, 1, 1]
    gpus = tuple(make_gpu(i, switch=f"sw{s}", root=f"r{s}", numa_node=s) for i, s in enumerate(side))
    triangle = tuple(NvLink(a, b, 6) for a, b in ((0, 1), (0, 2), (1, 2)))
    switches = (PcieSwitch("sw0", 0, "r0"), PcieSwitch("sw1", 1, "r1"))
    node = NodeInventory(name="triangle", numa_nodes=2, gpus=gpus, nvlinks=triangle, pcie_switches=switches)
    graph = TopologyGraph.from_inventory(node)
    scores = tuple(tuple(0 if a == b else go_gpuallocator_pair_score(graph, a, b) for b in range(7))
                   for a in range(7))
    assert best_effort(scores, available=range(7), size=4) == (0, 1, 2, None)
    assert go_gpuallocator_like(graph, available=frozenset(range(7)), size=4) is None


def _first_listed_best(scores: tuple[tuple[int, ...], ...], available: list[int],
                       required: frozenset[int], size: int) -> tuple[int | None, ...]:
    """go-gpuallocator's selection spelled out over its listing of every partition."""
    def score(group: tuple[int | None, ...]) -> int:
        members = [d for d in group if d is not None]
        return sum(scores[a][b] for a, b in itertools.combinations(members, 2))

    best: tuple[tuple[int | None, ...], ...] | None = None
    for partition in partitions(available, size):
        if not any(required <= set(g) and None not in g for g in partition):
            continue
        if best is None or sum(map(score, partition)) > sum(map(score, best)):
            best = partition
    holding = [g for g in best or () if required <= set(g)]
    return max(holding, key=score) if holding else ()  # max keeps the first of equals


def test_best_effort_equals_listing_every_partition_on_all_dgx1_free_sets() -> None:
    graph = TopologyGraph.from_inventory(dgx1_v100())
    scores = tuple(tuple(0 if a == b else go_gpuallocator_pair_score(graph, a, b) for b in range(8))
                   for a in range(8))
    for count in range(1, 9):
        for free in itertools.combinations(range(8), count):
            for size in range(2, count + 1):
                for required in (frozenset(), frozenset({free[-1]})):
                    expected = _first_listed_best(scores, list(free), required, size)
                    assert best_effort(scores, available=free, required=required, size=size) == expected
