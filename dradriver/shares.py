"""Fractional GPUs in DRA: one device per GPU that claims share through consumable capacity.

A GPU the sharing configuration makes ``fractional`` (``devicemodel.sharing``; not in MIG mode) is
published as one device, ``gpu-<index>-share`` (type ``gpu-share``, DeviceClass
``gpu-share.gpuweave.io``), instead of the whole GPU, with ``allowMultipleAllocations: true``
(KEP-5075, beta and on by default since Kubernetes 1.36) and two capacities a claim consumes:

- ``compute``: 100, in 1% units of the GPU's SMs (as ``gpuweave.io/gpu-compute``);
- ``memory``: the GPU's memory in whole GiB (as ``gpuweave.io/gpu-memory``), e.g. ``79Gi``.

Each has a request policy: ``validRange`` from 0 in steps of 1 (compute) or 1Gi (memory), so a
request is rounded up to a whole unit, and ``default: 0``, so a claim that names only one of them
consumes nothing of the other. That default is what lets the allocator pack: a capacity a claim
does not name is charged at its policy's default, and with the whole memory as default two
compute-only claims could never share a GPU. The allocator takes devices in pool order and keeps
a GPU's shares there until the next claim does not fit, so claims of 30 and 50 compute units land
on one GPU and a third of 30 on the next.

Prepare gives a share what the device plugin's Allocate gives ``gpu-compute`` and ``gpu-memory``
units of the same GPU (``nodeagent.allocation.grant_for`` builds both): the GPU's device
nodes, ``CUDA_MPS_PIPE_DIRECTORY`` and a mount of that GPU's pipe directory (its live daemon's,
waiting for a restart under way; refused while it has none), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
from the consumed compute and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<N>G`` from the consumed memory;
a capacity of 0 sets no limit of its own (the daemon's ``mps`` defaults apply). The amounts come
from the allocation result's ``consumedCapacity``, which the scheduler wrote; a claim with two
shares of one GPU, or a share of neither compute nor memory, is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from math import ceil
from typing import Any

from devicemodel.assignment import device_id_share
from devicemodel.contracts import RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.inventory import Gpu, NodeInventory
from devicemodel.quantity import parse_quantity
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, SharingMode, SharingPlan, memory_units
from dradriver.devices import ATTR_TYPE, DraDevice, DraKind
from dradriver.share_units import share_counter_set_name, share_counters, unit_devices
from nodeagent.allocation import (
    VISIBLE_DEVICES_ENV,
    ContainerGrant,
    DeviceListing,
    DeviceListStrategy,
    MpsPipeLookup,
    grant_for,
)
from nodeagent.devices import DeviceKind, PluginDevice, build_catalogue
from nodeagent.errors import AllocationRejectedError

SHARE_CLASS = "gpu-share.gpuweave.io"
CAPACITY_COMPUTE = "compute"
CAPACITY_MEMORY = "memory"
_GIB = 2**30
_ENV_ONLY = DeviceListing(strategies=frozenset({DeviceListStrategy.ENVVAR}))


class ShareError(GpuweaveError):
    """A share allocation this node cannot prepare (the caller names the claim)."""


def share_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}-share"


def _range_policy(maximum: str, step: str) -> dict[str, Any]:
    return {"default": "0", "validRange": {"min": "0", "max": maximum, "step": step}}


def share_device(whole: DraDevice, gpu: Gpu) -> DraDevice:
    """The fractional GPU's one shared device, from its whole-GPU device (same attributes, so a
    claim selects and constrains it as it would the GPU, but ``type: gpu-share``)."""
    memory = f"{memory_units(gpu.memory_mib)}Gi"
    plugin = PluginDevice(
        id=gpu.uuid,
        resource=RESOURCE_GPU_COMPUTE,
        kind=DeviceKind.COMPUTE,
        numa_node=gpu.numa_node if gpu.numa_node >= 0 else None,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        pcie_switch=gpu.pcie_switch,
    )
    return replace(
        whole,
        name=share_device_name(gpu),
        kind=DraKind.GPU_SHARE,
        attributes={**whole.attributes, ATTR_TYPE: {"string": DraKind.GPU_SHARE.value}},
        capacity={CAPACITY_COMPUTE: str(COMPUTE_UNITS_PER_GPU), CAPACITY_MEMORY: memory},
        plugin=plugin,
        consumes=share_counters(gpu),  # all of the GPU's: charged once, however many claims share it
        counter_set=share_counter_set_name(gpu),
        allow_multiple=True,
        request_policy={
            CAPACITY_COMPUTE: _range_policy(str(COMPUTE_UNITS_PER_GPU), "1"),
            CAPACITY_MEMORY: _range_policy(memory, "1Gi"),
        },
    )


def fractional_gpus(inventory: NodeInventory, plan: SharingPlan) -> dict[str, Gpu]:
    """GPU UUID -> GPU, for every GPU shared through MPS (fractional and not in MIG mode)."""
    return {
        g.uuid: g
        for g in inventory.gpus
        if not g.mig_enabled and plan.for_gpu(g).mode is SharingMode.FRACTIONAL
    }


def with_shares(
    devices: Sequence[DraDevice], inventory: NodeInventory, plan: SharingPlan
) -> tuple[DraDevice, ...]:
    """The pool with each fractional GPU's whole device replaced by its shared device and its
    units (``dradriver.share_units``). A GPU is offered under one mode, so its MIG placements
    (``--dra-mig dynamic``) are left out too."""
    fractional = fractional_gpus(inventory, plan)
    if not fractional:
        return tuple(devices)
    catalogue = build_catalogue(inventory, plan)
    out: list[DraDevice] = []
    for device in devices:
        gpu = fractional.get(device.gpu_uuid or "")
        if gpu is None or device.lost:
            out.append(device)
        elif device.kind is DraKind.GPU:
            out += [share_device(device, gpu), *unit_devices(gpu, catalogue)]
    return tuple(out)


@dataclass(frozen=True)
class ShareAllocation:
    """One claim's share of one shared device, as the allocator recorded it."""

    device: str
    share_id: str | None
    compute: int  # 1% units of the GPU's SMs; 0: no thread limit of its own
    memory_gib: int  # 0: no memory limit of its own


