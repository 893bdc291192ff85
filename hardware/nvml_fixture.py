"""Recorded NVML answers as JSON, and the comparison that holds the simulator to them.

A fixture (``tests/fixtures/nvml/<product>-<driver>.json``) is one recording: which machine it
came from (product, driver, GPU count, the built-in profile that describes it, the MIG layout it
had) and one entry per call: the call, its symbolic arguments (``gpu3``, a link number, a profile
ID) and either the answer (``ok``: scalars, lists, and structs as the fields the product reads) or
the NVML error it returned (``error``: ``NVML_ERROR_NOT_SUPPORTED``).

``compare`` checks a second recording (the simulator's) against it: the same calls, the same
errors, the same values where the value is a property of the product (names, memory in bytes,
MIG profiles and placements, link counts, topology levels, event masks) and the same *form* where
it depends on the machine (UUIDs, bus IDs, minor numbers, temperatures, counters, versions).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hardware.backend import HardwareError, HardwareTimeoutError

FORMAT_VERSION = 1
Json = Any

# call -> the parts compared by form: "" is the whole answer, else a top-level struct field.
BY_FORM: Mapping[str, frozenset[str]] = {
    call: frozenset(parts)
    for call, parts in {
        "nvmlSystemGetDriverVersion": [""],
        "nvmlSystemGetNVMLVersion": [""],
        "nvmlSystemGetCudaDriverVersion": [""],
        "nvmlDeviceGetUUID": [""],
        "nvmlDeviceGetPciInfo": ["busId"],
        "nvmlDeviceGetNvLinkRemotePciInfo": ["busId"],
        "nvmlDeviceGetMinorNumber": [""],
        "nvmlDeviceGetNumaNodeId": [""],
        "nvmlDeviceGetTotalEccErrors": [""],
        "nvmlDeviceGetRemappedRows": [""],
        "nvmlDeviceGetRetiredPagesPendingStatus": [""],
        "nvmlDeviceGetTemperature": [""],
        "nvmlDeviceGetCurrPcieLinkWidth": [""],
        "nvmlDeviceGetCurrPcieLinkGeneration": [""],
        "nvmlDeviceGetComputeRunningProcesses": [""],
        "nvmlGpuInstanceGetInfo": ["id"],
        "nvmlComputeInstanceGetInfo": ["id"],
        "nvmlDeviceGetGpuInstanceId": [""],
    }.items()
}
_HEX_RUN = re.compile(r"[0-9A-Fa-f]+")


class FixtureError(HardwareError):
    """A fixture file cannot be read or is not a recording this code understands."""


@dataclass(frozen=True)
class Entry:
    """One call and what NVML answered: ``{"ok": value}`` or ``{"error": "NVML_ERROR_..."}``."""

    call: str
    args: tuple[object, ...]
    answer: Mapping[str, Json]

    @property
    def key(self) -> tuple[str, str]:
        return self.call, json.dumps(list(self.args))


def encode_error(error: HardwareError, lib: Any) -> dict[str, Json]:
    """The NVML error's constant name (``NVML_ERROR_NOT_SUPPORTED``); "timeout" for a hung call."""
    if isinstance(error, HardwareTimeoutError) and error.code is None:
        return {"error": "timeout"}
    for name in dir(lib):
        if name.startswith("NVML_ERROR_") and getattr(lib, name) == error.code:
            return {"error": name}
    return {"error": f"code {error.code}" if error.code is not None else type(error).__name__}


def encode_answer(value: object, *, fields: Sequence[str] | None = None) -> dict[str, Json]:
    """``{"ok": ...}`` with structs reduced to ``fields`` (all of a nested struct's fields)."""
    if fields is not None:
        return {"ok": {name: _plain(getattr(value, name)) for name in fields}}
    return {"ok": _plain(value)}


def _plain(value: object) -> Json:
    """JSON for an NVML answer: bytes decoded, ctypes scalars unwrapped, structs as dicts."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.c_void_p):
        return "handle"
    if isinstance(value, ctypes._SimpleCData):
        return _plain(value.value)
    if isinstance(value, ctypes.Array):
        return [_plain(item) for item in value]
    if isinstance(value, ctypes.Structure):
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return "handle" if isinstance(value, ctypes._Pointer) else repr(type(value).__name__)


def form(value: Json) -> Json:
    """What a machine-dependent value must look like: hex runs as ``h``, numbers by type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return _HEX_RUN.sub("h", value)
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return {k: form(v) for k, v in value.items()}
    return "null"


def _comparable(entry: Entry) -> Json:
    if "ok" not in entry.answer:
        return entry.answer
    parts = BY_FORM.get(entry.call, frozenset())
    value = entry.answer["ok"]
    if "" in parts:
        return {"ok": form(value)}
    if isinstance(value, dict) and parts:
        return {"ok": {k: form(v) if k in parts else v for k, v in value.items()}}
    return entry.answer


def compare(expected: Iterable[Entry], actual: Iterable[Entry]) -> list[str]:
    """Every way ``actual`` differs from ``expected``, one line each (empty: the same)."""
    want = {e.key: e for e in expected}
    got = {e.key: e for e in actual}
    problems: list[str] = []
    for key, entry in want.items():
        other = got.get(key)
        where = f"{entry.call}({', '.join(map(str, entry.args))})"
        if other is None:
            problems.append(f"{where}: recorded {entry.answer}, never asked")
        elif _comparable(entry) != _comparable(other):
            problems.append(f"{where}: recorded {_comparable(entry)}, got {_comparable(other)}")
    for key, entry in got.items():
        if key not in want:
            where = f"{entry.call}({', '.join(map(str, entry.args))})"
            problems.append(f"{where}: not recorded, got {entry.answer}")
    return problems


# -- files -------------------------------------------------------------------------------------


def fixture_name(product: str, driver: str) -> str:
    """``<product>-<driver>.json`` in lower case, with anything but letters, digits and dots as ``-``."""
    slug = re.sub(r"[^a-z0-9.]+", "-", f"{product}-{driver}".lower()).strip("-")
    return f"{slug}.json"


def dump(meta: Mapping[str, Json], entries: Sequence[Entry]) -> str:
    """The fixture's JSON text: metadata first, then one entry per line (reviewable diffs)."""
    head = json.dumps({"format": FORMAT_VERSION, **meta}, indent=1)[:-2]  # without the closing brace
    lines = [json.dumps({"call": e.call, "args": list(e.args), **e.answer}) for e in entries]
    return head + ',\n "entries": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def load(path: Path) -> tuple[dict[str, Json], list[Entry]]:
    """A fixture's metadata and entries; ``FixtureError`` names the file and what is wrong."""
    try:
        document = json.loads(path.read_text())
        if document.get("format") != FORMAT_VERSION:
            raise FixtureError(f"{path}: format {document.get('format')!r}, expected {FORMAT_VERSION}")
        entries = [
            Entry(item["call"], tuple(item["args"]), {k: v for k, v in item.items() if k in ("ok", "error")})
            for item in document.pop("entries")
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        problem = f"{path}: not an NVML recording ({exc}); re-record it with scripts/gpu-check"
        raise FixtureError(problem) from exc
    return document, entries
