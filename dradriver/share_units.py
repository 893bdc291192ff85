"""Pod specs written for the device plugin on a DRA node: a fractional GPU's units as devices.

A DeviceClass with ``extendedResourceName`` (KEP-5004, GA in Kubernetes 1.37) lets a pod that asks
``gpuweave.io/gpu-compute: 30`` be served by DRA: kube-scheduler makes a claim for the pod with one
request per container and resource, ``count`` = the quantity, and allocates that many devices of
the class. A count is a number of distinct devices (Kubernetes 1.37 cannot turn it into capacity
of one shared device), so each fractional GPU also publishes its units, as the device plugin lists
them: ``gpu-<index>-compute-<k>`` (k < 100, type ``gpu-compute``) and ``gpu-<index>-memory-<k>`` (one
per GiB, type ``gpu-memory``), each the device plugin's ``<uuid>::compute-<k>`` / ``::memory-<k>``.

Two rules keep this correct:

- **One GPU serves claims' shares or units, never both at once.** The GPU's counter set
  ``gpu-<index>-share`` holds ``compute`` (100) and ``memory`` (its GiB); every unit consumes one of
  its kind, and the shared device (``dradriver.shares``) consumes all of both, which the allocator
  charges once however many claims share it. So the first share keeps units off that GPU and the
  first unit keeps shares off it, and neither mode can overcommit the GPU.
- **A container's units all come from one GPU.** A request's devices are taken in pool order, so
  units free on two GPUs would be split between them, which MPS cannot serve (one pipe directory
  per client). The agent therefore keeps the units of one GPU open at a time, the fractional GPU
  with the most free units that holds no share and carries no health taint, and puts a
  ``NoSchedule`` taint (``gpuweave.io/share-units=closed``) on the units of every other GPU. A
  request that does not fit the open GPU fits no GPU of the node, so it is unschedulable there
  rather than split. The agent counts what its prepared claims hold and moves the open GPU after
  each prepare and unprepare; a claim allocated but not yet prepared is not counted, so a second
  pod scheduled in that moment is placed on the same open GPU or waits for the next publish.

Prepare hands each request's units what the device plugin's Allocate gives the same unit IDs
(``ShareEdits.unit_edits``: the GPU's device node, its MPS pipe directory, mounted, and the
request's limit) as one CDI device, ``<claim-uid>-units-<request>``, named by the request's first
unit; its other units carry no CDI ID.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devicemodel.contracts import RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from devicemodel.errors import GpuweaveError
from devicemodel.inventory import Gpu
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, memory_units
from dradriver.devices import ATTR_TYPE, DraDevice, DraKind
from dradriver.taint import Taint
from nodeagent.devices import DeviceKind, PluginDevice

CLOSED_TAINT = Taint(key="gpuweave.io/share-units", value="closed", effect="NoSchedule")
COUNTER_COMPUTE = "compute"
COUNTER_MEMORY = "memory"
UNIT_KINDS: Mapping[DraKind, tuple[DeviceKind, str, str]] = {
    DraKind.GPU_COMPUTE: (DeviceKind.COMPUTE, RESOURCE_GPU_COMPUTE, COUNTER_COMPUTE),
    DraKind.GPU_MEMORY: (DeviceKind.MEMORY, RESOURCE_GPU_MEMORY, COUNTER_MEMORY),
}
_NAME = re.compile(r"^gpu-(\d+)-(share|compute|memory)(?:-\d+)?$")


def share_counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}-share"


def share_counters(gpu: Gpu) -> dict[str, int]:
    """A fractional GPU's counter set: its compute units and its memory in GiB."""
    return {COUNTER_COMPUTE: COMPUTE_UNITS_PER_GPU, COUNTER_MEMORY: memory_units(gpu.memory_mib)}


def _unit(gpu: Gpu, kind: DraKind, plugin: PluginDevice) -> DraDevice:
    _, _, counter = UNIT_KINDS[kind]
    return DraDevice(
        name=f"gpu-{gpu.index}-{counter}-{plugin.unit}",
        kind=kind,
        attributes={
            ATTR_TYPE: {"string": kind.value},
            "index": {"int": gpu.index},
            "uuid": {"string": gpu.uuid},
        },
        capacity={},
        plugin=plugin,
        gpu_uuid=gpu.uuid,
        consumes={counter: 1},
        counter_set=share_counter_set_name(gpu),
    )


def unit_devices(gpu: Gpu, catalogue: Mapping[str, Sequence[PluginDevice]]) -> list[DraDevice]:
    """The GPU's compute units, then its memory units, each the device plugin's unit device
    (``catalogue``: ``nodeagent.devices.build_catalogue`` under the node's sharing plan)."""
    units: list[DraDevice] = []
    for kind, (_, resource, _) in UNIT_KINDS.items():
        mine = [d for d in catalogue.get(resource, ()) if d.gpu_uuid == gpu.uuid]
        units += [_unit(gpu, kind, plugin) for plugin in sorted(mine, key=lambda d: d.unit)]
    return units


