"""Device health as DRA device taints: pure mapping from the agent's health state to taints.

One taint key, ``gpuweave.io/unhealthy``, whose value is the state, so one toleration covers them
all (an admin's debugging pod, say):

- Failed, Remediating (a fatal fault such as Xid 79, or a GPU being reset) and Retired (on the
  bad-hardware list) -> ``NoExecute``: the scheduler allocates the device to no new claim and
  kube-controller-manager's device-taint eviction deletes pods whose claims use it;
- Suspect and Probation -> ``NoSchedule``: withheld from new claims, running pods stay; the taint
  goes when the device is Healthy again (after its probation rounds).

A GPU's state fans out to every device backed by it (its MIG devices and MIG placements), never to
its siblings; a MIG device's own fault taints that MIG device only. Faults and withholdings the agent
records itself (a GPU off the bus, the NVSwitch fabric not trained, a MIG reshape in progress) are
Failed and Suspect respectively; a GPU off the bus is published with the value ``lost``, NoExecute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dradriver.devices import DraDevice
from dradriver.taint import Taint
from health.policy import DeviceState, worst
from health.scope import HealthSnapshot

TAINT_KEY = "gpuweave.io/unhealthy"
NO_EXECUTE = "NoExecute"
NO_SCHEDULE = "NoSchedule"
_EFFECTS: Mapping[DeviceState, str] = {
    DeviceState.FAILED: NO_EXECUTE,
    DeviceState.REMEDIATING: NO_EXECUTE,
    DeviceState.RETIRED: NO_EXECUTE,
    DeviceState.SUSPECT: NO_SCHEDULE,
    DeviceState.PROBATION: NO_SCHEDULE,
}


@dataclass(frozen=True)
class DeviceCondition:
    """A device's (or a physical GPU's) health state and why."""

    state: DeviceState
    reason: str = ""


def taint_for(condition: DeviceCondition) -> Taint | None:
    """The taint of one state; None while Healthy."""
    effect = _EFFECTS.get(condition.state)
    if effect is None:
        return None
    return Taint(key=TAINT_KEY, value=condition.state.value.lower(), effect=effect)


def conditions_from(
    snapshot: HealthSnapshot | None,
    *,
    faults: Mapping[str, str] | None = None,
    withheld: Mapping[str, str] | None = None,
) -> dict[str, DeviceCondition]:
    """Device ID or GPU UUID -> condition, from the health monitor's snapshot and the agent's own
    maps (``NodeAgent.health_maps``). The monitor pushes every withheld device to the agent as a
    fault, so for a device the snapshot tracks its state decides (Suspect stays NoSchedule); the
    agent's faults count for the rest, and its withholdings (fabric, MIG reshape) everywhere, the
    worse state winning."""
    conditions: dict[str, DeviceCondition] = {}

    def put(key: str, state: DeviceState, reason: str) -> None:
        old = conditions.get(key)
        if old is None or worst(old.state, state) is not old.state:
            conditions[key] = DeviceCondition(state, reason)

    tracked: set[str] = set()
    if snapshot is not None:
        tracked = {*snapshot.gpus, *snapshot.migs, *snapshot.efa_up}
        for key, record in [*snapshot.gpus.items(), *snapshot.migs.items()]:
            put(key, record.state, record.reason)
        for name, up in snapshot.efa_up.items():
            if not up:
                put(name, DeviceState.FAILED, "EFA link down")
    for key, reason in (withheld or {}).items():
        put(key, DeviceState.SUSPECT, reason)
    for key, reason in (faults or {}).items():
        if key not in tracked:
            put(key, DeviceState.FAILED, reason)
    return conditions


def device_taints(
    devices: Iterable[DraDevice], conditions: Mapping[str, DeviceCondition]
) -> dict[str, tuple[Taint, ...]]:
    """Published device name -> its taints, for every device that has one (the worst of the
    device's own condition and its GPU's)."""
    taints: dict[str, tuple[Taint, ...]] = {}
    for device in devices:
        if device.lost:
            taints[device.name] = (Taint(key=TAINT_KEY, value="lost", effect=NO_EXECUTE),)
            continue
        found = [conditions[key] for key in device.health_keys if key in conditions]
        if not found:
            continue
        state = found[0].state
        for condition in found[1:]:
            state = worst(state, condition.state)
        taint = taint_for(DeviceCondition(state))
        if taint is not None:
            taints[device.name] = (taint,)
    return taints


def carry_time_added(
    taints: Mapping[str, tuple[Taint, ...]], published: Mapping[str, Iterable[Mapping[str, str]]]
) -> dict[str, tuple[Taint, ...]]:
    """Keep the ``timeAdded`` the API server stamped on a taint that is still the same (device, key,
    effect), so republishing never restarts a NoExecute eviction's toleration clock."""
    kept: dict[str, tuple[Taint, ...]] = {}
    for name, device_taints_ in taints.items():
        old = {(t.get("key"), t.get("effect")): t.get("timeAdded") for t in published.get(name, ())}
        kept[name] = tuple(
            Taint(t.key, t.value, t.effect, t.time_added or old.get((t.key, t.effect)))
            for t in device_taints_
        )
    return kept
