"""NVSwitch fabric state: whether CUDA can start on an HGX board's GPUs yet.

On NVSwitch systems (HGX A100/H100/H200) every CUDA context fails with error 802 ("system not yet
initialized") until the fabric is trained, so a GPU the driver answers for may still be useless.
Two sources, by generation:

- Hopper and later report it per GPU through ``nvmlDeviceGetGpuFabricInfoV``: a state
  (not started, in progress, completed), the status of a completed training, and a health mask
  (an unhealthy route or a wrong configuration makes a completed fabric unusable).
- Ampere answers that call NOT_SUPPORTED, and a GPU the driver knows no fabric for answers it
  with state 0, ``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` (a one-GPU H200 VM does, driver
  580.159.04: ``tests/fixtures/nvml/``); both take the Fabric Manager check. Ampere's fabric
  is trained by the Fabric Manager service on the host, so the service must be running: its pid
  file (``/run/nvidia-fabricmanager``, mounted from the host) names a process whose ``comm`` is
  ``nv-fabricmanager`` in the host's ``/proc`` (seen with ``hostPID``). A pid that cannot be seen
  counts as not running (fail closed).

Reads return plain values; ``health.signals.fabric`` decides what to withhold.
"""

from __future__ import annotations

import ctypes
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from devicemodel.inventory import NodeInventory
from hardware.backend import GpuLostError, NotSupportedError
from hardware.nvml_call import NvmlCaller

FM_PID_FILE = Path("run/nvidia-fabricmanager/nv-fabricmanager.pid")
FM_PROCESS = "nv-fabricmanager"
_STATE_NOT_SUPPORTED, _STATE_NOT_STARTED, _STATE_IN_PROGRESS, _STATE_COMPLETED = 0, 1, 2, 3
_ROUTE_SHIFT, _CONFIG_SHIFT = 4, 8
_ROUTE_UNHEALTHY_TRUE, _CONFIG_NONE = 1, 1
_NO_CLUSTER = str(uuid.UUID(int=0))


class FabricState(StrEnum):
    NOT_STARTED = "not-started"
    IN_PROGRESS = "in-progress"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class GpuFabric:
    uuid: str
    state: FabricState
    detail: str  # what was read, and the next step when not completed
    cluster_uuid: str = ""  # the NVLink domain (rack) the GPU's fabric belongs to; "" when none
    clique_id: int = 0  # the NVLink partition inside that domain

    @property
    def clique(self) -> str | None:
        """``<cluster UUID>.<clique ID>`` as GFD's ``nvidia.com/gpu.clique`` label writes it.

        None without a multi-node NVLink domain: a fabric that is not completed, or an all-zero
        cluster UUID (a single-node NVSwitch board).
        """
        if not self.ready or not self.cluster_uuid or self.cluster_uuid == _NO_CLUSTER:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"

    @property
    def ready(self) -> bool:
        return self.state is FabricState.COMPLETED


@dataclass(frozen=True)
class FabricReport:
    """The fabric as seen from each NVSwitch-attached GPU that answers; empty without NVSwitch."""

    gpus: tuple[GpuFabric, ...] = ()

    @property
    def ready(self) -> bool:
        return all(g.ready for g in self.gpus)

    def summary(self) -> str:
        waiting = [g for g in self.gpus if not g.ready]
        if not waiting:
            return f"NVSwitch fabric completed on {len(self.gpus)} GPU(s)"
        return f"NVSwitch fabric not ready on {len(waiting)} of {len(self.gpus)} GPU(s): {waiting[0].detail}"


