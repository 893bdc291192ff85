"""The node's health state: signals in, per-device records and node faults out (single-threaded).

``HealthEngine`` turns Xid events, kernel-log records, check findings and remediation outcomes
into state-machine events for the right device (the GPU, or the one MIG device a GI/CI-attributed
event names) and keeps the tolerance windows. It does no I/O and takes timestamps from the
injected clock, so tests drive it step by step; ``HealthMonitor`` serialises calls into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from devicemodel.inventory import NodeInventory
from health.checks import Finding
from health.config import HealthSettings
from health.policy import (
    DeviceRecord,
    DeviceState,
    Event,
    Fault,
    MarkedBad,
    RoundCompleted,
    WindowCounter,
    step,
)
from health.scope import HealthSnapshot, NodeFault, NodeFaultKind, StartupGate, mig_target
from health.signals.kmsg import KernelRecord, KernelSxid, PciKey, pci_key
from health.xid import Action, Severity, XidTable, is_grace_part, recovery_rule, table_for

Clock = Callable[[], float]
XID_DEDUP_S = 30.0  # an NVML event and its kernel-log line arrive within this of each other


class HealthEngine:
    def __init__(self, inventory: NodeInventory, settings: HealthSettings, *, clock: Clock) -> None:
        self.settings = settings
        self._clock = clock
        self.gpus: dict[str, DeviceRecord] = {}
        self.migs: dict[str, DeviceRecord] = {}
        self._windows: dict[tuple[str, str], WindowCounter] = {}
        self._checked_faults: dict[str, set[str]] = {}  # node-level faults found by checks, per kind group
        self.node_faults: set[NodeFault] = set()
        self.efa_up: dict[str, bool] = {}
        self.gate = StartupGate(settings.startup_rounds)
        # GPUs a failed active check withholds until one passes again: no round counts as clean
        # for them meanwhile, so they stay Suspect (or in Probation after a remediation).
        self.rechecks: dict[str, str] = {}
        self.fault_observers: list[Callable[[str, Fault], None]] = []
        self._seen_xids: dict[tuple[str, int], list[tuple[str, float]]] = {}  # (GPU, Xid) -> (source, at)
        self.update_inventory(inventory)

    def update_inventory(self, inventory: NodeInventory) -> None:
        """Track new GPUs and MIG devices (after a MIG reshape); records of known ones are kept."""
        self.inventory = inventory
        self._tables: dict[str, XidTable] = {
            g.uuid: table_for(
                g.architecture,
                grace=is_grace_part(g.product),
                overrides=self.settings.xid_overrides,
                boot_ignored=self.settings.boot_ignored_xids,
            )
            for g in inventory.gpus
        }
        self._by_pci: dict[PciKey, str] = {pci_key(g.pci_bus_id): g.uuid for g in inventory.gpus}
        self._mig_ids = {
            (m.parent_uuid, m.gpu_instance_id, m.compute_instance_id): m.uuid for m in inventory.mig_devices
        }
        self.mig_parent = {m.uuid: m.parent_uuid for m in inventory.mig_devices}
        self.gpus = {g.uuid: self.gpus.get(g.uuid, DeviceRecord()) for g in inventory.gpus}
        self.migs = {m.uuid: self.migs.get(m.uuid, DeviceRecord()) for m in inventory.mig_devices}

    # --- state-machine plumbing ---------------------------------------------------------------

    def apply(self, device: str, event: Event) -> DeviceRecord:
        """Step the record of a GPU UUID or MIG UUID; unknown devices are ignored."""
        book = self.migs if device in self.migs else self.gpus if device in self.gpus else None
        if book is None:
            return DeviceRecord()
        book[device] = step(book[device], event, self.settings.policy)
        if isinstance(event, Fault):
            for observer in self.fault_observers:
                observer(device, event)
        return book[device]

    def snapshot(self) -> HealthSnapshot:
        return HealthSnapshot(
            gpus=dict(self.gpus),
            migs=dict(self.migs),
            mig_parent=dict(self.mig_parent),
            efa_up=dict(self.efa_up),
            node_faults=frozenset(self.node_faults),
            startup_pending=self.gate.pending,
        )

    def _windowed(self, device: str, signal: str, at: float, threshold_hit: bool = False) -> bool:
        window = self.settings.xid_windows.get(int(signal[4:])) if signal.startswith("xid-") else None
        if window is None:
            return threshold_hit
        counter = self._windows.get((device, signal), WindowCounter())
        counter, tripped = counter.observe(at, window)
        self._windows[(device, signal)] = counter
        return tripped

    # --- signals ------------------------------------------------------------------------------

    def on_xid(
        self,
        gpu_uuid: str,
        xid: int,
        *,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        nonfatal_hint: bool = False,
        at_boot: bool = False,
        source: str = "nvml",
    ) -> Severity:
        """Grade an Xid by the GPU's family table and apply it to the GPU or the named MIG device.

        The driver reports one Xid twice, as an NVML event and as a kernel-log line; whichever
        arrives first counts and the other one (same GPU and Xid, within ``XID_DEDUP_S``) is dropped.
        """
        table = self._tables.get(gpu_uuid)
        if table is None or self._duplicate(gpu_uuid, xid, source):
            return Severity.IGNORED
        rule = table.rule(xid, at_boot=at_boot, nonfatal_hint=nonfatal_hint)
        target = mig_target(
            gpu_uuid, gpu_instance=gpu_instance, compute_instance=compute_instance, mig_ids=self._mig_ids
        )
        device = target or gpu_uuid
        at = self._clock()
        severity = rule.severity
        if severity is Severity.APPLICATION and self._windowed(device, f"xid-{xid}", at):
            severity = Severity.SUSPECT  # the same application-class Xid too often: suspect the device
        ladder = rule.ladder
        if target is not None and severity is Severity.FATAL:
            ladder = tuple(_mig_step(a) for a in ladder)
        where = f" on GPU instance {gpu_instance}" if target else ""
        fault = Fault(
            at, "xid", severity, f"Xid {xid} ({rule.name}){where}", rule.cause, ladder, rule.strike, xid
        )
        self.apply(device, fault)
        return severity

    def _duplicate(self, gpu_uuid: str, xid: int, source: str) -> bool:
        now = self._clock()
        seen = [(s, t) for s, t in self._seen_xids.get((gpu_uuid, xid), []) if now - t < XID_DEDUP_S]
        for entry in seen:
            if entry[0] != source:
                seen.remove(entry)
                self._seen_xids[(gpu_uuid, xid)] = seen
                return True
        self._seen_xids[(gpu_uuid, xid)] = [*seen, (source, now)]
        return False

    def on_recovery_action(self, gpu_uuid: str, action: int, *, source: str = "nvml") -> Severity:
        """The driver's recommended recovery action for a GPU (Xid 154 / NVML event 0x8000).

        It concerns the whole GPU even when the Xid behind it was attributed to one MIG device.
        """
        if gpu_uuid not in self.gpus or self._duplicate(gpu_uuid, 1000 + action, source):
            return Severity.IGNORED
        rule = recovery_rule(action)
        reason = f"driver recovery action {rule.name.removeprefix('RECOVERY_')} (Xid 154)"
        fault = Fault(
            self._clock(), "recovery-action", rule.severity, reason, rule.cause, rule.ladder, rule.strike, 154
        )
        self.apply(gpu_uuid, fault)
        return rule.severity

    def on_kernel_record(self, record: KernelRecord, *, at_boot: bool) -> None:
        if isinstance(record, KernelSxid):
            if record.fatal:
                subject = "{:04x}:{:02x}:{:02x}".format(*record.pci)
                detail = f"fatal SXid {record.sxid}: {record.text[:120]}"
                self.node_faults.add(NodeFault(NodeFaultKind.NVSWITCH_FATAL, subject, detail))
            return
        uuid = self._by_pci.get(record.pci)
        if uuid is not None and record.recovery_action is not None:
            self.on_recovery_action(uuid, record.recovery_action, source="kmsg")
        elif uuid is not None:
            self.on_xid(
                uuid,
                record.xid,
                gpu_instance=record.gpu_instance,
                compute_instance=record.compute_instance,
                nonfatal_hint=record.nonfatal_hint,
                at_boot=at_boot,
                source="kmsg",
            )

    def on_findings(self, gpu_uuid: str, findings: Iterable[Finding]) -> bool:
        """Apply one round's findings for a GPU; True when the GPU was clean this round."""
        at, clean = self._clock(), True
        for finding in findings:
            clean = False
            fault = Fault(
                at,
                finding.signal,
                finding.severity,
                finding.reason,
                finding.cause,
                finding.ladder,
                finding.strike,
            )
            self.apply(gpu_uuid, fault)
        return clean

    def end_round(self, clean_gpus: set[str], *, all_checks_completed: bool) -> None:
        """Close a round: clean devices move along probation (not those awaiting an active
        re-check); the startup gate counts the round."""
        at = self._clock()
        clean_gpus = clean_gpus - self.rechecks.keys()
        for uuid in list(self.gpus):
            self.apply(uuid, RoundCompleted(at, clean=uuid in clean_gpus))
        for mig, parent in self.mig_parent.items():
            if mig in self.migs:
                self.apply(mig, RoundCompleted(at, clean=parent in clean_gpus))
        self.gate = self.gate.after_round(all_checks_completed=all_checks_completed)

    def set_checked_node_faults(self, kinds: set[NodeFaultKind], faults: frozenset[NodeFault]) -> None:
        """Replace the node faults of ``kinds`` with what this round's check found (they can clear)."""
        self.node_faults = {f for f in self.node_faults if f.kind not in kinds} | set(faults)

    def mark_bad(self, uuid: str, reason: str) -> None:
        self.apply(uuid, MarkedBad(self._clock(), reason))

    def retired(self) -> dict[str, DeviceRecord]:
        return {u: r for u, r in self.gpus.items() if r.state is DeviceState.RETIRED}

    def strikes(self) -> dict[str, int]:
        return {u: r.strikes for u, r in self.gpus.items() if r.strikes}

    def restore_strikes(self, strikes: dict[str, int]) -> None:
        for uuid, count in strikes.items():
            if uuid in self.gpus:
                self.gpus[uuid] = replace(self.gpus[uuid], strikes=count)

    def gpu_index(self, uuid: str) -> int | None:
        for gpu in self.inventory.gpus:
            if gpu.uuid == uuid:
                return gpu.index
        return None

    def mig_placement(self, mig_uuid: str) -> tuple[str, int, int] | None:
        for key, uuid in self._mig_ids.items():
            if uuid == mig_uuid:
                return key
        return None


def _mig_step(action: Action) -> Action:
    """A fault contained to one MIG device is first remediated by recreating that instance."""
    return Action.RECREATE_MIG if action is Action.RESET_GPU else action
