"""Graded remediation, run at the end of every check round.

For each Failed device the ladder's next step decides what happens:

- ``reset-gpu`` / ``recreate-mig``: evict the pods on that device only (Eviction API, grace period
  for checkpointing, PDB refusals retried next round, opted-out pods left alone), wait until the
  device runs nothing, then reset the GPU (or recreate the MIG instance); success puts the device
  on probation, failure moves it one step up the ladder. The reset or recreate runs on its own
  thread: a round waits for it at most ``check_timeout_s`` and later rounds collect the result,
  so a remediation stuck behind a MIG reshape of its GPU (they share one owner per GPU, wired by
  the node agent) keeps only that device withheld while every other GPU is checked as usual. A
  recreate of a MIG device a reshape has since destroyed is done: there is nothing to put back;
- ``reboot-node``: the device stays withheld and the node gets a reboot-required fault (condition
  and, under the cluster-wide disruption cap, a taint);
- ``replace``: the GPU goes on the bad-hardware list.

Node-level state is published every round: conditions, the node-fault taint (capped), the startup
taint (removed once the startup gate opens) and the bad-hardware list. Health state files the
disk refused are written again first; while any stays unsaved the node condition
``GpuweaveHealthStateSaved`` is False and an Event names the files (another when they are saved).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from devicemodel.assignment import parent_gpu_of_share
from hardware.gpu_reset import GpuInUseError, RebootRequiredError
from health.badlist import BadGpu, BadHardwareList
from health.metrics import HealthMetrics
from health.monitor import HealthMonitor
from health.persist import StateWriter
from health.policy import DeviceRecord, DeviceState, RemediationFinished, RemediationStarted
from health.scope import (
    TAINT_HEALTH_PENDING,
    TAINT_NODE_FAULT,
    NodeCondition,
    NodeFault,
    NodeFaultKind,
    node_conditions,
    node_verdict,
    state_condition,
    taint_decision,
)
from health.xid import Action, Cause

log = logging.getLogger(__name__)
_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    devices: frozenset[str]  # device IDs from the pod's assignment annotation (and the kubelet)
    opted_out: bool = False  # labelled gpuweave.io/no-health-eviction=true
    gang: str = ""  # the pod's gang key (``devicemodel.gangs``), "" for none
    whole_gang: bool = True  # a fault under it evicts its whole gang (gpuweave.io/gang-eviction)
    uid: str = ""  # as the API server listed it; "" for a pod only the kubelet still names


# (namespace, name) -> the device IDs the kubelet allocated to the pod; raises when it cannot tell.
# The node agent wires the kubelet's pod-resources API here (health never imports the device plugin).
PodDeviceLookup = Callable[[], Mapping[tuple[str, str], frozenset[str]]]


class EvictionOutcome:
    EVICTED = "evicted"
    BLOCKED = "blocked"  # a PodDisruptionBudget said no (HTTP 429): retry next round
    GONE = "gone"
    FAILED = "failed"


class ClusterActions(Protocol):
    """What remediation asks of the Kubernetes API (``health.kube.KubeCluster``)."""

    def pods_on_node(self) -> list[PodRef]: ...
    def evict(self, pod: PodRef, *, grace_s: int) -> str: ...
    def gang_pods(self, namespace: str, gang: str) -> list[PodRef]: ...  # on every node
    def post_event(
        self, *, reason: str, message: str, pod: PodRef | None = None, warning: bool = True
    ) -> None: ...
    def set_conditions(self, conditions: tuple[NodeCondition, ...]) -> None: ...
    def taint_counts(
        self, key: str
    ) -> tuple[int, int, bool]: ...  # nodes total, nodes tainted, this node tainted
    def set_taint(self, key: str, *, present: bool, value: str = "") -> None: ...
    def set_cordon(self, cordoned: bool) -> None: ...
    def list_bad_hardware(self) -> dict[str, BadGpu]: ...
    def add_bad_hardware(self, entry: BadGpu) -> None: ...


class DeviceOps(Protocol):
    def gpu_busy(self, uuid: str) -> bool: ...
    def reset_gpu(self, uuid: str) -> None: ...


# (parent GPU UUID, MIG device UUID) -> True when recreated, False when no instance serves it any
# more (a reshape replaced it); raises ``GpuInUseError`` while the instance is busy.
MigRecreate = Callable[[str, str], bool]
WallClock = Callable[[], datetime.datetime]


@dataclass
class Remediator:
    node_name: str
    device_ops: DeviceOps
    badlist: BadHardwareList
    cluster: ClusterActions | None = None
    recreate_mig: MigRecreate | None = None
    metrics: HealthMetrics | None = None
    pod_devices: PodDeviceLookup | None = None
    wall_clock: WallClock = field(default=lambda: datetime.datetime.now(datetime.UTC))
    state: StateWriter | None = None  # the health state files; unsaved ones are retried every round
    # DRA mode: a failed device is published with a NoExecute device taint, and kube-controller-
    # manager's device-taint eviction is the one owner of evicting its pods (it honours a claim's
    # toleration, e.g. an admin's diagnostic pod); the agent then evicts none of them itself and
    # waits for them to leave. Their gangs' other members are still chased from here.
    taints_evict: bool = False
    _evicted: set[tuple[str, str]] = field(default_factory=set)
    # (namespace, gang) -> (device, its record): gangs whose other members are still to be evicted
    _gangs: dict[tuple[str, str], tuple[str, DeviceRecord]] = field(default_factory=dict)
    _published: dict[str, object] = field(default_factory=dict)
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _in_use: dict[str, int] = field(default_factory=dict)  # device -> rounds its reset waited for users
    _reboot: dict[str, str] = field(default_factory=dict)  # device -> why only a reboot can reset it

    def __call__(self, monitor: HealthMonitor) -> None:
        unsaved = self._retry_state()
        self._collect(monitor)
        snap = monitor.snapshot()
        self._announce(snap.gpus)
        self._announce(snap.migs)
        failed = [
            (d, r)
            for book in (snap.gpus, snap.migs)
            for d, r in book.items()
            if r.state is DeviceState.FAILED
        ]
        for gone in (self._in_use.keys() | self._reboot.keys()) - {d for d, _ in failed}:
            self._in_use.pop(gone, None)
            self._reboot.pop(gone, None)
        for device, record in failed:
            self._remediate(monitor, device, record)
        self._evict_gangs(monitor.settings.eviction_grace_s)
        self._sync_bad_list(monitor)
        self._publish_node(monitor, unsaved)

    # --- per device -----------------------------------------------------------------------------

    def _remediate(self, monitor: HealthMonitor, device: str, record: DeviceRecord) -> None:
        action = record.next_action()
        if action is None or device in self._jobs:  # one step per device at a time
            return
        if action is Action.REPLACE:
            self._retire(monitor, device, f"needs replacement: {record.reason}")
        elif action is Action.REBOOT_NODE:
            with monitor.lock:
                monitor.engine.node_faults.add(
                    NodeFault(NodeFaultKind.REBOOT_REQUIRED, device, record.reason)
                )
        elif self._drained(monitor, device, record):
            self._run(monitor, device, action)

    def _run(self, monitor: HealthMonitor, device: str, action: Action) -> None:
        engine = monitor.engine
        gpu = engine.mig_parent.get(device, device)
        if device in self._reboot:
            self._need_reboot(monitor, device, self._reboot[device])  # kept until the node reboots
            return
        if action is Action.RESET_GPU and self.device_ops.gpu_busy(gpu):
            self._waited(monitor, device, "compute processes still run on it")
            return  # still in use: wait for the processes to end
        if action is Action.RECREATE_MIG and self.recreate_mig is None:
            log.warning("MIG device %s failed; no MIG manager can recreate it: it stays withheld", device)
            return
        with monitor.lock:
            engine.apply(device, RemediationStarted(monitor.now(), action))
        monitor.publish()
        job = _Job(action)
        job.thread = threading.Thread(
            target=lambda: job.result.append(self._attempt(monitor, device, gpu, action)),
            name=f"remediate-{device[:20]}",
            daemon=True,
        )
        self._jobs[device] = job
        job.thread.start()
        job.thread.join(monitor.settings.check_timeout_s)  # a quick step finishes in this round
        self._collect(monitor)

    def _collect(self, monitor: HealthMonitor) -> None:
        """Apply the results of finished remediation steps; a step still running keeps its device."""
        for device, job in list(self._jobs.items()):
            if not job.result:
                log.info("remediation of %s (%s) still running for %.0f s", device, job.action, job.age())
                continue
            del self._jobs[device]
            self._finished(monitor, device, job.action, job.result[0])

    def _finished(
        self, monitor: HealthMonitor, device: str, action: Action, finished: RemediationFinished
    ) -> None:
        with monitor.lock:
            monitor.engine.apply(device, finished)
        monitor.publish()
        if device in self._reboot:
            self._need_reboot(monitor, device, self._reboot[device])
            return
        if finished.retry:
            self._waited(monitor, device, finished.detail)
            return
        if self.metrics is not None:
            self.metrics.remediations.labels(action.value, "ok" if finished.ok else "failed").inc()
        reason = f"Gpuweave{'Remediated' if finished.ok else 'RemediationFailed'}"
        self._event(reason, f"{device}: {action} {finished.detail}".strip(), warning=not finished.ok)

    def _attempt(self, monitor: HealthMonitor, device: str, gpu: str, action: Action) -> RemediationFinished:
        """Run one remediation step; a GPU still in use is a retry, not a failed attempt."""
        try:
            if action is Action.RECREATE_MIG:
                if self.recreate_mig is None:
                    raise RuntimeError(f"no MIG manager to recreate {device}")
                if not self.recreate_mig(gpu, device):
                    gone = "nothing to recreate: a MIG reshape of its GPU has since replaced the device"
                    return RemediationFinished(monitor.now(), True, gone)
            else:
                self.device_ops.reset_gpu(gpu)
        except RebootRequiredError as exc:
            self._reboot[device] = str(exc)  # applied by the round thread (``_finished``)
            return RemediationFinished(monitor.now(), False, f"{action} impossible: {exc}", retry=True)
        except GpuInUseError as exc:
            return RemediationFinished(monitor.now(), False, f"{action} waits: {exc}", retry=True)
        except Exception as exc:
            log.warning("remediation of %s: %s failed: %s", device, action, exc)
            return RemediationFinished(monitor.now(), False, f"{action} failed: {exc}")
        return RemediationFinished(monitor.now(), True)

    def _waited(self, monitor: HealthMonitor, device: str, detail: str) -> None:
        """One more round the device's reset waited for its users; past ``reset_in_use_rounds`` a
        reboot is asked for (it frees every holder) instead of waiting for ever."""
        rounds = self._in_use.get(device, 0) + 1
        self._in_use[device] = rounds
        if rounds >= monitor.settings.reset_in_use_rounds:
            reason = f"reset still refused after {rounds} rounds in use ({detail}); a reboot frees the GPU"
            self._need_reboot(monitor, device, reason)

    def _need_reboot(self, monitor: HealthMonitor, device: str, reason: str) -> None:
        """The device stays withheld; the node gets a reboot-required fault (condition, capped taint)."""
        first = device not in self._reboot
        self._reboot[device] = reason
        with monitor.lock:
            monitor.engine.node_faults.add(NodeFault(NodeFaultKind.REBOOT_REQUIRED, device, reason))
        if first:
            log.error("%s: %s", device, reason)
            self._event("GpuweaveRebootRequired", f"{device}: {reason}", warning=True)

    def _drained(self, monitor: HealthMonitor, device: str, record: DeviceRecord) -> bool:
        """Evict pods on the device (once each); True when none remain.

        A pod is on the device when its assignment annotation or the kubelet (``pod_devices``)
        names one of the device's IDs. When the kubelet cannot be asked, the pods found through
        annotations are still evicted, but the device does not count as drained this round.
        """
        if self.cluster is None:
            return True
        ids = _device_ids(monitor, device)
        try:
            listed = self.cluster.pods_on_node()
        except Exception as exc:
            log.warning("cannot list pods for %s: %s; retrying next round", device, exc)
            return False
        allocated, complete = self._kubelet_devices(device)
        pods = [p for p in listed if _holds(p.devices | allocated.pop((p.namespace, p.name), _NONE), ids)]
        only_kubelet = sorted(allocated.items())  # not (yet or any more) listed by the API server
        pods += [PodRef(space, name, held) for (space, name), held in only_kubelet if _holds(held, ids)]
        for pod in pods:
            if self.taints_evict:
                self._left_to_taint_eviction(pod, device, record)
            else:
                self._evict(pod, device, record, monitor.settings.eviction_grace_s)
        return complete and not pods

    def _left_to_taint_eviction(self, pod: PodRef, device: str, record: DeviceRecord) -> None:
        """DRA mode: the device-taint eviction controller evicts the pod (or leaves it, when its
        claim tolerates the taint); marked handled so no gang chase evicts it from here."""
        key = (pod.namespace, pod.name)
        if key in self._evicted:
            return
        self._evicted.add(key)
        log.info("%s/%s on failed %s: left to the device-taint eviction", pod.namespace, pod.name, device)
        if pod.gang and pod.whole_gang and not pod.opted_out:
            self._gangs.setdefault((pod.namespace, pod.gang), (device, record))

    def _kubelet_devices(self, device: str) -> tuple[dict[tuple[str, str], frozenset[str]], bool]:
        """(namespace, name) -> devices the kubelet allocated, and False when it could not be asked."""
        if self.pod_devices is None:
            return {}, True
        try:
            return dict(self.pod_devices()), True
        except Exception as exc:
            log.warning("cannot read pod devices from the kubelet for %s: %s; retrying", device, exc)
            return {}, False

    def _evict(self, pod: PodRef, device: str, record: DeviceRecord, grace_s: int) -> None:
        if (pod.namespace, pod.name) in self._evicted:
            return
        message = f"evicted: device {device} failed ({record.reason}); grace {grace_s} s"
        evicted = self._evict_once(pod, record, grace_s, reason="GpuweaveDeviceFailed", message=message)
        if evicted and pod.gang and pod.whole_gang:  # its gang follows (``_evict_gangs``)
            self._gangs.setdefault((pod.namespace, pod.gang), (device, record))

    def _evict_once(
        self, pod: PodRef, record: DeviceRecord, grace_s: int, *, reason: str, message: str
    ) -> bool:
        """Evict the pod unless it opted out or went already; True once it is gone (an Event on
        it), False while it stays (refused now, retried next round; or opted out)."""
        key = (pod.namespace, pod.name)
        if key in self._evicted:
            return True
        if pod.opted_out or self.cluster is None:
            return False
        outcome = self.cluster.evict(pod, grace_s=grace_s)
        if self.metrics is not None:
            self.metrics.evictions.labels((record.cause or Cause.HARDWARE).value, outcome).inc()
        if outcome not in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            log.info("eviction of %s/%s %s; retrying next round", pod.namespace, pod.name, outcome)
            return False
        self._evicted.add(key)
        self.cluster.post_event(reason=reason, message=message, pod=pod)
        return True

    def _evict_gangs(self, grace_s: int) -> None:
        """Evict the other members, on any node, of every gang a member of which was evicted for a
        failed device: a training gang makes no progress without it, and its job controller
        re-creates the members together. Retried each round until every member is gone or opted
        out (labelled so, or saying ``gpuweave.io/gang-eviction: pod``); a PodDisruptionBudget
        refusal waits for the next round."""
        if self.cluster is None:
            return
        for (namespace, gang), (device, record) in list(self._gangs.items()):
            try:
                members = self.cluster.gang_pods(namespace, gang)
            except Exception as exc:
                log.warning("cannot list the pods of gang %s: %s; retrying next round", gang, exc)
                continue
            message = (
                f"evicted with its gang {gang}: a member's device {device} failed ({record.reason}); "
                f"grace {grace_s} s"
            )
            gone = [  # a member that says gpuweave.io/gang-eviction: pod goes only with its own device
                m.opted_out
                or not m.whole_gang
                or self._evict_once(m, record, grace_s, reason="GpuweaveGangEvicted", message=message)
                for m in members
            ]
            if all(gone):
                del self._gangs[(namespace, gang)]

    def _retire(self, monitor: HealthMonitor, device: str, reason: str) -> None:
        gpu = monitor.engine.mig_parent.get(device, device)
        with monitor.lock:
            monitor.engine.mark_bad(gpu, reason)
        monitor.publish()

    # --- node level -----------------------------------------------------------------------------

    def _sync_bad_list(self, monitor: HealthMonitor) -> None:
        with monitor.lock:
            retired = monitor.engine.retired()
            strikes = monitor.engine.strikes()
        self.badlist.save_strikes({**self.badlist.strikes(), **strikes})
        for uuid, record in retired.items():
            entry = BadGpu(uuid, record.reason, self.node_name, self.wall_clock().isoformat(), record.strikes)
            if self.badlist.add(entry):
                self._event("GpuweaveBadHardware", f"GPU {uuid} is on the bad-hardware list: {record.reason}")
            if self.cluster is not None and self._published.get(f"bad/{uuid}") is None:
                try:
                    self.cluster.add_bad_hardware(self.badlist.entries()[uuid])
                    self._published[f"bad/{uuid}"] = True
                except Exception as exc:
                    log.warning("cannot publish bad GPU %s: %s; retrying next round", uuid, exc)

    def _retry_state(self) -> dict[str, str]:
        """Write unsaved state files again; an Event when the set of unsaved files changes."""
        if self.state is None:
            return {}
        unsaved = self.state.retry()
        before = self._published.get("unsaved", {})
        if unsaved and unsaved != before:
            files = ", ".join(f"{name} ({error})" for name, error in sorted(unsaved.items()))
            self._event(
                "GpuweaveHealthStateUnsaved",
                f"cannot save {files}: kept in memory, checking goes on, retried every round; "
                "free space or fix the state volume, a restart now would lose them",
            )
        elif before and not unsaved:
            self._event("GpuweaveHealthStateSaved", "every health state file is saved again", warning=False)
        self._published["unsaved"] = unsaved
        return unsaved

    def _publish_node(self, monitor: HealthMonitor, unsaved: Mapping[str, str]) -> None:
        if self.cluster is None:
            return
        snap = monitor.snapshot()
        try:
            conditions = (*node_conditions(snap), node_verdict(snap), state_condition(unsaved))
            if self._published.get("conditions") != conditions:
                self.cluster.set_conditions(conditions)
                self._published["conditions"] = conditions
            self._node_taint(monitor, snap.node_faults)
            if self._published.get("startup") != snap.startup_pending:
                self.cluster.set_taint(TAINT_HEALTH_PENDING, present=snap.startup_pending)
                self._published["startup"] = snap.startup_pending
        except Exception as exc:
            log.warning("cannot publish node health: %s; retrying next round", exc)

    def _node_taint(self, monitor: HealthMonitor, faults: frozenset[NodeFault]) -> None:
        """Taint or untaint under the cap; lists the nodes only while there is something to decide."""
        assert self.cluster is not None
        if not faults and self._published.get("tainted") is False:
            return  # no fault and known untainted: no API traffic (every node runs this every round)
        total, tainted, mine = self.cluster.taint_counts(TAINT_NODE_FAULT)
        self._published["tainted"] = mine
        decision = taint_decision(
            faults,
            already_tainted=mine,
            nodes_total=total,
            nodes_tainted=tainted,
            cap_fraction=monitor.settings.disruption_cap_fraction,
        )
        if decision.taint != mine:
            kinds = ",".join(sorted({f.kind.value for f in faults}))
            self.cluster.set_taint(TAINT_NODE_FAULT, present=decision.taint, value=kinds)
            self._published["tainted"] = decision.taint
            if monitor.settings.cordon_node_faults:
                self.cluster.set_cordon(decision.taint)
            self._event(
                "GpuweaveNodeFault" if decision.taint else "GpuweaveNodeFaultCleared",
                decision.reason,
                warning=decision.taint,
            )
        elif decision.blocked_by_cap and self._published.get("blocked") != decision.reason:
            self._event("GpuweaveNodeTaintBlocked", decision.reason)
        self._published["blocked"] = decision.reason if decision.blocked_by_cap else None

    def _announce(self, book: Mapping[str, DeviceRecord]) -> None:
        """A node Event for each device that changed state since the last round."""
        for device, record in book.items():
            key = f"state/{device}"
            previous = self._published.get(key, DeviceState.HEALTHY)
            if previous == record.state:
                continue
            self._published[key] = record.state
            healthy = record.state is DeviceState.HEALTHY
            message = f"{device}: {previous} -> {record.state}" + (
                f" ({record.reason})" if record.reason else ""
            )
            self._event(f"GpuweaveDevice{record.state}", message, warning=not healthy)

    def _event(self, reason: str, message: str, *, warning: bool = True) -> None:
        if self.cluster is None:
            log.info("%s: %s", reason, message)
            return
        try:
            self.cluster.post_event(reason=reason, message=message, warning=warning)
        except Exception as exc:
            log.warning("cannot post event %s: %s", reason, exc)


@dataclass
class _Job:
    """One remediation step running on its own thread; ``result`` gets its outcome."""

    action: Action
    thread: threading.Thread | None = None
    result: list[RemediationFinished] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def age(self) -> float:
        return time.monotonic() - self.started


def _holds(devices: frozenset[str], ids: frozenset[str]) -> bool:
    """A pod holding ``devices`` uses one of ``ids`` (directly, or through a share of it)."""
    return bool(devices & ids) or any(parent_gpu_of_share(d) in ids for d in devices)


def _device_ids(monitor: HealthMonitor, device: str) -> frozenset[str]:
    """The device-plugin IDs served from ``device``: a GPU with its MIG devices, or one MIG device."""
    engine = monitor.engine
    if device in engine.mig_parent:
        return frozenset({device})
    return frozenset({device, *(m for m, parent in engine.mig_parent.items() if parent == device)})
