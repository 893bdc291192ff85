"""GetPreferredAllocation: pick the best ``size`` devices out of the kubelet's available set.

Pure. The extender's recorded choice wins when it fits; otherwise the resource kind that made the
devices chooses (``devicekinds``, its ``prefer``): whole GPUs go through the topology search
(NVLink/NVSwitch, NIC on the same PCIe switch, NUMA) behind ``GpuSetChooser``; MIG devices pack
onto already-busy GPUs; EFA adapters stay on one NUMA node and PCIe switch; fractional units and
time-sliced replicas stay on one GPU, the one they fit most tightly (``devicemodel.share_rule``,
the rule the extender uses among equal fragment increases: keep large holes for large requests).

Bad requests (a size the available set cannot meet, a must-include ID that is not offered) raise
``AllocationRejectedError``. Unknown available IDs are dropped, not fatal: a device that vanished
must not fail the admission of pods asking for its siblings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devicekinds.kind import GpuSetChooser, PreferContext
from devicekinds.registry import KINDS, KindRegistry
from nodeagent.devices import PluginDevice
from nodeagent.errors import AllocationRejectedError

Devices = Sequence[PluginDevice]


@dataclass(frozen=True)
class PreferenceRequest:
    resource: str
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _checked(request: PreferenceRequest, devices: Mapping[str, PluginDevice]) -> list[PluginDevice]:
    """The known available devices, after rejecting requests the kubelet can never send."""
    if request.size <= 0:
        raise AllocationRejectedError(
            f"{request.resource}: allocation_size {request.size} must be at least 1"
        )
    offered = set(request.available)
    for device_id in request.must_include:
        if device_id not in offered:
            raise AllocationRejectedError(
                f"{request.resource}: must-include device {device_id!r} is not in the available set"
            )
        if device_id not in devices:
            raise AllocationRejectedError(f"{request.resource}: unknown must-include device {device_id!r}")
    if len(set(request.must_include)) > request.size:
        raise AllocationRejectedError(
            f"{request.resource}: {len(request.must_include)} must-include devices exceed size {request.size}"
        )
    if request.size > len(offered):
        raise AllocationRejectedError(
            f"{request.resource}: size {request.size} is larger than the {len(offered)} available devices"
        )
    return [devices[d] for d in sorted(offered) if d in devices]


def preferred_devices(
    request: PreferenceRequest,
    *,
    devices: Mapping[str, PluginDevice],
    gpu_chooser: GpuSetChooser | None = None,
    hint: Sequence[str] | None = None,
    near: Devices = (),
    kinds: KindRegistry = KINDS,
) -> list[str]:
    """The preferred device IDs for one container.

    ``hint`` is the extender's recorded choice; ``near`` the devices the same container was just
    given for a sibling resource (see ``siblings``).
    """
    candidates = _checked(request, devices)
    candidate_ids = {d.id for d in candidates}
    hint_fits = hint and len(hint) == request.size and set(hint) <= candidate_ids
    if hint and hint_fits and set(request.must_include) <= set(hint):
        return list(hint)
    must = [devices[d] for d in dict.fromkeys(request.must_include)]
    if not candidates:  # every offered ID unknown (a device that vanished): nothing to prefer
        return []
    kind = kinds.kind_of(candidates[0])
    if kind is None:
        raise AllocationRejectedError(f"{request.resource}: no resource kind serves these devices")
    return kind.prefer(candidates, must, request.size, PreferContext(gpu_chooser=gpu_chooser, near=near))


__all__ = ["GpuSetChooser"]
