"""Apply a MIG layout to one GPU: plan, journal, withhold, destroy, create, verify.

Order matters for crash safety. The reconciler reads NVML, plans, and writes the target layout and
the steps to the journal before the first NVML call that changes anything; each finished step
advances the journal. Every apply starts from what NVML reports, repairs what a crash can leave
behind (a GPU instance without its compute instance is completed when the target wants it, else
destroyed), and re-plans against the journalled placements — so a restart after a crash at any
point converges with no orphaned and no duplicated instances.

MIG mode: Hopper and later switch one GPU without a reset; Ampere records a pending mode that is
applied by resetting only that GPU, and only when nothing runs on it. Hopper and later lose MIG
mode and every instance on reboot or driver reload, Ampere loses the instances: at start
``mig.restore`` re-applies every journalled layout.

The node agent composes this with hooks (``MigHooks``): which devices pods hold, withholding
devices about to go, and a refresh once a GPU changed. ``mig/`` never imports the agent.

Each apply owns its GPU (``GpuOwners``) for its whole run, then takes the node-wide reshape lock
(one reshape at a time): health remediation of the same GPU (a reset, a recreated instance) waits
for it and it waits for them, while other GPUs go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from devicemodel.errors import GpuweaveError
from devicemodel.gpu_keys import find_gpu
from hardware.mig_catalog import GpuModel, MigCatalog
from hardware.mig_ops import NVML_ERROR_IN_USE, GpuInstanceRecord, MigNvmlError, MigOps
from mig.journal import GpuRecord, MigJournal, Step
from mig.metrics import MigMetrics
from mig.owners import GpuOwners
from mig.planner import Instance, MigPlanError, Plan, PlannedInstance, TargetEntry, plan_layout

LOG = logging.getLogger(__name__)


class MigApplyError(GpuweaveError):
    """A reshape could not be carried out or verified; the journal keeps the target for a retry."""


class MigHooks(Protocol):
    """What the node agent provides to the reconciler."""

    def busy_devices(self) -> Collection[str]:
        """Device IDs (GPU or MIG UUIDs) allocated to pods now."""
        ...

    def withhold(self, device_ids: Collection[str]) -> None:
        """Stop offering these devices for new allocations: they are about to be destroyed."""
        ...

    def release(self, device_ids: Collection[str]) -> None:
        """Offer these devices again (the reshape is over, or failed before destroying them)."""
        ...

    def changed(self, gpu_index: int) -> None:
        """The GPU's MIG devices changed: refresh the inventory and the device lists."""
        ...


class NoHooks:
    """Hooks for a reconciler running without a node agent (CLI dry runs, benchmarks)."""

    def busy_devices(self) -> Collection[str]:
        return ()

    def withhold(self, device_ids: Collection[str]) -> None:
        return None

    def release(self, device_ids: Collection[str]) -> None:
        return None

    def changed(self, gpu_index: int) -> None:
        return None


@dataclass(frozen=True)
class GpuRef:
    index: int
    uuid: str
    product: str
    pci_bus_id: str = ""  # lets a declared layout name the GPU by bus id (indexes move after a reboot)


@dataclass(frozen=True)
class CreatedDevice:
    profile: str
    start: int
    size: int
    mig_uuid: str


@dataclass(frozen=True)
class ReshapeResult:
    """What one apply changed on one GPU."""

    gpu_index: int
    gpu_uuid: str
    destroyed: tuple[str, ...]  # "3g.40gb at 0:4 (MIG-...)"
    created: tuple[CreatedDevice, ...]
    mode_change: str | None  # "enabled", "disabled" or None
    final: tuple[PlannedInstance, ...]

    @property
    def changed(self) -> bool:
        return bool(self.destroyed or self.created or self.mode_change)


@dataclass(frozen=True)
class GpuSnapshot:
    """What NVML (and the agent) said about one GPU at the start of an apply."""

    mode: tuple[bool, bool] | None  # (current, pending) enabled; None: no MIG support
    records: tuple[GpuInstanceRecord, ...]
    busy: frozenset[str]

    def record_at(self, start: int, size: int) -> GpuInstanceRecord | None:
        return next((r for r in self.records if (r.start, r.size) == (start, size)), None)

    def bare_at(self, start: int, size: int, profile_index: int) -> GpuInstanceRecord | None:
        """A GPU instance of this profile at this placement with no compute instance (crash leftover)."""
        record = self.record_at(start, size)
        if record is None or record.computes or record.profile_index != profile_index:
            return None
        return record

    def devices_of(self, instances: Sequence[Instance]) -> list[str]:
        """MIG UUIDs of the given instances (matched by GI id, as ``current`` keys them)."""
        keys = {i.key for i in instances}
        return [c.mig_uuid for r in self.records if str(r.gi_id) in keys for c in r.computes]


