"""The CUDA driver API through ctypes: ``libcuda.so.1`` from the driver, no toolkit, no new dependency.

Only the calls the exerciser makes are bound, each with its argument types, under the names the
driver has exported since CUDA 4 (``cuCtxCreate_v2``, ``cuMemAlloc_v2``, ...): a driver keeps every
old symbol for the binaries built against it, so these resolve on CUDA 11, 12 and 13 drivers alike.
Every call's ``CUresult`` is checked; a failure raises ``CudaError`` with the driver's error name.
ctypes releases the GIL inside a foreign call, so one thread per GPU runs its GPU's checks at once.

This module is imported only by the exerciser's child process (``hardware.exerciser.child``): a
driver call that hangs hangs that process, which its parent kills at the run's deadline.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hardware.exerciser.protocol import ExerciserError

LIBRARY = "libcuda.so.1"
# Where a driver root (the host's, mounted at --driver-root; the GPU operator's driver container)
# keeps the library, tried before the loader's own search.
LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib")
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704

_P = ctypes.c_void_p
_U = ctypes.c_uint
_I = ctypes.c_int
_SIZE = ctypes.c_size_t
_DPTR = ctypes.c_uint64  # CUdeviceptr
_PP = ctypes.POINTER(ctypes.c_void_p)
_PI = ctypes.POINTER(ctypes.c_int)
# name(s) -> argument types; the first name the library exports is bound.
SIGNATURES: dict[tuple[str, ...], list[type]] = {
    ("cuInit",): [_U],
    ("cuDriverGetVersion",): [_PI],
    ("cuGetErrorName",): [_I, ctypes.POINTER(ctypes.c_char_p)],
    ("cuDeviceGetByPCIBusId",): [_PI, ctypes.c_char_p],
    ("cuDeviceGetUuid",): [ctypes.c_char_p, _I],
    ("cuDeviceGetAttribute",): [_PI, _I, _I],
    ("cuDeviceCanAccessPeer",): [_PI, _I, _I],
    ("cuCtxCreate_v2", "cuCtxCreate"): [_PP, _U, _I],
    ("cuCtxDestroy_v2", "cuCtxDestroy"): [_P],
    ("cuCtxSetCurrent",): [_P],
    ("cuCtxSynchronize",): [],
    ("cuCtxEnablePeerAccess",): [_P, _U],
    ("cuModuleLoadDataEx",): [_PP, ctypes.c_char_p, _U, _PI, _PP],
    ("cuModuleGetFunction",): [_PP, _P, ctypes.c_char_p],
    ("cuModuleUnload",): [_P],
    ("cuLaunchKernel",): [_P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP],
    ("cuMemGetInfo_v2", "cuMemGetInfo"): [ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE)],
    ("cuMemAlloc_v2", "cuMemAlloc"): [ctypes.POINTER(_DPTR), _SIZE],
    ("cuMemFree_v2", "cuMemFree"): [_DPTR],
    ("cuMemAllocHost_v2", "cuMemAllocHost"): [_PP, _SIZE],
    ("cuMemFreeHost",): [_P],
    ("cuMemsetD32_v2", "cuMemsetD32"): [_DPTR, _U, _SIZE],
    ("cuMemcpyHtoD_v2", "cuMemcpyHtoD"): [_DPTR, _P, _SIZE],
    ("cuMemcpyDtoH_v2", "cuMemcpyDtoH"): [_P, _DPTR, _SIZE],
    ("cuMemcpyPeer",): [_DPTR, _P, _DPTR, _P, _SIZE],
    ("cuMemcpyPeerAsync",): [_DPTR, _P, _DPTR, _P, _SIZE, _P],
    ("cuEventCreate",): [_PP, _U],
    ("cuEventRecord",): [_P, _P],
    ("cuEventSynchronize",): [_P],
    ("cuEventElapsedTime",): [ctypes.POINTER(ctypes.c_float), _P, _P],
    ("cuEventDestroy_v2", "cuEventDestroy"): [_P],
}


class CudaError(ExerciserError):
    """A driver call failed; ``code`` is its ``CUresult``."""

    def __init__(self, message: str, *, call: str = "", code: int | None = None) -> None:
        super().__init__(message, call=call, code=code)


def load_library(driver_root: Path = Path("/")) -> ctypes.CDLL:
    """``libcuda.so.1`` from under ``driver_root`` when it is there, else from the loader's path."""
    candidates = [driver_root / d / LIBRARY for d in LIBRARY_DIRS] if driver_root != Path("/") else []
    problems = []
    for path in [*(str(c) for c in candidates if c.exists()), LIBRARY]:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            problems.append(str(exc))
    raise ExerciserError(
        f"cannot load {LIBRARY} ({'; '.join(problems)[:300]}); the active check needs the driver's CUDA "
        "library: run with NVIDIA_DRIVER_CAPABILITIES including compute, or name --driver-root"
    )


