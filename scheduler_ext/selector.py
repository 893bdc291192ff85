"""Capability selectors: a CEL expression over DRA-named device attributes.

A pod's ``gpuweave.io/gpu-selector`` annotation holds one CEL expression that sees ``device`` as
DRA's CEL environment shows a device::

    device.attributes["gpuweave.io"].architecture          string  "hopper"
    device.attributes["gpuweave.io"].productName           string  "NVIDIA H100 80GB HBM3"
    device.attributes["gpuweave.io"].cudaComputeCapability version (compare with semver("8.0"))
    device.attributes["gpuweave.io"].driverVersion         version
    device.attributes["gpuweave.io"].migCapable            bool
    device.attributes["gpuweave.io"].nvlinkPeers           int     GPUs reachable over NVLink/NVSwitch
    device.attributes["gpuweave.io"].nvswitch              bool
    device.attributes["resource.kubernetes.io"].numaNode   int
    device.capacity["gpuweave.io"].memory                  int     bytes (compare with quantity("40Gi"))

Versions are encoded as one comparable integer (major*10^6 + minor*10^3 + patch), so both
``x >= semver("8.0")`` and DRA's ``x.compareTo(semver("8.0.0")) >= 0`` work; ``isGreaterThan`` and
``isLessThan`` are provided too. Quantities are integer bytes; ``quantity("40Gi")`` converts.

Expressions compile once (``common-expression-language``, Rust-backed); results are cached per
(expression, distinct attribute set), so a cluster of identical GPUs evaluates each expression once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cel

from topology.contracts import ATTRIBUTE_DOMAIN
from topology.errors import InvalidInputError

MAX_EXPRESSION_CHARS = 10 * 1024  # DRA's limit
MAX_CACHED = 50_000  # programs and verdicts kept; past this the caches start over
STANDARD_DOMAIN = "resource.kubernetes.io"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE]|m)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 1}


class SelectorError(InvalidInputError):
    """The selector does not compile or does not evaluate to a boolean."""


def semver(text: object) -> int:
    """``"8.6"`` / ``"8.6.0"`` / ``"v535.104.05"`` -> one comparable integer."""
    parts = str(text).strip().lstrip("v").split(".")
    numbers = [int(p) if p.isdigit() else 0 for p in [*parts, "0", "0"][:3]]
    return numbers[0] * 1_000_000 + numbers[1] * 1_000 + numbers[2]


def quantity(text: object) -> int:
    """A Kubernetes quantity string (``"40Gi"``, ``"80G"``, ``"1024"``) in whole units (bytes)."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix = float(match.group(1)), match.group(2) or ""
    if suffix == "m":
        return int(number / 1000)
    return int(number * (_BINARY.get(suffix) or _DECIMAL.get(suffix) or 1))


def _compare_to(left: object, right: object) -> int:
    if not isinstance(left, int | float) or not isinstance(right, int | float):
        raise TypeError("compareTo needs two versions or two quantities")
    return (left > right) - (left < right)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "semver": semver,
    "quantity": quantity,
    "compareTo": _compare_to,
    "isGreaterThan": lambda a, b: _compare_to(a, b) > 0,
    "isLessThan": lambda a, b: _compare_to(a, b) < 0,
}


@dataclass(frozen=True)
class DeviceAttributes:
    """One device's selector-visible attributes; equal values share one cached evaluation."""

    architecture: str
    product_name: str
    compute_capability: str
    driver_version: str
    memory_bytes: int
    mig_capable: bool
    nvlink_peers: int
    nvswitch: bool
    numa_node: int

    def as_cel(self) -> dict[str, Any]:
        return {
            "driver": ATTRIBUTE_DOMAIN,
            "attributes": {
                ATTRIBUTE_DOMAIN: {
                    "architecture": self.architecture,
                    "productName": self.product_name,
                    "cudaComputeCapability": semver(self.compute_capability),
                    "driverVersion": semver(self.driver_version),
                    "migCapable": self.mig_capable,
                    "nvlinkPeers": self.nvlink_peers,
                    "nvswitch": self.nvswitch,
                },
                STANDARD_DOMAIN: {"numaNode": self.numa_node},
            },
            "capacity": {ATTRIBUTE_DOMAIN: {"memory": self.memory_bytes}},
        }


class SelectorCache:
    """Compiles each distinct expression once and caches verdicts per attribute set (thread-safe)."""

    def __init__(self) -> None:
        self._programs: dict[str, Any] = {}
        self._compile_errors: dict[str, str] = {}
        self._verdicts: dict[tuple[str, DeviceAttributes], bool | str] = {}
        self._lock = threading.Lock()

    def stats(self, expression: str) -> tuple[int, int]:
        """(compiled programs in total, cached verdicts for ``expression``): for tests and metrics."""
        return len(self._programs), sum(1 for key in list(self._verdicts) if key[0] == expression)

    def check(self, expression: str) -> None:
        """Raise ``SelectorError`` if the expression does not compile."""
        self._program(expression)

    def matches(self, expression: str, attributes: DeviceAttributes) -> bool:
        """True when the device satisfies the expression; evaluation errors count as no match."""
        verdict = self.verdict(expression, attributes)
        return verdict is True

    def verdict(self, expression: str, attributes: DeviceAttributes) -> bool | str:
        """True/False, or the evaluation error text (a device lacking an attribute, a type error)."""
        key = (expression, attributes)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        program = self._program(expression)
        result: bool | str
        try:
            value = program.execute(
                cel.Context(variables={"device": attributes.as_cel()}, functions=FUNCTIONS)
            )
            result = (
                value if isinstance(value, bool) else f"selector returned {type(value).__name__}, not bool"
            )
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            result = f"selector failed on {attributes.product_name}: {exc}"
        with self._lock:
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            self._verdicts[key] = result
        return result

    def _program(self, expression: str) -> Any:
        program = self._programs.get(expression)
        if program is not None:
            return program
        error = self._compile_errors.get(expression)
        if error is not None:
            raise SelectorError(error)
        if len(expression) > MAX_EXPRESSION_CHARS:
            error = f"gpu-selector is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        else:
            try:
                program = cel.compile(expression)
            except (ValueError, RuntimeError, TypeError) as exc:
                error = f"gpu-selector does not compile: {exc}"
        with self._lock:
            if len(self._programs) + len(self._compile_errors) >= MAX_CACHED:
                self._programs.clear()
                self._compile_errors.clear()
            if error is not None:
                self._compile_errors[expression] = error
            else:
                self._programs[expression] = program
        if error is not None:
            raise SelectorError(error)
        return program
