# ruff: noqa: N801, N802, N803, N815 - the fake keeps pynvml's function, argument and field names
"""pynvml's MIG functions over the simulated MIG state, as a mixin of the fake pynvml library.

Same names, arguments and results as ``pynvml``: ``nvmlDeviceGetMigMode`` returns
``[current, pending]``, ``nvmlDeviceSetMigMode`` returns the activation status, array calls fill a
caller-allocated ctypes array and a ``byref`` count, errors raise the library's ``NVMLError(code)``.
GPU-instance, compute-instance and MIG-device handles are opaque integers (``c_void_p`` values),
so ctypes arrays of handles work exactly as with the real library. They are three kinds, as in
NVML: each call accepts only its own kind and answers INVALID_ARGUMENT to another, and the
``device`` field of ``nvmlGpuInstanceGetInfo`` / ``nvmlComputeInstanceGetInfo`` is the parent
GPU's handle (nvml.h: "Parent device"), never a MIG device: a MIG device is found only through
``nvmlDeviceGetMigDeviceHandleByIndex`` (or by UUID).

The host library provides ``NVMLError`` and ``nvmlDeviceGetIndex(handle)`` (the GPU's index) and
sets ``mig_node`` to a ``SimMigNode``; GPUs without MIG state answer NOT_SUPPORTED, as non-MIG
GPUs do. ``mig_latency_s`` delays every MIG call (default 0) to model a slow driver.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from devicemodel.inventory import NodeInventory
from hardware.mig_catalog import MigCatalog, default_catalog
from hardware.simulated.mig_state import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    HandleAllocator,
    SimComputeInstance,
    SimGpuInstance,
    SimMigGpu,
    SimNvmlError,
    ci_profile_id,
)

T = TypeVar("T")
HandleKind = Literal["gpu_instance", "compute_instance", "mig_device"]


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass(frozen=True)
class _ProfileInfo:
    """The fields of ``c_nvmlGpuInstanceProfileInfo_v2_t`` the callers read."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    memorySizeMB: int
    name: bytes
    isP2pSupported: int = 0


@dataclass(frozen=True)
class _ComputeProfileInfo:
    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int


@dataclass(frozen=True)
class _GpuInstanceInfo:
    device: int
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


@dataclass(frozen=True)
class _ComputeInstanceInfo:
    device: int
    gpuInstance: int
    id: int
    profileId: int
    placement: c_nvmlGpuInstancePlacement_t


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int
    computeInstanceId: int


class SimMigNode:
    """MIG state of every MIG-capable GPU of a simulated node, and the handle registry."""

    def __init__(
        self, gpus: dict[int, SimMigGpu], handles: HandleAllocator, *, bus_ids: dict[str, int] | None = None
    ) -> None:
        self.gpus = gpus
        self.handles = handles
        self.bus_ids = {k.lower(): v for k, v in (bus_ids or {}).items()}  # PCI bus id -> GPU index

    def reset(self, pci_bus_id: str) -> None:
        """``nvidia-smi -r -i <bus id>`` on the simulated node (``hardware.mig_ops.GpuResetter``)."""
        index = self.bus_ids.get(pci_bus_id.lower())
        if index is None or index not in self.gpus:
            raise SimNvmlError(NVML_ERROR_NOT_FOUND, f"no MIG-capable GPU at {pci_bus_id}")
        self.gpus[index].reset()

    def driver_reload(self) -> None:
        """Reboot or driver reload of the whole node: every GPU loses its instances."""
        for gpu in self.gpus.values():
            gpu.driver_reload()

    @classmethod
    def from_inventory(cls, inventory: NodeInventory, catalog: MigCatalog | None = None) -> SimMigNode:
        catalog = catalog or default_catalog()
        handles = HandleAllocator()
        gpus: dict[int, SimMigGpu] = {}
        for gpu in inventory.gpus:
            if not gpu.mig_capable or not catalog.supports(gpu.product):
                continue
            state = SimMigGpu(
                model=catalog.for_product(gpu.product),
                gpu_uuid=gpu.uuid,
                handles=handles,
                mig_enabled=gpu.mig_enabled,
            )
            for device in inventory.mig_devices_of(gpu.index):
                state.adopt(device)
            gpus[gpu.index] = state
        return cls(gpus, handles, bus_ids={g.pci_bus_id: g.index for g in inventory.gpus})

    def lookup(self, handle: object) -> tuple[int, SimMigGpu, SimGpuInstance, SimComputeInstance | None]:
        """The GPU index, GPU state, GPU instance and (for a CI/MIG handle) compute instance."""
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        if isinstance(value, int) and value >= self.handles.first:
            for index, gpu in self.gpus.items():
                found = gpu.find_handle(value)
                if found is not None:
                    return index, gpu, found[0], found[1]
        raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"unknown MIG handle {value!r}")

    def is_mig_handle(self, handle: object) -> bool:
        """Whether the handle names a GPU instance, compute instance or MIG device of this node."""
        return self.kind(handle) is not None

    def kind(self, handle: object) -> HandleKind | None:
        """Which MIG object a handle names; None when it names none."""
        try:
            _, _, _, ci = self.lookup(handle)
        except SimNvmlError:
            return None
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        if ci is None:
            return "gpu_instance"
        return "mig_device" if value == ci.device_handle else "compute_instance"


