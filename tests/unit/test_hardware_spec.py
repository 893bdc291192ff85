"""NodeProfile spec: derivation, lossless round trip through the wire form, one-line errors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from devicemodel.inventory import NicType
from devicemodel.spec import NodeProfile, NodeProfileSpec, ProfileError


def _doc() -> dict[str, Any]:
    gpus = [
        {
            "index": i, "product": "NVIDIA A100-SXM4-80GB", "architecture": "ampere",
            "computeCapability": "8.0", "memoryMiB": 81920, "numaNode": i // 2,
            "pcieSwitch": f"sw{i // 2}", "migCapable": True,
        }
        for i in range(4)
    ]
    gpus[1]["migEnabled"] = True
    return {
        "apiVersion": "gpuweave.io/v1alpha1",
        "kind": "NodeProfile",
        "metadata": {"name": "small"},
        "spec": {
            "numaNodes": 2,
            "pcieSwitches": [{"name": "sw0", "numaNode": 0}, {"name": "sw1", "numaNode": 1}],
            "gpus": gpus,
            "nvlinks": [{"gpus": [1, 0], "links": 4}, {"gpus": [2, 3], "links": 4}],
            "nics": [
                {"name": "mlx5_1", "type": "infiniband", "numaNode": 1, "pcieSwitch": "sw1"},
                {"name": "mlx5_0", "type": "infiniband", "numaNode": 0, "pcieSwitch": "sw0"},
                {"name": "eth0", "type": "ethernet", "numaNode": 0, "netdev": "eth0"},
            ],
            "migDevices": [
                {
                    "gpu": 1, "profile": "3g.40gb", "gpuInstanceId": 2, "computeInstanceId": 0,
                    "placementStart": 0, "placementSize": 4, "memoryMiB": 40192, "computeSlices": 3,
                }
            ],
        },
    }


def test_derived_fields_are_stable_per_node_and_distinct_between_nodes() -> None:
    profile = NodeProfile.parse(_doc())
    first, again = profile.to_inventory(), profile.to_inventory()
    other = profile.to_inventory(node_name="n2")
    assert first == again
    assert first.name == "small" and other.name == "n2"
    assert {g.uuid for g in first.gpus}.isdisjoint({g.uuid for g in other.gpus})
    assert [g.pci_bus_id for g in first.gpus] == [g.pci_bus_id for g in other.gpus]
    assert first.gpu(2).pcie_root == first.pcie_switches[1].root
    assert first.mig_devices[0].parent_uuid == first.gpu(1).uuid
    assert first.mig_devices[0].uuid.startswith("MIG-")


def test_inventory_is_canonical_order_and_rdma_nics_get_uverbs() -> None:
    inventory = NodeProfile.parse(_doc()).to_inventory()
    assert [(nl.gpu_a, nl.gpu_b) for nl in inventory.nvlinks] == [(0, 1), (2, 3)]
    assert [n.pci_bus_id for n in inventory.nics] == sorted(n.pci_bus_id for n in inventory.nics)
    by_name = {n.name: n for n in inventory.nics}
    assert by_name["mlx5_1"].uverbs_device == "/dev/infiniband/uverbs0"  # first in bus order
    assert by_name["mlx5_0"].uverbs_device == "/dev/infiniband/uverbs1"
    assert by_name["eth0"].uverbs_device is None and by_name["eth0"].type is NicType.ETHERNET


def test_from_inventory_is_the_exact_inverse_through_the_wire_form() -> None:
    inventory = NodeProfile.parse(_doc()).to_inventory(node_name="node-7")
    spec = NodeProfileSpec.from_inventory(inventory)
    assert spec.to_inventory(node_name="node-7") == inventory
    wire = spec.to_wire()
    assert all(g["uuid"] and g["pciBusId"] and g["pcieRoot"] for g in wire["gpus"])
    assert NodeProfileSpec.parse(wire).to_inventory(node_name="node-7") == inventory
    document = NodeProfile.from_inventory(inventory)
    assert NodeProfile.parse(document.to_wire()).to_inventory() == inventory


def test_a_nic_without_uverbs_stays_without_through_the_round_trip() -> None:
    doc = _doc()
    doc["spec"]["nics"][0]["uverbs"] = ""
    inventory = NodeProfile.parse(doc).to_inventory()
    assert {n.name: n.uverbs_device for n in inventory.nics}["mlx5_1"] is None
    assert NodeProfileSpec.from_inventory(inventory).to_inventory(node_name="small") == inventory


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = doc["spec"]
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            _set("gpus/3/pcieSwitch", "sw9"),
            "spec.gpus[3].pcieSwitch: unknown PCIe switch 'sw9' (known: sw0, sw1)",
        ),
        (_set("gpus/0/numaNode", 1), "spec.gpus[0].numaNode: 1, but its PCIe switch sw0 is on NUMA node 0"),
        (_set("gpus/2/numaNode", 5), "spec.gpus[2].numaNode: NUMA node 5 out of range (numaNodes is 2)"),
        (_set("gpus/1/index", 0), "spec.gpus[1].index: duplicate GPU index 0"),
        (_set("gpus/3/index", 7), "spec.gpus: indexes must be 0..3"),
        (_set("gpus/0/uuid", "GPU-1111-2222"), None),
        (_set("gpus/0/colour", "red"), "spec.gpus[0].colour: Extra inputs are not permitted"),
        (_set("gpus/0/memoryMiB", -1), "spec.gpus[0].memoryMiB: Input should be greater than or equal"),
        (_set("gpus/0/memoryMiB", 10**30), "spec.gpus[0].memoryMiB: Input should be less than or equal"),
        (_set("gpus/0/numaNode", 10**6), "spec.gpus[0].numaNode: Input should be less than 64"),
        (_set("nvlinks/0/links", 10**9), "spec.nvlinks[0].links: Input should be less than or equal to 64"),
        (_set("gpus/0/architecture", "fermi"), "spec.gpus[0].architecture: Input should be"),
        (_set("gpus/0/migEnabled", True), None),
        (_set("gpus/2/migCapable", False), None),
        (_set("nvlinks/1/gpus", [2, 9]), "spec.nvlinks[1].gpus: no GPU with index 9"),
        (_set("nvlinks/1/gpus", [1, 0]), "spec.nvlinks[1].gpus: GPUs 1 and 0 are listed twice"),
        (_set("nvlinks/1/links", 13), "spec.gpus[2]: GPU 2 has 13 NVLink lanes"),
        (_set("nvswitch", {"gpus": [0, 1, 5], "linksPerGpu": 4}), "spec.nvswitch.gpus: no GPU with index 5"),
        (_set("nics/1/name", "mlx5_1"), "spec.nics[1].name: duplicate NIC name 'mlx5_1'"),
        (
            _set("nics/2/pciBusId", "0000:10:00.0"),
            "spec.nics[2].pciBusId: 00000000:10:00.0 is already used by gpus[0]",
        ),
        (_set("migDevices/0/gpu", 0), "spec.migDevices[0].gpu: GPU 0 does not exist or does not have"),
        (_set("numaNodes", 0), "spec.numaNodes: Input should be greater than or equal to 1"),
    ],
)
def test_bad_profile_gives_one_line_naming_the_field(
    mutate: Callable[[dict[str, Any]], None], message: str | None
) -> None:
    doc = copy.deepcopy(_doc())
    mutate(doc)
    if message is None:  # a valid variation
        NodeProfile.parse(doc)
        return
    with pytest.raises(ProfileError) as exc:
        NodeProfile.parse(doc, source="my.yaml")
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"my.yaml: {message}")


def test_overlapping_mig_placements_are_rejected() -> None:
    doc = _doc()
    extra = dict(doc["spec"]["migDevices"][0], gpuInstanceId=3, placementStart=2, placementSize=2)
    doc["spec"]["migDevices"].append(extra)
    with pytest.raises(ProfileError, match=r"migDevices\[1\]\.placementStart: slots 2..3 on GPU 1 overlap"):
        NodeProfile.parse(doc)


def test_the_wire_form_has_no_nulls_and_still_round_trips() -> None:
    doc = _doc()
    doc["spec"]["gpus"][0]["pcieSwitch"] = None  # a GPU on a root port
    doc["spec"]["pcieSwitches"][0]["numaNode"] = 0
    doc["spec"]["gpus"][1]["pcieSwitch"] = None
    doc["spec"]["nics"][1]["pcieSwitch"] = None
    doc["spec"]["pcieSwitches"] = doc["spec"]["pcieSwitches"][1:]
    inventory = NodeProfile.parse(doc).to_inventory()
    wire = NodeProfileSpec.from_inventory(inventory).to_wire()

    def nulls(value: Any) -> int:
        if isinstance(value, dict):
            return sum(nulls(v) for v in value.values()) + sum(v is None for v in value.values())
        if isinstance(value, list):
            return sum(nulls(v) for v in value)
        return 0

    assert nulls(wire) == 0 and "nvswitch" not in wire
    assert NodeProfileSpec.parse(wire).to_inventory(node_name="small") == inventory
