"""EFA health from hardware counters: deltas between rounds, keep-alives, and what the reader sees."""

from __future__ import annotations

from pathlib import Path

from hardware.health_probe import EfaAdapter, read_efa_adapters
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from health.checks import judge_efa
from health.scope import NodeFaultKind
from health.signals.efa_counters import EfaCounterWatch


def adapter(name: str = "rdmap79s0", **counters: int) -> EfaAdapter:
    base = {"no_completion_cmds": 0, "keep_alive_rcvd": 0, "cmds_err": 0, "retrans_timeout_events": 0}
    return EfaAdapter(name, None, None, {**base, **counters})


def test_a_rise_in_no_completion_cmds_marks_the_adapter_down_until_its_counters_start_over() -> None:
    watch = EfaCounterWatch()
    assert watch.observe([adapter()], at=0.0).down == {}
    down = watch.observe([adapter(no_completion_cmds=1)], at=1.0).down
    assert "no_completion_cmds +1" in down["rdmap79s0"]
    assert "rdmap79s0" in watch.observe([adapter(no_completion_cmds=1)], at=2.0).down  # stays failed
    assert watch.observe([adapter()], at=3.0).down == {}  # counters reset: a driver reload


def test_keep_alives_that_stop_after_advancing_mark_the_adapter_down() -> None:
    watch = EfaCounterWatch(keepalive_stall_s=30.0)
    watch.observe([adapter(keep_alive_rcvd=10)], at=0.0)
    watch.observe([adapter(keep_alive_rcvd=11)], at=10.0)
    assert watch.observe([adapter(keep_alive_rcvd=11)], at=30.0).down == {}
    down = watch.observe([adapter(keep_alive_rcvd=11)], at=41.0).down
    assert down["rdmap79s0"] == "EFA rdmap79s0: no keep-alive for 31 s"
    assert watch.observe([adapter(keep_alive_rcvd=12)], at=42.0).down == {}


def test_a_kernel_that_never_advances_keep_alives_is_not_taken_for_a_stall() -> None:
    watch = EfaCounterWatch(keepalive_stall_s=1.0)
    for at in (0.0, 10.0, 100.0):
        assert watch.observe([adapter()], at=at).down == {}


def test_error_counters_above_the_rate_degrade_without_failing() -> None:
    watch = EfaCounterWatch(error_rate_per_s=100.0)
    watch.observe([adapter()], at=0.0)
    quiet = watch.observe([adapter(cmds_err=50)], at=1.0)
    assert quiet.degraded == {} and quiet.down == {}
    noisy = watch.observe([adapter(cmds_err=50, retrans_timeout_events=500)], at=2.0)
    assert noisy.down == {}
    assert noisy.degraded["rdmap79s0"] == "EFA rdmap79s0: retrans_timeout_events +500 in 1 s"


def test_judge_efa_reports_a_counter_failure_as_link_down_with_its_reason() -> None:
    adapters = [adapter("a"), adapter("b")]
    up, faults = judge_efa(
        adapters, expected=["a", "b"], expected_count=2, counter_down={"b": "EFA b: no_completion_cmds +1"}
    )
    assert up == {"a": True, "b": False}
    (fault,) = faults
    assert (fault.kind, fault.subject, fault.detail) == (
        NodeFaultKind.EFA_LINK_DOWN, "b", "EFA b: no_completion_cmds +1"
    )


def test_the_reader_returns_the_simulated_adapters_counters_and_a_stall_raises_them() -> None:
    backend = SimulatedBackend(load_profile("p5.48xlarge"))
    try:
        sys_root = Path(backend.sysfs_root) / "sys"
        before = {a.name: a for a in read_efa_adapters(sys_root)}
        backend.node.health.stall_efa("rdmap80s0")
        after = {a.name: a for a in read_efa_adapters(sys_root)}
    finally:
        backend.close()
    assert len(before) == 32 and before["rdmap80s0"].operstate is None  # EFA-only: no netdev
    assert before["rdmap80s0"].counters["no_completion_cmds"] == 0
    assert "retrans_timeout_events" in before["rdmap80s0"].counters
    assert after["rdmap80s0"].counters["no_completion_cmds"] == 1
    assert after["rdmap79s0"].counters == before["rdmap79s0"].counters
