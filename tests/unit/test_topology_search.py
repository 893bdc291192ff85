"""Best-set search: the placements the issue names, policies, look-ahead and explanations."""

from __future__ import annotations

import itertools

import pytest

from devicemodel.errors import InvalidInputError, TopologyError
from devicemodel.inventory import NodeInventory, NvLink
from tests.unit.topology_nodes import dgx1_v100, make_gpu, nvbridge_pairs, nvswitch_node, p4d, pcie_only
from topology.graph import TopologyGraph
from topology.search import (
    LOOKAHEAD_TOLERANCE,
    PlacementPolicy,
    Selection,
    best_set,
    explain_unsatisfiable,
)

ALL8 = frozenset(range(8))
BEST_EFFORT = PlacementPolicy.BEST_EFFORT
NVLINK = PlacementPolicy.NVLINK_REQUIRED
NIC = PlacementPolicy.NIC_ALIGNED
NUMA = PlacementPolicy.SINGLE_NUMA


def pick(inventory: NodeInventory, *, available: frozenset[int] = ALL8, size: int,
         must: frozenset[int] = frozenset(), policy: PlacementPolicy = BEST_EFFORT,
         lookahead: bool = True) -> Selection | None:
    graph = TopologyGraph.from_inventory(inventory)
    return best_set(graph, available=available, size=size, must_include=must, policy=policy,
                    lookahead=lookahead)


@pytest.mark.parametrize(
    "case",
    [
        # DGX-1 V100: the fully linked quads; with GPU 0 its double-linked partner on its socket.
        (dgx1_v100(), ALL8, 4, frozenset(), BEST_EFFORT, (0, 1, 2, 3)),
        (dgx1_v100(), ALL8 - {0}, 4, frozenset(), BEST_EFFORT, (4, 5, 6, 7)),
        (dgx1_v100(), ALL8, 2, frozenset({0}), BEST_EFFORT, (0, 3)),
        (dgx1_v100(), ALL8, 2, frozenset({5}), BEST_EFFORT, (5, 6)),
        (dgx1_v100(), ALL8, 4, frozenset({4}), NVLINK, (4, 5, 6, 7)),
        # NVSwitch: every pair NV18, NUMA and NIC alignment break the ties.
        (nvswitch_node(), ALL8, 4, frozenset(), BEST_EFFORT, (0, 1, 2, 3)),
        (nvswitch_node(), ALL8 - {0, 1}, 4, frozenset(), BEST_EFFORT, (4, 5, 6, 7)),
        (nvswitch_node(nic_switches=(1, 3, 5, 7)), ALL8, 2, frozenset(), BEST_EFFORT, (1, 3)),
        # p4d: a NIC-aligned pair lands on one PCIe switch.
        (p4d(), ALL8, 2, frozenset(), NIC, (0, 1)),
        (p4d(), ALL8 - {0}, 2, frozenset(), NIC, (2, 3)),
        (p4d(), ALL8, 2, frozenset({5}), NIC, (4, 5)),
        # PCIe only: the pair under one switch beats pairs through the host bridge.
        (pcie_only(), frozenset({0, 2, 3, 5}), 2, frozenset(), BEST_EFFORT, (2, 3)),
        (nvbridge_pairs(), frozenset({0, 1, 2, 3}), 2, frozenset({2}), BEST_EFFORT, (2, 3)),
        (nvbridge_pairs(), frozenset({1, 2, 3}), 2, frozenset({1}), BEST_EFFORT, (1, 2)),
        (nvbridge_pairs(), frozenset({0, 1, 2, 3}), 2, frozenset(), NUMA, (0, 1)),
    ],
)
def test_best_set_table(case: tuple[NodeInventory, frozenset[int], int, frozenset[int], PlacementPolicy,
                                    tuple[int, ...]]) -> None:
    inventory, available, size, must, policy, expected = case
    chosen = pick(inventory, available=available, size=size, must=must, policy=policy)
    assert chosen is not None
    assert chosen.gpus == expected
    assert chosen.score.gpus == expected


def test_nvswitch_pairs_count_as_nvlink() -> None:
    chosen = pick(nvswitch_node(), size=8, policy=NVLINK)
    assert chosen is not None and chosen.score.all_nvlink
    assert chosen.score.bottleneck_gbps == pytest.approx(450.0)