class FabricReader:
    """Reads fabric state through ``caller`` (NVML with a deadline) and the host files below ``host_root``."""

    def __init__(self, caller: NvmlCaller, *, host_root: Path = Path("/")) -> None:
        self._caller = caller
        self._host_root = host_root

    def read(self, inventory: NodeInventory) -> FabricReport:
        """Fabric state for the GPUs behind the NVSwitches (raises ``HardwareTimeoutError`` when hung)."""
        if inventory.nvswitch is None:
            return FabricReport()
        answering = {g.index: g.uuid for g in inventory.gpus}
        found = []
        for index in inventory.nvswitch.gpus:
            if index in answering:
                state = self._gpu_state(answering[index], index)
                if state is not None:
                    found.append(state)
        return FabricReport(tuple(found))

    def _gpu_state(self, uuid: str, index: int) -> GpuFabric | None:
        lib = self._caller.lib
        try:
            handle = self._caller.invoke("nvmlDeviceGetHandleByUUID", uuid, target=f"GPU {index}")
            info = lib.c_nvmlGpuFabricInfoV_t()
            where = f"GPU {index}"
            self._caller.invoke("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info), target=where)
        except GpuLostError:
            return None  # a GPU off the bus is withheld as lost, not as waiting for the fabric
        except (NotSupportedError, AttributeError):
            return self._fabric_manager(uuid)  # Ampere (or a driver without the call)
        if int(info.state) == _STATE_NOT_SUPPORTED:
            return self._fabric_manager(uuid)
        return _from_info(uuid, info)

    def _fabric_manager(self, uuid: str) -> GpuFabric:
        pid_file = self._host_root / FM_PID_FILE
        try:
            pid = int(pid_file.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return GpuFabric(
                uuid,
                FabricState.NOT_STARTED,
                (
                    f"Fabric Manager is not running (no pid in /{FM_PID_FILE}); start nvidia-fabricmanager "
                    "on the host and mount /run/nvidia-fabricmanager into the agent"
                ),
            )
        comm = self._host_root / "proc" / str(pid) / "comm"
        try:
            name = comm.read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
        if name != FM_PROCESS:
            return GpuFabric(
                uuid,
                FabricState.NOT_STARTED,
                (
                    f"Fabric Manager pid {pid} is not a running {FM_PROCESS} in /proc "
                    f"(found {name or 'nothing'}); restart nvidia-fabricmanager, and run the agent with "
                    "hostPID to see it"
                ),
            )
        return GpuFabric(uuid, FabricState.COMPLETED, f"Fabric Manager running (pid {pid})")


def cluster_uuid_of(info: Any) -> str:
    """The struct's 16-byte ``clusterUuid`` as a UUID string."""
    return str(uuid.UUID(bytes=bytes(bytearray(info.clusterUuid))))


def fabric_domain(info: Any) -> tuple[str, int] | None:
    """(cluster UUID, clique ID) of a completed fabric in a multi-node NVLink domain, else None
    (not completed, failed training, or the all-zero cluster UUID of a single-node board)."""
    if int(info.state) != _STATE_COMPLETED or int(info.status) != 0:
        return None
    cluster = cluster_uuid_of(info)
    return None if cluster == _NO_CLUSTER else (cluster, int(info.cliqueId))


def _from_info(gpu_uuid: str, info: Any) -> GpuFabric:
    completed = _completed_state(gpu_uuid, info)
    if not completed.ready:
        return completed
    return GpuFabric(gpu_uuid, completed.state, completed.detail, cluster_uuid_of(info), int(info.cliqueId))


def _completed_state(uuid: str, info: Any) -> GpuFabric:
    state, status, mask = int(info.state), int(info.status), int(info.healthMask)
    if state == _STATE_NOT_STARTED:
        return GpuFabric(
            uuid,
            FabricState.NOT_STARTED,
            (
                f"GPU {uuid}: fabric training not started; CUDA fails (error 802) until it completes: "
                "check nvidia-fabricmanager (or NVLink Subnet Manager) on the host"
            ),
        )
    if state == _STATE_IN_PROGRESS:
        return GpuFabric(uuid, FabricState.IN_PROGRESS, f"GPU {uuid}: fabric training in progress")
    if state != _STATE_COMPLETED:
        return GpuFabric(uuid, FabricState.FAILED, f"GPU {uuid}: unknown fabric state {state}")
    if status != 0:
        return GpuFabric(
            uuid,
            FabricState.FAILED,
            (f"GPU {uuid}: fabric training completed with NVML error {status}; see the Fabric Manager log"),
        )
    if (mask >> _ROUTE_SHIFT) & 0x3 == _ROUTE_UNHEALTHY_TRUE:
        detail = f"GPU {uuid}: fabric route unhealthy (health mask 0x{mask:x})"
        return GpuFabric(uuid, FabricState.FAILED, detail)
    config = (mask >> _CONFIG_SHIFT) & 0xF
    if config > _CONFIG_NONE:
        return GpuFabric(
            uuid,
            FabricState.FAILED,
            (f"GPU {uuid}: fabric incorrectly configured (code {config}, health mask 0x{mask:x})"),
        )
    return GpuFabric(uuid, FabricState.COMPLETED, f"GPU {uuid}: fabric completed")
