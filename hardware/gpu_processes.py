"""The processes running on each GPU, with their device memory and SM utilisation, through NVML.

Per GPU and read:

- the processes: ``nvmlDeviceGetComputeRunningProcesses`` (an MPS server is one of them) and
  ``nvmlDeviceGetMPSComputeRunningProcesses`` (the MPS clients, which the first call does not
  list), each with ``usedGpuMemory`` in bytes (None where the driver cannot tell);
- their SM utilisation: ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``, every
  sample since the last read, averaged per pid (NVML keeps a sample per process about every 1/6 s;
  NVML_ERROR_NOT_FOUND means no process ran since); where the driver does not sample processes,
  accounting (``nvmlDeviceGetAccountingStats``, its ``gpuUtilization``) when accounting mode is on.

Every call goes through the backend's ``NvmlCaller``, so a hung driver costs one deadline and
raises ``HardwareError`` like every other read; the caller decides what a failed read means.
What the MPS clients' per-process samples say on a real GPU is the driver's: not measured here.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hardware.backend import NotFoundError, NotSupportedError
from hardware.nvml_call import NvmlCaller

_FEATURE_ENABLED = 1


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    memory_bytes: int | None  # device memory the process holds; None: the driver cannot tell
    sm_utilization: float | None  # 0..1 of the GPU's SMs since the last read; None: no sample
    mps_client: bool = False


class GpuProcessReader:
    """Reads each GPU's processes; remembers per GPU the last sample it saw."""

    def __init__(self, caller: NvmlCaller) -> None:
        self._caller = caller
        self._last_seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def processes(self, gpu_uuid: str) -> tuple[GpuProcess, ...]:
        handle = self._caller.invoke("nvmlDeviceGetHandleByUUID", gpu_uuid, target=gpu_uuid)
        plain = self._list("nvmlDeviceGetComputeRunningProcesses", handle, gpu_uuid)
        clients = self._list("nvmlDeviceGetMPSComputeRunningProcesses", handle, gpu_uuid)
        found: dict[int, tuple[int | None, bool]] = {}
        for entry, mps in [*((e, False) for e in plain), *((e, True) for e in clients)]:
            pid = int(entry.pid)
            if pid not in found or mps:
                memory = entry.usedGpuMemory
                found[pid] = (int(memory) if memory is not None else None, mps)
        utilization = self._utilization(handle, gpu_uuid, list(found))
        return tuple(
            GpuProcess(pid, memory, utilization.get(pid), mps) for pid, (memory, mps) in sorted(found.items())
        )

    def _list(self, call: str, handle: Any, gpu_uuid: str) -> list[Any]:
        try:
            return list(self._caller.invoke(call, handle, target=gpu_uuid) or [])
        except NotSupportedError:
            return []  # an older driver without MPS client listing, or a GPU that cannot run MPS

    def _utilization(self, handle: Any, gpu_uuid: str, pids: list[int]) -> dict[int, float]:
        with self._lock:
            since = self._last_seen.get(gpu_uuid, 0)
        try:
            samples = self._caller.invoke("nvmlDeviceGetProcessUtilization", handle, since, target=gpu_uuid)
        except NotFoundError:
            return {}  # no sample since the last read: nothing ran
        except NotSupportedError:
            return self._accounting(handle, gpu_uuid, pids)
        per_pid: dict[int, list[int]] = defaultdict(list)
        newest = since
        for sample in samples or []:
            per_pid[int(sample.pid)].append(int(sample.smUtil))
            newest = max(newest, int(sample.timeStamp))
        with self._lock:
            self._last_seen[gpu_uuid] = newest
        return {pid: min(1.0, sum(values) / len(values) / 100) for pid, values in per_pid.items()}

    def _accounting(self, handle: Any, gpu_uuid: str, pids: list[int]) -> dict[int, float]:
        try:
            if (
                self._caller.invoke("nvmlDeviceGetAccountingMode", handle, target=gpu_uuid)
                != _FEATURE_ENABLED
            ):
                return {}
        except NotSupportedError:
            return {}
        found: dict[int, float] = {}
        for pid in pids:
            try:
                stats = self._caller.invoke("nvmlDeviceGetAccountingStats", handle, pid, target=gpu_uuid)
            except (NotFoundError, NotSupportedError):
                continue
            found[pid] = min(1.0, int(stats.gpuUtilization) / 100)
        return found
