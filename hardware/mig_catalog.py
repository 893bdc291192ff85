"""MIG GPU-instance profiles per GPU model: the facts the planner and the simulation share.

NVML numbers a profile twice: the *profile index* (``NVML_GPU_INSTANCE_PROFILE_*``, the argument of
``nvmlDeviceGetGpuInstanceProfileInfo``) and the *profile ID* (``info.id``, what ``nvidia-smi mig
-lgip`` prints and what every other call takes). Both are kept here. Placements are in memory-slice
units: a GPU has 8 memory slots (A30: 4), and a profile may only start at the listed slots.

Sources: the MIG user guide tables and ``nvidia-smi mig -lgipp`` captures (A100, H100, H100 NVL,
A30). The H200's profile IDs, slice counts, counts, placements and memory sizes are NVML's answers
on a real NVIDIA H200 (driver 580.159.04, ``tests/fixtures/nvml/nvidia-h200-580.159.04.json``,
held to the simulator by the replay test). B200 placements and profile IDs follow the H100 set (the
guide gives fractions, not placements), and its memory sizes are derived from the profile's share
of the GPU; on a real node the backend reads ``info.id`` and ``memorySizeMB`` from NVML instead.

Pure: no I/O, no NVML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import Architecture

# NVML_GPU_INSTANCE_PROFILE_* values (nvml.h).
PROFILE_1_SLICE: Final = 0x0
PROFILE_2_SLICE: Final = 0x1
PROFILE_3_SLICE: Final = 0x2
PROFILE_4_SLICE: Final = 0x3
PROFILE_7_SLICE: Final = 0x4
PROFILE_1_SLICE_REV1: Final = 0x7  # "+me": one slice with media engines
PROFILE_2_SLICE_REV1: Final = 0x8
PROFILE_1_SLICE_REV2: Final = 0x9  # one compute slice, twice the memory

# NVML_COMPUTE_INSTANCE_PROFILE_* for a compute instance covering a whole GPU instance.
_FULL_CI_PROFILE_INDEX: Final = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4}


class MigCatalogError(GpuweaveError):
    """A GPU model or MIG profile is not in the catalog."""


@dataclass(frozen=True)
class Placement:
    """A run of memory slots ``[start, start + size)``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start

    def describe(self) -> str:
        if self.size == 1:
            return f"slot {self.start}"
        return f"slots {self.start}-{self.end - 1}"


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile as ``nvidia-smi mig -lgip`` and ``-lgipp`` show it."""

    name: str  # "3g.40gb", "1g.10gb+me"
    profile_index: int  # NVML_GPU_INSTANCE_PROFILE_*
    profile_id: int  # info.id
    memory_slices: int  # = placement size
    compute_slices: int
    memory_mib: int
    max_count: int
    starts: tuple[int, ...]  # valid placement starts

    @property
    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(start, self.memory_slices) for start in self.starts)

    @property
    def ci_profile_index(self) -> int:
        """The compute-instance profile index of the one full-size compute instance."""
        return _FULL_CI_PROFILE_INDEX[self.compute_slices]


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and its profiles."""

    key: str  # "H100-80GB"
    products: tuple[str, ...]  # names as nvmlDeviceGetName reports them
    architecture: Architecture
    memory_slices: int
    compute_slices: int
    memory_mib: int
    profiles: tuple[GiProfile, ...]

    @property
    def resets_for_mode_change(self) -> bool:
        """Ampere needs a GPU reset to apply a MIG mode change; Hopper and later do not."""
        return self.architecture == Architecture.AMPERE

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1

    def profile(self, name: str) -> GiProfile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        offered = ", ".join(p.name for p in self.profiles)
        raise MigCatalogError(f"profile {name} is not offered by {self.key}; offered: {offered}")

    def profile_by_id(self, profile_id: int) -> GiProfile:
        for profile in self.profiles:
            if profile.profile_id == profile_id:
                return profile
        raise MigCatalogError(f"{self.key} has no GPU-instance profile with ID {profile_id}")

    def profile_by_index(self, profile_index: int) -> GiProfile | None:
        for profile in self.profiles:
            if profile.profile_index == profile_index:
                return profile
        return None


_EIGHT_SLOT_STARTS: Final = {
    PROFILE_1_SLICE: (0, 1, 2, 3, 4, 5, 6),
    PROFILE_1_SLICE_REV1: (0, 1, 2, 3, 4, 5, 6),
    PROFILE_1_SLICE_REV2: (0, 2, 4, 6),
    PROFILE_2_SLICE: (0, 2, 4),
    PROFILE_3_SLICE: (0, 4),
    PROFILE_4_SLICE: (0,),
    PROFILE_7_SLICE: (0,),
}
# (index, id, memory slices, compute slices, max count) of the 8-slot profile set.
_EIGHT_SLOT_SHAPES: Final = (
    (PROFILE_1_SLICE, 19, 1, 1, 7),
    (PROFILE_1_SLICE_REV1, 20, 1, 1, 1),
    (PROFILE_1_SLICE_REV2, 15, 2, 1, 4),
    (PROFILE_2_SLICE, 14, 2, 2, 3),
    (PROFILE_3_SLICE, 9, 4, 3, 2),
    (PROFILE_4_SLICE, 5, 4, 4, 1),
    (PROFILE_7_SLICE, 0, 8, 7, 1),
)


