"""The node agent's per-device health bookkeeping: which devices are reported Unhealthy, and why.

``DeviceHealthBook`` keeps four maps, each from a device ID or a physical GPU UUID to a reason (a
UUID fans out to that GPU's MIG devices and shares, never to siblings: ``unhealthy_reasons``):

- faults, recorded by ``set_health`` (the health service, ``device.set_health``): the device failed;
- withheld, ``withhold`` / ``release``: reported Unhealthy so the kubelet stops placing new work
  there (a MIG reshape, the Suspect state of the health design) without calling it failed;
- gates, ``set_gate``: named node-level conditions (the NVSwitch fabric, the MPS daemons), each
  replaced whole, so a MIG reshape's ``release`` of a GPU never lifts a gate on it;
- lost, ``follow_inventory``: GPUs the driver counts but cannot reach, always Unhealthy.

``NodeAgent`` owns one, calls it under its own lock and pushes ``reasons_for`` into every
resource's list; the book takes no lock of its own and streams nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from devicemodel.inventory import NodeInventory
from nodeagent.devices import PluginDevice, lost_reasons, unhealthy_reasons


class DeviceHealthBook:
    """Faults, withheld devices, gates and lost GPUs of one node agent (not thread-safe: the
    agent's lock guards it)."""

    def __init__(self) -> None:
        self._faults: dict[str, str] = {}
        self._withheld: dict[str, str] = {}
        self._lost: dict[str, str] = {}  # GPUs the driver counts but cannot reach: always Unhealthy
        self._gates: dict[str, dict[str, str]] = {}  # node-level conditions (gate -> ID -> reason)

    def follow_inventory(self, inventory: NodeInventory) -> None:
        """The lost GPUs of a newly discovered inventory replace the previous ones."""
        self._lost = lost_reasons(inventory)

    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Record a device's (or a whole GPU's, by UUID) fault, or clear it."""
        if healthy:
            self._faults.pop(device_id, None)
        else:
            self._faults[device_id] = reason or "unhealthy"

    def withhold(self, device_ids: Iterable[str], reason: str = "withheld") -> None:
        for device_id in device_ids:
            self._withheld[device_id] = reason

    def release(self, device_ids: Iterable[str]) -> None:
        for device_id in device_ids:
            self._withheld.pop(device_id, None)

    def set_gate(self, name: str, reasons: Mapping[str, str]) -> bool:
        """Withhold exactly ``reasons`` for the gate ``name``; False when it withholds just that already."""
        if self._gates.get(name, {}) == dict(reasons):
            return False
        self._gates[name] = dict(reasons)
        return True

    def reasons_for(self, devices: Iterable[PluginDevice]) -> dict[str, str]:
        """Device ID -> reason for every one of ``devices`` that must be reported Unhealthy."""
        faults = {**self._faults, **self._lost}
        return unhealthy_reasons(devices, faults=faults, withheld=self.withheld())

    def faults(self) -> dict[str, str]:
        """The recorded faults (lost GPUs not included), a copy."""
        return dict(self._faults)

    def withheld(self) -> dict[str, str]:
        """Everything withheld: every gate's and the ``withhold`` requests', a copy."""
        return {k: v for gate in self._gates.values() for k, v in gate.items()} | self._withheld

    def withheld_on_request(self) -> dict[str, str]:
        """Only what ``withhold`` withheld (no gate), a copy."""
        return dict(self._withheld)