def _units(text: object, *, unit: int, what: str) -> int:
    try:
        value = parse_quantity(str(text)) / unit
    except InvalidInputError as exc:
        raise ShareError(f"consumed {what} {text!r}: {exc}") from None
    if value < 0:
        raise ShareError(f"consumed {what} {text!r} is negative")
    return ceil(Fraction(value))


def _share_of(result: Mapping[str, Any]) -> ShareAllocation:
    device = str(result.get("device", ""))
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, Mapping):
        raise ShareError(
            f"the allocation of shared device {device} has no consumedCapacity: the scheduler that "
            "allocated it runs without consumable capacity (feature gate DRAConsumableCapacity)"
        )
    compute = _units(consumed.get(CAPACITY_COMPUTE, "0"), unit=1, what=CAPACITY_COMPUTE)
    memory = _units(consumed.get(CAPACITY_MEMORY, "0"), unit=_GIB, what=CAPACITY_MEMORY)
    if compute > COMPUTE_UNITS_PER_GPU:
        raise ShareError(f"share of {device}: {compute} compute units, more than a GPU's 100")
    if compute == 0 and memory == 0:
        raise ShareError(
            f"share of {device} consumes neither compute nor memory: ask for capacity.requests "
            "compute (1% units) and/or memory (GiB)"
        )
    share_id = result.get("shareID")
    return ShareAllocation(device, str(share_id) if share_id else None, compute, memory)


def share_allocations(
    results: Sequence[Mapping[str, Any]], *, shared: Collection[str]
) -> dict[str, ShareAllocation]:
    """Device name -> the claim's share, for the results that name a shared device."""
    shares: dict[str, ShareAllocation] = {}
    for result in results:
        if str(result.get("device", "")) not in shared:
            continue
        share = _share_of(result)
        if share.device in shares:
            raise ShareError(
                f"two requests of the claim hold shares of {share.device}; a claim holds one share "
                "per GPU (use one claim per container, or constrain the requests to distinct GPUs)"
            )
        shares[share.device] = share
    return shares


def _merged(grants: Sequence[ContainerGrant]) -> dict[str, Any]:
    """The grants' environment and mounts as CDI container edits; the claim's spec names the
    visible GPUs for the whole claim, so ``NVIDIA_VISIBLE_DEVICES`` is left out here."""
    env: dict[str, str] = {}
    mounts: dict[str, dict[str, Any]] = {}
    for grant in grants:
        env |= {k: v for k, v in grant.envs.items() if k != VISIBLE_DEVICES_ENV}
        for mount in grant.mounts:
            options = ["rbind", "ro" if mount.read_only else "rw"]
            mounts[mount.container_path] = {
                "hostPath": mount.host_path,
                "containerPath": mount.container_path,
                "options": options,
            }
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(env.items())]}
    if mounts:
        edits["mounts"] = [mounts[path] for path in sorted(mounts)]
    return edits


class ShareEdits:
    """The container edits of one share, built by the device plugin's Allocate code for the same
    number of ``gpu-compute`` and ``gpu-memory`` units of that GPU."""

    def __init__(
        self,
        *,
        sharing: Callable[[], tuple[NodeInventory, SharingPlan]],
        pipes: Callable[[], str | MpsPipeLookup | None],
    ) -> None:
        self._sharing = sharing
        self._pipes = pipes

    def edits(self, gpu_uuid: str, share: ShareAllocation) -> dict[str, Any]:
        """A share's edits: those of as many compute and memory units of its GPU."""
        grants = [
            self._grant(resource, [device_id_share(gpu_uuid, kind.value, unit) for unit in range(units)])
            for resource, kind, units in (
                (RESOURCE_GPU_COMPUTE, DeviceKind.COMPUTE, share.compute),
                (RESOURCE_GPU_MEMORY, DeviceKind.MEMORY, share.memory_gib),
            )
            if units > 0
        ]
        return _merged(grants)

    def unit_edits(self, resource: str, device_ids: Sequence[str]) -> dict[str, Any]:
        """The edits of the units one request of an extended-resource claim holds
        (``dradriver.share_units``): exactly Allocate's for those IDs."""
        return _merged([self._grant(resource, device_ids)])

    def _grant(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant:
        inventory, plan = self._sharing()
        devices = {d.id: d for d in build_catalogue(inventory, plan).get(resource, ())}
        try:
            return grant_for(
                resource,
                device_ids,
                devices=devices,
                unhealthy={},
                mps_pipe_dir=self._pipes(),
                listing=_ENV_ONLY,
            )
        except AllocationRejectedError as exc:
            raise ShareError(str(exc)) from None


def shares_wire(
    chosen: Sequence[DraDevice], shares: Mapping[str, ShareAllocation] | None
) -> dict[str, dict[str, Any]]:
    """What the claim checkpoint keeps of a claim's shares: per device its GPU and amounts (the
    per-pod memory check reads the limit from there)."""
    gpus = {d.name: d.gpu_uuid for d in chosen}
    return {
        name: {"gpu": gpus.get(name), "compute": share.compute, "memoryGiB": share.memory_gib}
        for name, share in (shares or {}).items()
    }
