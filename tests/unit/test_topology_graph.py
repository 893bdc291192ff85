"""The topology graph: pair classes as nvidia-smi prints them, bandwidths, NICs, shape keys."""

from __future__ import annotations

import pytest

from devicemodel.errors import TopologyError
from devicemodel.inventory import Architecture, NodeInventory, NvLink, NvSwitchFabric
from tests.unit.topology_nodes import (
    DGX1_V100_NVLINKS,
    dgx1_v100,
    make_gpu,
    nvbridge_pairs,
    nvswitch_node,
    p4d,
    pcie_only,
)
from topology.graph import LinkClass, PairLink, TopologyGraph


def graph_of(inventory: NodeInventory) -> TopologyGraph:
    return TopologyGraph.from_inventory(inventory)


DGX1_EXPECTED = [
    "X NV1 NV1 NV2 NV2 SYS SYS SYS",
    "NV1 X NV2 NV1 SYS NV2 SYS SYS",
    "NV1 NV2 X NV2 SYS SYS NV1 SYS",
    "NV2 NV1 NV2 X SYS SYS SYS NV1",
    "NV2 SYS SYS SYS X NV1 NV1 NV2",
    "SYS NV2 SYS SYS NV1 X NV2 NV1",
    "SYS SYS NV1 SYS NV1 NV2 X NV2",
    "SYS SYS SYS NV1 NV2 NV1 NV2 X",
]


def test_dgx1_cube_mesh_labels_match_nvidia_smi() -> None:
    graph = graph_of(dgx1_v100())
    labels = [" ".join(graph.pair_link(a, b).label for b in range(8)) for a in range(8)]
    assert labels == DGX1_EXPECTED


def test_dgx1_every_gpu_has_six_nvlink_lanes() -> None:
    lanes = dict.fromkeys(range(8), 0)
    for a, b, n in DGX1_V100_NVLINKS:
        lanes[a] += n
        lanes[b] += n
    assert set(lanes.values()) == {6}


@pytest.mark.parametrize(
    ("inventory", "a", "b", "label", "nvswitch"),
    [
        (nvswitch_node(), 0, 7, "NV18", True),
        (p4d(), 1, 6, "NV12", True),
        (nvbridge_pairs(), 0, 1, "NV12", False),
        (nvbridge_pairs(), 1, 2, "SYS", False),
        (pcie_only(), 0, 1, "PIX", False),
        (pcie_only(), 0, 2, "PXB", False),
        (pcie_only(), 0, 5, "SYS", False),
        (nvswitch_node(), 3, 3, "X", False),
    ],
)
def test_pair_labels(inventory: NodeInventory, a: int, b: int, label: str, nvswitch: bool) -> None:
    link = graph_of(inventory).pair_link(a, b)
    assert link.label == label
    assert link.via_nvswitch is nvswitch


def test_pcie_classes_for_root_ports_and_host_bridges() -> None:
    gpus = (
        make_gpu(0, switch="sw0", root="r0"),
        make_gpu(1, switch=None, root="r0"),  # on a root port of the same host bridge
        make_gpu(2, switch="sw2", root="r1"),  # another host bridge, same NUMA node
        make_gpu(3, switch="sw3", root="r0"),  # another switch under the same host bridge
    )
    graph = graph_of(NodeInventory(name="mixed", numa_nodes=1, gpus=gpus))
    assert [graph.pair_link(0, b).link_class for b in (1, 2, 3)] == [
        LinkClass.PHB, LinkClass.NODE, LinkClass.PXB]


def test_nvswitch_wider_than_direct_links_wins_and_direct_wider_wins_back() -> None:
    gpus = tuple(make_gpu(i) for i in range(3))
    inventory = NodeInventory(name="both", numa_nodes=1, gpus=gpus,
                              nvlinks=(NvLink(0, 1, 2), NvLink(1, 2, 20)),
                              nvswitch=NvSwitchFabric(gpus=(0, 1, 2), links_per_gpu=18))
    graph = graph_of(inventory)
    assert graph.pair_link(0, 1) == PairLink(LinkClass.NVSWITCH, 18)
    assert graph.pair_link(1, 2) == PairLink(LinkClass.NVLINK, 20)