class CudaDriver:
    """The bound calls of one loaded library; ``call`` checks each ``CUresult``."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._functions: dict[str, Any] = {}  # ctypes function pointers, argtypes and restype set
        for names, argtypes in SIGNATURES.items():
            function = _first(lib, names)
            function.argtypes = argtypes
            function.restype = _I
            self._functions[names[0].removesuffix("_v2")] = function

    def call(self, name: str, *args: object) -> None:
        code = int(self._functions[name](*args))
        if code != 0:
            raise CudaError(f"{name} failed: {self.error_name(code)} ({code})", call=name, code=code)

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if int(self._functions["cuGetErrorName"](code, ctypes.byref(text))) != 0 or not text.value:
            return "CUDA_ERROR_UNKNOWN"
        return text.value.decode(errors="replace")

    def version(self) -> int:
        value = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(value))
        return value.value

    def attribute(self, device: int, attribute: int) -> int:
        value = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
        return value.value

    def device(self, pci_bus_id: str) -> int:
        handle = ctypes.c_int()
        self.call("cuDeviceGetByPCIBusId", ctypes.byref(handle), cuda_bus_id(pci_bus_id).encode())
        return handle.value

    def uuid(self, device: int) -> str:
        raw = ctypes.create_string_buffer(16)
        self.call("cuDeviceGetUuid", raw, device)
        return format_uuid(raw.raw)

    def launch(
        self, function: int, *, grid: int, block: int, args: Sequence[ctypes._SimpleCData[Any]]
    ) -> None:
        """Launch on the current context's default stream; ``args`` stay alive through the call."""
        pointers = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args]
        )
        self.call("cuLaunchKernel", function, grid, 1, 1, block, 1, 1, 0, None, pointers, None)

    def load_module(self, ptx: str) -> int:
        """Compile ``ptx`` with the driver's JIT; a failure carries the JIT's error log."""
        module, log = ctypes.c_void_p(), ctypes.create_string_buffer(8192)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        try:
            self.call("cuModuleLoadDataEx", ctypes.byref(module), ptx.encode() + b"\0", 2, options, values)
        except CudaError as exc:
            text = log.value.decode(errors="replace").strip()[:400]
            raise CudaError(f"{exc}: {text or 'no JIT log'}", call=exc.call, code=exc.code) from exc
        return int(module.value or 0)

    def function(self, module: int, name: str) -> int:
        handle = ctypes.c_void_p()
        self.call("cuModuleGetFunction", ctypes.byref(handle), module, name.encode())
        return int(handle.value or 0)


def _first(lib: ctypes.CDLL, names: tuple[str, ...]) -> Any:
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise ExerciserError(f"{LIBRARY} exports none of {', '.join(names)}: driver too old or not NVIDIA's")


def cuda_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as the driver API writes it, ``0000:3b:00.0``."""
    parts = nvml_bus_id.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    try:
        domain, bus, rest = int(parts[-3], 16), int(parts[-2], 16), parts[-1].lower()
        device, _, function = rest.partition(".")
        return f"{domain:04x}:{bus:02x}:{int(device, 16):02x}.{int(function or '0', 16):x}"
    except (IndexError, ValueError) as exc:
        raise ExerciserError(f"PCI bus id {nvml_bus_id!r} is not DOMAIN:BUS:DEVICE.FUNCTION") from exc


def format_uuid(raw: bytes) -> str:
    """16 UUID bytes as NVML prints a GPU UUID (``GPU-8-4-4-4-12`` hex)."""
    text = raw[:16].hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
