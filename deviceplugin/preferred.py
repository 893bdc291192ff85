"""GetPreferredAllocation: pick the best ``size`` devices out of the kubelet's available set.

Pure. Whole GPUs go through the topology search (NVLink/NVSwitch, NIC on the same PCIe switch,
NUMA) behind ``GpuSetChooser``; MIG devices pack onto already-busy GPUs; EFA adapters stay on one
NUMA node and PCIe switch; fractional units and time-sliced replicas stay on one GPU, the one they
fit most tightly (``devicemodel.share_rule``, the rule the extender uses among equal fragment
increases: keep large holes for large requests).

Bad requests (a size the available set cannot meet, a must-include ID that is not offered) raise
``AllocationRejectedError``. Unknown available IDs are dropped, not fatal: a device that vanished
must not fail the admission of pods asking for its siblings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from devicemodel.share_rule import tightest_gpu
from nodeagent.devices import DeviceKind, PluginDevice
from nodeagent.errors import AllocationRejectedError

GpuSetChooser = Callable[[frozenset[int], int, frozenset[int]], "tuple[int, ...] | None"]
"""(available GPU indexes, size, must-include indexes) -> the chosen indexes, or None."""

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


def _numa_key(device: PluginDevice) -> tuple[int, str]:
    return (device.numa_node if device.numa_node is not None else 1 << 16, device.id)


def _fill(must: Sequence[PluginDevice], ordered: Sequence[PluginDevice], size: int) -> list[str]:
    chosen = [d.id for d in must]
    for device in ordered:
        if len(chosen) >= size:
            break
        if device.id not in chosen:
            chosen.append(device.id)
    return chosen


def _prefer_gpus(
    candidates: Sequence[PluginDevice], must: Sequence[PluginDevice], size: int, chooser: GpuSetChooser | None
) -> list[str]:
    by_index = {d.gpu_index: d for d in candidates if d.gpu_index is not None}
    if chooser is not None:
        must_indexes = frozenset(d.gpu_index for d in must if d.gpu_index is not None)
        picked = chooser(frozenset(by_index), size, must_indexes)
        if picked is not None and len(picked) == size and all(i in by_index for i in picked):
            return [by_index[i].id for i in picked]
    return _fill(must, sorted(candidates, key=_numa_key), size)


def _prefer_packed_mig(candidates: Devices, must: Devices, size: int) -> list[str]:
    free_on_gpu: dict[str | None, int] = defaultdict(int)
    for device in candidates:
        free_on_gpu[device.gpu_uuid] += 1
    must_gpus = {d.gpu_uuid for d in must}
    return _fill(
        must,
        sorted(
            candidates, key=lambda d: (d.gpu_uuid not in must_gpus, free_on_gpu[d.gpu_uuid], *_numa_key(d))
        ),
        size,
    )


def _prefer_local_nics(candidates: Devices, must: Devices, size: int, *, near: Devices) -> list[str]:
    """Adapters beside ``near`` (the container's GPUs) or the must-include ones: switch, then NUMA."""
    per_numa: dict[int | None, int] = defaultdict(int)
    for device in candidates:
        per_numa[device.numa_node] += 1
    anchors = list(must) or list(near)
    if anchors:
        numas = {d.numa_node for d in anchors}
    else:
        numas = {max(per_numa, key=lambda n: (per_numa[n], -(n or 0)))} if per_numa else set()
    switches = {d.pcie_switch for d in anchors if d.pcie_switch}
    return _fill(
        must,
        sorted(candidates, key=lambda d: (d.pcie_switch not in switches, d.numa_node not in numas, d.id)),
        size,
    )


def _prefer_tightest_gpu(candidates: Devices, must: Devices, size: int, *, affine: str | None) -> list[str]:
    """All units on one GPU: ``affine`` if it fits, else the GPU whose free units fit most tightly."""
    units: dict[str, list[PluginDevice]] = defaultdict(list)
    for device in candidates:
        if device.gpu_uuid:
            units[device.gpu_uuid].append(device)
    must_gpus = {d.gpu_uuid for d in must}
    if len(must_gpus) > 1:
        return []
    allowed = {g: len(free) for g, free in units.items() if not must_gpus or g in must_gpus}
    index = {
        g: min((d.gpu_index for d in free if d.gpu_index is not None), default=0) for g, free in units.items()
    }
    tightest = tightest_gpu(allowed, size, index=index)
    if tightest is None:
        return []
    best = affine if affine is not None and allowed.get(affine, 0) >= size else tightest
    return _fill(must, sorted(units[best], key=lambda d: d.unit), size)


def preferred_devices(
    request: PreferenceRequest,
    *,
    devices: Mapping[str, PluginDevice],
    gpu_chooser: GpuSetChooser | None = None,
    hint: Sequence[str] | None = None,
    near: Devices = (),
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
    kind = candidates[0].kind if candidates else DeviceKind.GPU
    if kind is DeviceKind.GPU:
        return _prefer_gpus(candidates, must, request.size, gpu_chooser)
    if kind is DeviceKind.MIG:
        return _prefer_packed_mig(candidates, must, request.size)
    if kind is DeviceKind.EFA:
        return _prefer_local_nics(candidates, must, request.size, near=near)
    affine = next((d.gpu_uuid for d in near if d.gpu_uuid), None)
    return _prefer_tightest_gpu(candidates, must, request.size, affine=affine)
