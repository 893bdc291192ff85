"""The simulated workload's share pods as processes on their GPUs, so the NVML process calls (and
the node agent's per-pod GPU use, ``nodeagent.usage_service``) see them as on a host.

A pod granted ``gpuweave.io/gpu-compute`` / ``gpu-memory`` units of a GPU runs one MPS client there
for as long as it runs: it holds ``MEMORY_FILL`` of its memory limit (1 GiB without one) and keeps
``SM_FILL`` of its compute share busy; its cgroup names the pod (a UID made from the pod's ID).
Time-sliced replicas and whole GPUs run no process here.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devicemodel.assignment import parent_gpu_of_share
from hardware.simulated.process_calls import SimProcessTable

GIB = 2**30
MEMORY_FILL = 0.6  # of the share's memory limit
SM_FILL = 0.8  # of the share's compute units
FIRST_PID = 100_000


@dataclass(frozen=True)
class ShareProcess:
    gpu: int
    pid: int
    memory_bytes: int
    sm_percent: int


class ShareProcesses:
    """Starts and ends the processes of one node's share pods."""

    def __init__(self, table: SimProcessTable) -> None:
        self._table = table
        self._pids = itertools.count(FIRST_PID)
        self._running: dict[str, list[ShareProcess]] = {}

    def start(
        self, pod_id: str, devices: Mapping[str, Sequence[str]], *, gpu_index: Mapping[str, int]
    ) -> None:
        units: dict[str, dict[str, int]] = {}
        for ids in devices.values():
            for device_id in ids:
                gpu = parent_gpu_of_share(device_id)
                kind = device_id.rpartition("::")[2].partition("-")[0]
                if gpu is not None and gpu in gpu_index and kind in ("compute", "memory"):
                    counts = units.setdefault(gpu, {"compute": 0, "memory": 0})
                    counts[kind] += 1
        pod_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpuweave-sim-pod/{pod_id}"))
        started = []
        for gpu, counts in units.items():
            process = ShareProcess(
                gpu_index[gpu],
                next(self._pids),
                int((counts["memory"] * MEMORY_FILL or 1) * GIB),
                round(counts["compute"] * SM_FILL),
            )
            self._table.run(
                process.gpu,
                process.pid,
                memory_bytes=process.memory_bytes,
                sm_percent=process.sm_percent,
                mps=True,
                pod_uid=pod_uid,
                container_id=f"{process.pid:064x}",
            )
            started.append(process)
        if started:
            self._running[pod_id] = started

    def end(self, pod_id: str) -> None:
        for process in self._running.pop(pod_id, []):
            self._table.end(process.gpu, process.pid)

    def running(self) -> list[ShareProcess]:
        return [p for processes in self._running.values() for p in processes]