@dataclass(frozen=True)
class GpuUse:
    """What the node's prepared claims hold of one fractional GPU."""

    index: int
    compute: int = 0
    memory: int = 0
    shared: bool = False  # a claim holds a share of its shared device


def use_by_gpu(held: Collection[str]) -> dict[int, GpuUse]:
    """GPU index -> its use, from the device names the prepared claims hold."""
    use: dict[int, GpuUse] = {}
    for name in held:
        match = _NAME.match(name)
        if match is None:
            continue
        index, what = int(match[1]), match[2]
        old = use.get(index, GpuUse(index))
        use[index] = GpuUse(
            index,
            old.compute + (what == COUNTER_COMPUTE),
            old.memory + (what == COUNTER_MEMORY),
            old.shared or what == "share",
        )
    return use


def open_gpu(devices: Sequence[DraDevice], *, held: Collection[str], tainted: Collection[str]) -> int | None:
    """The fractional GPU whose units are open: no share held, no taint on its shared device, the
    most free compute units, then memory units, then the lowest index; None when there is none."""
    use = use_by_gpu(held)
    totals: dict[int, list[int]] = {}
    for device in devices:
        if device.kind in UNIT_KINDS:
            index = int(device.attributes["index"]["int"])
            totals.setdefault(index, [0, 0])[device.kind is DraKind.GPU_MEMORY] += 1
    shared_tainted = {
        int(d.attributes["index"]["int"])
        for d in devices
        if d.kind is DraKind.GPU_SHARE and d.name in tainted
    }
    candidates = [
        (total[0] - use.get(i, GpuUse(i)).compute, total[1] - use.get(i, GpuUse(i)).memory, -i)
        for i, total in totals.items()
        if not use.get(i, GpuUse(i)).shared and i not in shared_tainted
    ]
    return -max(candidates)[2] if candidates else None


def closed_unit_taints(
    devices: Sequence[DraDevice], *, held: Collection[str], tainted: Collection[str]
) -> dict[str, tuple[Taint, ...]]:
    """Device name -> the ``closed`` taint, for every unit of every GPU but the open one."""
    chosen = open_gpu(devices, held=held, tainted=tainted)
    return {
        d.name: (CLOSED_TAINT,)
        for d in devices
        if d.kind in UNIT_KINDS and int(d.attributes["index"]["int"]) != chosen
    }


def units_by_request(
    wanted: Sequence[tuple[str, str]], devices: Mapping[str, DraDevice]
) -> dict[str, list[DraDevice]]:
    """Request name -> the unit devices the claim's results give it, in result order."""
    requests: dict[str, list[DraDevice]] = {}
    for request, name in wanted:
        device = devices.get(name)
        if device is not None and device.kind in UNIT_KINDS:
            requests.setdefault(request, []).append(device)
    return requests


UnitEdits = Callable[[str, Sequence[str]], dict[str, Any]]  # resource, unit IDs -> Allocate's edits


def unit_groups(
    units: Mapping[str, Sequence[DraDevice]], *, edits: UnitEdits | None, name: Callable[[str], str]
) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, tuple[str, ...]]]:
    """Per request: its CDI device (``units-<request>``: its GPU and Allocate's edits for its unit
    IDs), and the CDI ID each request's first unit answers with (``name``); the other units answer
    none. Units on more than one GPU are refused: MPS serves a container from one GPU."""
    gpus = {d.gpu_uuid for devices in units.values() for d in devices}
    if len(gpus) > 1:
        raise UnitsError(
            f"its GPU units come from {len(gpus)} GPUs; MPS serves a container from one GPU (the "
            "agent keeps one GPU's units open at a time: were they allocated while it moved?)"
        )
    groups: dict[str, tuple[str, dict[str, Any]]] = {}
    cdi: dict[str, tuple[str, ...]] = {}
    for request, devices in units.items():
        group = f"units-{request}"
        resource = UNIT_KINDS[devices[0].kind][1]
        ids = [d.plugin.id for d in devices if d.plugin is not None]
        try:
            groups[group] = (str(devices[0].gpu_uuid), edits(resource, ids) if edits else {})
        except GpuweaveError as exc:
            raise UnitsError(f"request {request}: {exc}") from None
        cdi[devices[0].name] = (name(group),)
    return groups, cdi


class UnitsError(GpuweaveError):
    """Units of a claim this node cannot prepare (the caller names the claim)."""
