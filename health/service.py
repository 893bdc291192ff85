"""The health part of a node agent, assembled from explicit parts and started in the right order.

``HealthService`` is what the node agent's composition root creates: it loads the bad-hardware
list (local file, merged with the cluster's ``GpuBadHardware`` objects) and the degraded NVLink
links (``health.links``: pairs active checks found slow, published, not withheld), withholds listed GPUs and
restores strike counts *before* the monitor's first push, then starts the monitor whose rounds end
with remediation and node publishing, and (given an exerciser) the burn-in, an active check of
every GPU the startup gate waits for (``health.active_runner``), and then checks of idle GPUs
between jobs (``health.active_idle``). Every state file (bad-hardware
list, strikes, kernel-log cursor) goes through one ``StateWriter``: a write the disk refuses is counted
(``gpuweave_health_state_write_failures``), kept in memory and retried every round. Health is
pushed to the agent through ``HealthSink`` (``set_device_health``), so this package never imports
the device plugin.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from devicemodel.inventory import DegradedLink, NodeInventory
from hardware.exerciser.protocol import Exerciser
from health.active import LinkVerdict
from health.active_idle import IdleChecks
from health.active_runner import ActiveCheckRunner, ActiveParts, Busy, Held, Hold
from health.badlist import BadHardwareList
from health.config import HealthSettings
from health.engine import Clock, HealthEngine
from health.links import inventory_links, next_links
from health.links_file import DegradedLinkFile
from health.metrics import HealthMetrics
from health.monitor import HealthMonitor, HealthProbe, HealthSink
from health.persist import StateWriter
from health.policy import Fault
from health.remediation import ClusterActions, DeviceOps, MigRecreate, PodDeviceLookup, Remediator
from health.scope import HealthSnapshot
from health.signals.kmsg import KernelLogTail
from health.signals.protocol import HealthSignal

log = logging.getLogger(__name__)
links_log = logging.getLogger("health.links")  # degraded NVLink links' transitions
KMSG_CURSOR_FILE = "kmsg-cursor.json"


@dataclass(frozen=True)
class HealthParts:
    inventory: NodeInventory
    probe: HealthProbe
    device_ops: DeviceOps
    sink: HealthSink
    state_dir: Path
    settings: HealthSettings
    node_name: str
    kernel_log: Path | None = None  # "/dev/kmsg" on a host, a file in simulation
    cluster: ClusterActions | None = None
    recreate_mig: MigRecreate | None = None
    metrics: HealthMetrics | None = None
    clock: Clock = time.monotonic
    pod_devices: PodDeviceLookup | None = None  # the kubelet's view of pod devices (pod-resources API)
    signals: tuple[HealthSignal, ...] = ()  # read each round after the built-in ones (MPS supervision)
    taints_evict: bool = False  # DRA mode: device-taint eviction evicts a failed device's pods
    exerciser: Exerciser | None = None  # active checks (burn-in, on demand); None: passive only
    hold: Hold | None = None  # withholds the GPUs an active check runs on (the agent's gate)
    busy: Busy | None = None  # why a GPU cannot be exercised (a pod holds it); processes always count
    held: Held | None = None  # the device IDs pods hold, for checks between jobs (None: they are off)
    # where the NVLink pairs active checks found slow go (the agent's ``set_degraded_links``)
    links: Callable[[tuple[DegradedLink, ...]], None] | None = None


class HealthService:
    def __init__(self, parts: HealthParts) -> None:
        self.parts = parts
        self.metrics = parts.metrics or HealthMetrics()
        self.state = StateWriter(on_result=self._count_write)
        self.badlist = BadHardwareList(parts.state_dir, writer=self.state)
        self._link_file = DegradedLinkFile(parts.state_dir, writer=self.state)
        self._links_lock = threading.Lock()
        self.links = self._link_file.load()  # degraded NVLink pairs, by GPU UUIDs
        self.engine = HealthEngine(parts.inventory, parts.settings, clock=parts.clock)
        self.remediator = Remediator(
            node_name=parts.node_name,
            device_ops=parts.device_ops,
            badlist=self.badlist,
            cluster=parts.cluster,
            recreate_mig=parts.recreate_mig,
            metrics=self.metrics,
            pod_devices=parts.pod_devices,
            state=self.state,
            taints_evict=parts.taints_evict,
        )
        tail = None
        if parts.kernel_log is not None:
            tail = KernelLogTail(
                parts.kernel_log, cursor_file=parts.state_dir / KMSG_CURSOR_FILE, writer=self.state
            )
        self.monitor = HealthMonitor(
            self.engine,
            parts.probe,
            clock=parts.clock,
            sink=parts.sink,
            kernel_log=tail,
            signals=parts.signals,
            round_hooks=(self.remediator, self._recheck),
            metrics=self.metrics,
        )
        self.engine.fault_observers.append(self._count_fault)
        self.monitor.add_listener(self._observe)
        self.active = self._active_runner() if parts.exerciser is not None else None
        self.stoppers: list[Callable[[], None]] = []  # stopped before the monitor (gang preflights)
        idle = parts.settings.active.idle
        self.idle = None if self.active is None else IdleChecks(self.active, idle, parts.held)

    def _active_runner(self) -> ActiveCheckRunner:
        assert self.parts.exerciser is not None
        active = ActiveParts(
            exerciser=self.parts.exerciser,
            probe=self.parts.probe,
            settings=self.parts.settings.active,
            hold=self.parts.hold,
            busy=self._busy,
            events=self._event if self.parts.cluster is not None else None,
            links=self._measured_links,
        )
        return ActiveCheckRunner(self.monitor, active)

    def _measured_links(self, measured: Mapping[frozenset[str], LinkVerdict]) -> set[frozenset[str]]:
        """A run measured NVLink pairs: a slow one becomes a degraded link (its GPUs stay in
        service), one measured at its rate again is cleared; persisted, logged, published. The
        pairs newly degraded (a gang's preflight that found one fails: ``health.preflight``)."""
        with self._links_lock:
            change = next_links(self.links, measured)
            if not change.changed:
                return set()
            self.links = change.links
            self._link_file.save(change.links)
        for record in change.added:
            a, b = record.gpus
            line = f"NVLink {a} <-> {b} degraded ({record.fraction:.0%} of its rate): {record.reason}"
            links_log.warning("%s; both GPUs stay in service, work across the pair is placed elsewhere", line)
            if self.parts.cluster is not None:
                self._event("GpuweaveNvlinkDegraded", line, True)
        for record in change.cleared:
            links_log.warning("NVLink %s <-> %s measured at its rate again: no longer degraded", *record.gpus)
        self._push_links()
        return {record.pair for record in change.added}

    def start_links(self) -> None:
        """Publish the degraded links remembered from before a restart (``start`` does it first)."""
        self._push_links()

    def _push_links(self) -> None:
        if self.parts.links is not None:
            with self._links_lock:
                records = list(self.links.values())
            self.parts.links(inventory_links(records, self.engine.inventory))

    def _busy(self, uuid: str) -> str | None:
        """Why an active check must leave the GPU alone: compute processes, or the caller's ``busy``."""
        if self.parts.device_ops.gpu_busy(uuid):
            return "compute processes run on it"
        return self.parts.busy(uuid) if self.parts.busy is not None else None

    def _recheck(self, monitor: HealthMonitor) -> None:
        """Round hook: re-checks of withheld GPUs first, then checks of idle GPUs between jobs."""
        if self.active is not None:
            self.active(monitor)
        if self.idle is not None:
            self.idle(monitor)

    def _event(self, reason: str, message: str, warning: bool) -> None:
        assert self.parts.cluster is not None
        self.parts.cluster.post_event(reason=reason, message=message, warning=warning)

    def start(self) -> None:
        """Bad list first, then the monitor; the burn-in (when configured) runs beside the first
        rounds and the startup gate waits for it."""
        self._load_bad_list()
        self.start_links()
        if self.active is not None:
            self.active.begin_burn_in()
        self.monitor.start()
        if self.active is not None:
            self.active.start_burn_in()

    def stop(self) -> None:
        for stop in self.stoppers:
            stop()
        self.monitor.stop()

    def snapshot(self) -> HealthSnapshot:
        return self.monitor.snapshot()

    def add_listener(self, listener: Callable[[HealthSnapshot], None]) -> None:
        self.monitor.add_listener(listener)

    def update_inventory(self, inventory: NodeInventory) -> None:
        """After a MIG reshape: track the new MIG devices (their GPU's state still applies)."""
        with self.monitor.lock:
            self.engine.update_inventory(inventory)
        self.monitor.publish()

    def _load_bad_list(self) -> None:
        if self.parts.cluster is not None:
            try:
                adopted = self.badlist.merge(self.parts.cluster.list_bad_hardware())
                if adopted:
                    log.warning("adopted %d bad GPUs from the cluster list", len(adopted))
            except Exception as exc:
                log.warning("cannot read the cluster's bad-hardware list (%s); using the local copy", exc)
        with self.monitor.lock:
            self.engine.restore_strikes(self.badlist.strikes())
            for uuid, entry in self.badlist.entries().items():
                if uuid in self.engine.gpus:
                    log.warning("GPU %s is on the bad-hardware list (%s); refusing it", uuid, entry.reason)
                    self.engine.mark_bad(uuid, f"bad-hardware list: {entry.reason}")

    def _count_write(self, path: Path, error: OSError | None) -> None:
        if error is not None:
            self.metrics.state_write_failures.labels(path.name).inc()
        self.metrics.state_unsaved.set(len(self.state.unsaved()))

    def _count_fault(self, device: str, fault: Fault) -> None:
        self.metrics.faults.labels(fault.signal, fault.severity.value, fault.cause.value).inc()
        if fault.signal in ("check-timeout", "check-failed"):
            self.metrics.check_timeouts.inc()

    def _observe(self, snapshot: HealthSnapshot) -> None:
        self.metrics.observe(snapshot, now=self.parts.clock())
