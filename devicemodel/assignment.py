"""The extender → node-agent handoff: which devices a pod was given, recorded on the pod.

The extender writes this as JSON in the pod annotation ``gpuweave.io/assignment`` at bind; the
node agent's ``GetPreferredAllocation`` reads it back to return the same devices. The device IDs
are the device plugin's IDs (see ``device_id_*`` below), so both sides agree by construction.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from devicemodel.contracts import (
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    RESOURCE_MIG_PREFIX,
)
from devicemodel.errors import InvalidInputError
from devicemodel.validation import first_problem

ASSIGNMENT_VERSION = 1


def device_id_gpu(gpu_uuid: str) -> str:
    """Whole GPU: the GPU UUID itself (``GPU-...``)."""
    return gpu_uuid


def device_id_mig(mig_uuid: str) -> str:
    """MIG device: the MIG device UUID itself (``MIG-...``)."""
    return mig_uuid


def device_id_share(gpu_uuid: str, kind: str, unit: int) -> str:
    """One unit of a fractional or replicated GPU: ``<gpu-uuid>::<kind>-<unit>``.

    ``kind`` is ``compute`` (1% of the GPU), ``memory`` (1 GiB) or ``replica`` (time-slicing).
    """
    return f"{gpu_uuid}::{kind}-{unit}"


def parent_gpu_of_share(device_id: str) -> str | None:
    """The GPU UUID a share device ID belongs to, or None for a non-share ID."""
    head, sep, _ = device_id.partition("::")
    return head if sep else None


SHARE_KINDS = {RESOURCE_GPU_COMPUTE: "compute", RESOURCE_GPU_MEMORY: "memory", RESOURCE_GPU_SHARED: "replica"}


def fits_resource(resource: str, device_id: str) -> bool:
    """Whether ``device_id`` has the form of a device of ``resource``: a share unit of that
    resource's kind, a ``GPU-`` UUID for whole GPUs, a ``MIG-`` UUID for MIG devices, and for any
    other resource (EFA) neither of those nor a share unit."""
    kind = SHARE_KINDS.get(resource)
    if kind is not None:
        return f"::{kind}-" in device_id
    if "::" in device_id:
        return False
    if resource == RESOURCE_GPU:
        return device_id.startswith("GPU-")
    if resource.startswith(RESOURCE_MIG_PREFIX):
        return device_id.startswith("MIG-")
    return not device_id.startswith(("GPU-", "MIG-"))


class ContainerAssignment(BaseModel):
    """Devices chosen for one container, per resource name.

    ``devices`` maps a resource name (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
    ``vpc.amazonaws.com/efa``, ``gpuweave.io/gpu-compute`` ...) to the device IDs chosen. For share
    resources the IDs are share device IDs, all on one GPU.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: dict[str, list[str]] = Field(default_factory=dict)


_DnsName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
MAX_IMEX_NODES = 576  # the largest NVLink 5 domain: 576 GPUs, so never more nodes than that


class ImexDomain(BaseModel):
    """The IMEX domain of a pod that requests ``gpuweave.io/imex-channel``: its job's nodes.

    The extender writes it at bind for every member of a gang (the nodes its plan placed the gang
    on) or for a lone pod (its own node); the node agent configures the node's IMEX daemon with
    ``nodes`` while that pod holds the node's channel (docs/nvlink-domains.md, IMEX).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: _DnsName
    nodes: tuple[_DnsName, ...] = Field(min_length=1, max_length=MAX_IMEX_NODES)


def imex_domain_name(key: str) -> str:
    """A DNS-safe name for the IMEX domain of a job (a gang key or a pod's namespace/name): the
    key's safe characters, cut short, and a digest of the whole key so two keys never share one."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", key.lower()).strip("-.")[:200] or "job"
    return f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


class PodAssignment(BaseModel):
    """The whole annotation value. ``imex`` is written only for pods that request an IMEX channel,
    so the annotation of every other pod reads as before."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = ASSIGNMENT_VERSION
    node: str
    containers: dict[str, ContainerAssignment]
    imex: ImexDomain | None = None

    def to_annotation(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_annotation(cls, value: str) -> PodAssignment:
        try:
            return cls.model_validate_json(value)
        except ValidationError as exc:
            where, problem = first_problem(exc, whole="value")
            message = f"bad gpuweave.io/assignment annotation at {where}: {problem}"
            raise InvalidInputError(message) from exc

    def all_device_ids(self) -> set[str]:
        return {d for c in self.containers.values() for ids in c.devices.values() for d in ids}
