"""The ``GpuPreflight`` object: a gang's preflight on one node, asked by the extender, answered by
that node's agent (CRD ``manifests/crds/gpupreflights.yaml``; docs/health.md, Gang preflight).

Both sides read it through these models, so they agree on its shape by construction. The
extender writes ``spec`` (``PreflightSpec``: the node, the GPUs the gang will use there, the
checks) and nothing else; the node agent of ``spec.nodeName`` writes ``status``
(``PreflightStatus``: the phase, one verdict per GPU, a message) and nothing else. Each reads the
other's half as input from another component: validated here, bounded, a bad one refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.contracts import API_GROUP, API_VERSION, PREFLIGHT_KIND
from devicemodel.errors import InvalidInputError, clip
from devicemodel.validation import first_problem

MAX_GPUS = 64
MAX_MESSAGE = 1024
MANAGED_BY = "gpuweave-extender"  # app.kubernetes.io/managed-by of the objects the extender writes
Phase = Literal["Running", "Passed", "Failed", "Incomplete", "Refused"]
Checks = Literal["bandwidth", "full"]


class PreflightSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    node_name: str = Field(alias="nodeName", min_length=1, max_length=253)
    gpus: list[str] = Field(default_factory=list, max_length=MAX_GPUS)  # empty: every idle GPU
    checks: Checks = "bandwidth"  # bandwidth: host <-> device and NVLink copies; full: every check
    level: int = Field(default=1, ge=1, le=2)
    requester: str = Field(default="", max_length=512)


class GpuVerdict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    verdict: Literal["passed", "failed", "incomplete", "skipped"]
    reason: str = Field(default="", max_length=MAX_MESSAGE)


class PreflightStatus(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    phase: Phase
    message: str = Field(default="", max_length=MAX_MESSAGE)
    run: int | None = Field(default=None, ge=0)
    gpus: dict[str, GpuVerdict] = Field(default_factory=dict, max_length=MAX_GPUS)


def preflight_object(name: str, spec: PreflightSpec) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": PREFLIGHT_KIND,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        "spec": spec.model_dump(by_alias=True),
    }


def read_spec(obj: Mapping[str, Any]) -> PreflightSpec:
    """The object's spec; ``InvalidInputError`` naming the field that is not right."""
    try:
        return PreflightSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="spec")
        raise InvalidInputError(f"GpuPreflight spec.{where}: {problem}") from None


def read_status(obj: Mapping[str, Any]) -> PreflightStatus | None:
    """The object's status, None while it has none; ``InvalidInputError`` for one that is not right."""
    status = obj.get("status")
    if not status:
        return None
    try:
        return PreflightStatus.model_validate(status)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="status")
        raise InvalidInputError(f"GpuPreflight status.{where}: {problem}") from None


def status_body(status: PreflightStatus) -> dict[str, Any]:
    body = status.model_dump(exclude_none=True)
    body["message"] = clip(body.get("message", ""), limit=MAX_MESSAGE - 40)
    return body
