# ruff: noqa: N802, N803, N815 - the fake keeps pynvml's function, argument and field names
"""Simulated GPU processes: what runs on each GPU, through pynvml's process calls.

``SimProcessTable`` (``SimulatedNode.processes``) holds the processes a test or the simulator's
workload runs on each GPU: pid, device memory used, SM utilisation, whether it is an MPS client,
and the container it runs in, written as ``<root>/proc/<pid>/cgroup`` (a cgroup v2 line in the
kubelet's cgroupfs layout, ``0::/kubepods/burstable/pod<uid>/<container id>``) so a reader of
``/proc`` finds its pod as it would on a host. ``ProcessCallsMixin`` answers pynvml's calls as
pynvml does:

- ``nvmlDeviceGetComputeRunningProcesses`` / ``nvmlDeviceGetMPSComputeRunningProcesses``: objects
  with ``pid``, ``usedGpuMemory`` (bytes), ``gpuInstanceId`` and ``computeInstanceId`` (0xFFFFFFFF
  off MIG); MPS clients are listed by the second call only, and while a GPU has any, the first
  lists its MPS server (a process in no pod), as NVML lists them;
- ``nvmlDeviceGetProcessUtilization(handle, timeStamp)``: ``c_nvmlProcessUtilizationSample_t``
  structures (``pid``, ``timeStamp`` in microseconds, ``smUtil``, ``memUtil``, ``encUtil``,
  ``decUtil`` in percent), one per process sampled after ``timeStamp``; NVML_ERROR_NOT_FOUND when
  there is none, which is what NVML answers for an idle GPU;
- ``nvmlDeviceGetAccountingMode`` / ``nvmlDeviceGetAccountingStats``: accounting, off unless a
  test turns it on (``accounting``), and then per pid ``gpuUtilization`` and ``maxMemoryUsage``.

A process's pid also makes its GPU busy for a reset (``SimHealthState.set_processes``).
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware.simulated.health_calls import NO_INSTANCE, HealthCallsMixin, SimHealthState

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
MPS_SERVER_PID_BASE = 7000  # + GPU index: the nvidia-cuda-mps-server of a GPU with MPS clients
MPS_SERVER_MEMORY = 256 * 2**20


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    _fields_ = (
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    )


class c_nvmlAccountingStats_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    _fields_ = (
        ("gpuUtilization", ctypes.c_uint),
        ("memoryUtilization", ctypes.c_uint),
        ("maxMemoryUsage", ctypes.c_ulonglong),
        ("time", ctypes.c_ulonglong),
        ("startTime", ctypes.c_ulonglong),
        ("isRunning", ctypes.c_uint),
        ("reserved", ctypes.c_uint * 5),
    )


@dataclass(frozen=True)
class SimProcess:
    """The fields of pynvml's ``c_nvmlProcessInfo_v3_t`` (as ``nvmlStructToFriendlyObject`` gives them)."""

    pid: int
    usedGpuMemory: int | None = 0
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


@dataclass(frozen=True)
class SimGpuProcess:
    pid: int
    memory_bytes: int
    sm_percent: int  # 0..100
    mps: bool
    started_us: int


def cgroup_line(pod_uid: str, container_id: str) -> str:
    """The ``/proc/<pid>/cgroup`` line of a container's process under the kubelet's cgroupfs driver."""
    return f"0::/kubepods/burstable/pod{pod_uid}/{container_id}\n"


class SimProcessTable:
    """Per GPU index, the processes running there; thread-safe."""

    def __init__(self, health: SimHealthState, *, proc_root: Path | None) -> None:
        self._health = health
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._gpus: dict[int, dict[int, SimGpuProcess]] = {}
        self.accounting = False  # nvmlDeviceGetAccountingMode: off by default, as on most hosts
        self.per_process_sampling = True  # False: nvmlDeviceGetProcessUtilization NOT_SUPPORTED

    def run(
        self,
        gpu: int,
        pid: int,
        *,
        memory_bytes: int,
        sm_percent: int,
        mps: bool = False,
        pod_uid: str = "",
        container_id: str = "",
    ) -> None:
        """Start (or change) a process on GPU ``gpu``; with ``pod_uid`` its cgroup names that pod."""
        process = SimGpuProcess(pid, memory_bytes, max(0, min(100, sm_percent)), mps, _now_us())
        with self._lock:
            self._gpus.setdefault(gpu, {})[pid] = process
            pids = tuple(sorted(self._gpus[gpu]))
        self._health.set_processes(gpu, pids)
        if pod_uid and self._proc_root is not None:
            directory = self._proc_root / str(pid)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup").write_text(cgroup_line(pod_uid, container_id), encoding="utf-8")

    def end(self, gpu: int, pid: int) -> None:
        with self._lock:
            self._gpus.get(gpu, {}).pop(pid, None)
            pids = tuple(sorted(self._gpus.get(gpu, {})))
        self._health.set_processes(gpu, pids)
        if self._proc_root is not None:
            (self._proc_root / str(pid) / "cgroup").unlink(missing_ok=True)

    def on(self, gpu: int) -> list[SimGpuProcess]:
        with self._lock:
            return list(self._gpus.get(gpu, {}).values())


def _now_us() -> int:
    return int(time.time() * 1_000_000)


class ProcessCallsMixin(HealthCallsMixin):
    """pynvml's process calls over ``processes``, with the health calls' gates and errors."""

    processes: SimProcessTable

    def _running(self, handle: Any) -> list[SimGpuProcess]:
        self._health_gpu(handle)  # gates, a lost GPU, an unknown handle: as every health read
        return self.processes.on(self._health_index(handle))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        running = self._running(handle)
        known = {p.pid: p for p in running}
        pids = self._health_gpu(handle).processes  # busy pids injected without usage count too
        listed = [
            SimProcess(pid, known[pid].memory_bytes if pid in known else 0)
            for pid in pids
            if pid not in known or not known[pid].mps
        ]
        if any(p.mps for p in running):  # MPS clients run in the GPU's MPS server, which NVML lists
            listed.append(SimProcess(MPS_SERVER_PID_BASE + self._health_index(handle), MPS_SERVER_MEMORY))
        return listed

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [SimProcess(p.pid, p.memory_bytes) for p in self._running(handle) if p.mps]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        running = self._running(handle)
        if not self.processes.per_process_sampling:
            raise self._health_error(NVML_ERROR_NOT_SUPPORTED)
        now = _now_us()
        samples = [
            c_nvmlProcessUtilizationSample_t(p.pid, now, p.sm_percent, 0, 0, 0)
            for p in running
            if now > timeStamp and now - p.started_us >= 0
        ]
        if not samples:
            raise self._health_error(NVML_ERROR_NOT_FOUND)
        return samples

    def nvmlDeviceGetAccountingMode(self, handle: Any) -> int:
        self._health_gpu(handle)
        return int(self.processes.accounting)

    def nvmlDeviceGetAccountingStats(self, handle: Any, pid: int) -> Any:
        running = {p.pid: p for p in self._running(handle)}
        if not self.processes.accounting or pid not in running:
            raise self._health_error(NVML_ERROR_NOT_FOUND)
        process = running[pid]
        stats = c_nvmlAccountingStats_t()
        stats.gpuUtilization = process.sm_percent
        stats.maxMemoryUsage = process.memory_bytes
        stats.startTime = process.started_us
        stats.isRunning = 1
        return stats
