"""Plans and results as JSON: what crosses to the exerciser's child process and back.

The child's output is input like any other (a crashed or confused process can print anything), so
each line is bounded and validated with pydantic before it becomes a ``CheckResult``; a line that
does not validate is dropped and counted by the caller.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import clip
from hardware.exerciser.protocol import (
    GPU_CHECKS,
    CheckKind,
    CheckResult,
    ExercisePlan,
    GpuTarget,
    PeerPair,
    ResultStatus,
)

MAX_LINE_BYTES = 64 << 10
MAX_DETAIL_CHARS = 400


def plan_to_json(plan: ExercisePlan) -> str:
    return json.dumps(asdict(plan))


class _Target(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int = Field(ge=0)
    uuid: str = Field(max_length=128)
    pci_bus_id: str = Field(max_length=64)
    memory_mib: int = Field(ge=0)


class _Pair(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    src: str = Field(max_length=128)
    dst: str = Field(max_length=128)
    lanes: int = Field(ge=0, le=1024)


class _Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    level: int = Field(ge=1, le=4)
    gpus: list[_Target] = Field(max_length=1024)
    pairs: list[_Pair] = Field(default_factory=list, max_length=1 << 16)
    memory_fraction: float = Field(gt=0, le=0.95)
    compute_threads: dict[str, int] = Field(default_factory=dict)
    compute_iterations: int = Field(ge=0, lt=1 << 32)
    compute_seconds: float = Field(ge=0)
    copy_bytes: int = Field(gt=0, le=16 << 30)
    copy_repeats: int = Field(ge=1, le=1000)
    peer_only: bool = False
    gpu_checks: list[CheckKind] = Field(default_factory=lambda: list(GPU_CHECKS), max_length=8)


def plan_from_json(text: str) -> ExercisePlan:
    data = _Plan.model_validate_json(text)
    return ExercisePlan(
        level=data.level,
        gpus=tuple(GpuTarget(**t.model_dump()) for t in data.gpus),
        pairs=tuple(PeerPair(**p.model_dump()) for p in data.pairs),
        memory_fraction=data.memory_fraction,
        compute_threads=dict(data.compute_threads),
        compute_iterations=data.compute_iterations,
        compute_seconds=data.compute_seconds,
        copy_bytes=data.copy_bytes,
        copy_repeats=data.copy_repeats,
        peer_only=data.peer_only,
        gpu_checks=tuple(k for k in data.gpu_checks if k in GPU_CHECKS),
    )


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    check: CheckKind
    gpu: str = Field(max_length=128)
    status: ResultStatus
    peer: str | None = Field(None, max_length=128)
    seconds: float = Field(0.0, ge=0)
    bytes: int = Field(0, ge=0)
    mismatches: int = Field(0, ge=0)
    first_bad_byte: int | None = Field(None, ge=0)
    answer_ok: bool | None = None
    gbps: float | None = Field(None, ge=0)
    verdict: str = Field("", max_length=16)
    test: str = Field("", max_length=128)
    detail: str = ""


def result_to_dict(result: CheckResult) -> dict[str, Any]:
    return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(result).items()}


def result_from_dict(data: object) -> CheckResult:
    """A ``CheckResult`` from decoded JSON; ``ValueError`` when it is not one."""
    try:
        model = _Result.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"not a check result: {clip(str(exc), limit=200)}") from exc
    fields = model.model_dump()
    fields["detail"] = clip(fields["detail"], limit=MAX_DETAIL_CHARS)
    return CheckResult(**fields)


class ChildLine(BaseModel):
    """One line the child prints: a check begins, a check's result, or why it cannot run at all."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    event: Literal["begin", "result", "fatal"]
    check: CheckKind | None = None
    gpu: str | None = Field(None, max_length=128)
    peer: str | None = Field(None, max_length=128)
    result: dict[str, Any] | None = None
    detail: str = ""


def child_line(line: bytes) -> ChildLine:
    """Parse one line of the child's output; ``ValueError`` for anything else."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"line of {len(line)} bytes is longer than {MAX_LINE_BYTES}")
    try:
        return ChildLine.model_validate_json(line)
    except ValidationError as exc:
        raise ValueError(f"not an exerciser line: {clip(str(exc), limit=200)}") from exc