def _eight_slot_model(
    key: str,
    *,
    products: tuple[str, ...],
    architecture: Architecture,
    memory_mib: int,
    names: tuple[str, str, str, str, str, str, str],
    mib: tuple[int, int, int, int],
) -> GpuModel:
    """An 8-slot model; ``names`` in _EIGHT_SLOT_SHAPES order, ``mib`` for 1, 2, 4 and 8 slots."""
    mib_by_slices = {1: mib[0], 2: mib[1], 4: mib[2], 8: mib[3]}
    profiles = tuple(
        GiProfile(
            name=name,
            profile_index=index,
            profile_id=profile_id,
            memory_slices=memory,
            compute_slices=compute,
            memory_mib=mib_by_slices[memory],
            max_count=max_count,
            starts=_EIGHT_SLOT_STARTS[index],
        )
        for name, (index, profile_id, memory, compute, max_count) in zip(
            names, _EIGHT_SLOT_SHAPES, strict=True
        )
    )
    return GpuModel(key, products, architecture, 8, 7, memory_mib, profiles)


def _names(small: int, double: int, half: int, full: int) -> tuple[str, str, str, str, str, str, str]:
    return (
        f"1g.{small}gb",
        f"1g.{small}gb+me",
        f"1g.{double}gb",
        f"2g.{double}gb",
        f"3g.{half}gb",
        f"4g.{half}gb",
        f"7g.{full}gb",
    )


def _a30() -> GpuModel:
    shapes = (
        ("1g.6gb", PROFILE_1_SLICE, 14, 1, 1, 5952, 4, (0, 1, 2, 3)),
        ("1g.6gb+me", PROFILE_1_SLICE_REV1, 21, 1, 1, 5952, 1, (0, 1, 2, 3)),
        ("2g.12gb", PROFILE_2_SLICE, 5, 2, 2, 11968, 2, (0, 2)),
        ("2g.12gb+me", PROFILE_2_SLICE_REV1, 6, 2, 2, 11968, 1, (0, 2)),
        ("4g.24gb", PROFILE_4_SLICE, 0, 4, 4, 24000, 1, (0,)),
    )
    profiles = tuple(
        GiProfile(name, index, pid, memory, compute, mib, count, starts)
        for name, index, pid, memory, compute, mib, count, starts in shapes
    )
    return GpuModel("A30-24GB", ("NVIDIA A30",), Architecture.AMPERE, 4, 4, 24576, profiles)


def _build_models() -> tuple[GpuModel, ...]:
    ampere, hopper, blackwell = Architecture.AMPERE, Architecture.HOPPER, Architecture.BLACKWELL
    return (
        _eight_slot_model(
            "A100-SXM4-40GB",
            products=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
            architecture=ampere,
            memory_mib=40960,
            names=_names(5, 10, 20, 40),
            mib=(4864, 9856, 19968, 40192),
        ),
        _eight_slot_model(
            "A100-80GB",
            products=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"),
            architecture=ampere,
            memory_mib=81920,
            names=_names(10, 20, 40, 80),
            mib=(9856, 19968, 40192, 80384),
        ),
        _a30(),
        _eight_slot_model(
            "H100-80GB",
            products=("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 SXM5 80GB"),
            architecture=hopper,
            memory_mib=81559,
            names=_names(10, 20, 40, 80),
            mib=(9984, 20096, 40448, 81152),
        ),
        _eight_slot_model(
            "H100-94GB-NVL",
            products=("NVIDIA H100 NVL",),
            architecture=hopper,
            memory_mib=95830,
            names=_names(12, 24, 47, 94),
            mib=(11264, 22784, 45824, 93184),
        ),
        _eight_slot_model(
            "H200-141GB",
            products=("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H200 141GB HBM3e"),
            architecture=hopper,
            memory_mib=143771,
            names=_names(18, 35, 71, 141),
            # As NVML reports them on an H200 (driver 580.159.04): the 1-slot profiles get less than
            # half of the 2-slot size, and 7g.141gb 143360 of the GPU's 143771 MiB.
            mib=(16384, 33280, 71424, 143360),
        ),
        _eight_slot_model(
            "B200-180GB",
            products=("NVIDIA B200",),
            architecture=blackwell,
            memory_mib=183359,
            names=_names(23, 45, 90, 180),
            mib=(22528, 45056, 90624, 181248),
        ),
    )


@dataclass(frozen=True)
class MigCatalog:
    """All catalogued models, looked up by key or by the product name NVML reports."""

    models: tuple[GpuModel, ...]

    def model(self, key: str) -> GpuModel:
        for model in self.models:
            if model.key == key:
                return model
        raise MigCatalogError(f"no MIG model {key!r}; known: {', '.join(m.key for m in self.models)}")

    def for_product(self, product: str) -> GpuModel:
        wanted = _normalise(product)
        for model in self.models:
            if wanted in {_normalise(p) for p in model.products} or wanted == _normalise(model.key):
                return model
        known = "; ".join(p for m in self.models for p in m.products)
        raise MigCatalogError(
            f"GPU product {product!r} is not in the MIG catalog (known: {known}); "
            "add its profiles to hardware/mig_catalog.py or leave MIG off for it"
        )

    def supports(self, product: str) -> bool:
        try:
            self.for_product(product)
        except MigCatalogError:
            return False
        return True


def _normalise(product: str) -> str:
    words = product.casefold().replace("_", " ").split()
    if words and words[0] == "nvidia":
        words = words[1:]
    return " ".join(words)


def default_catalog() -> MigCatalog:
    """The built-in catalog (a fresh immutable value; cheap to build)."""
    return MigCatalog(_build_models())
