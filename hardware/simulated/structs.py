# ruff: noqa: N815 - the fake keeps pynvml's constant, class and field names
"""pynvml's constants, error class and result structures, for the simulated library.

Values are NVML's (``nvml.h``), the same numbers ``pynvml`` exports; a contract test compares
them with the installed pynvml so the fake cannot drift. Strings are ``str`` as modern pynvml
returns them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass


class NvmlConstants:
    """The NVML_* constants callers read from the library object."""

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_ALREADY_INITIALIZED = 5
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_ERROR_INSUFFICIENT_POWER = 8
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_IRQ_ISSUE = 11
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_CORRUPTED_INFOROM = 14
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    NVML_ERROR_OPERATING_SYSTEM = 17
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_IN_USE = 19
    NVML_ERROR_MEMORY = 20
    NVML_ERROR_NO_DATA = 21
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23
    NVML_ERROR_UNKNOWN = 999

    NVML_DEVICE_ARCH_KEPLER = 2
    NVML_DEVICE_ARCH_MAXWELL = 3
    NVML_DEVICE_ARCH_PASCAL = 4
    NVML_DEVICE_ARCH_VOLTA = 5
    NVML_DEVICE_ARCH_TURING = 6
    NVML_DEVICE_ARCH_AMPERE = 7
    NVML_DEVICE_ARCH_ADA = 8
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_DEVICE_ARCH_BLACKWELL = 10
    NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_TOPOLOGY_INTERNAL = 0
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50
    NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
    NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
    NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
    NVML_GPU_FABRIC_STATE_COMPLETED = 3
    NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY = 4
    NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY = 0x3
    NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE = 1
    NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE = 2
    NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION = 8
    NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION = 0xF
    NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE = 1


_ERROR_TEXT = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    16: "GPU requires restart",
    19: "In use by another client",
    23: "Insufficient resources",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml.NVMLError's shape: ``NVMLError(code)``, ``.value`` the code, ``str()`` its text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


@dataclass(frozen=True)
class PciInfo:
    """``nvmlPciInfo_t`` as pynvml returns it (``busId`` a str)."""

    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int

    @classmethod
    def of(cls, bus_id: str, *, device_id: int = 0) -> PciInfo:
        domain, bus, rest = bus_id.split(":")
        slot = rest.split(".")[0]
        legacy = f"{int(domain, 16):04X}:{bus}:{rest}"
        return cls(bus_id, legacy, int(domain, 16), int(bus, 16), int(slot, 16), device_id, 0)


@dataclass(frozen=True)
class Memory:
    """``c_nvmlMemory_t`` (bytes)."""

    total: int
    free: int
    used: int


@dataclass(frozen=True)
class DeviceAttributes:
    """``c_nvmlDeviceAttributes`` (``memorySizeMB`` is MiB, as NVML reports it)."""

    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


nvmlGpuFabricInfo_v2 = 0x02000024  # noqa: N816 (pynvml's name): the struct's version word


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    """``nvmlGpuFabricInfo_v2_t``, filled through a pointer as NVML fills it (``ctypes.byref``)."""

    _fields_ = (
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    )

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t  # noqa: N816 (pynvml's alias)