FaultHook = Callable[[str], None]


class MigReconciler:
    """Reshapes the node's GPUs one at a time through ``MigOps``."""

    def __init__(
        self,
        *,
        ops: MigOps,
        journal: MigJournal,
        catalog: MigCatalog,
        gpus: Sequence[GpuRef],
        hooks: MigHooks | None = None,
        clock: Callable[[], float] = time.time,
        fault: FaultHook | None = None,
        owners: GpuOwners | None = None,
        metrics: MigMetrics | None = None,
    ) -> None:
        self._ops = ops
        self._journal = journal
        self._catalog = catalog
        self._gpus = {g.index: g for g in gpus}
        self._hooks = hooks or NoHooks()
        self._clock = clock
        self._fault = fault or (lambda point: None)
        self._lock = threading.Lock()
        self.owners = owners or GpuOwners()
        self._metrics = metrics

    # -- queries -------------------------------------------------------------------------------

    def gpu(self, index: int) -> GpuRef:
        try:
            return self._gpus[index]
        except KeyError:
            known = ", ".join(str(i) for i in sorted(self._gpus))
            raise MigApplyError(f"no GPU with index {index} on this node (GPUs: {known})") from None

    def mig_gpus(self) -> list[int]:
        """Indices of the GPUs that support MIG (catalogued model, NVML reports a MIG mode)."""
        return [
            index
            for index, gpu in sorted(self._gpus.items())
            if self._catalog.supports(gpu.product) and self._ops.mig_mode(index) is not None
        ]

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """(current, pending) MIG mode of a GPU; None when it does not support MIG."""
        return self._ops.mig_mode(index)

    def gpu_by_uuid(self, uuid: str) -> GpuRef | None:
        return next((g for g in self._gpus.values() if g.uuid == uuid), None)

    def gpu_by_key(self, key: str) -> GpuRef | None:
        """The GPU a canonical key (``devicemodel.gpu_keys``: UUID, bus id or index) names."""
        return find_gpu(key, self._gpus.values())

    @property
    def journal(self) -> MigJournal:
        return self._journal

    def records(self, index: int) -> tuple[GpuInstanceRecord, ...]:
        """The GPU's instances as NVML reports them (none while MIG mode is off)."""
        mode = self._ops.mig_mode(index)
        return self._ops.instances(index) if mode is not None and mode[0] else ()

    def model(self, index: int) -> GpuModel:
        return self._catalog.for_product(self.gpu(index).product)

    def snapshot(self, index: int) -> GpuSnapshot:
        """One read of the GPU: MIG mode, instances, and which devices are busy."""
        mode = self._ops.mig_mode(index)
        records = self._ops.instances(index) if mode is not None and mode[0] else ()
        busy = set(self._hooks.busy_devices()) | self._ops.busy_devices(index)
        return GpuSnapshot(mode, records, frozenset(busy))

    def current(self, index: int) -> tuple[Instance, ...]:
        """The GPU's instances as the planner sees them (busy = a pod or a process holds its device)."""
        return self._instances(index, self.snapshot(index))

    def _instances(self, index: int, snap: GpuSnapshot) -> tuple[Instance, ...]:
        model = self.model(index)
        found = []
        for record in snap.records:
            profile = model.profile_by_index(record.profile_index)
            name = profile.name if profile else f"profile-{record.profile_id}"
            held = any(c.mig_uuid in snap.busy for c in record.computes)
            found.append(Instance(name, record.start, record.size, busy=held, key=str(record.gi_id)))
        return tuple(found)

    def plan(self, index: int, target: Sequence[TargetEntry] | None) -> Plan:
        """The plan ``apply`` would carry out now (``target`` None: whole GPU, MIG off)."""
        return plan_layout(self.model(index), self.current(index), target or ())

    # -- apply ---------------------------------------------------------------------------------

    def apply(self, index: int, target: Sequence[TargetEntry] | None) -> ReshapeResult:
        """Reshape one GPU to ``target`` (None: whole GPU, MIG off) and verify it."""
        with self.owners.hold(self.gpu(index).uuid, who="MIG reshape"), self._lock:
            started = self._clock()
            try:
                result = self._apply(index, target)
            except MigPlanError:
                self._count("refused")
                raise
            except BaseException:
                self._count("error")
                raise
            if result.changed:
                self._count("changed", seconds=self._clock() - started)
            return result

    def _count(self, outcome: str, *, seconds: float | None = None) -> None:
        if self._metrics is None:
            return
        self._metrics.reshapes.labels(outcome).inc()
        if seconds is not None:
            self._metrics.reshape_seconds.observe(max(seconds, 0.0))

    def recreate(self, index: int, mig_uuid: str) -> ReshapeResult | None:
        """Destroy the instance serving ``mig_uuid`` and create it again at the same placement.

        One owner of the GPU from the check to the end: the layout put back is the one NVML shows
        now, so a reshape that ran after the fault is kept, never reverted. None when no instance
        serves ``mig_uuid`` any more (a reshape destroyed it): nothing to recreate. A busy
        instance raises ``MigPlanError`` before anything changes.
        """
        with self.owners.hold(self.gpu(index).uuid, who="health: recreate MIG instance"), self._lock:
            snap = self.snapshot(index)
            record = next((r for r in snap.records if any(c.mig_uuid == mig_uuid for c in r.computes)), None)
            if record is None:
                return None
            current = self._instances(index, snap)
            layout = [TargetEntry(i.profile, i.start) for i in current]
            self._apply(
                index, [TargetEntry(i.profile, i.start) for i in current if i.key != str(record.gi_id)]
            )
            return self._apply(index, layout)

    def _apply(self, index: int, target: Sequence[TargetEntry] | None) -> ReshapeResult:
        gpu, model = self.gpu(index), self.model(index)
        snap = self.snapshot(index)
        if snap.mode is None:
            raise MigApplyError(f"GPU {index} ({gpu.product}) does not support MIG")
        plan = plan_layout(model, self._instances(index, snap), target or ())
        steps = self._steps(index, model, snap, plan, whole=target is None)
        final = None if target is None else plan.final
        self._journal.record(GpuRecord(gpu.uuid, model.key, final, tuple(steps), 0, self._clock()))
        withheld = snap.devices_of(plan.destroy)
        if any(s.op == "enable-mig" for s in steps):
            withheld.append(gpu.uuid)
        if withheld:
            self._hooks.withhold(withheld)
        try:
            result = self._run(index, model, steps, final, snap)
        except BaseException:
            if steps:
                self._hooks.changed(index)  # show what NVML has now; the journal keeps the target
            self._hooks.release(withheld)
            raise
        self._journal.record(GpuRecord(gpu.uuid, model.key, final, (), 0, self._clock()))
        if result.changed:
            self._hooks.changed(index)
        if withheld:
            self._hooks.release(withheld)
        return result

    def _steps(
        self, index: int, model: GpuModel, snap: GpuSnapshot, plan: Plan, *, whole: bool
    ) -> list[Step]:
        current, pending = snap.mode or (False, False)
        steps: list[Step] = []
        if not whole and (not current or not pending):
            self._require_idle_gpu(index, model, snap, wanted="enable")
            steps.append(Step("enable-mig"))
            if model.resets_for_mode_change:
                steps.append(Step("reset"))
        steps += [Step("destroy", i.profile, i.start, i.size) for i in plan.destroy]
        bare = {str(r.gi_id) for r in snap.records if not r.computes}  # a crash between the two creates
        steps += [Step("create", i.profile, i.start, i.size) for i in plan.keep if i.key in bare]
        steps += [Step("create", p.profile, p.start, p.size) for p in plan.create]
        if whole and (current or pending):
            self._require_idle_gpu(index, model, snap, wanted="disable")
            steps.append(Step("disable-mig"))
            if model.resets_for_mode_change:
                steps.append(Step("reset"))
        return steps

    def _require_idle_gpu(self, index: int, model: GpuModel, snap: GpuSnapshot, *, wanted: str) -> None:
        gpu = self.gpu(index)
        held = [c.mig_uuid for r in snap.records for c in r.computes if c.mig_uuid in snap.busy]
        if gpu.uuid in snap.busy or held:
            what = "a pod holds the whole GPU" if gpu.uuid in snap.busy else f"pods hold {', '.join(held)}"
            generation = "Ampere resets the GPU" if model.resets_for_mode_change else "the GPU must be idle"
            raise MigPlanError(
                f"cannot {wanted} MIG mode on GPU {index} ({model.key}): {what}; {generation}, "
                "so drain those pods first"
            )

    def _run(
        self,
        index: int,
        model: GpuModel,
        steps: Sequence[Step],
        final: tuple[PlannedInstance, ...] | None,
        snap: GpuSnapshot,
    ) -> ReshapeResult:
        gpu = self.gpu(index)
        destroyed: list[str] = []
        created: list[CreatedDevice] = []
        mode_change: str | None = None
        for number, step in enumerate(steps):
            self._fault(f"step-{number}:{step.op}:before")
            if step.op == "destroy":
                destroyed.append(self._destroy(index, step, snap.record_at(step.start, step.size)))
            elif step.op == "create":
                bare = snap.bare_at(step.start, step.size, model.profile(step.profile).profile_index)
                created.append(self._create(index, model, step, number, bare))
            elif step.op in ("enable-mig", "disable-mig"):
                mode_change = self._set_mode(index, enabled=step.op == "enable-mig")
            else:
                self._ops.reset(index)
            self._journal.advance(gpu.uuid, number + 1, now=self._clock())
        self._verify(index, model, final)
        return ReshapeResult(index, gpu.uuid, tuple(destroyed), tuple(created), mode_change, final or ())

    def _destroy(self, index: int, step: Step, record: GpuInstanceRecord | None) -> str:
        if record is None:
            return f"{step.profile} at {step.start}:{step.size} (already gone)"
        try:
            self._ops.destroy(index, gi_id=record.gi_id)
        except MigNvmlError as exc:
            if exc.code == NVML_ERROR_IN_USE:
                raise MigApplyError(
                    f"{step.profile} at {step.start}:{step.size} on GPU {index} is in use (NVML IN_USE); "
                    "drain its pod and apply again"
                ) from exc
            raise
        uuids = ", ".join(c.mig_uuid for c in record.computes) or "no compute instance"
        return f"{step.profile} at {step.start}:{step.size} ({uuids})"

    def _create(
        self, index: int, model: GpuModel, step: Step, number: int, record: GpuInstanceRecord | None
    ) -> CreatedDevice:
        """Create at the step's placement, or complete ``record``: a GPU instance left without its CI."""
        profile = model.profile(step.profile)
        if record is None:
            profile_id = self._ops.profile_ids(index)[profile.profile_index]
            gi_id = self._ops.create_gpu_instance_only(
                index, profile_id=profile_id, start=step.start, size=step.size
            )
            self._fault(f"step-{number}:create:gi-created")
        else:
            gi_id = record.gi_id
        mig_uuid = self._ops.complete(index, gi_id=gi_id, ci_profile_index=profile.ci_profile_index)
        return CreatedDevice(step.profile, step.start, step.size, mig_uuid)

    def _set_mode(self, index: int, *, enabled: bool) -> str:
        status = self._ops.set_mig_mode(index, enabled=enabled)
        if status == NVML_ERROR_IN_USE:
            raise MigApplyError(
                f"GPU {index} is in use; MIG mode change refused (NVML IN_USE); drain it first"
            )
        return "enabled" if enabled else "disabled"

    def _verify(self, index: int, model: GpuModel, final: tuple[PlannedInstance, ...] | None) -> None:
        mode = self._ops.mig_mode(index)
        enabled = bool(mode and mode[0])
        if final is None:
            if enabled:
                raise MigApplyError(f"GPU {index}: MIG mode is still on after disabling it")
            return
        if not enabled:
            raise MigApplyError(f"GPU {index}: MIG mode is not on after enabling it (a reset may be pending)")
        records = self._ops.instances(index)
        seen = sorted((r.start, r.size, len(r.computes)) for r in records)
        wanted = sorted((p.start, p.size, 1) for p in final)
        if seen != wanted:
            raise MigApplyError(
                f"GPU {index} ({model.key}) verification failed: NVML shows (start, size, compute instances) "
                f"{seen}, wanted {wanted}; apply again to converge"
            )
