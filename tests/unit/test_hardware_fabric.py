"""NVSwitch fabric state through the production reader over the simulated node and its host files.

Hopper boards answer ``nvmlDeviceGetGpuFabricInfoV`` per GPU (filled through a pointer, as NVML
fills it); Ampere boards answer it NOT_SUPPORTED, and their fabric is ready while the Fabric
Manager service runs (its pid file and ``/proc/<pid>/comm`` on the host).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import pytest

from devicemodel.spec import NodeProfile
from hardware.fabric import FM_PID_FILE, FabricReader, FabricState
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.structs import NVMLError
from health.signals.fabric import FABRIC_GATE, FabricGate


def with_fabric(name: str, state: str) -> NodeProfile:
    document: dict[str, Any] = load_profile(name).to_wire()
    document["spec"]["nvswitch"]["fabricState"] = state
    return NodeProfile.parse(document)


def read(backend: SimulatedBackend) -> Any:
    return FabricReader(backend.nvml.caller, host_root=backend.sysfs_root).read(backend.discover())


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("not-started", FabricState.NOT_STARTED),
        ("in-progress", FabricState.IN_PROGRESS),
        ("completed", FabricState.COMPLETED),
        ("failed", FabricState.FAILED),
    ],
)
def test_hopper_fabric_state_comes_from_nvml_per_gpu(state: str, expected: FabricState) -> None:
    backend = SimulatedBackend(with_fabric("dgx-h100", state))
    try:
        report = read(backend)
    finally:
        backend.close()
    assert len(report.gpus) == 8
    assert {g.state for g in report.gpus} == {expected}
    assert report.ready is (expected is FabricState.COMPLETED)


def test_the_simulated_call_fills_the_struct_through_a_pointer_and_refuses_ampere() -> None:
    hopper = SimulatedBackend(load_profile("p5.48xlarge"))
    ampere = SimulatedBackend(load_profile("p4d.24xlarge"))
    try:
        for backend in (hopper, ampere):
            backend.lib.nvmlInit()
        info = hopper.lib.c_nvmlGpuFabricInfoV_t()
        hopper.lib.nvmlDeviceGetGpuFabricInfoV(hopper.lib.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
        assert (info.state, info.status) == (hopper.lib.NVML_GPU_FABRIC_STATE_COMPLETED, 0)
        with pytest.raises(NVMLError) as refused:
            handle = ampere.lib.nvmlDeviceGetHandleByIndex(0)
            ampere.lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        assert refused.value.value == ampere.lib.NVML_ERROR_NOT_SUPPORTED
    finally:
        hopper.close()
        ampere.close()


def test_ampere_fabric_is_ready_while_the_fabric_manager_runs() -> None:
    backend = SimulatedBackend(load_profile("dgx-a100"))
    try:
        assert read(backend).ready
        backend.node.health.set_fabric_state("not-started")
        assert not (backend.sysfs_root / FM_PID_FILE).exists()
        report = read(backend)
        assert {g.state for g in report.gpus} == {FabricState.NOT_STARTED}
        assert "Fabric Manager is not running" in report.gpus[0].detail
        backend.node.health.set_fabric_state("completed")
        assert read(backend).ready
    finally:
        backend.close()


def test_a_stale_fabric_manager_pid_counts_as_not_running() -> None:
    backend = SimulatedBackend(load_profile("dgx-a100"))
    try:
        (backend.sysfs_root / FM_PID_FILE).write_text("999999\n")
        report = read(backend)
    finally:
        backend.close()
    assert not report.ready
    assert "pid 999999 is not a running nv-fabricmanager" in report.gpus[0].detail


def test_nodes_without_nvswitch_have_no_fabric_to_wait_for() -> None:
    backend = SimulatedBackend(load_profile("l40s-pcie-8"))
    try:
        report = read(backend)
    finally:
        backend.close()
    assert report.gpus == () and report.ready


class Gates:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def set_gate(self, name: str, reasons: Mapping[str, str]) -> None:
        self.calls.append((name, dict(reasons)))


def test_the_gate_withholds_every_gpu_until_the_fabric_completes_then_releases_them() -> None:
    backend = SimulatedBackend(with_fabric("p5.48xlarge", "in-progress"))
    sink = Gates()
    try:
        inventory = backend.discover()
        gate = FabricGate(FabricReader(backend.nvml.caller, host_root=backend.sysfs_root).read, sink)
        gate.check(inventory)
        backend.node.health.set_fabric_state("completed")
        gate.check(inventory)
    finally:
        backend.close()
    (first_name, first), (_, second) = sink.calls
    assert first_name == FABRIC_GATE
    assert set(first) == {g.uuid for g in inventory.gpus}
    assert all("in-progress" in reason for reason in first.values())
    assert second == {}