def _fill(array: Any, count_ref: Any, values: Iterable[int]) -> None:
    """Fill a caller's ctypes handle array and its byref count, as NVML does."""
    items = list(values)
    count = count_ref._obj if hasattr(count_ref, "_obj") else count_ref
    if len(items) > len(array):
        count.value = len(items)
        raise SimNvmlError(7, "array too small")  # NVML_ERROR_INSUFFICIENT_SIZE
    for position, value in enumerate(items):
        array[position] = value
    count.value = len(items)


def _placement_of(placement: Any) -> tuple[int, int]:
    inner = placement._obj if hasattr(placement, "_obj") else placement
    return int(inner.start), int(inner.size)


class MigCallsMixin:
    """The MIG part of the fake pynvml surface (see the module docstring for the host contract)."""

    NVMLError: Any
    mig_node: SimMigNode | None = None
    mig_latency_s: float = 0.0
    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _mig_call(self, thunk: Callable[[], T]) -> T:
        if self.mig_latency_s > 0:
            time.sleep(self.mig_latency_s)
        try:
            return thunk()
        except SimNvmlError as exc:
            raise self.NVMLError(exc.code) from exc

    def _mig_gpu(self, device: Any) -> SimMigGpu:
        node = self.mig_node
        if node is None or node.is_mig_handle(device):
            raise SimNvmlError(NVML_ERROR_NOT_SUPPORTED, "not a GPU handle with MIG support")
        gpu = node.gpus.get(getattr(self, "nvmlDeviceGetIndex")(device))  # noqa: B009 - host's method
        if gpu is None:
            raise SimNvmlError(NVML_ERROR_NOT_SUPPORTED, "GPU is not MIG capable")
        return gpu

    def _mig_lookup(
        self, handle: Any, kind: HandleKind = "gpu_instance"
    ) -> tuple[int, SimMigGpu, SimGpuInstance, SimComputeInstance | None]:
        """Resolve a handle of ``kind``; any other handle is INVALID_ARGUMENT, as in NVML."""
        if self.mig_node is None or self.mig_node.kind(handle) != kind:
            raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"not a {kind.replace('_', ' ')} handle")
        return self.mig_node.lookup(handle)

    def _compute_instance(self, handle: Any) -> tuple[int, SimMigGpu, SimGpuInstance, SimComputeInstance]:
        index, gpu, gi, ci = self._mig_lookup(handle, "compute_instance")
        assert ci is not None  # a compute-instance handle always resolves to its instance
        return index, gpu, gi, ci

    def _mig_device(self, handle: Any) -> tuple[int, SimGpuInstance, SimComputeInstance]:
        index, _, gi, ci = self._mig_lookup(handle, "mig_device")
        assert ci is not None  # a MIG-device handle always resolves to its compute instance
        return index, gi, ci

    # -- mode ----------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return self._mig_call(lambda: list(self._mig_gpu(device).mode()))

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        return self._mig_call(lambda: self._mig_gpu(device).set_mode(mode))

    # -- GPU-instance profiles -----------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> _ProfileInfo:
        def info() -> _ProfileInfo:
            p = self._mig_gpu(device).profile_info(profile)
            sms = p.compute_slices * 16
            return _ProfileInfo(
                p.profile_id, p.compute_slices, p.max_count, sms, p.memory_mib, p.name.encode()
            )

        return self._mig_call(info)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        def fill() -> int:
            placements = self._mig_gpu(device).possible_placements(profileId)
            count = countRef._obj if hasattr(countRef, "_obj") else countRef
            if placementsRef is None:
                count.value = len(placements)
                return 0
            for position, placement in enumerate(placements[: len(placementsRef)]):
                placementsRef[position].start = placement.start
                placementsRef[position].size = placement.size
            count.value = min(len(placements), len(placementsRef))
            return 0

        return self._mig_call(fill)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        return self._mig_call(lambda: self._mig_gpu(device).remaining_capacity(profileId))

    # -- GPU instances -------------------------------------------------------------------------

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> int:
        def create() -> int:
            start, size = _placement_of(placement)
            return self._mig_gpu(device).create_gpu_instance(profileId, start, size).handle

        return self._mig_call(create)

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        def fill() -> int:
            gpu = self._mig_gpu(device)
            gpu.profile_by_id(profileId)
            _fill(gpuInstancesRef, countRef, (gi.handle for gi in gpu.gpu_instances(profileId)))
            return 0

        return self._mig_call(fill)

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> int:
        return self._mig_call(lambda: self._mig_gpu(device).gpu_instance(gpuInstanceId).handle)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> _GpuInstanceInfo:
        def info() -> _GpuInstanceInfo:
            index, _, gi, _ = self._mig_lookup(gpuInstance)
            placement = c_nvmlGpuInstancePlacement_t(gi.start, gi.profile.memory_slices)
            return _GpuInstanceInfo(self._mig_parent_handle(index), gi.id, gi.profile.profile_id, placement)

        return self._mig_call(info)

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        def destroy() -> int:
            _, gpu, gi, _ = self._mig_lookup(gpuInstance)
            gpu.destroy_gpu_instance(gi.id)
            return 0

        return self._mig_call(destroy)

    # -- compute instances ---------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> _ComputeProfileInfo:
        def info() -> _ComputeProfileInfo:
            _, gpu, gi, _ = self._mig_lookup(device)
            slices = gpu.ci_slices(gi, profile)
            return _ComputeProfileInfo(profile, slices, gi.profile.compute_slices // slices, slices * 16)

        return self._mig_call(info)

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> int:
        def create() -> int:
            _, gpu, gi, _ = self._mig_lookup(gpuInstance)
            return gpu.create_compute_instance(gi.id, profileId).handle

        return self._mig_call(create)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        def fill() -> int:
            _, gpu, gi, _ = self._mig_lookup(gpuInstance)
            slices = gpu.ci_slices(gi, profileId)
            handles = (
                ci.handle for ci in sorted(gi.computes.values(), key=lambda c: c.id) if ci.slices == slices
            )
            _fill(computeInstancesRef, countRef, handles)
            return 0

        return self._mig_call(fill)

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> _ComputeInstanceInfo:
        def info() -> _ComputeInstanceInfo:
            index, _, gi, ci = self._compute_instance(computeInstance)
            placement = c_nvmlGpuInstancePlacement_t(0, ci.slices)
            parent = self._mig_parent_handle(index)  # nvml.h: "Parent device", not the MIG device
            return _ComputeInstanceInfo(parent, gi.handle, ci.id, ci_profile_id(ci.slices), placement)

        return self._mig_call(info)

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        def destroy() -> int:
            _, gpu, gi, ci = self._compute_instance(computeInstance)
            gpu.destroy_compute_instance(gi.id, ci.id)
            return 0

        return self._mig_call(destroy)

    # -- MIG devices ---------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        def count() -> int:
            try:
                gpu = self._mig_gpu(device)
            except SimNvmlError:
                return 0
            return gpu.model.compute_slices if gpu.mig_enabled else 0

        return self._mig_call(count)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> int:
        def handle() -> int:
            devices = self._mig_gpu(device).mig_devices()
            if not 0 <= index < len(devices):
                raise SimNvmlError(NVML_ERROR_NOT_FOUND, f"no MIG device at index {index}")
            return devices[index][1].device_handle

        return self._mig_call(handle)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        node = self.mig_node
        return ctypes.c_uint(1 if node is not None and node.kind(device) == "mig_device" else 0)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        def parent() -> Any:
            return self._mig_parent_handle(self._mig_device(migDevice)[0])

        return self._mig_call(parent)

    def _mig_parent_handle(self, index: int) -> Any:
        getter = getattr(self, "nvmlDeviceGetHandleByIndex", None)
        return getter(index) if getter is not None else index

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig_call(lambda: self._mig_device(device)[1].id)

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig_call(lambda: self._mig_device(device)[2].id)

    # -- device calls that also take MIG-device handles ------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        node = self.mig_node
        if node is not None and node.is_mig_handle(handle):
            return self._mig_call(lambda: self._mig_device(handle)[2].mig_uuid)
        return str(getattr(super(), "nvmlDeviceGetUUID")(handle))  # noqa: B009 - the host's answer

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """On a MIG-device handle: one process while the device is marked busy."""
        node = self.mig_node
        if node is not None and node.is_mig_handle(handle):
            _, gi, ci = self._mig_call(lambda: self._mig_device(handle))
            if not ci.busy:
                return []
            return [_Process(10_000 + gi.id * 10 + ci.id, 1 << 30, gi.id, ci.id)]
        host = getattr(super(), "nvmlDeviceGetComputeRunningProcesses", None)
        processes = list(host(handle)) if host is not None else []
        gpu = node.gpus.get(getattr(self, "nvmlDeviceGetIndex")(handle)) if node is not None else None  # noqa: B009
        if not processes and gpu is not None and gpu.gpu_busy:
            processes.append(_Process(9_999, 1 << 30, 0xFFFFFFFF, 0xFFFFFFFF))
        return processes
