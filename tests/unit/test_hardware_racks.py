"""Rack profiles: a multi-node NVLink domain built from one node profile, and the fleets made of them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from devicemodel.spec import ProfileError
from gpuweave.simulate.fleet import build_fleet
from hardware.profiles import builtin_rack_names, is_rack, load_profile, load_rack
from topology.network import LABEL_GPU_CLIQUE


def test_builtin_racks_give_their_trays_the_rack_domain() -> None:
    assert {"gb200-nvl72", "gb200-nvl72-degraded"} <= set(builtin_rack_names())
    rack, node = load_rack("gb200-nvl72")
    trays = rack.nodes(node)
    assert len(trays) == 18
    fabrics = {(t.spec.nvswitch.cluster_uuid, t.spec.nvswitch.clique_id) for t in trays if t.spec.nvswitch}
    assert fabrics == {(rack.cluster_uuid(), 32766)}
    degraded, node = load_rack("gb200-nvl72-degraded")
    cliques = Counter(t.to_inventory().nvswitch.clique for t in degraded.nodes(node))  # type: ignore[union-attr]
    assert sorted(cliques.values()) == [9, 9] and len(cliques) == 2


def test_each_rack_instance_is_its_own_domain() -> None:
    rack, node = load_rack("gb200-nvl72")
    first, second = rack.nodes(node, instance=0), rack.nodes(node, instance=1)
    assert first[0].spec.nvswitch.cluster_uuid != second[0].spec.nvswitch.cluster_uuid  # type: ignore[union-attr]


def test_a_rack_name_is_not_a_node_profile_and_says_which_is() -> None:
    with pytest.raises(ProfileError, match="gb200-nvl72 is a rack of gb200-compute-tray nodes"):
        load_profile("gb200-nvl72")
    assert is_rack("gb200-nvl72") and not is_rack("gb200-compute-tray")


def test_a_users_rack_file(tmp_path: Path) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(
        "apiVersion: gpuweave.io/v1alpha1\nkind: RackProfile\nmetadata: {name: half}\n"
        "spec:\n  node: gb200-compute-tray\n  nodes: 4\n"
        "  clusterUuid: 0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9\n"
    )
    assert is_rack(path)
    rack, node = load_rack(path)
    assert [t.to_inventory().nvswitch.clique for t in rack.nodes(node)] == [  # type: ignore[union-attr]
        "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9.32766"
    ] * 4


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("  node: gb200-compute-tray\n", "give nodes"),
        ("  node: gb200-compute-tray\n  nodes: 3\n  cliques: [{id: 1, nodes: 2}]\n", "hold 2 nodes"),
        ("  node: gb200-compute-tray\n  cliques: [{id: 1, nodes: 2}, {id: 1, nodes: 2}]\n", "repeat"),
        ("  node: gb200-compute-tray\n  nodes: 2\n  clusterUuid: nope\n", "clusterUuid"),
    ],
)
def test_bad_rack_files_say_what_is_wrong(tmp_path: Path, spec: str, problem: str) -> None:
    path = tmp_path / "rack.yaml"
    header = "apiVersion: gpuweave.io/v1alpha1\nkind: RackProfile\nmetadata: {name: r}\nspec:\n"
    path.write_text(header + spec)
    with pytest.raises(ProfileError, match=problem):
        load_rack(path)


def test_a_rack_needs_a_node_with_nvswitches(tmp_path: Path) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(
        "apiVersion: gpuweave.io/v1alpha1\nkind: RackProfile\nmetadata: {name: r}\n"
        "spec:\n  node: l40s-pcie-8\n  nodes: 2\n"
    )
    rack, node = load_rack(path)
    with pytest.raises(ProfileError, match="has no nvswitch"):
        rack.nodes(node)


def test_a_fleet_of_racks_labels_each_node_with_its_clique() -> None:
    fleet = build_fleet(("gb200-nvl72-degraded", "gb200-nvl72", "p5.48xlarge"), nodes=40)
    assert [n.name for n in fleet[:2]] == ["gb200-nvl72-degraded-r0-00", "gb200-nvl72-degraded-r0-01"]
    assert fleet[18].name == "gb200-nvl72-r0-00" and fleet[36].name == "p5.48xlarge-00"
    assert fleet[37].name == "gb200-nvl72-degraded-r1-00"  # the last rack cut short at 40 nodes
    cliques = Counter(n.labels.get(LABEL_GPU_CLIQUE) for n in fleet)
    assert cliques[None] == 1  # the p5 node has no multi-node NVLink
    assert sorted(v for k, v in cliques.items() if k) == [3, 9, 9, 18]
    assert all(n.node_profile is not None and n.rack for n in fleet if n.labels.get(LABEL_GPU_CLIQUE))
