"""Backends under contract: the simulated backend for every built-in profile, and NVML on request.

``GPUWEAVE_CONTRACT_BACKENDS`` selects them: a comma list of ``simulated`` and ``nvml`` (default
``simulated``). ``nvml`` runs the same suite against the real driver through pynvml; it is only
generated when asked for, so a machine without GPUs never shows a skipped NVML run.
``GPUWEAVE_CONTRACT_PROFILES`` (a comma list of built-in profile names) narrows the simulated
backends, as ``scripts/gpu-check --simulate PROFILE`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devicemodel.inventory import NodeInventory
from hardware.backend import GpuBackend
from hardware.nvml import NvmlBackend
from hardware.nvml_call import NvmlCaller
from hardware.profiles import builtin_profile_names, load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.node import SimulatedNode

CALL_TIMEOUT_S = 5.0


@dataclass
class BackendUnderTest:
    name: str
    backend: GpuBackend
    caller: NvmlCaller
    lib: object
    expected: NodeInventory | None  # what discovery must return exactly, when known
    node: SimulatedNode | None  # fault injection, simulated backends only


def _selected() -> list[str]:
    raw = os.environ.get("GPUWEAVE_CONTRACT_BACKENDS", "simulated")
    chosen = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = set(chosen) - {"simulated", "nvml"}
    if unknown:
        raise pytest.UsageError(f"GPUWEAVE_CONTRACT_BACKENDS: unknown backend(s) {sorted(unknown)}")
    return chosen


def _profiles() -> list[str]:
    known = builtin_profile_names()
    raw = os.environ.get("GPUWEAVE_CONTRACT_PROFILES", "")
    chosen = [part.strip() for part in raw.split(",") if part.strip()] or list(known)
    unknown = set(chosen) - set(known)
    if unknown:
        raise pytest.UsageError(
            f"GPUWEAVE_CONTRACT_PROFILES: unknown profile(s) {sorted(unknown)}; built in: {list(known)}"
        )
    return chosen


def _params() -> list[str]:
    params: list[str] = []
    if "simulated" in _selected():
        params += [f"simulated:{name}" for name in _profiles()]
    if "nvml" in _selected():
        params.append("nvml")
    return params


@pytest.fixture(params=_params())
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendUnderTest]:
    param = str(request.param)
    if param == "nvml":
        real = NvmlBackend(call_timeout_s=CALL_TIMEOUT_S)
        yield BackendUnderTest(param, real, real.caller, real.lib, None, None)
        real.close()
        return
    profile = load_profile(param.split(":", 1)[1])
    simulated = SimulatedBackend(profile, tmp_path, call_timeout_s=CALL_TIMEOUT_S)
    yield BackendUnderTest(
        param, simulated, simulated.nvml.caller, simulated.lib, profile.to_inventory(), simulated.node
    )
    simulated.close()
