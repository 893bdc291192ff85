"""Simulated MIG state of one GPU, with the semantics NVML documents.

- Mode: ``set_mode`` on Ampere records a *pending* mode that only a reset of that GPU (idle, no
  instances busy) makes current; on Hopper and later it takes effect at once, refused with IN_USE
  while GPU instances exist or the GPU runs work. A driver reload clears every instance and, on
  Hopper and later, turns MIG off (Ampere keeps the mode in its InfoROM).
- GPU instances are created at an explicit placement in memory-slot units; an occupied slot, the
  profile's max count or the compute slices exhausted give INSUFFICIENT_RESOURCES, an invalid
  placement INVALID_ARGUMENT. Destroy gives IN_USE while compute instances or processes remain.
- Each compute instance is a MIG device with a fresh ``MIG-<uuid>`` (re-creation changes it). As in
  NVML, the compute-instance handle and the MIG-device handle are different objects: the first
  is for compute-instance calls, the second (from ``nvmlDeviceGetMigDeviceHandleByIndex``) for
  device calls such as ``nvmlDeviceGetUUID``.
- GI IDs are the smallest free ones, so they are reused as on real drivers.

Errors are ``SimNvmlError(code)`` with NVML's numeric codes; the pynvml-shaped lib turns them into
its NVMLError classes. Simulation controls (``set_busy``, ``set_gpu_busy``, ``driver_reload``,
``reset``) model what processes and administrators do.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass, field

from devicemodel.inventory import MigDevice
from hardware.mig_catalog import GiProfile, GpuModel, Placement

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
# Profile indexes 0..0x10 exist (an index the GPU does not offer: NOT_SUPPORTED); 0x11 and past are
# INVALID_ARGUMENT, as a real H200 on driver 580.159.04 answered (tests/fixtures/nvml/).
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x11
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
_CI_SLICES_BY_INDEX = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
_MIG_UUID_NAMESPACE = uuid.UUID("6f1c2c4e-9d1b-4c55-8b7a-7a0f3f6f2b10")


def ci_profile_id(slices: int) -> int:
    """NVML's compute-instance profile ID (``NVML_COMPUTE_INSTANCE_PROFILE_*``) for a slice count."""
    return next(index for index, count in _CI_SLICES_BY_INDEX.items() if count == slices)


