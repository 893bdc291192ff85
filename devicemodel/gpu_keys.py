"""Naming a GPU in configuration: by UUID, by PCI bus id, or by index.

NVML numbers GPUs in PCI bus order at driver load, so when one GPU is missing after a reboot every
GPU behind it moves down one index, and a setting keyed by index lands on the wrong GPU. UUIDs
(``GPU-...``) and PCI bus ids (``0000:53:00.0`` or NVML's ``00000000:53:00.0``, any case) do not
move; an index is still accepted for hand-written files on nodes whose GPUs never go missing.
Pure: keys are normalized once, at the edge, and matched against inventory values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from devicemodel.errors import InvalidInputError
from devicemodel.spec_derive import normalize_bus_id

_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_UUID = re.compile(r"^GPU-[0-9A-Za-z-]+$")




class NamedGpu(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def pci_bus_id(self) -> str: ...


G = TypeVar("G", bound=NamedGpu)
V = TypeVar("V")


def gpu_key(text: str) -> str:
    """The canonical form of a GPU key (index digits, UUID as given, bus id in NVML's form);
    ``InvalidInputError`` naming the key when it is none of the three."""
    key = text.strip()
    if key.isdigit():
        return str(int(key))
    if _UUID.match(key):
        return key
    if _BUS_ID.match(key):
        return normalize_bus_id(key)
    raise InvalidInputError(
        f"GPU key {text!r} is not a GPU UUID (GPU-...), PCI bus id (0000:53:00.0) or index (3)"
    )


def is_index_key(key: str) -> bool:
    return key.isdigit()


def matches(key: str, gpu: NamedGpu) -> bool:
    """Whether a canonical key names ``gpu``."""
    if key.isdigit():
        return int(key) == gpu.index
    if key.startswith("GPU-"):
        return key == gpu.uuid
    return key == normalize_bus_id(gpu.pci_bus_id)


def find_gpu(key: str, gpus: Iterable[G]) -> G | None:
    """The GPU a canonical key names, or None."""
    return next((g for g in gpus if matches(key, g)), None)


def canonical_keys(entries: Mapping[str, V]) -> dict[str, V]:
    """A per-GPU mapping with every key in ``gpu_key`` form; a bad key is a ``ValueError`` (for
    pydantic validators, which report it with the field's location)."""
    canonical: dict[str, V] = {}
    for key, value in entries.items():
        try:
            canonical[gpu_key(key)] = value
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
    return canonical
