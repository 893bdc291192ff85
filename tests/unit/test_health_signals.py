"""One interface for health signals: a signal registered in ``HealthParts.signals`` is read every
round with the round's context, and what it returns reaches the engine's verdict and the sink."""

from __future__ import annotations

from pathlib import Path

from hardware.health_probe import NvmlHealthProbe
from hardware.simulated.health_calls import SimHealthState
from health.checks import Finding
from health.config import HealthSettings
from health.monitor import builtin_signals
from health.policy import DeviceState, Fault
from health.service import HealthParts, HealthService
from health.signals.kernel_log import KernelLogSignal
from health.signals.kmsg import KernelLogTail
from health.signals.protocol import HealthSignal, Observations, RoundContext
from health.xid import Severity
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.unit.test_health_monitor import FakeClock, SimLib, Sink, efa_sysfs

INVENTORY = small_inventory(gpus=4)


class FanSpeed:
    """A toy signal: GPU 3's fan is too slow in every round it is asked."""

    name = "fan-speed"

    def __init__(self) -> None:
        self.contexts: list[RoundContext] = []
        self.seen: list[DeviceState] = []  # GPU 3's state when asked

    def observe(self, context: RoundContext) -> Observations:
        self.contexts.append(context)
        self.seen.append(context.gpu_states()[gpu_uuid(3)])
        return Observations(findings={gpu_uuid(3): [Finding("fan-speed", Severity.SUSPECT, "fan at 5%")]})


class Breaker:
    """A toy signal that raises, then a fault it sees on GPU 1 the next time."""

    name = "breaker"

    def __init__(self, clock: FakeClock) -> None:
        self.calls, self._clock = 0, clock

    def observe(self, context: RoundContext) -> Observations:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the source went away")
        fault = Fault(self._clock(), "breaker", Severity.FATAL, "tripped")
        return Observations(faults=[(gpu_uuid(1), fault)])


def health_with(
    tmp_path: Path, signals: tuple[HealthSignal, ...], clock: FakeClock
) -> tuple[HealthService, Sink]:
    sysfs = efa_sysfs(tmp_path / "sys", [n.name for n in INVENTORY.nics])
    state = SimHealthState(
        [(g.uuid, g.pci_bus_id, 12) for g in INVENTORY.gpus], kmsg_path=tmp_path / "kmsg", sysfs_root=sysfs
    )
    probe = NvmlHealthProbe(SimLib(state), sysfs_root=sysfs, reset=lambda uuid: None)
    sink = Sink()
    parts = HealthParts(
        inventory=INVENTORY,
        probe=probe,
        device_ops=probe,
        sink=sink,
        state_dir=tmp_path / "state",
        settings=HealthSettings(round_interval_s=0.05, check_timeout_s=0.5),
        node_name="node-a",
        kernel_log=tmp_path / "kmsg",
        clock=clock,
        signals=signals,
    )
    return HealthService(parts), sink


def test_a_registered_signal_reaches_the_verdict(tmp_path: Path) -> None:
    fan = FanSpeed()
    health, sink = health_with(tmp_path, (fan,), FakeClock())
    health.monitor.run_round()
    record = health.snapshot().gpus[gpu_uuid(3)]
    assert record.state is DeviceState.SUSPECT
    assert "fan at 5%" in record.reason
    assert sink.health[gpu_uuid(3)] is False
    assert [uuid for uuid, ok in sink.health.items() if not ok] == [gpu_uuid(3)]
    (context,) = fan.contexts
    assert context.inventory is INVENTORY
    assert fan.seen == [DeviceState.HEALTHY]


def test_a_signal_that_raises_leaves_the_round_incomplete_not_the_loop(tmp_path: Path) -> None:
    clock = FakeClock()
    breaker = Breaker(clock)
    health, sink = health_with(tmp_path, (breaker,), clock)
    health.monitor.run_round()  # raises inside: logged, the round goes on
    assert health.monitor.rounds_completed == 1
    assert health.engine.gate.clean_rounds == 0
    health.monitor.run_round()  # the fault, then remediation resets the idle GPU: probation
    record = health.snapshot().gpus[gpu_uuid(1)]
    assert record.state is DeviceState.PROBATION
    assert "tripped" in record.reason
    assert sink.health[gpu_uuid(1)] is False


def test_the_built_in_signals_run_first_in_round_order(tmp_path: Path) -> None:
    tail = KernelLogTail(tmp_path / "kmsg", cursor_file=tmp_path / "cursor.json")
    names = [s.name for s in builtin_signals(tail)]
    assert names == ["kmsg", "gpu-checks", "efa"]
    assert isinstance(builtin_signals(tail)[0], KernelLogSignal)
    assert [s.name for s in builtin_signals(None)] == ["gpu-checks", "efa"]
