"""The simulated pynvml library: one object with pynvml's function names, over a ``SimulatedNode``.

It is composed from call mixins listed in one place, ``SimulatedNvmlLib``'s bases. To extend
the fake, write a mixin with pynvml's names and add it to that list; earlier bases win, so a
mixin placed first may refine a call and reach the next one with ``super()``:

- ``MigCallsMixin`` (hardware/simulated/mig_calls.py): MIG mode, GPU/compute instances, placements
  and MIG-device handles, over ``SimMigNode``.
- ``NvLinkCalls``, ``DeviceCalls``, ``SystemCalls``, ``InitCalls`` (device_calls.py): init,
  driver versions, GPUs, PCI info, memory, architecture, NUMA, NVLink wiring.
- ``ProcessCallsMixin`` (process_calls.py): running processes (MPS clients too), per-process
  utilisation samples and accounting, over ``SimProcessTable``; before the health calls, whose
  process list it refines.
- ``HealthCallsMixin`` (health_calls.py): events (Xid), ECC, remapped rows, temperatures, PCIe
  width, over ``SimHealthState``.

The host class supplies what the mixins ask of it: ``NVMLError``, ``nvmlDeviceGetIndex``,
``mig_node``, ``health`` and the ``_health_*`` hooks, and routes every call through the node's gates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hardware.simulated.device_calls import DeviceCalls, InitCalls, NvLinkCalls, SystemCalls
from hardware.simulated.health_calls import HealthCallsMixin, SimGpuHealth
from hardware.simulated.mig_calls import MigCallsMixin
from hardware.simulated.node import SimulatedNode
from hardware.simulated.process_calls import ProcessCallsMixin
from hardware.simulated.structs import NVMLError

T = TypeVar("T")


class SimulatedNvmlLib(
    MigCallsMixin, NvLinkCalls, ProcessCallsMixin, HealthCallsMixin, DeviceCalls, SystemCalls, InitCalls
):
    """A pynvml look-alike for one simulated node; pass it as ``NvmlBackend(lib=...)``."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.mig_node = node.mig
        self.health = node.health
        self.processes = node.processes
        self._init_count = 0
        node.health.nvml_sessions = lambda: self._init_count  # our session holds every GPU, as NVML's does

    # -- hooks the mixins ask for --------------------------------------------------------------

    def _health_index(self, handle: Any) -> int:
        index = self.node.index_of(handle)
        if index is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def _health_handle(self, index: int) -> Any:
        return self.node.handle_of(index)

    def _health_error(self, code: int) -> Exception:
        return NVMLError(code)

    def _health_gpu(self, handle: Any) -> SimGpuHealth:
        index = self._health_index(handle)
        self._enter("health", index)
        return super()._health_gpu(handle)

    def _mig_call(self, thunk: Callable[[], T]) -> T:
        self._enter("mig")
        return super()._mig_call(thunk)
