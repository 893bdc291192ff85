"""The node agent's per-pod GPU use: read every few seconds, exported, shown, and enforced.

``PodUsageService`` runs one round every ``interval_s`` (``--pod-usage-interval``) on a thread of
its own: it reads each GPU's processes through NVML, each process's cgroup under ``/proc``, and the
kubelet's pod-resources API for what each container holds, and joins them (``pod_usage``). The
rows are what ``/metrics`` shows (``UsageCollector``: ``gpuweave_pod_gpu_utilization_ratio``,
``gpuweave_pod_gpu_memory_used_bytes`` and ``gpuweave_pod_gpu_memory_limit_bytes`` per namespace,
pod, container and GPU, all from one round), what ``usage.pods`` on the control socket answers, and
what the inventory's ``status.podUsage`` carries for ``gpuweave status`` (``published``).

Enforcement: MPS takes a share's limits from the client's environment, which the tenant can change
(docs/device-plugin.md, *What a tenant can and cannot do*). So the agent checks what each container
really holds against its share's memory limit; one over it for ``memory_grace_s``
(``--share-memory-grace``) is evicted through the Eviction API (PodDisruptionBudgets apply), with
a ``GpuShareMemoryExceeded`` Event naming the GPU, the use and the limit, and counted in
``gpuweave_share_memory_evictions_total{outcome}``. A GPU whose processes cannot be read is
skipped for that round (counted in ``gpuweave_pod_usage_read_errors_total``), never taken as idle;
without the pod-resources API no limit is known and nothing is evicted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan
from hardware.gpu_processes import GpuProcess, GpuProcessReader
from hardware.proc_cgroup import ContainerCgroup, container_of
from nodeagent.pod_usage import (
    MIB,
    MemoryLimitWatch,
    PodGpuUsage,
    PodIdentities,
    ShareMemory,
    memory_limits,
    pod_usage,
)
from nodeagent.podresources import ContainerDevices

log = logging.getLogger(__name__)
EVENT_REASON = "GpuShareMemoryExceeded"
MAX_PUBLISHED_ROWS = 512  # the inventory's status.podUsage; a node runs far fewer GPU containers


@dataclass(frozen=True)
class UsageSettings:
    interval_s: float = 10.0  # --pod-usage-interval; 0 turns the service off
    memory_grace_s: float = 60.0  # --share-memory-grace: over the limit this long -> evicted
    eviction_grace_s: int = 30  # the evicted pod's deletion grace period


class Evictor(Protocol):
    """The API server's side: evict a pod, post an Event on it (``health.kube.KubeCluster``'s)."""

    def evict_pod(self, namespace: str, name: str, *, uid: str, grace_s: int) -> str: ...

    def pod_event(self, namespace: str, name: str, *, reason: str, message: str) -> None: ...


def _labels(row: PodGpuUsage) -> list[str]:
    return [row.key.namespace, row.key.pod, row.key.container, str(row.gpu_index), row.gpu_uuid]


class UsageCollector(Collector):
    """The last round's rows as gauges, all from one round (a scrape never sees half a round)."""

    def __init__(self, rows: Callable[[], Sequence[PodGpuUsage]]) -> None:
        self._rows = rows

    def collect(self) -> Iterable[GaugeMetricFamily]:
        names = ["namespace", "pod", "container", "gpu", "uuid"]
        util = GaugeMetricFamily(
            "gpuweave_pod_gpu_utilization_ratio",
            "Share of the GPU's SMs the container's processes used since the last round (0..1)",
            labels=names,
        )
        used = GaugeMetricFamily(
            "gpuweave_pod_gpu_memory_used_bytes", "Device memory the container's processes hold", labels=names
        )
        limit = GaugeMetricFamily(
            "gpuweave_pod_gpu_memory_limit_bytes",
            "The memory limit of the container's share of the GPU (shares only)",
            labels=names,
        )
        for row in self._rows():
            util.add_metric(_labels(row), row.utilization)
            used.add_metric(_labels(row), row.memory_bytes)
            if row.memory_limit_bytes is not None:
                limit.add_metric(_labels(row), row.memory_limit_bytes)
        return [util, used, limit]

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


