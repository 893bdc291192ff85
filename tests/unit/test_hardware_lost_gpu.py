"""A GPU off the bus, through the production NVML and sysfs readers over the simulated node.

The simulated GPU answers every NVML call (its handle included) with GPU_IS_LOST, as a GPU that
fell off the bus does; discovery must keep the other GPUs and name the lost one from what it last
answered, the PCI tree, or the identity file.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.sharing import SharingPlan
from devicemodel.spec import NodeProfile, ProfileError
from gpuweave.cli import main
from hardware.backend import HardwareError
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.structs import NVMLError
from nodeagent.devices import build_catalogue, lost_device_id, lost_reasons
from nodeagent.published import inventory_object
from scheduler_ext.cluster.objects import inventory_record


def profile_with_lost(name: str, *indexes: int) -> NodeProfile:
    document: dict[str, Any] = load_profile(name).to_wire()
    for index in indexes:
        document["spec"]["gpus"][index]["lost"] = True
    return NodeProfile.parse(document)


def test_a_lost_gpu_answers_its_handle_with_gpu_is_lost_and_still_counts() -> None:
    backend = SimulatedBackend(profile_with_lost("p5.48xlarge", 3))
    try:
        lib = backend.lib
        lib.nvmlInit()
        assert lib.nvmlDeviceGetCount() == 8
        with pytest.raises(NVMLError) as lost:
            lib.nvmlDeviceGetHandleByIndex(3)
        assert lost.value.value == lib.NVML_ERROR_GPU_IS_LOST
        lib.nvmlShutdown()
    finally:
        backend.close()


def test_discovery_keeps_the_seven_answering_gpus_and_names_the_lost_one_by_bus_id() -> None:
    profile = profile_with_lost("p5.48xlarge", 3)
    expected = profile.to_inventory()
    backend = SimulatedBackend(profile)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    assert [g.index for g in inventory.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert [g.uuid for g in inventory.gpus] == [g.uuid for g in expected.gpus if g.index != 3]
    (lost,) = inventory.lost_gpus
    assert (lost.index, lost.uuid, lost.pci_bus_id) == (3, "", expected.gpu(3).pci_bus_id)
    assert "GPU is lost" in lost.reason
    assert inventory.nvswitch is not None and 3 not in inventory.nvswitch.gpus
    assert inventory.nvswitch.links_per_gpu == expected.nvswitch.links_per_gpu  # type: ignore[union-attr]


def test_links_to_a_lost_gpu_are_dropped_and_not_taken_for_an_nvswitch() -> None:
    profile = profile_with_lost("dgx1-v100", 0)
    backend = SimulatedBackend(profile)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    assert inventory.nvswitch is None
    assert all(0 not in (link.gpu_a, link.gpu_b) for link in inventory.nvlinks)
    kept = {(nl.gpu_a, nl.gpu_b) for nl in profile.to_inventory().nvlinks if 0 not in (nl.gpu_a, nl.gpu_b)}
    assert {(link.gpu_a, link.gpu_b) for link in inventory.nvlinks} == kept


def test_a_gpu_lost_after_it_answered_keeps_its_uuid_in_the_same_process() -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"))
    try:
        before = backend.discover()
        backend.node.set_gpu_lost(5)
        after = backend.discover()
    finally:
        backend.close()
    (lost,) = after.lost_gpus
    assert (lost.uuid, lost.pci_bus_id) == (before.gpu(5).uuid, before.gpu(5).pci_bus_id)
    assert len(after.gpus) == 7


def test_the_identity_file_names_a_gpu_lost_before_a_restart(tmp_path: Path) -> None:
    identities = tmp_path / "gpu-identities.json"
    first = SimulatedBackend(load_profile("dgx-h100"), identity_file=identities)
    try:
        healthy = first.discover()
    finally:
        first.close()
    stored = json.loads(identities.read_text())["uuidByBusId"]
    assert stored == {g.pci_bus_id: g.uuid for g in healthy.gpus}
    second = SimulatedBackend(profile_with_lost("dgx-h100", 6), identity_file=identities)
    try:
        inventory = second.discover()
    finally:
        second.close()
    (lost,) = inventory.lost_gpus
    assert lost.uuid == healthy.gpu(6).uuid


def test_a_corrupt_identity_file_is_ignored_not_fatal(tmp_path: Path) -> None:
    identities = tmp_path / "gpu-identities.json"
    identities.write_text("{not json")
    backend = SimulatedBackend(profile_with_lost("dgx-h100", 1), identity_file=identities)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    assert [lost.index for lost in inventory.lost_gpus] == [1]
    assert len(inventory.gpus) == 7


def test_the_catalogue_lists_a_lost_gpu_under_nvidia_gpu_with_its_reason() -> None:
    backend = SimulatedBackend(profile_with_lost("p5.48xlarge", 3))
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    devices = build_catalogue(inventory, SharingPlan())[RESOURCE_GPU]
    (lost,) = inventory.lost_gpus
    assert len(devices) == 8
    assert lost_device_id(lost) == f"unreachable-{lost.pci_bus_id}"
    assert lost_device_id(lost) in {d.id for d in devices}
    assert set(lost_reasons(inventory)) == {lost_device_id(lost)}
    assert "GPU 3 unreachable" in lost_reasons(inventory)[lost_device_id(lost)]


def test_the_published_inventory_of_a_node_with_a_lost_gpu_is_read_back_by_the_extender() -> None:
    backend = SimulatedBackend(profile_with_lost("p5.48xlarge", 3))
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    record = inventory_record(inventory_object(inventory))
    assert [g.index for g in record.inventory.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert record.inventory.gpus == inventory.gpus
    assert record.inventory.nvswitch == inventory.nvswitch


def test_a_profile_must_still_list_every_gpu() -> None:
    document: dict[str, Any] = load_profile("p5.48xlarge").to_wire()
    del document["spec"]["gpus"][3]
    document["spec"]["nvswitch"]["gpus"] = [0, 1, 2, 4, 5, 6, 7]
    with pytest.raises(ProfileError, match=r"indexes must be 0\.\.6 as NVML numbers them; missing 3"):
        NodeProfile.parse(document)


def test_a_closed_nvml_session_fails_discovery_as_a_whole_instead_of_losing_gpus() -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"))
    try:
        backend.discover()
        gate = backend.node.hang("nvmlDeviceGetName", gpu=2)  # the session closes while discovery waits
        result: list[object] = []
        worker = threading.Thread(target=lambda: result.append(_discover_or_error(backend)))
        worker.start()
        assert gate.entered.wait(10)
        backend.lib.nvmlShutdown()
        gate.release()
        worker.join(10)
        backend.lib.nvmlInit()
    finally:
        backend.close()
    (outcome,) = result
    assert isinstance(outcome, HardwareError) and "Uninitialized" in str(outcome)


def _discover_or_error(backend: SimulatedBackend) -> object:
    try:
        return backend.discover()
    except HardwareError as exc:
        return exc


def test_publish_prints_what_the_agent_publishes_for_a_profile_with_a_lost_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p5-lost.yaml"
    path.write_text(yaml.safe_dump(profile_with_lost("p5.48xlarge", 3).to_wire()))
    assert main(["publish", "--simulate", str(path), "--node-name", "node-7"]) == 0
    inventory_cr, node = yaml.safe_load(capsys.readouterr().out)["items"]
    assert [g["index"] for g in inventory_cr["spec"]["gpus"]] == [0, 1, 2, 4, 5, 6, 7]
    (lost,) = [d for d in inventory_cr["status"]["devices"] if d["id"].startswith("unreachable-")]
    assert lost["health"] == "Unhealthy" and "GPU 3 unreachable" in lost["reason"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "7"
