"""Resets that can succeed: our own NVML session and event set released around the reset and renewed
after it, other holders of the GPU named, "in use" escalated, RESET_REQUIRED mapped to a reboot.

The simulated driver refuses a reset while any NVML session or event registration holds the GPU
(as ``nvidia-smi -r`` answers "In use by another client"), so the agent's own session is seen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hardware.gpu_reset import GpuInUseError, RebootRequiredError, device_holders
from hardware.health_probe import NvmlHealthProbe
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.health_calls import SimNvmlCallError
from health.scope import NodeFaultKind
from health.xid import Action
from tests.support.small_inventory import gpu_uuid
from tests.unit.test_health_remediation import RecordingCluster, service, state_of


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[tuple[SimulatedBackend, NvmlHealthProbe]]:
    backend = SimulatedBackend(load_profile("dgx-h100"), tmp_path / "root")
    backend.discover()  # the agent's NVML session is open from here on
    root = tmp_path / "root"
    probe = NvmlHealthProbe(
        backend.lib, sysfs_root=root / "sys", reset=backend.node.health.reset_uuid, proc_root=root / "proc"
    )
    yield backend, probe
    backend.close()


def test_the_simulated_driver_refuses_a_reset_while_an_nvml_session_is_open(
    h100: tuple[SimulatedBackend, NvmlHealthProbe],
) -> None:
    backend, _ = h100
    with pytest.raises(SimNvmlCallError, match="in use by another client"):
        backend.node.health.reset_uuid(backend.inventory.gpus[2].uuid)


def test_a_reset_releases_our_session_and_events_then_renews_them(
    h100: tuple[SimulatedBackend, NvmlHealthProbe],
) -> None:
    backend, probe = h100
    uuids = [g.uuid for g in backend.inventory.gpus]
    assert probe.register_events(uuids) == []
    probe.reset_gpu(uuids[2])
    assert backend.node.health.gpus[2].resets == 1
    assert backend.inventory == backend.discover()  # the session is open again
    backend.node.health.inject_xid(2, 31)
    backend.node.health.inject_xid(6, 31)
    seen = {probe.wait_event(200).gpu_uuid for _ in range(2)}  # type: ignore[union-attr]
    assert seen == {uuids[2], uuids[6]}  # events renewed for the reset GPU and every other one


def test_another_holder_of_the_device_file_is_named_and_the_reset_waits(
    h100: tuple[SimulatedBackend, NvmlHealthProbe], tmp_path: Path
) -> None:
    backend, probe = h100
    gpu = backend.inventory.gpus[3]
    process = tmp_path / "root" / "proc" / "4321"
    (process / "fd").mkdir(parents=True)
    (process / "comm").write_text("nvidia-persiste\n")
    os.symlink(gpu.device_node, process / "fd" / "7")
    held = r"held open by nvidia-persiste \(pid 4321\).*--no-persistence-mode"
    with pytest.raises(GpuInUseError, match=held):
        probe.reset_gpu(gpu.uuid)
    assert backend.node.health.gpus[3].resets == 0
    assert device_holders(tmp_path / "root" / "proc", gpu.device_node, exclude_pid=4321) == ()


def test_reset_required_becomes_reboot_required(h100: tuple[SimulatedBackend, NvmlHealthProbe]) -> None:
    backend, probe = h100
    backend.node.health.gpus[4].reset_required = True  # a pass-through VM's GPU
    with pytest.raises(RebootRequiredError, match="reboot the node"):
        probe.reset_gpu(backend.inventory.gpus[4].uuid)
    assert backend.inventory == backend.discover()  # the session came back although the reset failed


def test_a_reset_in_use_for_n_rounds_asks_for_a_reboot_instead_of_waiting_for_ever(tmp_path: Path) -> None:
    health, state, _ = service(tmp_path, RecordingCluster([]), reset_in_use_rounds=3)
    state.set_processes(5, (4242,))
    state.inject_xid(5, 79)
    for _ in range(2):
        health.monitor.run_round()
    assert not {f.kind for f in health.snapshot().node_faults} & {NodeFaultKind.REBOOT_REQUIRED}
    health.monitor.run_round()
    faults = [f for f in health.snapshot().node_faults if f.kind is NodeFaultKind.REBOOT_REQUIRED]
    assert [f.subject for f in faults] == [gpu_uuid(5)]
    assert "after 3 rounds in use" in faults[0].detail
    assert state.gpus[5].resets == 0


def test_reset_required_asks_for_a_reboot_without_retiring_the_gpu(tmp_path: Path) -> None:
    cluster = RecordingCluster([])
    health, state, _ = service(tmp_path, cluster)
    state.gpus[5].reset_required = True
    state.inject_xid(5, 79)
    for _ in range(4):
        health.monitor.run_round()
    faults = [f for f in health.snapshot().node_faults if f.kind is NodeFaultKind.REBOOT_REQUIRED]
    assert [f.subject for f in faults] == [gpu_uuid(5)]
    assert "requires a reboot" in faults[0].detail
    assert cluster.bad == {}  # not sent to the bad-hardware list: the GPU is not known to be broken
    record = health.snapshot().gpus[gpu_uuid(5)]
    assert record.next_action() is Action.RESET_GPU and state_of(health, 5).value == "Failed"


def test_renewed_events_replace_the_old_set_and_still_deliver(
    h100: tuple[SimulatedBackend, NvmlHealthProbe],
) -> None:
    backend, probe = h100
    uuids = [g.uuid for g in backend.inventory.gpus]
    probe.register_events(uuids)
    assert probe.renew_events() == []
    assert len(backend.node.health._masks) == 1  # the old set was freed, not leaked
    backend.node.health.inject_xid(1, 31)
    event = probe.wait_event(200)
    assert event is not None and event.gpu_uuid == uuids[1]


def test_the_event_loop_keeps_beating_while_a_reset_runs(tmp_path: Path) -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"), tmp_path / "root")
    backend.discover()
    started, finish = threading.Event(), threading.Event()

    def slow_reset(uuid: str) -> None:
        started.set()
        finish.wait(30)
        backend.node.health.reset_uuid(uuid)

    root = tmp_path / "root"
    probe = NvmlHealthProbe(backend.lib, sysfs_root=root / "sys", reset=slow_reset, proc_root=root / "proc")
    try:
        probe.register_events([g.uuid for g in backend.inventory.gpus])
        worker = threading.Thread(target=probe.reset_gpu, args=(backend.inventory.gpus[0].uuid,))
        worker.start()
        assert started.wait(10)
        waited = [probe.wait_event(20) for _ in range(3)]  # returns (None) while the reset runs
        assert waited == [None, None, None] and worker.is_alive()
        finish.set()
        worker.join(10)
        assert backend.node.health.gpus[0].resets == 1
    finally:
        finish.set()
        backend.close()
