"""PCIe switches on different root ports of one host bridge (``rootPort``): PHB, not PXB.

Through every layer that carries it: the profile and its inventory (both ways), the topology
graph, the simulated driver's common ancestor, the fake sysfs tree and discovery reading it back,
and the published wire form against the CRD.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfile, NodeProfileSpec
from hardware.nvml import NvmlBackend
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.unit.test_nodeagent_published import assert_fits, crd_schema
from topology.graph import TopologyGraph
from topology.links import LinkClass

GO_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "go_gpuallocator"
DGX1_FIXTURE = GO_FIXTURES / "profiles" / "dgx1-volta.yaml"


def _profile(ports: tuple[str | None, ...]) -> NodeProfile:
    """Switch ``sw<i>`` (GPU i and a NIC on it) under one host bridge, on root port ``ports[i]``."""
    switches = [{"name": f"sw{i}", "numaNode": 0, "root": "pci0000:00", **({"rootPort": p} if p else {})}
                for i, p in enumerate(ports)]
    gpus = [{"index": i, "product": "NVIDIA L40S", "architecture": "ada", "computeCapability": "8.9",
             "memoryMiB": 46068, "numaNode": 0, "pcieSwitch": f"sw{i}"} for i in range(len(ports))]
    nics = [{"name": f"mlx5_{i}", "type": "infiniband", "numaNode": 0, "pcieSwitch": f"sw{i}"}
            for i in range(len(ports))]
    return NodeProfile.parse({"apiVersion": "gpuweave.io/v1alpha1", "kind": "NodeProfile",
                              "metadata": {"name": "ports"},
                              "spec": {"numaNodes": 1, "pcieSwitches": switches, "gpus": gpus, "nics": nics}})


def _classes(inventory: NodeInventory) -> list[str]:
    graph = TopologyGraph.from_inventory(inventory)
    return [graph.pair_link(0, b).label for b in graph.gpu_indices[1:]]


@pytest.mark.parametrize(
    ("ports", "classes", "kept"),
    [
        ((None, None, None), ["PXB", "PXB"], (None, None, None)),  # profiles before rootPort: unchanged
        (("a", "a", "a"), ["PXB", "PXB"], (None, None, None)),  # one port for all: nothing to say
        (("a", "b", "c"), ["PHB", "PHB"], ("a", "b", "c")),
        ((None, "b", None), ["PHB", "PXB"], (None, "b", None)),  # unnamed ones share a port
    ],
)
def test_root_ports_decide_pxb_or_phb_and_survive_the_round_trip(
    ports: tuple[str | None, ...], classes: list[str], kept: tuple[str | None, ...]
) -> None:
    inventory = _profile(ports).to_inventory()
    assert tuple(s.root_port for s in inventory.pcie_switches) == kept
    assert _classes(inventory) == classes
    again = NodeProfileSpec.parse(NodeProfileSpec.from_inventory(inventory).to_wire())
    assert again.to_inventory(node_name="ports") == inventory


def test_the_go_gpuallocator_dgx1_is_phb_between_switches_and_the_builtin_one_stays_pxb() -> None:
    fixture = TopologyGraph.from_inventory(load_profile(DGX1_FIXTURE).to_inventory())
    assert [fixture.pair_link(0, b).link_class for b in (1, 2, 4)] == [
        LinkClass.NVLINK, LinkClass.NVLINK, LinkClass.NVLINK]
    assert [fixture.pcie_link(0, b).link_class for b in (1, 2, 3, 5)] == [
        LinkClass.PIX, LinkClass.PHB, LinkClass.PHB, LinkClass.SYS]
    builtin = TopologyGraph.from_inventory(load_profile("dgx1-v100").to_inventory())
    assert builtin.pcie_link(0, 2).link_class is LinkClass.PXB


@pytest.mark.parametrize("ports", [("a", "b", "c"), (None, "b", None), (None, None, None)])
def test_simulated_discovery_reads_the_root_ports_back(ports: tuple[str | None, ...], tmp_path: Path) -> None:
    profile = _profile(ports)
    backend = SimulatedBackend(profile, tmp_path)
    try:
        assert backend.discover() == profile.to_inventory()
        lib = backend.lib
        handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
        expected = [lib.NVML_TOPOLOGY_MULTIPLE if c == "PXB" else lib.NVML_TOPOLOGY_HOSTBRIDGE
                    for c in _classes(profile.to_inventory())]
        assert [lib.nvmlDeviceGetTopologyCommonAncestor(handles[0], h) for h in handles[1:]] == expected
    finally:
        backend.close()


def test_discovery_without_names_gives_root_ports_their_bus_address(tmp_path: Path) -> None:
    """On a real host nothing names the root ports: discovery gives their bdf, and only where the
    host bridge's switches use more than one."""
    backend = SimulatedBackend(_profile((None, "b", None)), tmp_path)
    try:
        plain = NvmlBackend(lib=backend.lib, sysfs_root=tmp_path, node_name="ports")
        ports = [s.root_port for s in plain.discover().pcie_switches]
        bdf = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0")
        assert all(p is not None and bdf.fullmatch(p) for p in ports)
        assert len(set(ports)) == 2
        assert _classes(plain.discover()) == ["PHB", "PXB"]
    finally:
        backend.close()


def test_the_published_spec_carries_root_ports_within_the_crd() -> None:
    wire: dict[str, Any] = NodeProfileSpec.from_inventory(load_profile(DGX1_FIXTURE).to_inventory()).to_wire()
    assert [s.get("rootPort") for s in wire["pcieSwitches"]] == ["rp0", "rp1", "rp0", "rp1"]
    spec_schema = crd_schema()["properties"]["spec"]
    assert_fits(wire, spec_schema, "spec")
