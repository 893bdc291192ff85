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
(expression, distinct attribute set), failures included, so a cluster of identical GPUs evaluates
each expression once.

Bounded: a selector is refused when it is first seen if its static cost estimate
(``selector_cost``) passes Kubernetes' limit of 1,000,000. Only a selector that is cheap by that
estimate and loops over nothing runs in the request thread; any other runs in the sandbox
(``selector_sandbox``), a worker process killed at a 0.25 s deadline, so no selector can hold the
GIL against other requests. A selector that misses the deadline is refused from then on.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cel

from devicemodel.contracts import ATTRIBUTE_DOMAIN
from devicemodel.errors import InvalidInputError, clip, echo
from devicemodel.quantity import parse_quantity
from scheduler_ext.pods.selector_cost import COST_LIMIT, estimate
from scheduler_ext.pods.selector_sandbox import (
    EvaluationTimeoutError,
    SandboxError,
    SelectorSandbox,
    WorkerDiedError,
)

LOG = logging.getLogger(__name__)
MAX_EXPRESSION_CHARS = 10 * 1024  # DRA's limit
MAX_CACHED = 50_000  # programs and verdicts kept; past this the caches start over
IN_PROCESS_COST = 10_000  # a loop-free selector under this estimate runs in the request thread
STANDARD_DOMAIN = "resource.kubernetes.io"


class SelectorError(InvalidInputError):
    """The selector does not compile or does not evaluate to a boolean."""


def semver(text: object) -> int:
    """``"8.6"`` / ``"8.6.0"`` / ``"v535.104.05"`` -> one comparable integer."""
    parts = str(text).strip().lstrip("v").split(".")
    numbers = [int(p) if p.isascii() and p.isdigit() and len(p) < 10 else 0 for p in [*parts, "0", "0"][:3]]
    return numbers[0] * 1_000_000 + numbers[1] * 1_000 + numbers[2]


def quantity(text: object) -> int:
    """A Kubernetes quantity string (``"40Gi"``, ``"80G"``, ``"1024"``) in whole units (bytes),
    rounded up as Kubernetes' ``Quantity.Value()`` rounds."""
    return math.ceil(parse_quantity(str(text)))


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


@dataclass(frozen=True)
class _Compiled:
    """A compiled selector and where it may run (``in_process``: cheap and loop-free)."""

    program: Any
    in_process: bool


