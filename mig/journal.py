"""The MIG journal: what each GPU should look like, written before any NVML call touches it.

``STATE_DIR/mig-journal.json`` holds, per GPU UUID, the declared layout (explicit placements, or
``None`` for a whole GPU with MIG off) and, while a reshape is in flight, the plan's steps and the
index of the next one. A crash at any point leaves the journal describing where the GPU was going;
on restart the reconciler re-plans from the journalled target and the state NVML reports, so steps
already done are not repeated and none are lost. The declared layout also survives reboots and
driver reloads, which wipe MIG instances (and, on Hopper and later, MIG mode) — it is re-applied
at start.

Writes are atomic (temporary file, fsync, ``os.replace``, fsync of the directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import GpuweaveError
from devicemodel.state_file import replace_file_atomically
from mig.planner import PlannedInstance

JOURNAL_FILE = "mig-journal.json"
JOURNAL_VERSION = 1


class MigJournalError(GpuweaveError):
    """The journal file cannot be read or written."""


@dataclass(frozen=True)
class Step:
    """One NVML-level step of a plan, identified by placement (GI ids are reused by the driver)."""

    op: Literal["destroy", "create", "enable-mig", "disable-mig", "reset"]
    profile: str = ""
    start: int = 0
    size: int = 0

    def describe(self) -> str:
        if self.op in ("destroy", "create"):
            return f"{self.op} {self.profile} at {self.start}:{self.size}"
        return self.op


@dataclass(frozen=True)
class GpuRecord:
    """Journalled state of one GPU: the declared target and the reshape in flight, if any."""

    gpu_uuid: str
    model: str
    target: tuple[PlannedInstance, ...] | None  # None: whole GPU, MIG off
    steps: tuple[Step, ...] = ()
    next_step: int = 0
    updated: float = 0.0

    @property
    def in_flight(self) -> bool:
        return self.next_step < len(self.steps)


@dataclass(frozen=True)
class JournalState:
    gpus: dict[str, GpuRecord] = field(default_factory=dict)


class _InstanceWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str
    start: int = Field(ge=0)
    size: int = Field(ge=1)


class _StepWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["destroy", "create", "enable-mig", "disable-mig", "reset"]
    profile: str = ""
    start: int = 0
    size: int = 0


class _GpuWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    target: list[_InstanceWire] | None
    steps: list[_StepWire] = Field(default_factory=list)
    next_step: int = Field(default=0, ge=0)
    updated: float = 0.0


class _JournalWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = JOURNAL_VERSION
    gpus: dict[str, _GpuWire] = Field(default_factory=dict)


class MigJournal:
    """Reads and atomically rewrites the journal file; one instance per node agent."""

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(state_dir) / JOURNAL_FILE

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> JournalState:
        if not self._path.exists():
            return JournalState()
        try:
            wire = _JournalWire.model_validate_json(self._path.read_bytes())
        except (ValidationError, OSError) as exc:
            raise MigJournalError(
                f"MIG journal {self._path} is unreadable ({exc.__class__.__name__}); "
                "fix or remove it, then restart the node agent"
            ) from exc
        return JournalState({uuid: _from_wire(uuid, gpu) for uuid, gpu in wire.gpus.items()})

    def record(self, gpu: GpuRecord) -> None:
        """Replace one GPU's record and write the file atomically."""
        state = self.load()
        gpus = dict(state.gpus)
        gpus[gpu.gpu_uuid] = gpu
        self._write(JournalState(gpus))

    def advance(self, gpu_uuid: str, next_step: int, *, now: float) -> GpuRecord:
        record = self.load().gpus[gpu_uuid]
        updated = replace(record, next_step=next_step, updated=now)
        self.record(updated)
        return updated

    def _write(self, state: JournalState) -> None:
        wire = _JournalWire(gpus={uuid: _to_wire(gpu) for uuid, gpu in state.gpus.items()})
        payload = json.dumps(wire.model_dump(), indent=2, sort_keys=True).encode()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        replace_file_atomically(self._path, payload, sync_directory=True)


def _from_wire(uuid: str, gpu: _GpuWire) -> GpuRecord:
    target = (
        None if gpu.target is None else tuple(PlannedInstance(i.profile, i.start, i.size) for i in gpu.target)
    )
    steps = tuple(Step(s.op, s.profile, s.start, s.size) for s in gpu.steps)
    return GpuRecord(uuid, gpu.model, target, steps, min(gpu.next_step, len(steps)), gpu.updated)


def _to_wire(gpu: GpuRecord) -> _GpuWire:
    target = (
        None
        if gpu.target is None
        else [_InstanceWire(profile=i.profile, start=i.start, size=i.size) for i in gpu.target]
    )
    steps = [_StepWire(op=s.op, profile=s.profile, start=s.start, size=s.size) for s in gpu.steps]
    return _GpuWire(model=gpu.model, target=target, steps=steps, next_step=gpu.next_step, updated=gpu.updated)
