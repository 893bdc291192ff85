"""Set scores: the documented formula on sets whose numbers are known by hand."""

from __future__ import annotations

import pytest

from devicemodel.errors import TopologyError
from tests.unit.topology_nodes import dgx1_v100, nvbridge_pairs, nvswitch_node, p4d
from topology.graph import TopologyGraph
from topology.scoring import NIC_BONUS, NUMA_FACTOR, SWITCH_FACTOR, SetScore, score_set

DGX1 = TopologyGraph.from_inventory(dgx1_v100())


def test_dgx1_quad_numbers() -> None:
    score = score_set(DGX1, (3, 1, 0, 2))
    assert score.gpus == (0, 1, 2, 3)
    assert score.bottleneck_gbps == pytest.approx(25.0)
    assert score.sum_pair_gbps == pytest.approx(225.0)  # three NV1 and three NV2 pairs
    assert score.mean_pair_gbps == pytest.approx(37.5)
    assert score.all_nvlink
    assert (score.numa_nodes, score.pcie_switches, score.nic_aligned) == (1, 2, 1.0)
    expected = (25.0 + 37.5) / 2 * (1 + NIC_BONUS) * SWITCH_FACTOR
    assert score.value == pytest.approx(expected)


def test_cross_quad_set_is_not_all_nvlink_and_spans_numa() -> None:
    score = score_set(DGX1, frozenset({0, 3, 4, 7}))
    assert not score.all_nvlink
    assert score.numa_nodes == 2
    assert score.bottleneck_gbps == pytest.approx(16.0 * 0.35)
    assert score.value < score_set(DGX1, (0, 1, 2, 3)).value


def test_pair_ranking_from_gpu0() -> None:
    values = {partner: score_set(DGX1, (0, partner)).value for partner in range(1, 8)}
    ranking = sorted(values, key=lambda p: -values[p])
    assert ranking[:3] == [3, 4, 1]  # NV2 on socket, NV2 across sockets, NV1 on its switch
    assert values[4] == pytest.approx(values[3] * NUMA_FACTOR)


def test_single_gpu_scores_its_host_link_and_nic() -> None:
    h100 = TopologyGraph.from_inventory(nvswitch_node(nic_switches=(0,)))
    with_nic = score_set(h100, (0,))
    without = score_set(h100, (1,))
    assert with_nic.value == pytest.approx(63.0 * (1 + NIC_BONUS))
    assert without.value == pytest.approx(63.0)
    assert with_nic.all_nvlink and with_nic.bottleneck_gbps == 0.0


def test_numa_and_nic_break_nvswitch_ties() -> None:
    graph = TopologyGraph.from_inventory(p4d())
    same_switch = score_set(graph, (0, 1))
    same_numa = score_set(graph, (0, 2))
    cross_numa = score_set(graph, (0, 4))
    assert same_switch.bottleneck_gbps == same_numa.bottleneck_gbps == cross_numa.bottleneck_gbps == 300.0
    assert same_switch.value > same_numa.value > cross_numa.value


def test_nic_fraction_counts_gpus_with_a_nic_on_their_switch() -> None:
    graph = TopologyGraph.from_inventory(nvswitch_node(nic_switches=(0, 1)))
    assert score_set(graph, (0, 1, 2, 3)).nic_aligned == pytest.approx(0.5)
    assert score_set(TopologyGraph.from_inventory(nvbridge_pairs()), (0, 1)).nic_aligned == 0.0


@pytest.mark.parametrize("gpus", [(), (1, 1), (0, 12)])
def test_bad_sets_are_topology_errors(gpus: tuple[int, ...]) -> None:
    with pytest.raises(TopologyError, match="dgx1-v100"):
        score_set(DGX1, gpus)


def test_score_is_a_frozen_value() -> None:
    score = score_set(DGX1, (0, 3))
    assert isinstance(score, SetScore)
    with pytest.raises(AttributeError):
        score.value = 0.0  # type: ignore[misc]
