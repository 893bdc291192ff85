"""The NodeProfile format (docs/node-profiles.md): a node's hardware written as YAML, and its wire form.

A node profile describes simulated hardware for what-if runs; the same ``spec`` shape is the
``spec`` of the per-node inventory custom resource the node agent publishes and the extender
reads. So ``NodeProfileSpec.from_inventory`` is the exact inverse of ``to_inventory``: it fills
every optional field, and ``spec.to_inventory(node_name=n)`` of the result equals the inventory.

Optional fields are derived deterministically when omitted (GPU and MIG UUIDs from the node name,
PCI bus ids from the index, minor numbers, the PCIe root from the switch), so one profile file
yields distinct, stable devices on every simulated node. ``to_inventory`` returns the canonical
order discovery produces: GPUs by index, NICs by PCI bus id, NVLink pairs low index first.

Validation errors are ``ProfileError`` with one line naming the field path and the problem.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from devicemodel import inventory as inv
from devicemodel.errors import InvalidInputError
from devicemodel.spec_checks import check_spec, index_gap_problem
from devicemodel.spec_derive import (
    derived_gpu_bus_id,
    derived_gpu_uuid,
    derived_mig_uuid,
    derived_nic_bus_id,
    inventory_to_spec_dict,
    normalize_bus_id,
    spec_to_inventory,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "GpuSpec",
    "MigDeviceSpec",
    "NicSpec",
    "NodeProfile",
    "NodeProfileSpec",
    "NvLinkSpec",
    "NvSwitchSpec",
    "PcieSwitchSpec",
    "ProfileError",
    "derived_gpu_bus_id",
    "derived_gpu_uuid",
    "derived_mig_uuid",
    "derived_nic_bus_id",
    "normalize_bus_id",
]

API_VERSION = "gpuweave.io/v1alpha1"
KIND = "NodeProfile"
_PCI_BUS_ID = r"^([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class ProfileError(InvalidInputError):
    """A node profile (file or published inventory spec) failed validation."""


# Bounds from real hardware, with room: a profile outside them is a typo or hostile, and numbers
# here size what the agent builds (one device ID per GiB of a fractional GPU's memory, per GPU, ...).
MAX_GPUS = 256  # per node
MAX_NUMA = 64
MAX_GPU_MEMORY_MIB = 1 << 20  # 1 TiB per GPU (H200: 141 GiB, B300: 288 GiB)
MIN_GPU_MEMORY_MIB = 1 << 10  # 1 GiB
MAX_LINKS = 64  # NVLinks between two GPUs, or per GPU to an NVSwitch (H100: 18)
MAX_NICS = 512
MAX_MIG_SLICES = 32


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class PcieSwitchSpec(_Model):
    name: str = Field(pattern=_NAME)
    numa_node: int = Field(ge=0, lt=MAX_NUMA)
    root: str | None = Field(default=None, pattern=_NAME)
    # The host bridge's root port above the switch; omitted: the port every switch of ``root``
    # without one shares (they meet in an upstream switch: PXB), else its own (PHB to the others).
    root_port: str | None = Field(default=None, pattern=_NAME)


class GpuSpec(_Model):
    index: int = Field(ge=0, lt=MAX_GPUS)
    uuid: str | None = Field(default=None, pattern=r"^GPU-[0-9a-fA-F-]{8,}$")
    product: str = Field(min_length=1, max_length=256)
    architecture: inv.Architecture
    compute_capability: str = Field(pattern=r"^\d+\.\d+$", max_length=16)
    memory_mib: int = Field(ge=MIN_GPU_MEMORY_MIB, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    numa_node: int = Field(ge=0, lt=MAX_NUMA)
    pcie_switch: str | None = None
    mig_capable: bool = False
    pci_bus_id: str | None = Field(default=None, pattern=_PCI_BUS_ID)
    mig_enabled: bool = False
    minor: int | None = Field(default=None, ge=0, lt=1 << 20)
    pcie_root: str | None = Field(default=None, pattern=_NAME)
    # Simulation only (never published): the GPU is off the bus from the start and answers every
    # NVML call as such a GPU does, so the agent's lost-GPU path runs from a profile.
    lost: bool | None = None


class NvLinkSpec(_Model):
    gpus: tuple[int, int]
    links: int = Field(ge=1, le=MAX_LINKS)


class NvSwitchSpec(_Model):
    gpus: tuple[int, ...] = Field(min_length=1, max_length=MAX_GPUS)
    links_per_gpu: int = Field(ge=1, le=MAX_LINKS)
    # Simulation only (never published): the NVSwitch fabric's state as NVML reports it per GPU
    # (Hopper+) or as the Fabric Manager service shows it (Ampere); omitted means completed.
    fabric_state: Literal["not-started", "in-progress", "completed", "failed"] | None = None
    # The multi-node NVLink domain (GB200/GB300 NVL72): the cluster UUID and clique ID each GPU's
    # fabric reports (``nvmlDeviceGetGpuFabricInfoV``). Omitted: a single-node NVSwitch board.
    cluster_uuid: str | None = Field(default=None, pattern=UUID_PATTERN)
    clique_id: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)


class NicSpec(_Model):
    """A network adapter. ``uverbs`` omitted or null: derived for RDMA NICs (efa, infiniband);
    ``""``: none. ``netdev`` omitted or null: a plain Ethernet NIC (no uverbs) is named by its
    interface, so it defaults to ``name``; others have none unless given. ``""``: none."""

    name: str = Field(pattern=_NAME)
    type: inv.NicType
    numa_node: int = Field(ge=0, lt=MAX_NUMA)
    pcie_switch: str | None = None
    pci_bus_id: str | None = Field(default=None, pattern=_PCI_BUS_ID)
    uverbs: str | None = Field(default=None, pattern=r"^(/dev/infiniband/uverbs\d+)?$")
    netdev: str | None = Field(default=None, pattern=r"^([A-Za-z0-9][A-Za-z0-9_.:-]*)?$")
    pcie_root: str | None = Field(default=None, pattern=_NAME)


class MigDeviceSpec(_Model):
    """A MIG device (GPU instance + compute instance) on an already partitioned GPU."""

    gpu: int = Field(ge=0, lt=MAX_GPUS)
    uuid: str | None = Field(default=None, pattern=r"^MIG-[0-9a-fA-F-]{8,}$")
    profile: str = Field(pattern=r"^\d+g\.\d+gb(\+\w+)?$", max_length=32)
    gpu_instance_id: int = Field(ge=0, lt=1 << 16)
    compute_instance_id: int = Field(ge=0, lt=1 << 16)
    placement_start: int = Field(ge=0, lt=MAX_MIG_SLICES)
    placement_size: int = Field(ge=1, le=MAX_MIG_SLICES)
    memory_mib: int = Field(gt=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    compute_slices: int = Field(ge=1, le=MAX_MIG_SLICES)


class NodeProfileSpec(_Model):
    """The hardware of one node; also the ``spec`` of the published inventory resource."""

    numa_nodes: int = Field(ge=1, le=MAX_NUMA)
    pcie_switches: tuple[PcieSwitchSpec, ...] = Field(default=(), max_length=4 * MAX_GPUS)
    gpus: tuple[GpuSpec, ...] = Field(default=(), max_length=MAX_GPUS)
    nvlinks: tuple[NvLinkSpec, ...] = Field(default=(), max_length=MAX_GPUS * (MAX_GPUS - 1) // 2)
    nvswitch: NvSwitchSpec | None = None
    nics: tuple[NicSpec, ...] = Field(default=(), max_length=MAX_NICS)
    mig_devices: tuple[MigDeviceSpec, ...] = Field(default=(), max_length=MAX_GPUS * 7)
    driver_version: str = ""
    cuda_driver_version: str = ""

    @model_validator(mode="after")
    def _cross_field_checks(self) -> NodeProfileSpec:
        problem = check_spec(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @classmethod
    def parse(cls, data: object, *, source: str = "spec") -> NodeProfileSpec:
        """Validate a plain mapping (YAML/JSON) into a spec, or raise a one-line ProfileError."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _profile_error(exc, source=source, prefix="spec") from None

    def to_inventory(self, *, node_name: str) -> inv.NodeInventory:
        return spec_to_inventory(self, node_name=node_name)

    @classmethod
    def from_inventory(cls, inventory: inv.NodeInventory) -> NodeProfileSpec:
        return cls.parse(inventory_to_spec_dict(inventory), source=f"inventory of node {inventory.name}")

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready mapping (camelCase keys) used in YAML files and the inventory resource.

        Null fields are left out: in this format null and absent mean the same, and the API
        server prunes nulls anyway, so the wire form carries no nulls at all.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ProfileMetadata(_Model):
    name: str = Field(pattern=_NAME)


