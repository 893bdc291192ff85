"""The simulated library keeps pynvml's constants and call signatures (tests may import pynvml)."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from hardware.simulated import process_calls
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.structs import NvmlConstants

CONSTANTS = sorted(name for name in vars(NvmlConstants) if name.startswith("NVML_"))
CALLS = sorted(name for name in dir(SimulatedNvmlLib) if name.startswith("nvml"))


def _required_positional(function: object) -> int:
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return sum(
        1
        for p in parameters
        if p.name != "self" and p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def _positional(function: object) -> int:
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return sum(
        1
        for p in parameters
        if p.name != "self"
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_has_pynvml_value(name: str) -> None:
    assert getattr(SimulatedNvmlLib, name) == getattr(pynvml, name)


@pytest.mark.parametrize("name", CALLS)
def test_call_exists_in_pynvml_and_takes_the_same_arguments(name: str) -> None:
    real = getattr(pynvml, name)
    fake = getattr(SimulatedNvmlLib, name)
    # The fake accepts every call pynvml accepts: no more required arguments, at least as many in all.
    assert _required_positional(fake) <= _required_positional(real) <= _positional(fake)


@pytest.mark.parametrize("name", ["c_nvmlProcessUtilizationSample_t", "c_nvmlAccountingStats_t"])
def test_process_structures_have_pynvmls_fields(name: str) -> None:
    fake = getattr(process_calls, name)
    real = getattr(pynvml, name)
    assert [(f, t) for f, t, *_ in fake._fields_] == [(f, t) for f, t, *_ in real._fields_]


def test_process_info_has_the_fields_pynvml_gives() -> None:
    fields = {name for name, *_ in pynvml.c_nvmlProcessInfo_v3_t._fields_}
    assert set(process_calls.SimProcess.__dataclass_fields__) == fields
