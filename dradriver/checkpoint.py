"""The DRA claim checkpoint's shape, checked when the agent starts.

``STATE_DIR/dra-claims.json`` says which claims this node prepared (and which MIG instances it
made, and which GpuImexDomain it joined, for them); the agent cannot serve without knowing. A file
that is not JSON, not this version, or JSON of another shape (a key missing, a list where an
object goes) stops the start with one line naming the file and the first field at fault, never a
``KeyError`` later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from devicemodel.errors import GpuweaveError
from devicemodel.validation import first_problem

CHECKPOINT_VERSION = 1
FIX = "fix or remove the file (the kubelet prepares running claims again)"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Device(_Wire):
    request_names: list[str] = Field(alias="requestNames")
    pool_name: str = Field(alias="poolName")
    device_name: str = Field(alias="deviceName")
    cdi_device_ids: list[str] = Field(alias="cdiDeviceIDs")


class _DomainRef(_Wire):
    namespace: str
    name: str


class _Claim(_Wire):
    namespace: str
    name: str
    pending: bool = False
    mig: list[tuple[int, str, int]] = Field(default_factory=list)
    imex: _DomainRef | None = None  # the GpuImexDomain this node joined for the claim
    devices: list[_Device] | None = None
    spec: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _prepared_has_devices(self) -> _Claim:
        if not self.pending and (self.devices is None or self.spec is None):
            raise ValueError("a prepared claim needs its devices and spec")
        return self


class _Checkpoint(_Wire):
    version: int
    claims: dict[str, _Claim] = Field(default_factory=dict)


def load_checkpoint(path: Path) -> dict[str, dict[str, Any]]:
    """The checkpoint's claims by UID, as written (plain JSON values); {} when there is no file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise GpuweaveError(
            f"cannot read the DRA claim checkpoint {path} ({exc}): the agent does not know which "
            f"claims are prepared; {FIX}"
        ) from None
    try:
        checkpoint = _Checkpoint.model_validate(data)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="file")
        raise GpuweaveError(f"DRA claim checkpoint {path}: {where}: {problem}; {FIX}") from None
    if checkpoint.version != CHECKPOINT_VERSION:
        raise GpuweaveError(f"DRA claim checkpoint {path} is not version {CHECKPOINT_VERSION}; {FIX}")
    return {uid: dict(entry) for uid, entry in data.get("claims", {}).items()}
