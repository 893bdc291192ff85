"""NVML MIG operations for one node, through the same pynvml-shaped library the backend uses.

The library is injected (``pynvml`` itself on a GPU host, the simulated lib elsewhere), so this
module never imports pynvml. Every call goes through ``call`` — the backend's per-call timeout
wrapper — so a hung driver surfaces as an error instead of a stuck reconcile. Arrays and counts
are passed as ctypes objects exactly as pynvml expects them.

GPU instances are listed per profile ID and described by placement; GI ids are only used to find
an instance again, because the driver reuses them. Profile IDs are read from NVML per GPU (index ->
``info.id``), never assumed.

A MIG device's identity (its ``MIG-`` UUID) comes from NVML's MIG-device handles
(``nvmlDeviceGetMigDeviceHandleByIndex``), matched to a compute instance by its GPU-instance and
compute-instance IDs. The ``device`` field of ``nvmlComputeInstanceGetInfo`` is the *parent* GPU
(nvml.h: "Parent device"); reading a UUID through it would name the whole GPU for every instance.
"""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from hardware.backend import HardwareError

T = TypeVar("T")

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
GPU_INSTANCE_PROFILE_COUNT = 0x12
COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0


class MigNvmlError(HardwareError):
    """An NVML MIG call failed; ``code`` is NVML's return code (0 when not from NVML)."""

    def __init__(self, message: str, *, call: str = "", code: int = 0) -> None:
        super().__init__(message, call=call, code=code)
        self.code: int = code


class MigInUseError(MigNvmlError):
    """NVML refused with IN_USE: processes run on the instance or GPU."""


class _UnlistedMigDeviceError(MigNvmlError):
    """A compute instance with no MIG device in the list read before it (see ``instances``)."""


_READ_ATTEMPTS = 3
_GONE = (NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND)  # what a destroyed instance's handle answers


Caller = Callable[[str, Callable[[], Any]], Any]


def direct_call(name: str, thunk: Callable[[], T]) -> T:
    """The default caller: no timeout (tests, simulation)."""
    return thunk()


class GpuResetter(Protocol):
    """Resets one GPU (by PCI bus id); NVML has no reset call."""

    def reset(self, pci_bus_id: str) -> None: ...


