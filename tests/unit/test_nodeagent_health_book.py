"""DeviceHealthBook: the node agent's faults, withheld devices, gates and lost GPUs."""

from __future__ import annotations

import dataclasses

from devicemodel.inventory import LostGpu, NodeInventory
from devicemodel.sharing import SharingPlan
from hardware.profiles import load_profile
from nodeagent.devices import PluginDevice, build_catalogue
from nodeagent.health_book import DeviceHealthBook


def _gpu_devices(profile: str = "p4d.24xlarge") -> tuple[NodeInventory, tuple[PluginDevice, ...]]:
    inventory = load_profile(profile).to_inventory(node_name="n")
    return inventory, build_catalogue(inventory, SharingPlan())["nvidia.com/gpu"]


def test_a_fault_on_a_gpu_is_reported_until_cleared() -> None:
    _, devices = _gpu_devices()
    book = DeviceHealthBook()
    book.set_health(devices[1].id, healthy=False)
    assert book.reasons_for(devices) == {devices[1].id: "unhealthy"}
    assert book.faults() == {devices[1].id: "unhealthy"}
    book.set_health(devices[1].id, healthy=True)
    assert book.reasons_for(devices) == {} and book.faults() == {}


def test_a_gate_is_withheld_apart_from_withhold_and_release_never_lifts_it() -> None:
    _, devices = _gpu_devices()
    book = DeviceHealthBook()
    assert book.set_gate("fabric", {devices[0].id: "fabric not trained"})
    assert not book.set_gate("fabric", {devices[0].id: "fabric not trained"})  # unchanged
    book.withhold([devices[0].id, devices[2].id], "MIG reshape")
    book.release([devices[0].id, devices[2].id])
    assert book.reasons_for(devices) == {devices[0].id: "fabric not trained"}
    assert book.withheld() == {devices[0].id: "fabric not trained"}
    assert book.withheld_on_request() == {}
    book.withhold([devices[3].id], "suspect")
    assert book.withheld() == {devices[0].id: "fabric not trained", devices[3].id: "suspect"}
    assert book.withheld_on_request() == {devices[3].id: "suspect"}


def test_a_lost_gpu_is_unhealthy_wins_over_a_fault_and_is_not_a_recorded_fault() -> None:
    inventory, _ = _gpu_devices()
    gone = inventory.gpus[-1]
    lost = dataclasses.replace(
        inventory,
        gpus=inventory.gpus[:-1],
        lost_gpus=(LostGpu(gone.index, gone.uuid, "", "fell off the bus"),),
    )
    devices = build_catalogue(lost, SharingPlan())["nvidia.com/gpu"]
    book = DeviceHealthBook()
    book.set_health(gone.uuid, healthy=False, reason="Xid 79")
    book.follow_inventory(lost)
    assert book.reasons_for(devices) == {gone.uuid: f"GPU {gone.index} unreachable: fell off the bus"}
    assert book.faults() == {gone.uuid: "Xid 79"}
    book.follow_inventory(inventory)  # back on the bus: only the recorded fault is left
    assert book.reasons_for(devices) == {gone.uuid: "Xid 79"}
