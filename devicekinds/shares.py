"""GPU shares: fractional GPUs (``gpuweave.io/gpu-compute``, 1% of the SMs, and
``gpuweave.io/gpu-memory``, 1 GiB, served through the GPU's MPS daemon) and time-sliced replicas
(``gpuweave.io/gpu-shared``). A device per unit, ``<gpu-uuid>::<kind>-<unit>``; a container's units
all come from one GPU.

The extender plans shares FGD-style (``scheduler_ext/decide/shares.py``); GetPreferredAllocation
puts a container's units on the GPU they fit most tightly (``devicemodel.share_rule``), or beside
the sibling resource just granted (compute beside memory, and back).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import ClassVar

from devicekinds.device import DeviceKind, PluginDevice, numa_of
from devicekinds.grant import ContainerGrant, GrantContext, HostMount, listed, with_devices
from devicekinds.kind import DeviceNames, Devices, DeviceText, PreferContext, ResourceKind, fill, short_id
from devicemodel.assignment import device_id_share, parent_gpu_of_share
from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, RESOURCE_GPU_SHARED
from devicemodel.errors import AllocationRejectedError
from devicemodel.inventory import Gpu, NodeInventory
from devicemodel.share_rule import tightest_gpu
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, SharingMode, SharingPlan, memory_units

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
SHARE_WORDS = {
    RESOURCE_GPU_COMPUTE: ("% compute", "% compute"),
    RESOURCE_GPU_MEMORY: (" GiB", " GiB"),
    RESOURCE_GPU_SHARED: (" replica", " replicas"),
}


def share_devices(gpu: Gpu, *, resource: str, kind: str, units: int) -> list[PluginDevice]:
    return [
        PluginDevice(
            id=device_id_share(gpu.uuid, kind, unit),
            resource=resource,
            kind=kind,
            numa_node=numa_of(gpu.numa_node),
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            unit=unit,
            pcie_switch=gpu.pcie_switch,
        )
        for unit in range(units)
    ]


def single_gpu(resource: str, chosen: Devices) -> str:
    gpus = sorted({d.gpu_uuid for d in chosen if d.gpu_uuid})
    if len(gpus) != 1:
        raise AllocationRejectedError(
            f"{resource}: {len(chosen)} units span {len(gpus)} GPUs ({', '.join(gpus)}); a container's "
            "share units must all come from one GPU: request fewer units or let the scheduler place the pod"
        )
    return gpus[0]


def share_text(resource: str, ids: Sequence[str], gpu_index: Mapping[str, int]) -> str:
    """``40% compute of GPU 7``: share units counted per parent GPU."""
    per_gpu = Counter(parent_gpu_of_share(i) or i for i in ids)
    one, many = SHARE_WORDS[resource]
    parts = []
    for parent, count in sorted(per_gpu.items()):
        where = f"GPU {gpu_index[parent]}" if parent in gpu_index else short_id(parent)
        parts.append(f"{count}{one if count == 1 else many} of {where}")
    return ", ".join(parts)


class _Units(ResourceKind):
    """What both share kinds do alike: units on one GPU, chosen tightest, described per GPU."""

    core_planned = True

    def prefer(self, candidates: Devices, must: Devices, size: int, context: PreferContext) -> list[str]:
        """All units on one GPU: the sibling's GPU if it fits, else the GPU whose free units fit
        most tightly."""
        affine = next((d.gpu_uuid for d in context.near if d.gpu_uuid), None)
        units: dict[str, list[PluginDevice]] = defaultdict(list)
        for device in candidates:
            if device.gpu_uuid:
                units[device.gpu_uuid].append(device)
        must_gpus = {d.gpu_uuid for d in must}
        if len(must_gpus) > 1:
            return []
        allowed = {g: len(free) for g, free in units.items() if not must_gpus or g in must_gpus}
        index = {
            g: min((d.gpu_index for d in free if d.gpu_index is not None), default=0)
            for g, free in units.items()
        }
        tightest = tightest_gpu(allowed, size, index=index)
        if tightest is None:
            return []
        best = affine if affine is not None and allowed.get(affine, 0) >= size else tightest
        return fill(must, sorted(units[best], key=lambda d: d.unit), size)

    def describe(self, resource: str, ids: Sequence[str], names: DeviceNames) -> DeviceText:
        return DeviceText(share_text(resource, ids, names.gpu_index))


class FractionalShare(_Units):
    """MPS shares of a fractional GPU: compute and memory units, granted with the GPU's daemon."""

    words = (DeviceKind.COMPUTE, DeviceKind.MEMORY)
    resources = (RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY)

    siblings: ClassVar[Mapping[str, str]] = {
        RESOURCE_GPU_COMPUTE: RESOURCE_GPU_MEMORY,
        RESOURCE_GPU_MEMORY: RESOURCE_GPU_COMPUTE,
    }

    def check_request(self, counts: Mapping[str, int], *, container: str) -> str | None:
        if counts.get(RESOURCE_GPU) and (counts.get(RESOURCE_GPU_COMPUTE) or counts.get(RESOURCE_GPU_MEMORY)):
            return whole_and_shares(container)
        return None

    def gpu_devices(self, gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        if gpu.mig_enabled or plan.for_gpu(gpu).mode is not SharingMode.FRACTIONAL:
            return []
        compute = share_devices(
            gpu, resource=RESOURCE_GPU_COMPUTE, kind=DeviceKind.COMPUTE, units=COMPUTE_UNITS_PER_GPU
        )
        memory = share_devices(
            gpu, resource=RESOURCE_GPU_MEMORY, kind=DeviceKind.MEMORY, units=memory_units(gpu.memory_mib)
        )
        return compute + memory

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        gpu_uuid = single_gpu(resource, chosen)
        pipe = context.mps_pipe_dir
        if callable(pipe):
            pipe = pipe(gpu_uuid)  # this GPU's own daemon, or a rejection
        envs: dict[str, str] = {}
        mounts: tuple[HostMount, ...] = ()
        if chosen[0].kind == DeviceKind.COMPUTE:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(len(chosen))
        else:
            # One GPU is visible in the container, so it is CUDA device ordinal 0 for the MPS client.
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={len(chosen)}G"
        if isinstance(pipe, str) and pipe:
            envs[MPS_PIPE_ENV] = pipe
            mounts = (HostMount(pipe, pipe),)
        grant = listed(resource, [gpu_uuid], listing=context.listing, envs=envs)
        return with_devices(grant, chosen, mounts=mounts)


class TimeSlicedReplica(_Units):
    """Replicas of a time-sliced GPU: the GPU itself, listed once, shared in time."""

    words = (DeviceKind.REPLICA,)
    resources = (RESOURCE_GPU_SHARED,)

    def check_request(self, counts: Mapping[str, int], *, container: str) -> str | None:
        if not counts.get(RESOURCE_GPU_SHARED):
            return None
        if counts.get(RESOURCE_GPU):
            return whole_and_shares(container)
        if counts.get(RESOURCE_GPU_COMPUTE) or counts.get(RESOURCE_GPU_MEMORY):
            return (
                f"container {container} mixes time-sliced replicas (gpuweave.io/gpu-shared) with "
                "MPS shares (gpu-compute/gpu-memory); choose one"
            )
        return None

    def gpu_devices(self, gpu: Gpu, inventory: NodeInventory, plan: SharingPlan) -> list[PluginDevice]:
        sharing = plan.for_gpu(gpu)
        if gpu.mig_enabled or sharing.mode is not SharingMode.TIME_SLICED:
            return []
        return share_devices(
            gpu, resource=RESOURCE_GPU_SHARED, kind=DeviceKind.REPLICA, units=sharing.replicas
        )

    def grant(self, resource: str, chosen: Devices, context: GrantContext) -> ContainerGrant:
        gpus = sorted({d.gpu_uuid for d in chosen if d.gpu_uuid})
        return with_devices(listed(resource, gpus, listing=context.listing), chosen)


def whole_and_shares(container: str) -> str:
    return (
        f"container {container} asks for whole GPUs and GPU shares at once; "
        "request either nvidia.com/gpu or gpuweave.io/gpu-* in one container"
    )
