"""The issue's placement checks on the built-in node profiles, end to end from YAML to best set."""

from __future__ import annotations

import pytest

from hardware.profiles import builtin_profile_names, load_profile
from topology.graph import TopologyGraph
from topology.search import PlacementPolicy, best_set


def graph(name: str) -> TopologyGraph:
    return TopologyGraph.from_inventory(load_profile(name).to_inventory())


def test_dgx1_v100_quads_and_double_linked_partner() -> None:
    dgx1 = graph("dgx1-v100")
    everything = frozenset(dgx1.gpu_indices)
    labels = {dgx1.pair_link(a, b).label for a in range(8) for b in range(8) if a != b}
    assert {"NV1", "NV2", "SYS"} == labels
    quad = best_set(dgx1, available=everything, size=4)
    assert quad is not None and quad.gpus in {(0, 1, 2, 3), (4, 5, 6, 7)} and quad.score.all_nvlink
    partner = best_set(dgx1, available=everything, size=2, must_include=frozenset({0}))
    assert partner is not None
    (other,) = set(partner.gpus) - {0}
    assert dgx1.pair_link(0, other).label == "NV2"
    assert dgx1.gpu(other).numa_node == dgx1.gpu(0).numa_node


def test_dgx1_v100_lookahead_keeps_the_free_quad() -> None:
    dgx1 = graph("dgx1-v100")
    chosen = best_set(dgx1, available=frozenset({0, 1, 2, 3, 5, 6}), size=2)
    assert chosen is not None and chosen.gpus == (5, 6)


def test_p4d_nic_aligned_pair_lands_on_one_pcie_switch() -> None:
    p4d = graph("p4d.24xlarge")
    chosen = best_set(p4d, available=frozenset(p4d.gpu_indices), size=2, policy=PlacementPolicy.NIC_ALIGNED)
    assert chosen is not None
    first, second = (p4d.gpu(i) for i in chosen.gpus)
    assert first.pcie_switch == second.pcie_switch
    assert chosen.score.pcie_switches == 1


@pytest.mark.parametrize("name", builtin_profile_names())
def test_every_builtin_profile_builds_a_graph_and_places_every_size(name: str) -> None:
    node = graph(name)
    everything = frozenset(node.gpu_indices)
    for size in range(1, len(everything) + 1):
        chosen = best_set(node, available=everything, size=size)
        assert chosen is not None and len(chosen.gpus) == size
    assert len(node.matrix().rows) == len(node.gpu_indices) + len(node.nic_names)
