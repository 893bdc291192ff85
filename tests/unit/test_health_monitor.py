"""The health engine and monitor driven through the simulated NVML health surface, round by round."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from hardware.health_probe import NvmlHealthProbe
from hardware.simulated.health_calls import HealthCallsMixin, SimHealthState
from health.config import HealthSettings
from health.engine import HealthEngine
from health.monitor import HealthMonitor
from health.policy import DeviceState, Fault, RemediationFinished, RemediationStarted
from health.signals.kmsg import KernelLogTail
from health.xid import Action, Severity
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.support.waiting import poll_until


class SimLib(HealthCallsMixin):
    """The smallest pynvml-shaped library: handles are GPU indices."""

    NVMLError = pynvml.NVMLError

    def __init__(self, health: SimHealthState) -> None:
        self.health = health

    def nvmlDeviceGetIndex(self, handle: Any) -> int:  # noqa: N802
        return int(handle)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        return [g.uuid for g in self.health.gpus].index(uuid)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return self.health.gpus[int(handle)].uuid


class Sink:
    def __init__(self) -> None:
        self.health: dict[str, bool] = {}

    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        self.health[device_id] = healthy


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def efa_sysfs(root: Path, names: list[str]) -> Path:
    """The sysfs layout of EFA adapters: vendor/device ids and a netdev with operstate."""
    for n, name in enumerate(names):
        device = root / "class" / "infiniband" / name / "device"
        (device / "net" / f"eth{n + 1}").mkdir(parents=True)
        (device / "vendor").write_text("0x1d0f\n")
        (device / "device").write_text("0xefa1\n")
        (device / "net" / f"eth{n + 1}" / "operstate").write_text("up\n")
    return root


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[HealthMonitor, SimHealthState, Sink, FakeClock]]:
    inventory = small_inventory(gpus=8, mig_on=(6,))
    sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in inventory.nics])
    state = SimHealthState(
        [(g.uuid, g.pci_bus_id, 12) for g in inventory.gpus], kmsg_path=tmp_path / "kmsg", sysfs_root=sysfs
    )
    clock, sink = FakeClock(), Sink()
    settings = HealthSettings(round_interval_s=0.05, check_timeout_s=0.3, event_wait_ms=20)
    engine = HealthEngine(inventory, settings, clock=clock)
    probe = NvmlHealthProbe(SimLib(state), sysfs_root=tmp_path / "sys", reset=lambda uuid: None)
    tail = KernelLogTail(tmp_path / "kmsg", cursor_file=tmp_path / "cursor.json")
    monitor = HealthMonitor(engine, probe, clock=clock, sink=sink, kernel_log=tail)
    assert probe.register_events([g.uuid for g in inventory.gpus]) == []
    yield monitor, state, sink, clock
    monitor.stop()


def deliver(monitor: HealthMonitor, probe_timeout_ms: int = 50) -> None:
    event = monitor._probe.wait_event(probe_timeout_ms)
    assert event is not None
    monitor.on_event(event)


def test_xid_79_withholds_only_that_gpu(node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock]) -> None:
    monitor, state, sink, _ = node
    monitor.publish()
    state.inject_xid(5, 79)
    deliver(monitor)
    assert sink.health[gpu_uuid(5)] is False
    assert [u for u, ok in sink.health.items() if not ok] == [gpu_uuid(5)]
    assert monitor.snapshot().gpus[gpu_uuid(5)].state is DeviceState.FAILED


def test_health_transitions_reach_the_default_log_level(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    """The CLI logs at WARNING by default: a GPU leaving Healthy and its return are WARNINGs, the
    steps between them INFO; a healthy start says nothing."""
    monitor, state, _, clock = node
    caplog.set_level(logging.INFO, logger="health.monitor")
    monitor.publish()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    state.inject_xid(5, 79)
    deliver(monitor)
    (failed,) = [r for r in caplog.records if gpu_uuid(5) in r.getMessage()]
    assert failed.levelno == logging.WARNING
    assert "is Failed (was Healthy): Xid 79" in failed.getMessage()
    caplog.clear()
    with monitor.lock:
        monitor.engine.apply(gpu_uuid(2), Fault(clock(), "check-failed", Severity.SUSPECT, "ECC unread"))
    monitor.publish()
    for _ in range(3):  # Suspect -> Probation -> two clean rounds -> Healthy
        monitor.run_round()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if gpu_uuid(2) in r.getMessage()]
    assert lines == [
        (logging.WARNING, f"device {gpu_uuid(2)} is Suspect (was Healthy): ECC unread"),
        (logging.INFO, f"device {gpu_uuid(2)} is Probation (was Suspect): probation after: ECC unread"),
        (logging.WARNING, f"device {gpu_uuid(2)} is Healthy (was Probation)"),
    ]


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_change_nothing(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock], xid: int
) -> None:
    monitor, state, sink, _ = node
    monitor.publish()
    state.inject_xid(5, xid)
    deliver(monitor)
    monitor.run_round()
    assert all(sink.health.values())
    assert monitor.snapshot().gpus[gpu_uuid(5)].last_xid == xid


def test_mig_attributed_xid_marks_that_mig_device_alone(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, sink, _ = node
    monitor.publish()
    migs = monitor.engine.inventory.mig_devices_of(6)
    state.inject_xid(6, 95, gpu_instance=migs[0].gpu_instance_id, compute_instance=0)
    deliver(monitor)
    assert sink.health[migs[0].uuid] is False
    assert sink.health[migs[1].uuid] is True
    assert sink.health[gpu_uuid(6)] is True


def test_gpu_fault_fans_out_to_mig_devices(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, sink, _ = node
    monitor.publish()
    state.inject_xid(6, 119)
    deliver(monitor)
    assert [sink.health[m.uuid] for m in monitor.engine.inventory.mig_devices_of(6)] == [False, False]


def test_hung_gpu_fails_closed_within_timeout_then_recovers(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, sink, clock = node
    monitor.run_round()
    state.hang(0.6, index=2)
    monitor.run_round()
    record = monitor.snapshot().gpus[gpu_uuid(2)]
    assert record.state is DeviceState.SUSPECT
    assert "timed out" in record.reason
    assert sum(not ok for ok in sink.health.values()) == 1
    monitor.run_round()  # the hung call is still running: no second thread, still suspect
    assert monitor.snapshot().gpus[gpu_uuid(2)].state is DeviceState.SUSPECT
    assert monitor._runner.idle(2.0)
    states = []
    for _ in range(3):
        clock.now += 1
        monitor.run_round()
        states.append(monitor.snapshot().gpus[gpu_uuid(2)].state)
    assert states == [DeviceState.PROBATION, DeviceState.PROBATION, DeviceState.HEALTHY]
    assert sink.health[gpu_uuid(2)] is True


def test_kernel_log_history_and_new_lines_are_applied(
    tmp_path: Path, node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock]
) -> None:
    monitor, state, _, _ = node
    state.write_kernel_log("NVRM: Xid (PCI:0000:13:00): 48, pid=1, DBE")  # GPU 3, before the agent ran
    monitor.run_round()
    assert monitor.snapshot().gpus[gpu_uuid(3)].state is DeviceState.FAILED


def test_checks_find_dbe_nvlink_and_lost_gpu(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, _, _ = node
    state.gpus[1].dbe = 2
    state.set_nvlink_down(2, 3)
    state.gpus[4].lost = True
    state.set_pcie_width(7, 8)
    monitor.run_round()
    snap = monitor.snapshot()
    assert snap.gpus[gpu_uuid(1)].state is DeviceState.FAILED
    assert "NVLink" in snap.gpus[gpu_uuid(2)].reason
    assert snap.gpus[gpu_uuid(4)].state is DeviceState.FAILED
    assert snap.gpus[gpu_uuid(7)].state is DeviceState.SUSPECT
    assert snap.gpus[gpu_uuid(0)].state is DeviceState.HEALTHY


def test_startup_gate_opens_after_two_complete_rounds(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, _, _, _ = node
    assert monitor.snapshot().startup_pending
    monitor.run_round()
    assert monitor.snapshot().startup_pending
    monitor.run_round()
    assert not monitor.snapshot().startup_pending


def test_efa_missing_and_link_down_are_node_faults(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, sink, _ = node
    names = [n.name for n in monitor.engine.inventory.nics]
    monitor.run_round()
    assert not monitor.snapshot().node_faults
    state.set_efa(names[0], link_up=False)
    state.set_efa(names[1], present=False)
    monitor.run_round()
    kinds = sorted(f.kind.value for f in monitor.snapshot().node_faults)
    assert kinds == ["efa-link-down", "efa-missing"]
    assert sink.health[names[0]] is False
    assert all(sink.health[g.uuid] for g in monitor.engine.inventory.gpus)
    state.clear()
    monitor.run_round()
    assert not monitor.snapshot().node_faults
    assert sink.health[names[0]] is True


def test_an_xid_seen_as_event_and_kernel_line_counts_once(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, _, clock = node
    state.inject_xid(4, 79)  # queues the NVML event and writes the kernel-log line
    deliver(monitor)
    monitor.run_round()
    assert monitor.snapshot().gpus[gpu_uuid(4)].strikes == 1
    uuid = gpu_uuid(4)
    with monitor.lock:  # the GPU was reset (this monitor has no remediation hook of its own)
        monitor.engine.apply(uuid, RemediationStarted(clock.now, Action.RESET_GPU))
        monitor.engine.apply(uuid, RemediationFinished(clock.now, ok=True))
    clock.now += 60
    state.write_kernel_log("NVRM: Xid (PCI:0000:14:00): 79, pid=1, GPU has fallen off the bus.")
    state.gpus[4].lost = False
    monitor.run_round()  # a later, separate Xid 79 from the kernel log alone is a new failure
    record = monitor.snapshot().gpus[gpu_uuid(4)]
    assert (record.state, record.strikes) == (DeviceState.FAILED, 2)


def test_watchdog_withholds_every_gpu_while_checks_are_stuck(tmp_path: Path) -> None:
    inventory = small_inventory(gpus=4)
    sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in inventory.nics])
    state = SimHealthState([(g.uuid, g.pci_bus_id, 12) for g in inventory.gpus], sysfs_root=sysfs)
    settings = HealthSettings(round_interval_s=0.05, check_timeout_s=0.2, event_wait_ms=20, stall_after_s=0.3)
    engine = HealthEngine(inventory, settings, clock=time.monotonic)
    probe = NvmlHealthProbe(SimLib(state), sysfs_root=sysfs, reset=lambda uuid: None)
    gate, sink = threading.Event(), Sink()

    def stuck_hook(monitor: HealthMonitor) -> None:
        if monitor.rounds_completed == 2:
            gate.wait(10)

    monitor = HealthMonitor(engine, probe, clock=time.monotonic, sink=sink, round_hooks=(stuck_hook,))
    monitor.start()
    try:
        assert poll_until(
            lambda: sink.health and not any(sink.health[g.uuid] for g in inventory.gpus),
            timeout=10,
            every=0.02,
        )
        assert "stalled" in monitor.snapshot().gpus[gpu_uuid(0)].reason
        gate.set()
        assert poll_until(lambda: all(sink.health[g.uuid] for g in inventory.gpus), timeout=10, every=0.02)
    finally:
        gate.set()
        monitor.stop()


def test_recovery_action_fails_the_whole_gpu_once(
    node: tuple[HealthMonitor, SimHealthState, Sink, FakeClock],
) -> None:
    monitor, state, sink, _ = node
    monitor.publish()
    state.set_recovery_action(6, 4)  # drain and reset: NVML event + Xid 154 kernel line
    deliver(monitor)
    monitor.run_round()
    record = monitor.snapshot().gpus[gpu_uuid(6)]
    assert (record.state, record.strikes, record.last_xid) == (DeviceState.FAILED, 1, 154)
    assert "DRAIN_AND_RESET" in record.reason
    assert [sink.health[m.uuid] for m in monitor.engine.inventory.mig_devices_of(6)] == [False, False]
