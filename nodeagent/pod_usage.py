"""Per-pod GPU use: which pod's container each GPU process belongs to, how much it uses, its limit.

Pure: values in, rows out. The node agent's ``PodUsageService`` (``nodeagent.usage_service``)
gathers the inputs each round:

- each GPU's processes with their memory and SM utilisation (``hardware.gpu_processes``);
- each process's pod UID and container ID, from its ``/proc/<pid>/cgroup`` (``hardware.proc_cgroup``);
- the pods of the node by UID, with their containers by runtime ID (``PodIdentities``, fed by the
  agent's pod watch);
- what each container holds, from the kubelet's pod-resources API, for its memory limit
  (``memory_limits``): ``gpuweave.io/gpu-memory`` units (1 GiB each, device plugin or DRA units),
  the memory a DRA share consumed (its claim's ``consumedCapacity``), else, for a share without
  a memory limit of its own, the GPU's MPS daemon default (``mps.defaultPinnedMemoryMiB``).

``pod_usage`` sums a container's processes per GPU into one ``PodGpuUsage`` row; a process in a
pod the watch does not know yet is reported under its pod UID. ``MemoryLimitWatch`` says which rows
have stayed over their limit for the grace period: the pods to evict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devicemodel.assignment import parent_gpu_of_share
from hardware.gpu_processes import GpuProcess
from hardware.proc_cgroup import ContainerCgroup
from nodeagent.podresources import ContainerDevices

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True, order=True)
class ContainerKey:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class PodIdentity:
    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict, hash=False)  # runtime ID -> name


class PodIdentities:
    """This node's pods by UID, as the agent's pod watch delivers them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodIdentity] = {}

    def upsert(self, pod: Mapping[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "").lower()
        if not uid:
            return
        status = pod.get("status") or {}
        containers: dict[str, str] = {}
        for key in ("initContainerStatuses", "containerStatuses"):
            for entry in status.get(key) or []:
                if isinstance(entry, Mapping) and entry.get("containerID") and entry.get("name"):
                    containers[str(entry["containerID"]).rpartition("://")[2]] = str(entry["name"])
        identity = PodIdentity(
            str(metadata.get("namespace") or ""), str(metadata.get("name") or ""), containers
        )
        with self._lock:
            self._pods[uid] = identity

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid.lower(), None)

    def get(self, uid: str) -> PodIdentity | None:
        with self._lock:
            return self._pods.get(uid.lower())


@dataclass(frozen=True)
class PodGpuUsage:
    key: ContainerKey
    gpu_uuid: str
    gpu_index: int
    utilization: float  # 0..1 of the GPU's SMs (its processes' sum); 0 when no sample
    memory_bytes: int  # device memory its processes hold
    memory_limit_bytes: int | None  # its share's limit; None: no limit of its own (a whole GPU)
    pids: tuple[int, ...]
    pod_uid: str = ""  # from its processes' cgroup: the UID an eviction is bound to

    @property
    def over_limit(self) -> bool:
        return self.memory_limit_bytes is not None and self.memory_bytes > self.memory_limit_bytes


def _key_of(cgroup: ContainerCgroup, pods: Callable[[str], PodIdentity | None]) -> ContainerKey:
    identity = pods(cgroup.pod_uid)
    if identity is None:  # not (yet) seen by the watch: named by what the cgroup says
        return ContainerKey("", cgroup.pod_uid, cgroup.container_id[:12])
    name = identity.containers.get(cgroup.container_id, cgroup.container_id[:12])
    return ContainerKey(identity.namespace, identity.name, name)