class SimNvmlError(Exception):
    """An NVML return code from the simulation; ``code`` is nvmlReturn_t."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(f"NVML error {code}: {detail}" if detail else f"NVML error {code}")
        self.code = code


@dataclass
class SimComputeInstance:
    id: int
    slices: int
    handle: int  # the nvmlComputeInstance_t
    mig_uuid: str
    device_handle: int  # the MIG device's nvmlDevice_t
    busy: bool = False


@dataclass
class SimGpuInstance:
    id: int
    profile: GiProfile
    start: int
    handle: int
    computes: dict[int, SimComputeInstance] = field(default_factory=dict)

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.profile.memory_slices)

    @property
    def busy(self) -> bool:
        return any(ci.busy for ci in self.computes.values())


class HandleAllocator:
    """Opaque handles as integers (ctypes ``c_void_p`` values), unique across the node."""

    def __init__(self, first: int = 0x7000_0000) -> None:
        self.first = first
        self._next = itertools.count(first)

    def new(self) -> int:
        return next(self._next)


class SimMigGpu:
    """MIG state of one simulated GPU; all methods are thread-safe."""

    def __init__(
        self,
        *,
        model: GpuModel,
        gpu_uuid: str,
        handles: HandleAllocator,
        mig_enabled: bool = False,
    ) -> None:
        self.model = model
        self.gpu_uuid = gpu_uuid
        self._handles = handles
        self._lock = threading.RLock()
        self._current = NVML_DEVICE_MIG_ENABLE if mig_enabled else NVML_DEVICE_MIG_DISABLE
        self._pending = self._current
        self._instances: dict[int, SimGpuInstance] = {}
        self._gpu_busy = False
        self._serial = itertools.count(1)
        self.resets = 0

    # -- mode --------------------------------------------------------------------------------

    @property
    def mig_enabled(self) -> bool:
        return self._current == NVML_DEVICE_MIG_ENABLE

    def mode(self) -> tuple[int, int]:
        return self._current, self._pending

    def set_mode(self, mode: int) -> int:
        """NVML's activationStatus: SUCCESS, or IN_USE when the change cannot take effect now."""
        if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
            raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"MIG mode {mode}")
        with self._lock:
            if self.model.resets_for_mode_change:
                self._pending = mode
                return NVML_SUCCESS
            if mode != self._current and (self._instances or self._gpu_busy):
                return NVML_ERROR_IN_USE
            self._current = self._pending = mode
            return NVML_SUCCESS

    def reset(self) -> None:
        """GPU reset (``nvidia-smi -r -i``): needs the GPU idle; clears instances, applies pending mode."""
        with self._lock:
            if self._gpu_busy or any(gi.busy for gi in self._instances.values()):
                raise SimNvmlError(NVML_ERROR_IN_USE, f"GPU {self.gpu_uuid} has running processes")
            self._instances.clear()
            self._current = self._pending
            self.resets += 1

    def driver_reload(self) -> None:
        """Reboot or driver reload: instances are gone; Hopper and later also lose MIG mode."""
        with self._lock:
            self._instances.clear()
            self._gpu_busy = False
            if self.model.resets_for_mode_change:
                self._current = self._pending
            else:
                self._current = self._pending = NVML_DEVICE_MIG_DISABLE

    @property
    def gpu_busy(self) -> bool:
        return self._gpu_busy

    def set_gpu_busy(self, busy: bool) -> None:
        """A process runs on the whole GPU (no MIG) — blocks resets and Hopper mode changes."""
        with self._lock:
            self._gpu_busy = busy

    # -- profiles and placements -------------------------------------------------------------

    def profile_info(self, profile_index: int) -> GiProfile:
        if not 0 <= profile_index < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"GPU instance profile index {profile_index}")
        profile = self.model.profile_by_index(profile_index)
        if profile is None:
            raise SimNvmlError(NVML_ERROR_NOT_SUPPORTED, f"profile index {profile_index} on {self.model.key}")
        return profile

    def profile_by_id(self, profile_id: int) -> GiProfile:
        for profile in self.model.profiles:
            if profile.profile_id == profile_id:
                return profile
        raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"GPU instance profile ID {profile_id}")

    def possible_placements(self, profile_id: int) -> tuple[Placement, ...]:
        return self.profile_by_id(profile_id).placements

    def remaining_capacity(self, profile_id: int) -> int:
        profile = self.profile_by_id(profile_id)
        with self._lock:
            self._require_mig()
            occupied = self._occupied()
            count = 0
            for placement in profile.placements:
                if not occupied & placement.mask:
                    occupied |= placement.mask
                    count += 1
            existing = sum(1 for gi in self._instances.values() if gi.profile == profile)
            compute_left = self.model.compute_slices - self._compute_used()
            return max(0, min(count, profile.max_count - existing, compute_left // profile.compute_slices))

    # -- GPU instances -----------------------------------------------------------------------

    def create_gpu_instance(self, profile_id: int, start: int, size: int) -> SimGpuInstance:
        profile = self.profile_by_id(profile_id)
        if start not in profile.starts or size != profile.memory_slices:
            raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"placement {start}:{size} for {profile.name}")
        with self._lock:
            self._require_mig()
            placement = Placement(start, size)
            existing = sum(1 for gi in self._instances.values() if gi.profile == profile)
            if (
                self._occupied() & placement.mask
                or existing >= profile.max_count
                or self._compute_used() + profile.compute_slices > self.model.compute_slices
            ):
                raise SimNvmlError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"{profile.name} at {start}:{size}")
            gi_id = next(i for i in itertools.count(1) if i not in self._instances)
            instance = SimGpuInstance(gi_id, profile, start, self._handles.new())
            self._instances[gi_id] = instance
            return instance

    def destroy_gpu_instance(self, gi_id: int) -> None:
        with self._lock:
            instance = self.gpu_instance(gi_id)
            if instance.computes:
                raise SimNvmlError(NVML_ERROR_IN_USE, f"GPU instance {gi_id} has compute instances")
            del self._instances[gi_id]

    def gpu_instance(self, gi_id: int) -> SimGpuInstance:
        with self._lock:
            self._require_mig()
            try:
                return self._instances[gi_id]
            except KeyError:
                raise SimNvmlError(NVML_ERROR_NOT_FOUND, f"GPU instance {gi_id}") from None

    def gpu_instances(self, profile_id: int | None = None) -> tuple[SimGpuInstance, ...]:
        with self._lock:
            self._require_mig()
            found = sorted(self._instances.values(), key=lambda gi: gi.id)
            return tuple(gi for gi in found if profile_id is None or gi.profile.profile_id == profile_id)

    # -- compute instances -------------------------------------------------------------------

    def ci_slices(self, gi: SimGpuInstance, ci_profile_index: int) -> int:
        slices = _CI_SLICES_BY_INDEX.get(ci_profile_index)
        if not 0 <= ci_profile_index < NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise SimNvmlError(NVML_ERROR_INVALID_ARGUMENT, f"compute profile index {ci_profile_index}")
        if slices is None or slices > gi.profile.compute_slices:
            raise SimNvmlError(
                NVML_ERROR_NOT_SUPPORTED, f"compute profile {ci_profile_index} in {gi.profile.name}"
            )
        return slices

    def create_compute_instance(self, gi_id: int, ci_profile_id: int) -> SimComputeInstance:
        with self._lock:
            gi = self.gpu_instance(gi_id)
            slices = self.ci_slices(gi, ci_profile_id)
            used = sum(ci.slices for ci in gi.computes.values())
            if used + slices > gi.profile.compute_slices:
                raise SimNvmlError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"compute slices in GI {gi_id}")
            ci_id = next(i for i in itertools.count(0) if i not in gi.computes)
            key = f"{self.gpu_uuid}/{gi_id}/{ci_id}/{next(self._serial)}"
            mig_uuid = f"MIG-{uuid.uuid5(_MIG_UUID_NAMESPACE, key)}"
            ci = SimComputeInstance(ci_id, slices, self._handles.new(), mig_uuid, self._handles.new())
            gi.computes[ci_id] = ci
            return ci

    def destroy_compute_instance(self, gi_id: int, ci_id: int) -> None:
        with self._lock:
            gi = self.gpu_instance(gi_id)
            ci = gi.computes.get(ci_id)
            if ci is None:
                raise SimNvmlError(NVML_ERROR_NOT_FOUND, f"compute instance {ci_id} of GI {gi_id}")
            if ci.busy:
                raise SimNvmlError(NVML_ERROR_IN_USE, f"MIG device {ci.mig_uuid} runs processes")
            del gi.computes[ci_id]

    def adopt(self, device: MigDevice) -> None:
        """Start with a MIG device the node profile declares (its ids and UUID as given)."""
        with self._lock:
            profile = self.model.profile(device.profile)
            gi = self._instances.get(device.gpu_instance_id)
            if gi is None:
                gi = SimGpuInstance(
                    device.gpu_instance_id, profile, device.placement_start, self._handles.new()
                )
                self._instances[gi.id] = gi
            ci = SimComputeInstance(
                device.compute_instance_id,
                profile.compute_slices,
                self._handles.new(),
                device.uuid,
                self._handles.new(),
            )
            gi.computes[ci.id] = ci
            self._current = self._pending = NVML_DEVICE_MIG_ENABLE

    # -- MIG devices ---------------------------------------------------------------------------

    def mig_devices(self) -> tuple[tuple[SimGpuInstance, SimComputeInstance], ...]:
        """Every (GI, CI) pair in NVML's enumeration order (GI id, then CI id)."""
        with self._lock:
            if not self.mig_enabled:
                return ()
            return tuple(
                (gi, gi.computes[ci_id])
                for gi in sorted(self._instances.values(), key=lambda g: g.id)
                for ci_id in sorted(gi.computes)
            )

    def set_busy(self, mig_uuid: str, busy: bool = True) -> None:
        """A process starts (or stops) on one MIG device."""
        with self._lock:
            for _, ci in self.mig_devices():
                if ci.mig_uuid == mig_uuid:
                    ci.busy = busy
                    return
        raise KeyError(f"GPU {self.gpu_uuid} has no MIG device {mig_uuid}")

    def find_handle(self, value: int) -> tuple[SimGpuInstance, SimComputeInstance | None] | None:
        """The GPU instance (and compute instance) a GI, CI or MIG-device handle names here, if any."""
        with self._lock:
            for gi in self._instances.values():
                if gi.handle == value:
                    return gi, None
                for ci in gi.computes.values():
                    if value in (ci.handle, ci.device_handle):
                        return gi, ci
        return None

    # -- helpers -----------------------------------------------------------------------------

    def _require_mig(self) -> None:
        if not self.mig_enabled:
            raise SimNvmlError(NVML_ERROR_NOT_SUPPORTED, f"MIG mode is off on {self.gpu_uuid}")

    def _occupied(self) -> int:
        mask = 0
        for gi in self._instances.values():
            mask |= gi.placement.mask
        return mask

    def _compute_used(self) -> int:
        return sum(gi.profile.compute_slices for gi in self._instances.values())