class NvidiaSmiResetter:
    """``nvidia-smi -r -i <bus id>``: resets only that GPU (unlike tools that reset every GPU)."""

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        self._timeout_s = timeout_s

    def reset(self, pci_bus_id: str) -> None:
        result = subprocess.run(
            ["nvidia-smi", "-r", "-i", pci_bus_id],
            capture_output=True,
            text=True,
            timeout=self._timeout_s,
            check=False,
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise MigNvmlError(
                f"GPU reset of {pci_bus_id} failed: {detail[0]}; stop the processes holding it"
            )


@dataclass(frozen=True)
class ComputeRecord:
    ci_id: int
    mig_uuid: str


@dataclass(frozen=True)
class GpuInstanceRecord:
    """A GPU instance as NVML reports it."""

    gi_id: int
    profile_index: int
    profile_id: int
    start: int
    size: int
    computes: tuple[ComputeRecord, ...]


class MigOps:
    """MIG calls on the node's GPUs, addressed by GPU index."""

    def __init__(self, lib: Any, *, call: Caller = direct_call, resetter: GpuResetter | None = None) -> None:
        self._lib = lib
        self._call = call
        self._resetter = resetter or NvidiaSmiResetter()
        self._profile_cache: dict[int, dict[int, tuple[int, int]]] = {}
        self._ci_profile_cache: dict[int, list[tuple[int, int]]] = {}  # by GI profile ID

    def _nvml(self, name: str, *args: Any) -> Any:
        fn = getattr(self._lib, name)
        try:
            return self._call(name, lambda: fn(*args))
        except MigNvmlError:
            raise
        except HardwareError as exc:  # from the backend's timeout wrapper, which maps NVML errors
            code = exc.code or 0
            kind = MigInUseError if code == NVML_ERROR_IN_USE else MigNvmlError
            raise kind(str(exc), call=name, code=code) from exc
        except self._lib.NVMLError as exc:
            code = int(getattr(exc, "value", 0))
            kind = MigInUseError if code == NVML_ERROR_IN_USE else MigNvmlError
            raise kind(f"NVML call {name} failed: {exc} (NVML error {code})", call=name, code=code) from exc

    def handle(self, index: int) -> Any:
        return self._nvml("nvmlDeviceGetHandleByIndex", index)

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """(current, pending) enabled flags; None when the GPU does not support MIG."""
        try:
            current, pending = self._nvml("nvmlDeviceGetMigMode", self.handle(index))
        except MigNvmlError as exc:
            if exc.code == NVML_ERROR_NOT_SUPPORTED:
                return None
            raise
        return current == NVML_DEVICE_MIG_ENABLE, pending == NVML_DEVICE_MIG_ENABLE

    def set_mig_mode(self, index: int, *, enabled: bool) -> int:
        """Returns NVML's activationStatus (0 = applied or pending a reset; IN_USE = GPU not idle)."""
        mode = NVML_DEVICE_MIG_ENABLE if enabled else NVML_DEVICE_MIG_DISABLE
        return int(self._nvml("nvmlDeviceSetMigMode", self.handle(index), mode))

    def reset(self, index: int) -> None:
        bus_id = self._nvml("nvmlDeviceGetPciInfo", self.handle(index)).busId
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode()
        self._resetter.reset(str(bus_id))

    def busy_devices(self, index: int) -> set[str]:
        """UUIDs of the GPU and of its MIG devices that have compute processes running."""
        handle = self.handle(index)
        busy: set[str] = set()
        if self._nvml("nvmlDeviceGetComputeRunningProcesses", handle):
            busy.add(self._text(self._nvml("nvmlDeviceGetUUID", handle)))
        mode = self.mig_mode(index)
        if mode is None or not mode[0]:
            return busy
        for mig in self._mig_device_handles(handle):
            try:
                if self._nvml("nvmlDeviceGetComputeRunningProcesses", mig):
                    busy.add(self._text(self._nvml("nvmlDeviceGetUUID", mig)))
            except MigNvmlError as exc:  # destroyed since it was listed: nothing runs on it
                if exc.code not in _GONE:
                    raise
        return busy

    def _mig_device_handles(self, handle: Any) -> list[Any]:
        """The GPU's MIG-device handles; empty slots (NOT_FOUND) are skipped."""
        found: list[Any] = []
        for position in range(int(self._nvml("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                found.append(self._nvml("nvmlDeviceGetMigDeviceHandleByIndex", handle, position))
            except MigNvmlError as exc:
                if exc.code != NVML_ERROR_NOT_FOUND:
                    raise
        return found

    def mig_uuids(self, index: int) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> MIG UUID of every MIG device on the GPU, from its MIG-device handles."""
        uuids: dict[tuple[int, int], str] = {}
        for mig in self._mig_device_handles(self.handle(index)):
            gi_id = int(self._nvml("nvmlDeviceGetGpuInstanceId", mig))
            ci_id = int(self._nvml("nvmlDeviceGetComputeInstanceId", mig))
            uuids[(gi_id, ci_id)] = self._text(self._nvml("nvmlDeviceGetUUID", mig))
        return uuids

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def profile_ids(self, index: int) -> dict[int, int]:
        """profile index (NVML_GPU_INSTANCE_PROFILE_*) -> profile ID, for the profiles this GPU offers."""
        return {profile_index: profile_id for profile_index, (profile_id, _) in self._profiles(index).items()}

    def _profiles(self, index: int) -> dict[int, tuple[int, int]]:
        """profile index -> (profile ID, max instances); NVML says it is immutable, so it is cached."""
        cached = self._profile_cache.get(index)
        if cached is not None:
            return cached
        handle = self.handle(index)
        found: dict[int, tuple[int, int]] = {}
        for profile_index in range(GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._nvml("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile_index)
            except MigNvmlError as exc:
                if exc.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            found[profile_index] = (int(info.id), max(1, int(info.instanceCount)))
        if found:  # with MIG off some drivers answer NOT_SUPPORTED for every profile: ask again later
            self._profile_cache[index] = found
        return found

    def instances(self, index: int) -> tuple[GpuInstanceRecord, ...]:
        """Every GPU instance with its compute instances, including ones left without any.

        The MIG devices (for the UUIDs) and the GPU/compute instances are separate NVML lists, so a
        compute instance created between the two reads has no UUID yet in the first, and one
        destroyed after its handle was listed answers INVALID_ARGUMENT or NOT_FOUND. The read is
        taken again then (up to ``_READ_ATTEMPTS`` times) before it fails."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                return self._read_instances(index)
            except MigNvmlError as exc:
                changed = isinstance(exc, _UnlistedMigDeviceError) or exc.code in _GONE
                if not changed or attempt == _READ_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _read_instances(self, index: int) -> tuple[GpuInstanceRecord, ...]:
        handle = self.handle(index)
        uuids = self.mig_uuids(index) if self._profiles(index) else {}
        records: list[GpuInstanceRecord] = []
        for profile_index, (profile_id, capacity) in self._profiles(index).items():
            array = (self._lib.c_nvmlGpuInstance_t * capacity)()
            count = ctypes.c_uint(capacity)
            self._nvml("nvmlDeviceGetGpuInstances", handle, profile_id, array, ctypes.byref(count))
            for gi in array[: count.value]:
                gi_info = self._nvml("nvmlGpuInstanceGetInfo", gi)
                records.append(
                    GpuInstanceRecord(
                        gi_id=int(gi_info.id),
                        profile_index=profile_index,
                        profile_id=profile_id,
                        start=int(gi_info.placement.start),
                        size=int(gi_info.placement.size),
                        computes=self._computes(
                            gi, index=index, gi_id=int(gi_info.id), gi_profile_id=profile_id, uuids=uuids
                        ),
                    )
                )
        return tuple(sorted(records, key=lambda r: r.start))

    def _compute_handles(self, gi: Any, gi_profile_id: int) -> list[Any]:
        """Handles of every compute instance in a GPU instance, over all CI profiles it offers."""
        handles: list[Any] = []
        for ci_profile_id, capacity in self._ci_profiles(gi, gi_profile_id):
            array = (self._lib.c_nvmlComputeInstance_t * capacity)()
            count = ctypes.c_uint(capacity)
            self._nvml("nvmlGpuInstanceGetComputeInstances", gi, ci_profile_id, array, ctypes.byref(count))
            handles.extend(array[: count.value])
        return handles

    def _ci_profiles(self, gi: Any, gi_profile_id: int) -> list[tuple[int, int]]:
        """(CI profile ID, max count) offered inside GPU instances of one profile; cached (immutable)."""
        cached = self._ci_profile_cache.get(gi_profile_id)
        if cached is not None:
            return cached
        found: list[tuple[int, int]] = []
        for ci_index in range(COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                profile = self._ci_profile(gi, ci_index)
            except MigNvmlError as exc:
                if exc.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            found.append((int(profile.id), max(1, int(profile.instanceCount))))
        self._ci_profile_cache[gi_profile_id] = found
        return found

    def _ci_profile(self, gi: Any, ci_index: int) -> Any:
        return self._nvml(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gi,
            ci_index,
            COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )

    def _created_uuid(self, index: int, *, gi: Any, ci: Any) -> str:
        """The MIG UUID of a compute instance just created (its MIG device, found by GI/CI id)."""
        gi_id = int(self._nvml("nvmlGpuInstanceGetInfo", gi).id)
        ci_id = int(self._nvml("nvmlComputeInstanceGetInfo", ci).id)
        return self._uuid_of(self.mig_uuids(index), index=index, gi_id=gi_id, ci_id=ci_id)

    @staticmethod
    def _uuid_of(uuids: dict[tuple[int, int], str], *, index: int, gi_id: int, ci_id: int) -> str:
        uuid = uuids.get((gi_id, ci_id))
        if uuid is None:
            raise _UnlistedMigDeviceError(
                f"GPU {index}: compute instance {ci_id} of GPU instance {gi_id} has no MIG device among "
                f"the {len(uuids)} NVML lists (nvmlDeviceGetMigDeviceHandleByIndex); check nvidia-smi -L"
            )
        return uuid

    def _computes(
        self, gi: Any, *, index: int, gi_id: int, gi_profile_id: int, uuids: dict[tuple[int, int], str]
    ) -> tuple[ComputeRecord, ...]:
        found: list[ComputeRecord] = []
        for ci in self._compute_handles(gi, gi_profile_id):
            ci_id = int(self._nvml("nvmlComputeInstanceGetInfo", ci).id)
            found.append(ComputeRecord(ci_id, self._uuid_of(uuids, index=index, gi_id=gi_id, ci_id=ci_id)))
        return tuple(sorted(found, key=lambda c: c.ci_id))

    def create(self, index: int, *, profile_id: int, start: int, size: int, ci_profile_index: int) -> str:
        """Create a GPU instance at ``start`` and one compute instance in it; returns the MIG UUID."""
        gi = self._create_gpu_instance(index, profile_id=profile_id, start=start, size=size)
        ci = self._nvml("nvmlGpuInstanceCreateComputeInstance", gi, self._ci_profile(gi, ci_profile_index).id)
        return self._created_uuid(index, gi=gi, ci=ci)

    def create_gpu_instance_only(self, index: int, *, profile_id: int, start: int, size: int) -> int:
        """Create just the GPU instance (the first half of ``create``); returns its GI id."""
        gi = self._create_gpu_instance(index, profile_id=profile_id, start=start, size=size)
        return int(self._nvml("nvmlGpuInstanceGetInfo", gi).id)

    def _create_gpu_instance(self, index: int, *, profile_id: int, start: int, size: int) -> Any:
        """``nvmlDeviceCreateGpuInstanceWithPlacement`` at ``start``/``size``; the new GI's handle."""
        placement = self._lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        return self._nvml(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            self.handle(index),
            profile_id,
            ctypes.byref(placement),
        )

    def complete(self, index: int, *, gi_id: int, ci_profile_index: int) -> str:
        """Add the compute instance a GPU instance lacks (after a crash between the two creates)."""
        gi = self._nvml("nvmlDeviceGetGpuInstanceById", self.handle(index), gi_id)
        ci = self._nvml("nvmlGpuInstanceCreateComputeInstance", gi, self._ci_profile(gi, ci_profile_index).id)
        return self._created_uuid(index, gi=gi, ci=ci)

    def destroy(self, index: int, *, gi_id: int) -> None:
        """Destroy a GPU instance and its compute instances; already gone is fine."""
        try:
            gi = self._nvml("nvmlDeviceGetGpuInstanceById", self.handle(index), gi_id)
        except MigNvmlError as exc:
            if exc.code == NVML_ERROR_NOT_FOUND:
                return
            raise
        gi_profile_id = int(self._nvml("nvmlGpuInstanceGetInfo", gi).profileId)
        for ci in self._compute_handles(gi, gi_profile_id):
            self._nvml("nvmlComputeInstanceDestroy", ci)
        self._nvml("nvmlGpuInstanceDestroy", gi)
