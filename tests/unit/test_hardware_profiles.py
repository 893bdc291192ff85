"""Built-in node profiles load, describe the machines they name, and behave like user files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from devicemodel.inventory import NicType
from devicemodel.spec import ProfileError
from hardware.profiles import builtin_profile_names, load_profile

EXPECTED = {
    "p5.48xlarge",
    "p4d.24xlarge",
    "dgx-a100",
    "dgx-h100",
    "dgx1-v100",
    "l40s-pcie-8",
    "a100-pcie-nvbridge-4",
    "h200-vm-1",
}
H200_RECORDING = Path(__file__).parents[1] / "fixtures" / "nvml" / "nvidia-h200-580.159.04.json"


def test_every_design_profile_is_built_in() -> None:
    assert set(builtin_profile_names()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_profile_is_named_after_its_file_and_round_trips(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    inventory = profile.to_inventory()
    assert [g.index for g in inventory.gpus] == list(range(len(inventory.gpus)))


def test_p5_has_four_efa_per_gpu_on_the_gpu_switch() -> None:
    inventory = load_profile("p5.48xlarge").to_inventory()
    assert len(inventory.gpus) == 8 and len(inventory.nics) == 32
    assert all(n.type is NicType.EFA and n.uverbs_device for n in inventory.nics)
    per_switch = Counter(n.pcie_switch for n in inventory.nics)
    assert all(per_switch[g.pcie_switch] == 4 for g in inventory.gpus)
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inventory.nvswitch is not None and inventory.nvswitch.links_per_gpu == 18


def test_p4d_has_two_gpus_and_one_efa_per_switch() -> None:
    inventory = load_profile("p4d.24xlarge").to_inventory()
    gpus_per_switch = Counter(g.pcie_switch for g in inventory.gpus)
    efa_per_switch = Counter(n.pcie_switch for n in inventory.nics)
    assert set(gpus_per_switch.values()) == {2} and set(efa_per_switch.values()) == {1}
    assert set(gpus_per_switch) == set(efa_per_switch)


def test_dgx1_cube_mesh_gives_every_gpu_six_lanes_and_no_nvswitch() -> None:
    inventory = load_profile("dgx1-v100").to_inventory()
    lanes: Counter[int] = Counter()
    for link in inventory.nvlinks:
        lanes[link.gpu_a] += link.links
        lanes[link.gpu_b] += link.links
    assert inventory.nvswitch is None
    assert dict(lanes) == dict.fromkeys(range(8), 6)
    doubles = {(nl.gpu_a, nl.gpu_b) for nl in inventory.nvlinks if nl.links == 2}
    assert doubles == {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}


def test_pcie_only_and_bridged_profiles() -> None:
    l40s = load_profile("l40s-pcie-8").to_inventory()
    assert not l40s.nvlinks and l40s.nvswitch is None
    bridged = load_profile("a100-pcie-nvbridge-4").to_inventory()
    assert [(nl.gpu_a, nl.gpu_b, nl.links) for nl in bridged.nvlinks] == [(0, 1, 12), (2, 3, 12)]


def test_h200_vm_is_the_recorded_host() -> None:
    """One H200 passed through to a VM, as NVML and nvidia-smi showed it (docs/gpu-check.md)."""
    inventory = load_profile("h200-vm-1").to_inventory()
    recording = json.loads(H200_RECORDING.read_text())
    assert recording["profile"] == "h200-vm-1" and recording["source"] == "nvml"
    (gpu,) = inventory.gpus
    recorded = (recording["product"], recording["driver"], recording["gpuCount"])
    assert (gpu.product, inventory.driver_version, len(inventory.gpus)) == recorded
    assert (gpu.pci_bus_id, gpu.minor, gpu.memory_mib * 1024 * 1024) == ("00000000:00:06.0", 0, 150754820096)
    assert (gpu.architecture.value, gpu.compute_capability) == ("hopper", "9.0")
    assert inventory.cuda_driver_version == "13.0"
    assert gpu.mig_capable and not gpu.mig_enabled
    assert not inventory.nvlinks and inventory.nvswitch is None and not inventory.nics


def test_a_user_file_works_like_a_builtin(tmp_path: Path) -> None:
    source = load_profile("p4d.24xlarge")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(source.to_wire(), sort_keys=False), encoding="utf-8")
    assert load_profile(str(path)).to_inventory() == source.to_inventory()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec: [unclosed", "mine.yaml: not valid YAML at line"),
        ("- a list", "mine.yaml: a node profile is a YAML mapping"),
        ("", "mine.yaml: a node profile is a YAML mapping with apiVersion, kind, metadata, spec; got an"),
        ("apiVersion: gpuweave.io/v1alpha1\nkind: NodeProfile\nmetadata: {name: x}\n", "mine.yaml: spec: "),
    ],
)
def test_bad_files_give_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(exc.value).startswith(message.replace("mine.yaml", str(path)))
    assert "\n" not in str(exc.value)


def test_unknown_name_and_missing_file() -> None:
    with pytest.raises(ProfileError, match=r"no built-in node profile 'p9' \(built-in: .*p5.48xlarge"):
        load_profile("p9")
    with pytest.raises(ProfileError, match=r"cannot read node profile /nonexistent/x\.yaml"):
        load_profile("/nonexistent/x.yaml")