class UsageMetrics:
    """The per-pod series (``UsageCollector``) and the service's counters, on the agent's registry."""

    def __init__(self, registry: CollectorRegistry, *, rows: Callable[[], Sequence[PodGpuUsage]]) -> None:
        registry.register(UsageCollector(rows))
        self.read_errors = Counter(
            "gpuweave_pod_usage_read_errors",
            "Per-pod GPU use rounds that could not read a source: nvml (one GPU), pod-resources",
            ["source"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpuweave_share_memory_evictions",
            "Pods evicted for holding more device memory than their share's limit, by outcome",
            ["outcome"],
            registry=registry,
        )


class PodUsageService:
    def __init__(
        self,
        *,
        reader: GpuProcessReader,
        proc_root: Path,
        node: Callable[[], tuple[NodeInventory, SharingPlan]],
        identities: PodIdentities,
        containers: Callable[[], list[ContainerDevices]] | None,
        registry: CollectorRegistry,
        settings: UsageSettings = UsageSettings(),
        share_memory: ShareMemory | None = None,
        evictor: Evictor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._reader = reader
        self._proc_root = proc_root
        self._node = node
        self._identities = identities
        self._containers = containers
        self._share_memory = share_memory
        self._evictor = evictor
        self._clock = clock
        self._watch = MemoryLimitWatch(settings.memory_grace_s)
        self._last_error = ""
        self._lock = threading.Lock()
        self._rows: tuple[PodGpuUsage, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.listeners: list[Callable[[], None]] = []  # after each round (the usage publisher)
        self.metrics = UsageMetrics(registry, rows=self.rows)

    def rows(self) -> tuple[PodGpuUsage, ...]:
        with self._lock:
            return self._rows

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            try:
                self.round()
            except Exception:  # one bad round must not end the service: logged, next round runs
                log.exception("per-pod GPU use round failed")

    def round(self) -> tuple[PodGpuUsage, ...]:
        """Read, join, export and enforce once; returns the rows."""
        inventory, plan = self._node()
        samples = self._samples(inventory)
        cgroups = self._cgroups(samples.values())
        rows = tuple(
            pod_usage(
                samples,
                cgroups=cgroups,
                pods=self._identities.get,
                limits=self._limits(inventory, plan),
                gpu_index={g.uuid: g.index for g in inventory.gpus},
            )
        )
        with self._lock:
            self._rows = rows
            self.rounds += 1
        self._enforce(rows)
        for listener in self.listeners:
            listener()
        return rows

    def _samples(self, inventory: NodeInventory) -> dict[str, tuple[GpuProcess, ...]]:
        samples: dict[str, tuple[GpuProcess, ...]] = {}
        for gpu in inventory.gpus:
            try:
                samples[gpu.uuid] = self._reader.processes(gpu.uuid)
            except GpuweaveError as exc:  # a lost or hung GPU: skipped this round, not idle
                self.metrics.read_errors.labels("nvml").inc()
                log.debug("processes of GPU %s not read: %s", gpu.index, exc)
        return samples

    def _cgroups(self, samples: Iterable[Sequence[GpuProcess]]) -> dict[int, ContainerCgroup]:
        found: dict[int, ContainerCgroup] = {}
        for processes in samples:
            for process in processes:
                cgroup = container_of(self._proc_root, process.pid)
                if cgroup is not None:
                    found[process.pid] = cgroup
        return found

    def _limits(self, inventory: NodeInventory, plan: SharingPlan) -> dict[Any, int]:
        if self._containers is None:
            return {}
        try:
            containers = self._containers()
        except GpuweaveError as exc:
            self.metrics.read_errors.labels("pod-resources").inc()
            if str(exc) != self._last_error:  # once per cause, not every round
                log.warning("per-pod GPU limits unknown (no share is evicted meanwhile): %s", exc)
            self._last_error = str(exc)
            return {}
        self._last_error = ""
        defaults = {
            g.uuid: mib * MIB
            for g in inventory.gpus
            if (mib := plan.for_gpu(g).mps.pinned_memory_mib) is not None
        }
        return memory_limits(containers, share_memory=self._share_memory, daemon_defaults=defaults)

    def _enforce(self, rows: Sequence[PodGpuUsage]) -> None:
        for row in self._watch.observe(rows, self._clock()):
            if self._evictor is None or not row.key.namespace:
                continue  # no API server, or a pod the watch does not know: nothing to evict
            outcome = self._evictor.evict_pod(
                row.key.namespace, row.key.pod, uid=row.pod_uid, grace_s=self.settings.eviction_grace_s
            )
            self.metrics.evictions.labels(outcome).inc()
            if outcome in ("evicted", "gone"):
                self._watch.evicted(row)
            if outcome == "evicted":
                self._evictor.pod_event(
                    row.key.namespace, row.key.pod, reason=EVENT_REASON, message=_message(row, self.settings)
                )
            log.warning(
                "%s/%s over its share's GPU memory on GPU %s: eviction %s",
                row.key.namespace,
                row.key.pod,
                row.gpu_index,
                outcome,
            )

    def status(self) -> dict[str, Any]:
        """``usage.pods`` on the control socket: the last round's rows."""
        return {"rounds": self.rounds, "pods": [usage_wire(r) for r in self.rows()]}

    def published(self) -> list[dict[str, Any]]:
        """The rows as the inventory's ``status.podUsage`` (bounded)."""
        return [usage_wire(r) for r in self.rows()[:MAX_PUBLISHED_ROWS]]


def usage_wire(row: PodGpuUsage) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "namespace": row.key.namespace,
        "pod": row.key.pod,
        "container": row.key.container,
        "gpu": row.gpu_uuid,
        "utilization": round(row.utilization, 3),
        "memoryUsedBytes": row.memory_bytes,
    }
    if row.memory_limit_bytes is not None:
        wire["memoryLimitBytes"] = row.memory_limit_bytes
    return wire


def _message(row: PodGpuUsage, settings: UsageSettings) -> str:
    used, limit = row.memory_bytes / 2**30, (row.memory_limit_bytes or 0) / 2**30
    return (
        f"container {row.key.container} held {used:.1f} GiB of GPU {row.gpu_index} ({row.gpu_uuid}) for "
        f"more than {settings.memory_grace_s:g} s, over its share's limit of {limit:.1f} GiB; evicted "
        "(MPS takes the limit from the container's environment, which the container can change)"
    )
