"""Properties of best_set on random topologies, checked against brute force over all sets."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicemodel.inventory import Architecture, NodeInventory, NvLink, NvSwitchFabric
from tests.unit.topology_nodes import make_gpu, make_nic
from topology.graph import TopologyGraph
from topology.scoring import score_set
from topology.search import LOOKAHEAD_TOLERANCE, PlacementPolicy, best_set, remaining_quality

SWITCHES = 4  # switches 0,1 on NUMA node 0 under one host bridge; 2,3 on NUMA node 1


@st.composite
def inventories(draw: st.DrawFn) -> NodeInventory:
    count = draw(st.integers(min_value=2, max_value=8))
    architecture = draw(st.sampled_from([Architecture.VOLTA, Architecture.AMPERE, Architecture.HOPPER]))
    switch_of = draw(st.lists(st.integers(0, SWITCHES - 1), min_size=count, max_size=count))
    gpus = tuple(make_gpu(i, architecture=architecture, numa_node=s // 2, switch=f"sw{s}",
                          root=f"root{s // 2}") for i, s in enumerate(switch_of))
    pairs = list(itertools.combinations(range(count), 2))
    linked = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs)))
    lanes = draw(st.lists(st.integers(1, 4), min_size=len(linked), max_size=len(linked)))
    fabric_members = draw(st.sets(st.integers(0, count - 1)))
    fabric = NvSwitchFabric(tuple(sorted(fabric_members)), 12) if len(fabric_members) > 1 else None
    nic_switches = draw(st.sets(st.integers(0, SWITCHES - 1)))
    nics = tuple(make_nic(f"nic{s}", numa_node=s // 2, switch=f"sw{s}", root=f"root{s // 2}")
                 for s in sorted(nic_switches))
    return NodeInventory(name="random", numa_nodes=2, gpus=gpus, nics=nics, nvswitch=fabric,
                         nvlinks=tuple(NvLink(a, b, n) for (a, b), n in zip(linked, lanes, strict=True)))


@st.composite
def requests(draw: st.DrawFn) -> tuple[NodeInventory, frozenset[int], int, frozenset[int], PlacementPolicy]:
    inventory = draw(inventories())
    indices = [g.index for g in inventory.gpus]
    available = frozenset(draw(st.sets(st.sampled_from(indices), min_size=1)))
    size = draw(st.integers(1, len(available)))
    must = frozenset(draw(st.sets(st.sampled_from(sorted(available)), max_size=size)))
    policy = draw(st.sampled_from(list(PlacementPolicy)))
    return inventory, available, size, must, policy


def satisfies(graph: TopologyGraph, gpus: tuple[int, ...], policy: PlacementPolicy) -> bool:
    score = score_set(graph, gpus)
    return {
        PlacementPolicy.BEST_EFFORT: True,
        PlacementPolicy.NVLINK_REQUIRED: score.all_nvlink,
        PlacementPolicy.NIC_ALIGNED: score.nic_aligned == 1.0,
        PlacementPolicy.SINGLE_NUMA: score.numa_nodes == 1,
    }[policy]


def brute_force_values(graph: TopologyGraph, available: frozenset[int], size: int,
                       must: frozenset[int], policy: PlacementPolicy) -> list[float]:
    return [score_set(graph, combo).value for combo in itertools.combinations(sorted(available), size)
            if must <= set(combo) and satisfies(graph, combo, policy)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_best_set_is_valid_and_near_optimal(
    request: tuple[NodeInventory, frozenset[int], int, frozenset[int], PlacementPolicy],
) -> None:
    inventory, available, size, must, policy = request
    graph = TopologyGraph.from_inventory(inventory)
    values = brute_force_values(graph, available, size, must, policy)
    planned = best_set(graph, available=available, size=size, must_include=must, policy=policy)
    greedy = best_set(graph, available=available, size=size, must_include=must, policy=policy,
                      lookahead=False)
    if not values:
        assert planned is None and greedy is None
        return
    assert planned is not None and greedy is not None
    best = max(values)
    for chosen in (planned, greedy):
        assert len(chosen.gpus) == size
        assert must <= set(chosen.gpus) <= available
        assert satisfies(graph, chosen.gpus, policy)
        assert chosen.score == score_set(graph, chosen.gpus)
        assert chosen.candidates == len(values)
    assert greedy.score.value == best
    assert planned.score.value >= best - LOOKAHEAD_TOLERANCE * abs(best)
    left_planned = remaining_quality(graph, available - set(planned.gpus))
    left_greedy = remaining_quality(graph, available - set(greedy.gpus))
    assert left_planned >= left_greedy - 1e-9
