"""How each GPU is offered: whole, as fractional MPS shares, or as time-sliced replicas.

A GPU is offered under exactly one mode so the kubelet's per-resource accounting can never hand
the same GPU out twice: ``exclusive`` (``nvidia.com/gpu``), ``fractional``
(``gpuweave.io/gpu-compute`` in 1% units plus ``gpuweave.io/gpu-memory`` in 1 GiB units) or
``time-sliced`` (``gpuweave.io/gpu-shared`` with a per-GPU replica count). The configuration is a
YAML file read at the edge with pydantic and turned into a frozen ``SharingPlan``.

A fractional GPU's limits are enforced by its own MPS control daemon (``nodeagent.mps``):
``mpsPipeDirectory`` is the base path under which each such GPU gets ``<uuid>/pipe`` and
``<uuid>/log``, and a GPU's ``mps`` entry sets the defaults its daemon gives a client that sets
no limit of its own.

A cluster can hold several named configurations (one file ``<name>.yaml`` each in a directory);
a node picks one with its label ``gpuweave.io/sharing-config`` (``named_sharing_file``), as
NVIDIA's device plugin picks one per node by ``nvidia.com/device-plugin.config``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from devicemodel.errors import InvalidInputError, clip
from devicemodel.gpu_keys import canonical_keys
from devicemodel.inventory import Gpu
from devicemodel.spec_derive import normalize_bus_id
from devicemodel.validation import first_problem

MILLI_PER_GPU = 1000  # a GPU in the milli-GPU units of the FGD trace and fragmentation measure
COMPUTE_UNITS_PER_GPU = 100  # gpuweave.io/gpu-compute: 1% of one GPU
MILLI_PER_COMPUTE_UNIT = MILLI_PER_GPU // COMPUTE_UNITS_PER_GPU
MIB_PER_GIB = 1024  # gpuweave.io/gpu-memory is counted in GiB
DEFAULT_REPLICAS = 4  # gpuweave.io/gpu-shared replicas of a time-sliced GPU that names none


def memory_units(memory_mib: int) -> int:
    """The ``gpuweave.io/gpu-memory`` units (whole GiB) a GPU of ``memory_mib`` offers: the one
    count the node agent lists and the extender plans against."""
    return memory_mib // MIB_PER_GIB


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"
    FRACTIONAL = "fractional"
    TIME_SLICED = "time-sliced"


class MpsModel(BaseModel):
    """A fractional GPU's MPS daemon defaults (its control commands), for clients that set none."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    default_active_thread_percentage: int | None = Field(
        default=None, ge=1, le=100, alias="defaultActiveThreadPercentage"
    )
    default_pinned_memory_mib: int | None = Field(default=None, ge=1, alias="defaultPinnedMemoryMiB")


class GpuSharingModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    mode: SharingMode = SharingMode.EXCLUSIVE
    replicas: int = Field(default=DEFAULT_REPLICAS, ge=1, le=64)
    mps: MpsModel = MpsModel()


class SharingConfigModel(BaseModel):
    """The file format: ``gpus`` keys are GPU UUIDs (``GPU-...``), PCI bus ids (``0000:53:00.0``) or
    indexes (``"0"``; an index moves when a GPU is missing at boot, the other two do not)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: Literal["gpuweave.io/v1alpha1"] = Field(default="gpuweave.io/v1alpha1", alias="apiVersion")
    kind: Literal["SharingConfig"] = "SharingConfig"
    default: GpuSharingModel = GpuSharingModel()
    gpus: dict[str, GpuSharingModel] = Field(default_factory=dict)
    mps_pipe_directory: str | None = Field(default=None, alias="mpsPipeDirectory")

    @field_validator("gpus")
    @classmethod
    def _keys_name_gpus(cls, gpus: dict[str, GpuSharingModel]) -> dict[str, GpuSharingModel]:
        return canonical_keys(gpus)


@dataclass(frozen=True)
class MpsDefaults:
    thread_percentage: int | None = None
    pinned_memory_mib: int | None = None


@dataclass(frozen=True)
class GpuSharing:
    mode: SharingMode
    replicas: int = DEFAULT_REPLICAS
    mps: MpsDefaults = MpsDefaults()


@dataclass(frozen=True)
class SharingPlan:
    """Per-GPU sharing decisions; GPUs not named use ``default``."""

    default: GpuSharing = GpuSharing(SharingMode.EXCLUSIVE)
    per_gpu: dict[str, GpuSharing] = field(default_factory=dict, hash=False)
    mps_pipe_directory: str | None = None

    def for_gpu(self, gpu: Gpu) -> GpuSharing:
        """By UUID, then PCI bus id, then index (keys in ``devicemodel.gpu_keys`` canonical form)."""
        for key in (gpu.uuid, normalize_bus_id(gpu.pci_bus_id), str(gpu.index)):
            if key in self.per_gpu:
                return self.per_gpu[key]
        return self.default


def plan_from_model(model: SharingConfigModel) -> SharingPlan:
    def convert(entry: GpuSharingModel) -> GpuSharing:
        mps = MpsDefaults(entry.mps.default_active_thread_percentage, entry.mps.default_pinned_memory_mib)
        return GpuSharing(entry.mode, entry.replicas, mps)

    return SharingPlan(
        default=convert(model.default),
        per_gpu={key: convert(value) for key, value in model.gpus.items()},
        mps_pipe_directory=model.mps_pipe_directory,
    )


def load_sharing_plan(path: Path) -> SharingPlan:
    """Read a sharing configuration file; a bad file is an ``InvalidInputError`` naming the field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read sharing config {path}: {exc}") from exc
    try:
        return plan_from_model(SharingConfigModel.model_validate(raw or {}))
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="value")
        raise InvalidInputError(f"bad sharing config {path} at {where}: {problem}") from exc


# A named sharing configuration is chosen by a node label's value: the same characters, 63 at most
SHARING_CONFIG_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
SHARING_CONFIG_SUFFIX = ".yaml"


def named_sharing_configs(directory: Path) -> list[str]:
    """The names of the sharing configurations in ``directory`` (``<name>.yaml`` each), sorted."""
    try:
        files = sorted(directory.glob(f"*{SHARING_CONFIG_SUFFIX}"))
    except OSError as exc:
        raise InvalidInputError(f"cannot list sharing configurations in {directory}: {exc}") from exc
    return [f.name.removesuffix(SHARING_CONFIG_SUFFIX) for f in files if SHARING_CONFIG_NAME.match(f.stem)]


def named_sharing_file(directory: Path, name: str, *, label: str) -> Path:
    """The file of the configuration ``name`` (a node's ``label`` value) in ``directory``; a name
    that is no configuration there is refused, naming those there are."""
    names = named_sharing_configs(directory)
    if not SHARING_CONFIG_NAME.match(name) or name not in names:
        there = ", ".join(names) or "none"
        raise InvalidInputError(
            f"node label {label}={clip(name, limit=80)!r} names no sharing configuration in {directory} "
            f"(there: {there}); add it (the chart's nodeAgent.sharingConfigs) or label the node with one "
            "of those"
        )
    return directory / f"{name}{SHARING_CONFIG_SUFFIX}"
