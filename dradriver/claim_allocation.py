"""What a ResourceClaim's allocation gives this node, read and checked before anything is prepared.

Pure: the claim's JSON (as the API server returns it) and the node's published devices in, the
devices to prepare out, or ``ClaimError`` naming the claim and what is wrong with it. Used by
``dradriver.prepare``, whose ``ClaimPreparer`` does the writing (CDI spec, checkpoint, MIG
instances, IMEX domain).

- ``allocated_here``: (request, device) of every allocation result of driver ``gpuweave.io`` in
  this node's pool; a claim that was replaced (another UID), is not allocated, or holds nothing
  here is refused.
- ``placements_to_make``: the allocated MIG placements that have no instance yet
  (``--dra-mig dynamic``).
- ``resolve_devices``: the published devices the results name, refused when a device left the
  pool, is off the bus, or is a placement or MIG-mode GPU nothing can be prepared for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from devicemodel.errors import GpuweaveError
from dradriver.devices import DRIVER, DraDevice


class ClaimError(GpuweaveError):
    """A claim this node cannot prepare (reported for that claim only)."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    uid: str
    namespace: str
    name: str

    def describe(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device as the kubelet's ``Device`` message carries it (``share_id``: the
    allocator's ID of one share of a device that several claims share)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "requestNames": list(self.request_names),
            "poolName": self.pool_name,
            "deviceName": self.device_name,
            "cdiDeviceIDs": list(self.cdi_device_ids),
        }
        if self.share_id:
            wire["shareID"] = self.share_id
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PreparedDevice:
        share_id = data.get("shareID")
        return cls(
            tuple(data["requestNames"]),
            str(data["poolName"]),
            str(data["deviceName"]),
            tuple(data["cdiDeviceIDs"]),
            str(share_id) if share_id else None,
        )


class ClaimSource(Protocol):
    """Reads a ResourceClaim (its JSON, camelCase); raises ``ClaimError`` when it cannot."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


def our_results(claim: Mapping[str, Any], *, ref: ClaimRef, pool: str) -> list[Mapping[str, Any]]:
    """Every allocation result of our driver in our pool, after checking the claim is the one the
    kubelet named and is allocated."""
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"{ref.describe()}: the API server has uid {uid}; the claim was replaced, not preparing it"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{ref.describe()} is not allocated yet")
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [
        r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER and r.get("pool") == pool
    ]
    if not ours:
        raise ClaimError(
            f"{ref.describe()} has no device of driver {DRIVER} in pool {pool}: nothing to prepare here"
        )
    return ours


def allocated_here(claim: Mapping[str, Any], *, ref: ClaimRef, pool: str) -> list[tuple[str, str]]:
    """(request name, device name) of every allocation result for our driver in our pool."""
    return [
        (str(r.get("request", "")), str(r.get("device", ""))) for r in our_results(claim, ref=ref, pool=pool)
    ]


Placement = tuple[int, str, int]  # GPU index, MIG profile, first memory slot


def placements_to_make(wanted: Sequence[tuple[str, str]], devices: Sequence[DraDevice]) -> list[Placement]:
    """The allocated MIG placements that have no instance yet (``--dra-mig dynamic``)."""
    by_name = {d.name: d for d in devices}
    made: list[Placement] = []
    for _, name in wanted:
        device = by_name.get(name)
        if device is None or device.plugin is not None or device.lost or device.mig_profile is None:
            continue
        placement = (
            int(device.attributes["index"]["int"]),
            device.mig_profile,
            int(device.placement_start or 0),
        )
        if placement not in made:
            made.append(placement)
    return made


def resolve_devices(
    ref: ClaimRef, wanted: Sequence[tuple[str, str]], devices: Sequence[DraDevice]
) -> list[DraDevice]:
    """The published devices the results name, each once, in the results' order."""
    by_name = {d.name: d for d in devices}
    chosen: list[DraDevice] = []
    for _, name in wanted:
        device = by_name.get(name)
        if device is None:
            raise ClaimError(f"{ref.describe()}: device {name} is not in this node's pool any more")
        if device.lost:
            raise ClaimError(
                f"{ref.describe()}: GPU {name} is unreachable (off the bus); it cannot be prepared"
            )
        if device.plugin is None and device.mig_profile is not None:
            raise ClaimError(
                f"{ref.describe()}: device {name} is a MIG placement with no MIG instance and none was "
                "made for it (this agent makes MIG instances only with --dra-mig dynamic)"
            )
        if device.plugin is None:
            raise ClaimError(
                f"{ref.describe()}: GPU {name} is in MIG mode; a whole GPU is prepared only with MIG off"
            )
        if device not in chosen:
            chosen.append(device)
    return chosen
