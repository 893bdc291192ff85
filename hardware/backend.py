"""The hardware backend protocol and the errors every backend raises.

A backend turns the machine into a ``NodeInventory``. The NVML backend reads the real driver and
sysfs; the simulated backend runs those same readers against a fake pynvml library and a fake
sysfs tree. Callers depend only on this protocol and these error types, never on pynvml's.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory


@runtime_checkable
class GpuBackend(Protocol):
    """Discovers the node's GPUs, MIG devices, links, PCIe tree, NUMA nodes and NICs."""

    def discover(self) -> NodeInventory:
        """Read the hardware now; raises ``HardwareError`` (never a library's own error)."""
        ...

    def close(self) -> None:
        """Release the driver session; safe to call twice."""
        ...


class HardwareError(GpuweaveError):
    """A hardware read or driver call failed.

    ``call`` names the driver call (``nvmlDeviceGetUUID``) and ``code`` is the driver's return
    code (NVML's ``nvmlReturn_t``) when there is one, so callers can branch without string parsing.
    """

    def __init__(self, message: str, *, call: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.code = code


class GpuLostError(HardwareError):
    """The GPU fell off the bus or stopped answering (NVML_ERROR_GPU_IS_LOST): it needs a reset."""


class NotSupportedError(HardwareError):
    """The device or driver does not support the call (for example MIG on a V100)."""


class NoPermissionError(HardwareError):
    """The process may not make the call (run as root or with the device nodes mounted)."""


class HardwareTimeoutError(HardwareError):
    """A driver call did not return within its deadline; the driver is treated as hung."""


class DriverNotLoadedError(HardwareError):
    """No NVIDIA driver or NVML library on this host."""


class NotFoundError(HardwareError):
    """The addressed object (GPU, MIG device, instance) does not exist (NVML_ERROR_NOT_FOUND)."""