class SelectorCache:
    """Compiles each distinct expression once and caches verdicts per attribute set (thread-safe)."""

    def __init__(self, *, sandbox: SelectorSandbox | None = None, cost_limit: int = COST_LIMIT) -> None:
        """``cost_limit``: the static estimate a selector may reach (tests raise it to reach the
        sandbox's deadline with a selector the estimate would refuse)."""
        self.sandbox = sandbox or SelectorSandbox()
        self.cost_limit = cost_limit
        self._programs: dict[str, _Compiled] = {}
        self._compile_errors: dict[str, str] = {}
        self._verdicts: dict[tuple[str, DeviceAttributes], bool | str] = {}
        self._lock = threading.Lock()

    def stats(self, expression: str) -> tuple[int, int]:
        """(compiled programs in total, cached verdicts for ``expression``): for tests and metrics."""
        return len(self._programs), sum(1 for key in list(self._verdicts) if key[0] == expression)

    def close(self) -> None:
        """Stop the sandbox's worker processes."""
        self.sandbox.close()

    def check(self, expression: str) -> None:
        """Raise ``SelectorError`` if the expression does not compile or is over its budget."""
        self._program(expression)

    def matches(self, expression: str, attributes: DeviceAttributes) -> bool:
        """True when the device satisfies the expression; evaluation errors count as no match."""
        verdict = self.verdict(expression, attributes)
        return verdict is True

    def verdict(self, expression: str, attributes: DeviceAttributes) -> bool | str:
        """True/False, or the evaluation error text (a device lacking an attribute, a type error,
        division by zero, overflow). Raises ``SelectorError`` when the selector is over budget."""
        key = (expression, attributes)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        compiled = self._program(expression)
        if compiled.in_process:
            result = _run(compiled.program, attributes)
        else:
            result = self._run_sandboxed(expression, attributes)
        with self._lock:
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            self._verdicts[key] = result
        return result

    def _run_sandboxed(self, expression: str, attributes: DeviceAttributes) -> bool | str:
        try:
            result = self.sandbox.evaluate(expression, attributes.as_cel())
        except EvaluationTimeoutError as exc:
            reason = (
                f"gpu-selector refused: {exc} (the deadline stands in for Kubernetes' runtime limit "
                f"of {COST_LIMIT:,} CEL cost units); iterate over fewer elements"
            )
            self._remember_error(expression, reason)
            raise SelectorError(reason) from None
        except WorkerDiedError as exc:
            if not self.sandbox.closed:  # not our shutdown: the selector crashed its evaluator
                self._remember_error(expression, f"gpu-selector refused: {exc}")
            raise SelectorError(f"gpu-selector could not be evaluated: {exc}") from None
        except SandboxError as exc:
            raise SelectorError(f"gpu-selector could not be evaluated now: {exc}") from None
        if isinstance(result, bool):
            return result
        return clip(f"selector failed on {attributes.product_name}: {result}")

    def _program(self, expression: str) -> _Compiled:
        compiled = self._programs.get(expression)
        if compiled is not None:
            return compiled
        error = self._compile_errors.get(expression)
        if error is not None:
            raise SelectorError(error)
        compiled_or_error = _compile(expression, cost_limit=self.cost_limit)
        if isinstance(compiled_or_error, str):
            self._remember_error(expression, compiled_or_error)
            raise SelectorError(compiled_or_error)
        with self._lock:
            self._make_room()
            self._programs[expression] = compiled_or_error
        return compiled_or_error

    def _remember_error(self, expression: str, error: str) -> None:
        """Cache a refusal (logged once per distinct selector: retries hit the cache)."""
        LOG.info("gpu-selector %r refused: %s", expression[:200], error)
        with self._lock:
            self._make_room()
            self._programs.pop(expression, None)
            self._compile_errors[expression] = error

    def _make_room(self) -> None:
        if len(self._programs) + len(self._compile_errors) >= MAX_CACHED:
            self._programs.clear()
            self._compile_errors.clear()


def _compile(expression: str, *, cost_limit: int) -> _Compiled | str:
    """The compiled selector, or why it is refused (length, syntax, estimated cost)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"gpu-selector is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
    try:
        program = cel.compile(expression)
    except Exception as exc:  # the library raises several types; every one is the selector's fault
        return clip(f"gpu-selector does not compile: {_parser_words(expression, exc)}")
    cost = estimate(expression)
    if cost is not None and cost.cost > cost_limit:
        return (
            f"gpu-selector's estimated cost is {cost.cost:,}; the limit is {cost_limit:,} "
            "(Kubernetes' CEL cost limit for device selectors): iterate over fewer elements "
            "or nest fewer comprehensions"
        )
    in_process = cost is not None and cost.comprehensions == 0 and cost.cost <= IN_PROCESS_COST
    return _Compiled(program=program, in_process=in_process)


def _parser_words(expression: str, exc: Exception) -> str:
    """The CEL library's error without its copies of the expression: it quotes the whole of it,
    then repeats each line over a caret line; here the expression is quoted once, cut (``echo``),
    and the parser's own words (``Syntax error: ...``) stay."""
    quoted = str(exc).replace(f"'{expression}'", echo(expression), 1)  # repr: no raw line breaks
    return quoted.split("\n| ", 1)[0]


def _run(program: Any, attributes: DeviceAttributes) -> bool | str:
    """Evaluate in this thread (only cheap, loop-free selectors get here)."""
    try:
        value = program.execute(cel.Context(variables={"device": attributes.as_cel()}, functions=FUNCTIONS))
    except Exception as exc:  # 1/0, overflow, a missing attribute: the selector's answer, never a 5xx
        return clip(f"selector failed on {attributes.product_name}: {type(exc).__name__}: {exc}")
    if isinstance(value, bool):
        return value
    return f"selector returned {type(value).__name__}, not bool"
