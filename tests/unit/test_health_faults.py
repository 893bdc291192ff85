"""Health keeps checking through its own faults: a full state disk, a bad kernel-log line, a failing
sink, a dead loop. The monitor runs over the simulated NVML health surface; the full disk is a real
tmpfs (``tests/support/small_fs.py``), so writes fail with the kernel's own ENOSPC.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuweave.cli import main
from hardware.health_probe import NvmlHealthProbe
from hardware.simulated.health_calls import SimHealthState
from health.badlist import BadGpu, BadHardwareList
from health.config import HealthSettings
from health.engine import HealthEngine
from health.errors import HealthStateError
from health.metrics import HealthMetrics
from health.monitor import HealthMonitor
from health.persist import StateWriter, require_writable_dir
from health.policy import DeviceState
from health.service import HealthParts, HealthService
from health.signals.kmsg import KernelLogTail
from mig.owners import GpuOwners
from tests.support.small_fs import fill, free, remount_read_only, small_tmpfs
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.support.waiting import poll_until
from tests.unit.test_health_monitor import FakeClock, SimLib, Sink, efa_sysfs
from tests.unit.test_health_remediation import RecordingCluster
from tests.unit.test_health_remediation import service as remediation_service

INVENTORY = small_inventory(gpus=8)
SETTINGS = HealthSettings(round_interval_s=0.05, check_timeout_s=0.3, event_wait_ms=20)


class Node:
    """A monitor whose state (kernel-log cursor) lives in ``state_dir``, over simulated GPUs."""

    def __init__(self, tmp_path: Path, state_dir: Path, *, sink: Sink | None = None) -> None:
        sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in INVENTORY.nics])
        gpus = [(g.uuid, g.pci_bus_id, 12) for g in INVENTORY.gpus]
        self.gpus = SimHealthState(gpus, kmsg_path=tmp_path / "kmsg", sysfs_root=sysfs)
        self.metrics = HealthMetrics()
        self.state = StateWriter()
        self.sink = sink or Sink()
        self.tail = KernelLogTail(tmp_path / "kmsg", cursor_file=state_dir / "cursor.json", writer=self.state)
        probe = NvmlHealthProbe(SimLib(self.gpus), sysfs_root=sysfs, reset=lambda uuid: None)
        engine = HealthEngine(INVENTORY, SETTINGS, clock=FakeClock())
        self.monitor = HealthMonitor(
            engine, probe, clock=FakeClock(), sink=self.sink, kernel_log=self.tail, metrics=self.metrics
        )

    def state_of(self, index: int) -> DeviceState:
        return self.monitor.snapshot().gpus[gpu_uuid(index)].state

    def bad_lines(self) -> float:
        return self.metrics.registry.get_sample_value("gpuweave_health_kernel_log_bad_lines_total") or 0.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, tmp_path / "state")
    yield node
    node.monitor.stop()


def test_a_bad_kernel_line_is_counted_and_skipped_and_the_batch_still_acts(node: Node) -> None:
    node.gpus.write_kernel_log("NVRM: Xid (PCI:0000:12:00): " + "7" * 5000 + ", pid=1, corrupt")  # GPU 2
    node.gpus.write_kernel_log("NVRM: Xid (PCI:0000:13:00): 48, pid=1, DBE")  # GPU 3, same batch
    node.monitor.run_round()
    assert node.state_of(3) is DeviceState.FAILED
    assert node.state_of(2) is DeviceState.HEALTHY
    assert node.bad_lines() == 1
    node.monitor.run_round()  # the cursor moved past both lines: nothing is read twice
    assert node.bad_lines() == 1
    assert node.monitor.snapshot().gpus[gpu_uuid(3)].strikes == 1


def test_on_a_full_state_disk_checking_goes_on_and_the_cursor_is_saved_once_space_returns(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "state", size_kib=64) as state_dir:
        node = Node(tmp_path, state_dir)
        fill(state_dir)
        node.gpus.write_kernel_log("NVRM: Xid (PCI:0000:13:00): 48, pid=1, DBE")
        node.gpus.set_nvlink_down(5, 2)
        node.monitor.run_round()
        node.monitor.run_round()
        assert node.state_of(3) is DeviceState.FAILED  # acted on, though its cursor is not saved
        assert "NVLink" in node.monitor.snapshot().gpus[gpu_uuid(5)].reason
        assert node.state.unsaved() == {"cursor.json": "ENOSPC: No space left on device"}
        free(state_dir)
        assert node.state.retry() == {}
        assert KernelLogTail(tmp_path / "kmsg", cursor_file=state_dir / "cursor.json").read_new() == []
        node.monitor.stop()


def test_the_bad_list_is_kept_in_memory_and_written_when_the_disk_allows(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "state", size_kib=64) as state_dir:
        results: list[str] = []
        writer = StateWriter(on_result=lambda path, exc: results.append("failed" if exc else "saved"))
        badlist = BadHardwareList(state_dir, writer=writer)
        fill(state_dir)
        assert badlist.add(BadGpu(gpu_uuid(1), "Xid 79 three times", "node-a", "2026-01-01T00:00:00Z", 3))
        assert gpu_uuid(1) in badlist
        assert results == ["failed"]
        assert writer.retry() == {"bad-hardware.json": "ENOSPC: No space left on device"}
        free(state_dir)
        assert writer.retry() == {}
        assert gpu_uuid(1) in BadHardwareList(state_dir)


def test_a_read_only_state_dir_is_one_error_naming_it(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "state", size_kib=64) as state_dir:
        remount_read_only(state_dir)
        with pytest.raises(HealthStateError) as error:
            require_writable_dir(state_dir / "agent")
    message = str(error.value)
    assert message.count("\n") == 0
    assert f"{state_dir / 'agent'} is not writable (Read-only file system)" in message


class RecordingSink(Sink):
    """A device plugin that keeps every push in order."""

    def __init__(self) -> None:
        super().__init__()
        self.pushes: list[tuple[str, bool]] = []

    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        super().set_device_health(device_id, healthy, reason)
        self.pushes.append((device_id, healthy))


class RefusingSink(Sink):
    """A device plugin whose pushes fail (its own state write failed) until ``working`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.working = False

    def set_device_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        if not self.working:
            raise OSError(28, "No space left on device")
        super().set_device_health(device_id, healthy, reason)


def test_a_push_the_sink_refuses_is_sent_again_and_the_loop_lives(tmp_path: Path) -> None:
    sink = RefusingSink()
    node = Node(tmp_path, tmp_path / "state", sink=sink)
    node.gpus.set_nvlink_down(4, 1)
    node.monitor.run_round()  # would raise out of the round loop if a push could
    assert sink.health == {}
    sink.working = True
    node.monitor.publish()
    assert sink.health[gpu_uuid(4)] is False
    assert sink.health[gpu_uuid(0)] is True


class CrashOnce:
    """A round hook that ends the round loop's thread once (not an Exception: no hook guard stops it)."""

    def __init__(self) -> None:
        self.crashed = threading.Event()

    def __call__(self, monitor: HealthMonitor) -> None:
        if not self.crashed.is_set():
            self.crashed.set()
            raise SystemExit("the round loop dies here")


def test_dead_loops_are_restarted_and_gpus_withheld_meanwhile(tmp_path: Path) -> None:
    node = Node(tmp_path, tmp_path / "state", sink=RecordingSink())
    settings = HealthSettings(round_interval_s=0.05, check_timeout_s=0.3, event_wait_ms=20, stall_after_s=5)
    monitor = HealthMonitor(
        HealthEngine(INVENTORY, settings, clock=time.monotonic),
        node.monitor._probe,
        clock=time.monotonic,
        sink=node.sink,
        metrics=node.metrics,
    )
    monitor._round_hooks = (CrashOnce(),)
    monitor.start()
    try:
        restarts = node.metrics.loop_restarts.labels("rounds")
        assert poll_until(lambda: restarts._value.get() == 1, timeout=10, every=0.02)
        assert "rounds loop died" in monitor.snapshot().gpus[gpu_uuid(0)].reason
        efa = INVENTORY.nics[0].name  # checked by the rounds too: withheld while they were dead
        assert (efa, False) in node.sink.pushes
        assert poll_until(lambda: all(node.sink.health[g.uuid] for g in INVENTORY.gpus), timeout=10)
        assert poll_until(lambda: node.sink.health[efa], timeout=10)  # back after the next check
    finally:
        monitor.stop()


def test_node_agent_on_a_read_only_state_dir_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k").mkdir()
    with small_tmpfs(tmp_path / "ro", size_kib=64) as read_only:
        remount_read_only(read_only)
        argv = ["node-agent", "--kubelet-dir", str(tmp_path / "k"), "--state-dir", str(read_only / "s")]
        assert main([*argv, "--simulate", "dgx-h100", "--no-kube"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"gpuweave node-agent: state directory {read_only / 's'} is not writable" in err


def test_a_stuck_remediation_withholds_only_its_device(tmp_path: Path) -> None:
    inventory = small_inventory(gpus=8, mig_on=(6,))
    sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in inventory.nics])
    gpus = SimHealthState([(g.uuid, g.pci_bus_id, 12) for g in inventory.gpus], sysfs_root=sysfs)
    probe = NvmlHealthProbe(SimLib(gpus), sysfs_root=sysfs, reset=lambda uuid: None)
    owners, sink = GpuOwners(), Sink()
    settings = HealthSettings(round_interval_s=0.05, check_timeout_s=0.3, event_wait_ms=20, stall_after_s=1.0)
    parts = HealthParts(
        inventory, probe, probe, sink, tmp_path / "state", settings, "node-a", clock=time.monotonic
    )
    health = HealthService(parts)

    def recreate(gpu: str, mig: str) -> bool:
        with owners.hold(gpu, who="health: recreate MIG instance"):  # waits behind the reshape
            return True

    health.remediator.recreate_mig = recreate
    failed = inventory.mig_devices_of(6)[0]
    health.start()
    try:
        with owners.hold(gpu_uuid(6), who="MIG reshape"):  # a reshape of GPU 6 is in flight
            assert poll_until(lambda: health.monitor.rounds_completed >= 2, timeout=10)
            gpus.inject_xid(6, 95, gpu_instance=failed.gpu_instance_id, compute_instance=0)
            assert poll_until(lambda: state_of(health, failed.uuid) is DeviceState.REMEDIATING, timeout=10)
            rounds = health.monitor.rounds_completed
            assert poll_until(lambda: health.monitor.rounds_completed >= rounds + 30, timeout=30)  # > 1 s
            assert all(sink.health[g.uuid] for g in inventory.gpus)  # no GPU withheld for it, not even GPU 6
            assert sink.health[failed.uuid] is False
            assert state_of(health, failed.uuid) is DeviceState.REMEDIATING
        assert poll_until(lambda: sink.health[failed.uuid], timeout=10)  # recreated, probation passed
        assert health.snapshot().migs[failed.uuid].strikes == 1
    finally:
        health.stop()


def state_of(health: HealthService, device: str) -> DeviceState:
    snap = health.snapshot()
    return (snap.migs.get(device) or snap.gpus[device]).state


def test_unsaved_state_is_an_event_and_a_node_condition_until_saved(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "state", size_kib=64) as state_dir:
        cluster = RecordingCluster([])
        health, gpus, _ = remediation_service(tmp_path, cluster)
        fill(state_dir)
        gpus.inject_xid(2, 79)  # a strike to save
        health.monitor.run_round()
        health.monitor.run_round()
        saved = next(c for c in cluster.conditions if c.type == "GpuweaveHealthStateSaved")
        assert (saved.status, saved.reason) == ("False", "StateUnsaved")
        assert "health-strikes.json: ENOSPC" in saved.message
        assert ("GpuweaveHealthStateUnsaved", "node") in cluster.events
        assert set(health.state.unsaved()) == {"health-strikes.json", "kmsg-cursor.json"}
        assert health.metrics.registry.get_sample_value("gpuweave_health_state_unsaved_files") == 2
        free(state_dir)
        health.monitor.run_round()
        saved = next(c for c in cluster.conditions if c.type == "GpuweaveHealthStateSaved")
        assert saved.status == "True"
        assert ("GpuweaveHealthStateSaved", "node") in cluster.events
        assert health.metrics.registry.get_sample_value("gpuweave_health_state_unsaved_files") == 0
        assert BadHardwareList(state_dir).strikes() == {gpu_uuid(2): 1}