@pytest.mark.parametrize(
    ("inventory", "available", "size", "must", "policy"),
    [
        (nvbridge_pairs(), frozenset({0, 1, 2, 3}), 3, frozenset(), NVLINK),
        (dgx1_v100(), frozenset({0, 3, 4, 7}), 3, frozenset(), NVLINK),
        (dgx1_v100(), frozenset({0, 1, 4, 5, 6}), 4, frozenset(), NUMA),
        (dgx1_v100(), ALL8, 2, frozenset({0, 4}), NUMA),
        (nvbridge_pairs(), frozenset({0, 1}), 1, frozenset(), NIC),
        (pcie_only(), ALL8, 3, frozenset({2}), NIC),
        (dgx1_v100(), frozenset({0, 1}), 3, frozenset(), BEST_EFFORT),
        (dgx1_v100(), frozenset({0, 1}), 1, frozenset({2}), BEST_EFFORT),
        (dgx1_v100(), ALL8, 1, frozenset({1, 2}), BEST_EFFORT),
    ],
)
def test_unsatisfiable_requests_return_none(inventory: NodeInventory, available: frozenset[int], size: int,
                                            must: frozenset[int], policy: PlacementPolicy) -> None:
    assert pick(inventory, available=available, size=size, must=must, policy=policy) is None


@pytest.mark.parametrize(
    "case",
    [
        (nvbridge_pairs(), frozenset({0, 1, 2, 3}), 3, frozenset(), NVLINK,
         "needs 3 NVLink-connected GPUs; largest free NVLink group is 2 (GPUs 0,1)"),
        (dgx1_v100(), ALL8, 2, frozenset({0, 5}), NVLINK,
         "needs 2 NVLink-connected GPUs including GPUs 0,5; no such group"),
        (dgx1_v100(), frozenset({0, 1, 4, 5, 6}), 4, frozenset(), NUMA,
         "the most free in one NUMA node is 3 (NUMA 1: GPUs 4,5,6)"),
        (dgx1_v100(), ALL8, 2, frozenset({0, 4}), NUMA, "must-include GPUs 0,4 span NUMA nodes 0,1"),
        (nvbridge_pairs(), frozenset({0, 1}), 1, frozenset(), NIC,
         "needs 1 GPUs with a NIC on their own PCIe switch; 0 free GPUs have one (none)"),
        (pcie_only(), ALL8, 2, frozenset({2}), NIC, "must-include GPUs 2 have no NIC on their PCIe switch"),
        (dgx1_v100(), frozenset({0, 1}), 3, frozenset(), BEST_EFFORT, "needs 3 GPUs; only 2 are free (0,1)"),
        (dgx1_v100(), frozenset({0, 1}), 1, frozenset({2}), BEST_EFFORT, "must-include GPUs 2 are not free"),
        (dgx1_v100(), ALL8, 1, frozenset({1, 2}), BEST_EFFORT, "2 must-include GPUs do not fit"),
        (dgx1_v100(), ALL8, 2, frozenset(), BEST_EFFORT,
         "satisfiable under best-effort; best set is GPUs 2,3"),
    ],
)
def test_explain_unsatisfiable(case: tuple[NodeInventory, frozenset[int], int, frozenset[int],
                                           PlacementPolicy, str]) -> None:
    inventory, available, size, must, policy, reason = case
    graph = TopologyGraph.from_inventory(inventory)
    text = explain_unsatisfiable(graph, available=available, size=size, must_include=must, policy=policy)
    assert text.startswith(f"node {inventory.name}: ")
    assert reason in text


def test_lookahead_keeps_a_quad_free() -> None:
    # Pairs (2,3) and (6,7) are equally good (double NVLink, one PCIe switch). Taking (2,3) would
    # break the only fully linked quad left; the look-ahead takes (6,7) instead.
    free = frozenset({0, 1, 2, 3, 6, 7})
    greedy = pick(dgx1_v100(), available=free, size=2, lookahead=False)
    planned = pick(dgx1_v100(), available=free, size=2)
    assert greedy is not None and planned is not None
    assert greedy.gpus == (2, 3)
    assert planned.gpus == (6, 7)
    assert planned.score.value == pytest.approx(greedy.score.value)
    assert planned.lookahead > 0.0