class NodeProfile(_Model):
    """A whole profile document: ``apiVersion``, ``kind``, ``metadata.name`` and ``spec``."""

    api_version: Literal["gpuweave.io/v1alpha1"]
    kind: Literal["NodeProfile"]
    metadata: ProfileMetadata
    spec: NodeProfileSpec

    @model_validator(mode="before")
    @classmethod
    def _every_gpu_listed(cls, data: Any) -> Any:
        """Checked before the spec so the gap is reported, not a link to the missing index."""
        spec = data.get("spec") if isinstance(data, dict) else None
        gpus = spec.get("gpus") if isinstance(spec, dict) else None
        if isinstance(gpus, list) and all(isinstance(g, dict) for g in gpus):
            indexes = [g.get("index") for g in gpus]
            if all(isinstance(i, int) and not isinstance(i, bool) for i in indexes):
                problem = index_gap_problem(indexes)
                if problem is not None:
                    raise ValueError(problem)
        return data

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def parse(cls, data: object, *, source: str = "profile") -> NodeProfile:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _profile_error(exc, source=source, prefix="") from None

    def to_inventory(self, *, node_name: str | None = None) -> inv.NodeInventory:
        """The inventory of a node built from this profile (named ``node_name``, default the profile)."""
        return self.spec.to_inventory(node_name=node_name or self.name)

    @classmethod
    def from_inventory(cls, inventory: inv.NodeInventory) -> NodeProfile:
        spec = NodeProfileSpec.from_inventory(inventory)
        return cls.model_validate(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": inventory.name}, "spec": spec}
        )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _profile_error(exc: ValidationError, *, source: str, prefix: str) -> ProfileError:
    errors = exc.errors()
    first = errors[0]
    path = _format_path(first["loc"], prefix=prefix)
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] != "value_error" and "input" in first and not isinstance(first["input"], dict):
        message = f"{message} (got {first['input']!r})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    # Cross-field messages (value_error) start with their own path below the model's.
    separator = "." if first["type"] == "value_error" else ": "
    where = f"{path}{separator}" if path else ""
    return ProfileError(f"{source}: {where}{message}{more}")


def _format_path(loc: tuple[int | str, ...], *, prefix: str) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path
