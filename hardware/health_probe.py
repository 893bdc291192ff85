"""Health reads and writes against the hardware: NVML events and counters, EFA sysfs, GPU reset.

``NvmlHealthProbe`` speaks the pynvml call surface through the library object it is given (the
real ``pynvml`` module through ``hardware.nvml``, or the simulated library), so it never imports
pynvml itself. It returns plain frozen values and maps NVML errors to ``ProbeError`` kinds; it does
not judge health (``health/`` does). Calls may hang: callers run them under their own timeouts.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from devicemodel.errors import GpuweaveError
from hardware.gpu_reset import (
    GpuInUseError,
    Holder,
    RebootRequiredError,
    ResetRefusedError,
    SessionGate,
    device_holders,
    in_use_message,
    nvidia_smi_reset,
)
from hardware.sysfs import read_hw_counters

LOG = logging.getLogger(__name__)
EFA_VENDOR = "0x1d0f"
EFA_DEVICE_PREFIX = "0xefa"
NO_INSTANCE = 0xFFFFFFFF

# NVML constants (nvml.h); read from the library when it defines them.
_XID_EVENT, _DBE_EVENT, _RECOVERY_EVENT = 0x8, 0x2, 0x8000
_ERROR_NOT_SUPPORTED, _ERROR_TIMEOUT, _ERROR_GPU_IS_LOST, _ERROR_IN_USE = 3, 10, 15, 19
_ERROR_RESET_REQUIRED = 16
_MEMORY_ERROR_UNCORRECTED, _MEMORY_ERROR_CORRECTED, _VOLATILE_ECC = 1, 0, 0
_TEMPERATURE_GPU = 0


class ProbeError(GpuweaveError):
    """A hardware read failed; ``kind`` is ``lost``, ``unsupported``, ``timeout`` or ``error``."""

    def __init__(self, message: str, *, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class XidEvent:
    gpu_uuid: str
    event_type: int
    xid: int  # eventData: the Xid, or 999 for an unknown one; 0 for a DBE event
    gpu_instance: int | None
    compute_instance: int | None

    @property
    def is_dbe(self) -> bool:
        return self.event_type == _DBE_EVENT

    @property
    def is_recovery_action(self) -> bool:
        """``xid`` then holds the new ``nvmlDeviceGpuRecoveryAction_t`` value."""
        return self.event_type == _RECOVERY_EVENT


@dataclass(frozen=True)
class GpuReadings:
    """One round of counters for one GPU; None where the GPU does not support the read."""

    volatile_dbe: int | None
    volatile_sbe: int | None
    remapped_rows: tuple[int, int, bool, bool] | None  # correctable, uncorrectable, pending, failure
    retired_pages_pending: bool | None
    nvlinks_down: tuple[int, ...]
    nvlinks_active: int
    temperature_c: int | None
    pcie_width: tuple[int, int] | None  # current, max
    pcie_generation: tuple[int, int] | None  # current, max (drops at idle to save power)


@dataclass(frozen=True)
class EfaAdapter:
    name: str
    netdev: str | None
    operstate: str | None  # "up", "down", "unknown"; None for an EFA-only interface (no netdev)
    # Hardware counters (port and device level, ``hardware.sysfs.read_hw_counters``): the only view
    # of an EFA link, whose verbs port always reads ACTIVE; empty where the kernel has none.
    counters: Mapping[str, int] = field(default_factory=dict, compare=False)


class NvmlHealthProbe:
    """Health reads through a pynvml-shaped library (``lib``) and an EFA sysfs root."""

    def __init__(
        self,
        lib: Any,
        *,
        sysfs_root: Path = Path("/sys"),
        reset: Callable[[str], None] | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self._lib = lib
        self._sysfs_root = sysfs_root
        self._proc_root = proc_root
        self._reset = reset or nvidia_smi_reset
        self._event_set: Any = None
        self._uuid_by_handle: dict[Any, str] = {}
        self._registered: list[str] = []  # GPUs whose events we asked for (renewed after a reset)
        self._events_lock = threading.Lock()  # one event-set user at a time: wait, free, re-create
        self._session = SessionGate()  # our reads vs. a reset that closes our NVML session

    def _const(self, name: str, default: int) -> int:
        return int(getattr(self._lib, name, default))

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._lib.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == self._const("NVML_ERROR_GPU_IS_LOST", _ERROR_GPU_IS_LOST):
                raise ProbeError(f"{what}: GPU is lost (fallen off the bus)", kind="lost") from exc
            if value in (self._const("NVML_ERROR_NOT_SUPPORTED", _ERROR_NOT_SUPPORTED),):
                raise ProbeError(f"{what}: not supported", kind="unsupported") from exc
            if value == self._const("NVML_ERROR_TIMEOUT", _ERROR_TIMEOUT):
                raise ProbeError(f"{what}: timed out", kind="timeout") from exc
            if value == self._const("NVML_ERROR_RESET_REQUIRED", _ERROR_RESET_REQUIRED):
                reboot = f"{what}: the GPU requires a reboot of the node (or VM)"
                raise ProbeError(reboot, kind="reboot") from exc
            raise ProbeError(f"{what}: NVML error {exc}", kind="error") from exc

    def _optional(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return self._call(what, fn)
        except ProbeError as exc:
            if exc.kind == "unsupported":
                return None
            raise

    def _handle(self, uuid: str) -> Any:
        return self._call(f"GPU {uuid}", lambda: self._lib.nvmlDeviceGetHandleByUUID(uuid))

    # --- events -------------------------------------------------------------------------------

    def register_events(self, gpu_uuids: Iterable[str]) -> list[str]:
        """Register Xid and DBE events for the GPUs; returns the UUIDs that could not be registered."""
        self._registered = list(gpu_uuids)
        with self._events_lock:
            return self._create_event_set(self._registered)

    def _create_event_set(self, gpu_uuids: list[str]) -> list[str]:
        lib = self._lib
        self._event_set = self._call("nvmlEventSetCreate", lib.nvmlEventSetCreate)
        wanted = (
            self._const("nvmlEventTypeXidCriticalError", _XID_EVENT)
            | self._const("nvmlEventTypeDoubleBitEccError", _DBE_EVENT)
            | self._const("nvmlEventTypeGpuRecoveryAction", _RECOVERY_EVENT)
        )
        failed = []
        for uuid in gpu_uuids:
            try:
                handle = self._handle(uuid)
                self._uuid_by_handle[_handle_key(handle)] = uuid
                mask = wanted & self._supported_events(handle, default=wanted & ~_RECOVERY_EVENT)
                self._call(
                    f"register events on {uuid}",
                    partial(lib.nvmlDeviceRegisterEvents, handle, mask, self._event_set),
                )
            except ProbeError:
                failed.append(uuid)
        return failed

    def renew_events(self) -> list[str]:
        """A fresh event set for the same GPUs: after a MIG mode change (which may unbind and
        re-create the device) the old registrations no longer deliver that GPU's Xids."""
        with self._events_lock:
            if self._event_set is not None:
                self._optional_free(self._event_set)
                self._event_set = None
            self._uuid_by_handle.clear()
            return self._create_event_set(self._registered) if self._registered else []

    def _supported_events(self, handle: Any, *, default: int) -> int:
        """The event types the GPU supports (older drivers lack the recovery-action event)."""
        query = getattr(self._lib, "nvmlDeviceGetSupportedEventTypes", None)
        if query is None:
            return default
        supported = self._optional("supported event types", partial(query, handle))
        return default if supported is None else int(supported)

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        """The next event, or None when none arrived within ``timeout_ms`` (or while a reset has
        released the event set)."""
        lib = self._lib
        with self._events_lock:
            event_set = self._event_set
            try:
                data = None if event_set is None else self._call(
                    "nvmlEventSetWait", lambda: lib.nvmlEventSetWait_v2(event_set, timeout_ms)
                )
            except ProbeError as exc:
                if exc.kind == "timeout":
                    return None
                raise
        if data is None:
            time.sleep(timeout_ms / 1000)
            return None
        uuid = self._uuid_by_handle.get(_handle_key(data.device))  # a lost GPU cannot name itself
        if uuid is None:
            uuid = self._call("event device UUID", lambda: _text(lib.nvmlDeviceGetUUID(data.device)))
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return XidEvent(
            gpu_uuid=uuid,
            event_type=int(data.eventType),
            xid=int(data.eventData),
            gpu_instance=None if gi == NO_INSTANCE else gi,
            compute_instance=None if ci == NO_INSTANCE else ci,
        )

    # --- periodic reads -----------------------------------------------------------------------

    def read_gpu(self, uuid: str, *, expected_nvlinks: int) -> GpuReadings:
        """Every health counter of one GPU (waits while a reset has our NVML session closed)."""
        with self._session.reading():
            return self._read_gpu(uuid, expected_nvlinks=expected_nvlinks)

    def _read_gpu(self, uuid: str, *, expected_nvlinks: int) -> GpuReadings:
        """Read every health counter of one GPU; raises ``ProbeError`` (kind ``lost``) for a lost GPU."""
        lib, h = self._lib, self._handle(uuid)
        unc, cor, vol = (
            self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _MEMORY_ERROR_UNCORRECTED),
            self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", _MEMORY_ERROR_CORRECTED),
            self._const("NVML_VOLATILE_ECC", _VOLATILE_ECC),
        )
        rows = self._optional("remapped rows", lambda: lib.nvmlDeviceGetRemappedRows(h))
        pending = self._optional("retired pages", lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h))
        width = self._optional(
            "PCIe width",
            lambda: (lib.nvmlDeviceGetCurrPcieLinkWidth(h), lib.nvmlDeviceGetMaxPcieLinkWidth(h)),
        )
        gen = self._optional(
            "PCIe generation",
            lambda: (lib.nvmlDeviceGetCurrPcieLinkGeneration(h), lib.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        )
        down = [
            link
            for link in range(expected_nvlinks)
            if not self._optional(f"NVLink {link}", partial(lib.nvmlDeviceGetNvLinkState, h, link))
        ]
        return GpuReadings(
            volatile_dbe=self._optional("ECC DBE", lambda: lib.nvmlDeviceGetTotalEccErrors(h, unc, vol)),
            volatile_sbe=self._optional("ECC SBE", lambda: lib.nvmlDeviceGetTotalEccErrors(h, cor, vol)),
            remapped_rows=None
            if rows is None
            else (int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])),
            retired_pages_pending=None if pending is None else bool(pending),
            nvlinks_down=tuple(down),
            nvlinks_active=expected_nvlinks - len(down),
            temperature_c=self._optional(
                "temperature", lambda: lib.nvmlDeviceGetTemperature(h, _TEMPERATURE_GPU)
            ),
            pcie_width=None if width is None else (int(width[0]), int(width[1])),
            pcie_generation=None if gen is None else (int(gen[0]), int(gen[1])),
        )

    def gpu_busy(self, uuid: str) -> bool:
        """Whether compute processes still run on the GPU (a reset must wait); a lost GPU runs nothing."""
        try:
            with self._session.reading():
                return self._processes(uuid)
        except ProbeError as exc:
            if exc.kind == "lost":
                return False
            raise

    def _processes(self, uuid: str) -> bool:
        procs = self._optional(
            "running processes", lambda: self._lib.nvmlDeviceGetComputeRunningProcesses(self._handle(uuid))
        )
        return bool(procs)

    def holders(self, uuid: str) -> tuple[Holder, ...]:
        """Other processes with the GPU's device file open (persistenced, DCGM, ...); needs the
        host's /proc (hostPID) to see beyond this pod."""
        query = getattr(self._lib, "nvmlDeviceGetMinorNumber", None)
        if query is None:
            return ()
        try:
            with self._session.reading():
                handle = self._handle(uuid)
                minor = self._call(f"GPU {uuid} minor", partial(query, handle))
        except ProbeError as exc:
            if exc.kind == "lost":
                return ()  # a GPU off the bus names no device file; the reset itself will tell
            raise
        return device_holders(self._proc_root, f"/dev/nvidia{int(minor)}", exclude_pid=os.getpid())

    def reset_gpu(self, uuid: str) -> None:
        """Reset one GPU: ``GpuInUseError`` while compute processes or other clients hold it (not a
        failed reset), ``RebootRequiredError`` when only a reboot can reset it. Our own NVML session
        and event set would hold it too, so they are released around the reset and renewed after
        it, events re-registered for every GPU (a reset invalidates the GPU's registrations)."""
        if self.gpu_busy(uuid):
            raise GpuInUseError(f"GPU {uuid} still runs compute processes; reset after they exit")
        holders = self.holders(uuid)
        if holders:
            raise GpuInUseError(in_use_message(uuid, holders))
        with self._released():
            self._reset_now(uuid)

    def _reset_now(self, uuid: str) -> None:
        try:
            self._reset(uuid)
        except ResetRefusedError:
            raise
        except Exception as exc:
            code = getattr(exc, "code", getattr(exc, "value", None))
            if code == _ERROR_IN_USE:
                raise GpuInUseError(f"GPU {uuid} is in use: {exc}; reset after its users exit") from exc
            if code == self._const("NVML_ERROR_RESET_REQUIRED", _ERROR_RESET_REQUIRED):
                message = f"GPU {uuid} cannot be reset in place ({exc}): reboot the node"
                raise RebootRequiredError(message) from exc
            raise ResetRefusedError(f"reset of GPU {uuid} failed: {exc}") from exc

    @contextmanager
    def _released(self) -> Iterator[None]:
        """Free our event set and close our NVML session for the duration (our reads wait for it);
        then re-open both. NVML users outside this probe see UNINITIALIZED meanwhile and fail closed."""
        with self._session.closed(), self._closed_session():
            yield

    @contextmanager
    def _closed_session(self) -> Iterator[None]:
        """The event lock is held only while the set is freed and re-created, so the event loop
        keeps beating (it finds no set and sleeps) through a reset however long it takes."""
        shutdown, init = (getattr(self._lib, name, None) for name in ("nvmlShutdown", "nvmlInit"))
        with self._events_lock:
            if self._event_set is not None:
                self._optional_free(self._event_set)
                self._event_set = None
            if shutdown is not None:
                shutdown()
        try:
            yield
        finally:
            with self._events_lock:
                if init is not None:
                    init()
                self._uuid_by_handle.clear()
                failed = self._create_event_set(self._registered) if self._registered else []
            if failed:
                LOG.warning("after the reset, NVML events could not be renewed on %s", ", ".join(failed))

    def _optional_free(self, event_set: Any) -> None:
        try:
            self._call("nvmlEventSetFree", lambda: self._lib.nvmlEventSetFree(event_set))
        except ProbeError as exc:
            LOG.warning("cannot free the NVML event set before a reset: %s", exc)

    def read_efa(self) -> tuple[EfaAdapter, ...]:
        """EFA adapters found by PCI vendor/device (never by name) with their netdev link state and
        hardware counters."""
        return read_efa_adapters(self._sysfs_root)


def read_efa_adapters(sysfs_root: Path) -> tuple[EfaAdapter, ...]:
    found = []
    base = sysfs_root / "class" / "infiniband"
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        vendor = _read(dev / "device" / "vendor")
        device = _read(dev / "device" / "device")
        if vendor != EFA_VENDOR or not (device or "").startswith(EFA_DEVICE_PREFIX):
            continue
        net = dev / "device" / "net"
        netdevs = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        netdev = netdevs[0] if netdevs else None
        operstate = _read(net / netdev / "operstate") if netdev else None
        found.append(EfaAdapter(dev.name, netdev, operstate, read_hw_counters(dev)))
    return tuple(found)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle: the pointer value of a ctypes handle, else the handle."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
