"""Configuration that names GPUs by UUID or PCI bus id survives the index shift of a missing GPU.

NVML numbers GPUs in bus order at driver load: with the GPU at index 3 missing after a reboot, the
GPU that was index 5 becomes index 4. Sharing configs and declared MIG layouts keyed by UUID or bus
id still reach the GPU they meant; an index key still works (and moves, as NVML's index does).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from devicemodel.errors import InvalidInputError
from devicemodel.gpu_keys import find_gpu, gpu_key
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingMode, load_sharing_plan
from mig.intent import parse_layout_annotation
from mig.planner import TargetEntry
from mig.reconciler import GpuRef
from tests.support.small_inventory import small_inventory

BEFORE = small_inventory(gpus=8)


def rebooted_without_gpu_3() -> NodeInventory:
    """The same node after a reboot with GPU 3 gone: every GPU behind it one index lower."""
    kept = [g for g in BEFORE.gpus if g.index != 3]
    return replace(BEFORE, gpus=tuple(replace(g, index=i) for i, g in enumerate(kept)))


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:15:00.0", "00000000:15:00.0"),
        ("00000000:15:00.0", "00000000:15:00.0"),
        ("0000:ab:00.0", "00000000:AB:00.0"),
        ("03", "3"),
        ("GPU-00000000-0000-4000-8000-000000000005", "GPU-00000000-0000-4000-8000-000000000005"),
    ],
)
def test_keys_have_one_canonical_form(text: str, canonical: str) -> None:
    assert gpu_key(text) == canonical


def test_a_key_that_names_nothing_is_a_one_line_error() -> None:
    with pytest.raises(InvalidInputError, match="'gpu5' is not a GPU UUID"):
        gpu_key("gpu5")


def test_sharing_by_uuid_and_bus_id_follows_the_gpu_across_the_index_shift(tmp_path: Path) -> None:
    gpu5, gpu6 = BEFORE.gpu(5), BEFORE.gpu(6)
    config = {
        "kind": "SharingConfig",
        "gpus": {
            gpu5.uuid: {"mode": "time-sliced", "replicas": 2},
            gpu6.pci_bus_id.removeprefix("0000").lower(): {"mode": "fractional"},
            "7": {"mode": "time-sliced", "replicas": 8},
        },
    }
    path = tmp_path / "sharing.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = load_sharing_plan(path)
    after = rebooted_without_gpu_3()
    moved5 = next(g for g in after.gpus if g.uuid == gpu5.uuid)
    moved6 = next(g for g in after.gpus if g.uuid == gpu6.uuid)
    assert (moved5.index, moved6.index) == (4, 5)
    assert plan.for_gpu(moved5).replicas == 2
    assert plan.for_gpu(moved6).mode is SharingMode.FRACTIONAL
    assert plan.for_gpu(after.gpu(7 - 1)).mode is SharingMode.EXCLUSIVE  # what was index 7 is 6 now


def test_a_bad_sharing_key_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "sharing.yaml"
    path.write_text(yaml.safe_dump({"gpus": {"first": {"mode": "fractional"}}}))
    with pytest.raises(InvalidInputError, match=r"bad sharing config .*sharing.yaml at gpus: .*'first'"):
        load_sharing_plan(path)


def test_mig_layout_keys_resolve_by_uuid_and_bus_id() -> None:
    after = rebooted_without_gpu_3()
    refs = [GpuRef(g.index, g.uuid, g.product, g.pci_bus_id) for g in after.gpus]

    def resolve(key: str) -> int:
        gpu = find_gpu(key, refs)
        if gpu is None:
            raise InvalidInputError(f"GPU {key} is not on this node")
        return gpu.index

    uuid5, bus6 = BEFORE.gpu(5).uuid, BEFORE.gpu(6).pci_bus_id
    value = f'{{"gpus": {{"{uuid5}": ["3g.40gb"], "{bus6}": null, "1": []}}}}'
    assert parse_layout_annotation(value, resolve=resolve) == {1: (), 4: (TargetEntry("3g.40gb"),), 5: None}
    with pytest.raises(InvalidInputError, match="needs the node's GPUs"):
        parse_layout_annotation(value)
