"""A device taint as ResourceSlices carry it (``resource.k8s.io/v1`` ``DeviceTaint``).

Its own module so that the modules deciding taints (``dradriver.taints`` for health,
``dradriver.share_units`` for closed units) and the slice builder (``dradriver.slices``) share it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Taint:
    """A device taint as ResourceSlices carry it (``effect``: NoSchedule, NoExecute or None)."""

    key: str
    value: str
    effect: str
    time_added: str | None = None  # RFC 3339; the API server sets it when absent

    def to_wire(self) -> dict[str, str]:
        wire = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.time_added:
            wire["timeAdded"] = self.time_added
        return wire