def test_lookahead_trades_a_switch_step_of_value_for_a_whole_quad() -> None:
    # (2,3) shares a PCIe switch, (5,6) spans two: 2% apart, within the tolerance. Taking (2,3)
    # would leave no fully linked quad; taking (5,6) keeps {0,1,2,3}.
    free = frozenset({0, 1, 2, 3, 5, 6})
    greedy = pick(dgx1_v100(), available=free, size=2, lookahead=False)
    planned = pick(dgx1_v100(), available=free, size=2)
    assert greedy is not None and planned is not None
    assert (greedy.gpus, planned.gpus) == ((2, 3), (5, 6))
    assert planned.score.value >= greedy.score.value * (1 - LOOKAHEAD_TOLERANCE)
    assert planned.lookahead > greedy.lookahead


def test_lookahead_keeps_a_numa_node_whole_on_nvswitch() -> None:
    # GPUs 0 and 4 are busy; a single GPU should come from a half that is already broken, but the
    # halves tie, so the pick must leave a free 2-set on one NUMA node either way.
    chosen = pick(nvswitch_node(), available=frozenset({1, 2, 3, 5, 6, 7}), size=2)
    assert chosen is not None
    assert chosen.score.numa_nodes == 1


def test_size_below_one_is_an_error_and_unknown_gpus_are_named() -> None:
    graph = TopologyGraph.from_inventory(nvbridge_pairs())
    with pytest.raises(TopologyError, match="ask for 1 or more"):
        best_set(graph, available=frozenset({0}), size=0)
    with pytest.raises(TopologyError, match=r"no GPUs \[7\]"):
        best_set(graph, available=frozenset({0, 7}), size=1)


def test_identical_nodes_share_memoized_results() -> None:
    first = TopologyGraph.from_inventory(dgx1_v100(uuid_seed="a"))
    second = TopologyGraph.from_inventory(dgx1_v100(uuid_seed="b"))
    free = frozenset({1, 2, 4, 5, 7})
    one = best_set(first, available=free, size=3)
    two = best_set(second, available=free, size=3)
    assert one == two
    assert first.shape_key is not second.shape_key


@pytest.mark.parametrize(("text", "policy"), [("best-effort", BEST_EFFORT), (" NVLink-Required ", NVLINK),
                                              ("nic-aligned", NIC), ("single-numa", NUMA)])
def test_policy_parse(text: str, policy: PlacementPolicy) -> None:
    assert PlacementPolicy.parse(text) is policy


def test_policy_parse_rejects_unknown_words() -> None:
    with pytest.raises(InvalidInputError, match="policy 'fastest'; use one of: best-effort, nvlink-required"):
        PlacementPolicy.parse("fastest")


def twenty_gpu_node() -> NodeInventory:
    """Two NVLink cliques of ten GPUs (0-9 double lanes, 10-19 single), one NUMA node each."""
    gpus = tuple(make_gpu(i, numa_node=i // 10, switch=f"sw{i // 2}", root=f"r{i // 10}") for i in range(20))
    links = tuple(NvLink(a, b, 2 if a < 10 else 1) for group in (range(10), range(10, 20))
                  for a, b in itertools.combinations(group, 2))
    return NodeInventory(name="twenty", numa_nodes=2, gpus=gpus, nvlinks=links)


@pytest.mark.parametrize(
    ("must", "policy", "expected"),
    [
        (frozenset(), BEST_EFFORT, tuple(range(10))),
        (frozenset({12}), NVLINK, tuple(range(10, 20))),
        (frozenset({3, 12}), NVLINK, None),
    ],
)
def test_nodes_beyond_sixteen_gpus_fall_back_to_greedy_growth(
        must: frozenset[int], policy: PlacementPolicy, expected: tuple[int, ...] | None) -> None:
    graph = TopologyGraph.from_inventory(twenty_gpu_node())
    chosen = best_set(graph, available=frozenset(range(20)), size=10, must_include=must, policy=policy)
    assert (chosen.gpus if chosen else None) == expected
    if chosen is not None:
        assert chosen.lookahead == 0.0
