"""The NVSwitch fabric gate for the node agent (``NodeAgentBuilder.fabric``), over its backend.

On a GPU host the fabric is read through the backend's NVML caller and the host's ``/run`` and
``/proc`` (the DaemonSet mounts ``/run/nvidia-fabricmanager`` and runs with ``hostPID``); with a
simulated backend, through the simulated library and the fake tree's root, where the simulated
Fabric Manager keeps its files.
"""

from __future__ import annotations

from pathlib import Path

from devicemodel.errors import GpuweaveError
from hardware.backend import GpuBackend
from hardware.fabric import FabricReader
from hardware.nvml import NvmlBackend
from hardware.simulated.backend import SimulatedBackend
from health.signals.fabric import FabricGate
from nodeagent.agent import NodeAgent


def fabric_gate(agent: NodeAgent, backend: GpuBackend, *, interval_s: float) -> FabricGate:
    """The gate for ``agent``; call ``check(inventory)`` before the agent starts, then ``start``."""
    if isinstance(backend, SimulatedBackend):
        reader = FabricReader(backend.nvml.caller, host_root=backend.sysfs_root)
    elif isinstance(backend, NvmlBackend):
        reader = FabricReader(backend.caller, host_root=Path("/"))
    else:
        raise GpuweaveError(f"no NVSwitch fabric reader for a {type(backend).__name__} backend")
    return FabricGate(reader.read, agent, interval_s=interval_s)
