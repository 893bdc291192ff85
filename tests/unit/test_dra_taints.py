"""Health state to DRA device taints: effects per state, fan-out to MIG, probation, retired GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devicemodel.inventory import LostGpu
from dradriver.devices import MigPublishing, dra_devices
from dradriver.taint import Taint
from dradriver.taints import (
    TAINT_KEY,
    DeviceCondition,
    carry_time_added,
    conditions_from,
    device_taints,
    taint_for,
)
from health.policy import DeviceRecord, DeviceState
from health.scope import HealthSnapshot
from tests.support.small_inventory import gpu_uuid, small_inventory


@pytest.mark.parametrize(
    ("state", "effect"),
    [
        (DeviceState.HEALTHY, None),
        (DeviceState.SUSPECT, "NoSchedule"),
        (DeviceState.PROBATION, "NoSchedule"),
        (DeviceState.FAILED, "NoExecute"),
        (DeviceState.REMEDIATING, "NoExecute"),
        (DeviceState.RETIRED, "NoExecute"),
    ],
)
def test_each_state_has_its_effect(state: DeviceState, effect: str | None) -> None:
    taint = taint_for(DeviceCondition(state))
    assert (taint.effect if taint else None) == effect
    if taint:
        assert taint.key == TAINT_KEY and taint.value == state.value.lower()


def test_a_failed_gpu_taints_its_mig_devices_not_its_siblings() -> None:
    inventory = small_inventory(mig_on=(1,))
    devices = dra_devices(inventory)
    snapshot = HealthSnapshot(gpus={gpu_uuid(1): DeviceRecord(state=DeviceState.FAILED, reason="Xid 79")})
    taints = device_taints(devices, conditions_from(snapshot))
    assert set(taints) == {"gpu-1-mig-1-0", "gpu-1-mig-2-0"}
    assert {t.effect for ts in taints.values() for t in ts} == {"NoExecute"}


def test_a_mig_fault_taints_only_that_mig_device() -> None:
    inventory = small_inventory(mig_on=(1,))
    mig = inventory.mig_devices_of(1)[0]
    snapshot = HealthSnapshot(
        migs={mig.uuid: DeviceRecord(state=DeviceState.SUSPECT)}, mig_parent={mig.uuid: gpu_uuid(1)}
    )
    taints = device_taints(dra_devices(inventory), conditions_from(snapshot))
    assert set(taints) == {"gpu-1-mig-1-0"} and taints["gpu-1-mig-1-0"][0].effect == "NoSchedule"


def test_dynamic_placements_follow_their_gpu() -> None:
    devices = dra_devices(small_inventory(), mig=MigPublishing.DYNAMIC)
    taints = device_taints(devices, conditions_from(None, faults={gpu_uuid(0): "Xid 79"}))
    assert taints and all(name == "gpu-0" or name.startswith("gpu-0-mig-") for name in taints)


def test_probation_keeps_no_schedule_until_healthy() -> None:
    devices = dra_devices(small_inventory())
    for state, expected in ((DeviceState.PROBATION, {"gpu-0"}), (DeviceState.HEALTHY, set())):
        snapshot = HealthSnapshot(gpus={gpu_uuid(0): DeviceRecord(state=state)})
        assert set(device_taints(devices, conditions_from(snapshot))) == expected


def test_retired_gpu_stays_tainted_and_agent_maps_count() -> None:
    devices = dra_devices(small_inventory())
    snapshot = HealthSnapshot(gpus={gpu_uuid(3): DeviceRecord(state=DeviceState.RETIRED)})
    conditions = conditions_from(snapshot, withheld={gpu_uuid(2): "fabric"}, faults={"rdmap17s0": "down"})
    taints = device_taints(devices, conditions)
    assert taints["gpu-3"][0].effect == "NoExecute"
    assert taints["gpu-2"][0].effect == "NoSchedule"
    efa = next(d.name for d in devices if d.plugin is not None and d.plugin.id == "rdmap17s0")
    assert taints[efa][0].effect == "NoExecute"


def test_the_worse_of_snapshot_and_agent_maps_wins() -> None:
    snapshot = HealthSnapshot(gpus={gpu_uuid(0): DeviceRecord(state=DeviceState.FAILED)})
    conditions = conditions_from(snapshot, withheld={gpu_uuid(0): "reshape"})
    assert conditions[gpu_uuid(0)].state is DeviceState.FAILED


def test_time_added_is_carried_over_for_the_same_taint() -> None:
    taints = {"gpu-0": (Taint(TAINT_KEY, "failed", "NoExecute"),)}
    old = {"gpu-0": [{"key": TAINT_KEY, "effect": "NoExecute", "timeAdded": "2026-12-01T00:00:00Z"}]}
    assert carry_time_added(taints, old)["gpu-0"][0].time_added == "2026-12-01T00:00:00Z"
    changed = {"gpu-0": [{"key": TAINT_KEY, "effect": "NoSchedule", "timeAdded": "2026-12-01T00:00:00Z"}]}
    assert carry_time_added(taints, changed)["gpu-0"][0].time_added is None


def test_the_monitors_pushed_fault_does_not_turn_suspect_into_no_execute() -> None:
    snapshot = HealthSnapshot(gpus={gpu_uuid(0): DeviceRecord(state=DeviceState.SUSPECT, reason="ecc")})
    conditions = conditions_from(snapshot, faults={gpu_uuid(0): "ecc", gpu_uuid(1): "lost"})
    taints = device_taints(dra_devices(small_inventory()), conditions)
    assert taints["gpu-0"][0].effect == "NoSchedule" and taints["gpu-1"][0].effect == "NoExecute"


def test_a_gpu_off_the_bus_stays_in_the_pool_tainted_no_execute() -> None:
    inventory = small_inventory()
    lost = replace(
        inventory,
        gpus=inventory.gpus[:3],
        lost_gpus=(LostGpu(index=3, uuid=gpu_uuid(3), pci_bus_id="", reason="fell off the bus"),),
    )
    devices = {d.name: d for d in dra_devices(lost)}
    assert devices["gpu-3"].plugin is None and devices["gpu-3"].lost
    taints = device_taints(devices.values(), {})
    assert taints == {"gpu-3": (Taint(TAINT_KEY, "lost", "NoExecute"),)}