def pod_usage(
    samples: Mapping[str, Sequence[GpuProcess]],
    *,
    cgroups: Mapping[int, ContainerCgroup],
    pods: Callable[[str], PodIdentity | None],
    limits: Mapping[tuple[ContainerKey, str], int],
    gpu_index: Mapping[str, int],
) -> list[PodGpuUsage]:
    """One row per container and GPU that runs a process in a pod, sorted by GPU and container."""
    summed: dict[tuple[ContainerKey, str], tuple[float, int, list[int]]] = {}
    uids: dict[ContainerKey, str] = {}
    for gpu, processes in samples.items():
        for process in processes:
            cgroup = cgroups.get(process.pid)
            if cgroup is None:
                continue  # the MPS server, the agent, a host process: not a pod's
            key = (_key_of(cgroup, pods), gpu)
            uids[key[0]] = cgroup.pod_uid
            util, memory, pids = summed.get(key, (0.0, 0, []))
            summed[key] = (
                util + (process.sm_utilization or 0.0),
                memory + (process.memory_bytes or 0),
                [*pids, process.pid],
            )
    rows = [
        PodGpuUsage(
            key,
            gpu,
            gpu_index.get(gpu, -1),
            min(1.0, util),
            memory,
            limits.get((key, gpu)),
            tuple(pids),
            pod_uid=uids[key],
        )
        for (key, gpu), (util, memory, pids) in summed.items()
    ]
    return sorted(rows, key=lambda r: (r.gpu_index, r.gpu_uuid, r.key))


ShareMemory = Callable[[str, str, str], tuple[str, int] | None]  # claim ns, name, device -> (GPU, GiB)


def memory_limits(
    containers: Iterable[ContainerDevices],
    *,
    share_memory: ShareMemory | None = None,
    daemon_defaults: Mapping[str, int] | None = None,
) -> dict[tuple[ContainerKey, str], int]:
    """(container, GPU UUID) -> its memory limit in bytes, for every container that holds a share."""
    limits: dict[tuple[ContainerKey, str], int] = {}
    shared: set[tuple[ContainerKey, str]] = set()
    for entry in containers:
        key = ContainerKey(entry.namespace, entry.pod, entry.container)
        for device_id in entry.device_ids:
            gpu = parent_gpu_of_share(device_id)
            if gpu is None:
                continue
            shared.add((key, gpu))
            if "::memory-" in device_id:
                limits[(key, gpu)] = limits.get((key, gpu), 0) + GIB
        for claim_namespace, claim_name, device in entry.claim_devices:
            found = share_memory(claim_namespace, claim_name, device) if share_memory else None
            if found is None:
                continue
            gpu, gib = found
            shared.add((key, gpu))
            if gib > 0:
                limits[(key, gpu)] = limits.get((key, gpu), 0) + gib * GIB
    for key, gpu in shared - set(limits):
        default = (daemon_defaults or {}).get(gpu)
        if default:
            limits[(key, gpu)] = default
    return limits


@dataclass
class _Over:
    since: float
    evicted: bool = False


class MemoryLimitWatch:
    """Which containers have used more device memory than their share's limit for ``grace_s``.

    A row over its limit starts a clock; a later round still over it after ``grace_s`` makes it due
    (returned every round until ``evicted`` is called for it); a round under its limit, or the row
    gone, clears it. Pure apart from its own state: the caller passes the time."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._over: dict[tuple[ContainerKey, str], _Over] = {}

    def observe(self, rows: Sequence[PodGpuUsage], now: float) -> list[PodGpuUsage]:
        seen: dict[tuple[ContainerKey, str], _Over] = {}
        due: list[PodGpuUsage] = []
        for row in rows:
            if not row.over_limit:
                continue
            key = (row.key, row.gpu_uuid)
            state = self._over.get(key) or _Over(now)
            seen[key] = state
            if now - state.since >= self.grace_s and not state.evicted:
                due.append(row)
        self._over = seen
        return due

    def evicted(self, row: PodGpuUsage) -> None:
        state = self._over.get((row.key, row.gpu_uuid))
        if state is not None:
            state.evicted = True

    def over_since(self, row: PodGpuUsage) -> float | None:
        state = self._over.get((row.key, row.gpu_uuid))
        return state.since if state is not None else None