@pytest.mark.parametrize(
    ("inventory", "a", "b", "gbps"),
    [
        (dgx1_v100(), 0, 3, 50.0),  # NV2 on V100: 2 x 25
        (dgx1_v100(), 0, 1, 25.0),
        (dgx1_v100(), 0, 5, 16.0 * 0.35),  # SYS on a Gen3 machine
        (nvswitch_node(), 0, 5, 450.0),  # H100 NVSwitch: 18 x 25
        (nvswitch_node(architecture=Architecture.BLACKWELL), 0, 5, 900.0),
        (p4d(), 0, 7, 300.0),  # A100: 12 x 25
        (pcie_only(), 0, 1, 31.0),  # Gen4 x16 under one switch
        (pcie_only(architecture=Architecture.HOPPER), 0, 1, 63.0),
    ],
)
def test_pair_bandwidth_model(inventory: NodeInventory, a: int, b: int, gbps: float) -> None:
    graph = graph_of(inventory)
    assert graph.pair_bandwidth(a, b) == pytest.approx(gbps)
    assert graph.pair_bandwidth(b, a) == pytest.approx(gbps)


def test_nics_near_prefers_switch_then_numa() -> None:
    node = pcie_only()  # NICs on sw0 (GPUs 0,1) and sw2 (GPUs 4,5)
    graph = graph_of(node)
    assert graph.nics_near(0) == ("nic0",)
    assert graph.nics_near(3) == ("nic0",)  # no NIC on sw1; same NUMA node
    assert graph.nics_near(6) == ("nic2",)
    assert graph_of(nvbridge_pairs()).nics_near(0) == ()


def test_nvlink_components_and_cliques() -> None:
    bridges = graph_of(nvbridge_pairs())
    assert bridges.nvlink_components() == [frozenset({0, 1}), frozenset({2, 3})]
    assert bridges.nvlink_components([1, 2, 3]) == [frozenset({2, 3}), frozenset({1})]
    dgx1 = graph_of(dgx1_v100())
    assert dgx1.nvlink_components() == [frozenset(range(8))]
    assert dgx1.largest_nvlink_clique() == frozenset({0, 1, 2, 3})
    assert dgx1.largest_nvlink_clique([0, 3, 4, 7]) == frozenset({0, 3})
    assert graph_of(pcie_only()).largest_nvlink_clique([]) == frozenset()


def test_matrix_cells_and_text() -> None:
    matrix = graph_of(dgx1_v100()).matrix()
    assert matrix.columns[:8] == tuple(f"GPU{i}" for i in range(8))
    assert matrix.cell("GPU0", "GPU3") == "NV2"
    assert matrix.cell("GPU0", "NIC0") == "PIX"
    assert matrix.cell("GPU0", "NIC2") == "SYS"
    assert matrix.cell("NIC1", "GPU2") == "PIX"
    assert matrix.rows[5].numa_affinity == "1"
    text = matrix.to_text()
    assert text.splitlines()[0].split() == [*matrix.columns, "NUMA", "Affinity"]
    assert "NIC0: nic0" in text
    assert matrix.to_dict()["nicLegend"] == {"NIC0": "nic0", "NIC1": "nic1", "NIC2": "nic2", "NIC3": "nic3"}


def test_shape_key_ignores_names_and_uuids_but_not_links() -> None:
    first = graph_of(dgx1_v100(uuid_seed="1")).shape_key
    second = graph_of(dgx1_v100(uuid_seed="2")).shape_key
    assert first == second
    assert hash(first) == hash(second)
    assert first != graph_of(p4d()).shape_key
    a100_one_gpu_per_switch = nvswitch_node(links=12, architecture=Architecture.AMPERE)
    assert graph_of(p4d()).shape_key != graph_of(a100_one_gpu_per_switch).shape_key


@pytest.mark.parametrize(
    "inventory",
    [
        NodeInventory(name="bad", numa_nodes=1, gpus=(make_gpu(0),), nvlinks=(NvLink(0, 5, 1),)),
        NodeInventory(name="dup", numa_nodes=1, gpus=(make_gpu(0), make_gpu(0))),
    ],
)
def test_bad_inventory_is_a_topology_error(inventory: NodeInventory) -> None:
    with pytest.raises(TopologyError, match=inventory.name):
        graph_of(inventory)


def test_unknown_gpu_query_names_node_and_gpus() -> None:
    graph = graph_of(nvbridge_pairs())
    with pytest.raises(TopologyError, match=r"no GPU 9; GPUs are \[0, 1, 2, 3\]"):
        graph.pair_link(0, 9)
    with pytest.raises(TopologyError, match="no NIC"):
        graph.gpu_nic_link(0, "efa9")
