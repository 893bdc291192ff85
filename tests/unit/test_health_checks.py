"""Judging one round of readings, the configuration edge, the sim.inject request and the metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from devicemodel.errors import InvalidInputError
from hardware.health_probe import EfaAdapter, GpuReadings, ProbeError
from hardware.simulated.health_calls import SimHealthState, SimNvmlCallError
from hardware.simulated.health_inject import apply_request, parse_request
from health.checks import judge_efa, judge_failure, judge_readings, temperature_outliers
from health.config import load_health_settings
from health.errors import HealthConfigError
from health.metrics import HealthMetrics
from health.policy import DeviceRecord, DeviceState
from health.scope import HealthSnapshot, NodeFaultKind
from health.xid import Action, Cause, Severity

CLEAN = GpuReadings(0, 0, (0, 0, False, False), False, (), 18, 40, (16, 16), (5, 5))


def readings(**changes: object) -> GpuReadings:
    values = {**CLEAN.__dict__, **changes}
    return GpuReadings(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "signals"),
    [
        ({}, []),
        ({"volatile_dbe": 2}, [("ecc-dbe", Severity.FATAL)]),
        ({"remapped_rows": (3, 1, True, False)}, [("row-remap-pending", Severity.FATAL)]),
        ({"remapped_rows": (3, 1, True, True)}, [("row-remap-failure", Severity.FATAL)]),
        ({"retired_pages_pending": True}, [("retired-pages-pending", Severity.SUSPECT)]),
        ({"nvlinks_down": (2, 7)}, [("nvlink-down", Severity.FATAL)]),
        ({"pcie_width": (8, 16)}, [("pcie-degraded", Severity.SUSPECT)]),
        ({"pcie_generation": (1, 5)}, []),  # idle GPUs drop the link generation to save power
        ({"volatile_dbe": None, "remapped_rows": None, "temperature_c": None, "pcie_width": None}, []),
    ],
)
def test_judge_readings(changes: dict[str, object], signals: list[tuple[str, Severity]]) -> None:
    assert [(f.signal, f.severity) for f in judge_readings(readings(**changes))] == signals


def test_row_remap_failure_goes_straight_to_replacement_and_pending_is_no_strike() -> None:
    failure = judge_readings(readings(remapped_rows=(0, 9, False, True)))[0]
    pending = judge_readings(readings(remapped_rows=(0, 1, True, False)))[0]
    assert failure.ladder == (Action.REPLACE,)
    assert not pending.strike


def test_failed_checks_fail_closed() -> None:
    lost = judge_failure(ProbeError("GPU 3: GPU is lost", kind="lost"), timeout_s=2)
    assert (lost.signal, lost.severity) == ("gpu-lost", Severity.FATAL)
    timeout = judge_failure(None, timeout_s=2)
    assert (timeout.signal, timeout.severity, timeout.cause) == (
        "check-timeout",
        Severity.SUSPECT,
        Cause.PLATFORM,
    )
    assert "2 s" in timeout.reason
    broken = judge_failure(ProbeError("NVML error 999", kind="error"), timeout_s=2)
    assert broken.signal == "check-failed"


def test_temperature_gap_against_the_median() -> None:
    temps = {"a": 40, "b": 42, "c": 41, "d": 70}
    assert temperature_outliers(temps, gap_c=15) == {"d": 28.5}
    assert temperature_outliers({"a": 40, "d": 90}, gap_c=15) == {}


def test_efa_count_and_link_state() -> None:
    expected = ["efa0", "efa1", "efa2"]
    adapters = [EfaAdapter("efa0", "eth1", "up"), EfaAdapter("efa1", "eth2", "down")]
    up, faults = judge_efa(adapters, expected=expected, expected_count=3)
    assert up == {"efa0": True, "efa1": False, "efa2": False}
    assert {(f.kind, f.subject) for f in faults} == {
        (NodeFaultKind.EFA_MISSING, "efa2"),
        (NodeFaultKind.EFA_LINK_DOWN, "efa1"),
    }
    renamed = [EfaAdapter("rdmap1s0", None, None), EfaAdapter("rdmap2s0", None, None)]
    up, faults = judge_efa(renamed, expected=["rdmap1s0", "rdmap2s0"], expected_count=2)
    assert all(up.values()) and not faults  # EFA-only interfaces (no netdev) count as up


def test_health_config_validation() -> None:
    settings = load_health_settings(
        {"round_interval_s": 0.05, "xid_overrides": [{"xid": 94, "severity": "fatal"}]}
    )
    assert settings.round_interval_s == 0.05
    assert settings.xid_overrides[0].severity is Severity.FATAL
    with pytest.raises(HealthConfigError, match=r"health\.round_interval_s"):
        load_health_settings({"round_interval_s": 0})
    with pytest.raises(HealthConfigError, match=r"health\.no_such"):
        load_health_settings({"no_such": 1})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"xid": 79}, "need --gpu"),
        ({}, "nothing to inject"),
        ({"gpu": 1, "xid": 79, "mig_instance": "x"}, "mig_instance"),
        ({"gpu": 1, "mig_instance": "1:0"}, "only qualifies --xid and --busy"),
        ({"gpu": -1, "xid": 79}, "gpu"),
        ({"gpu": 1, "xid": 79, "bogus": 1}, "bogus"),
    ],
)
def test_bad_inject_requests_are_rejected(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_request(params)


def test_inject_request_applies_to_the_simulated_node(tmp_path: Path) -> None:
    state = SimHealthState(
        [("GPU-a", "00000000:05:00.0", 4), ("GPU-b", "00000000:06:00.0", 4)], kmsg_path=tmp_path / "k"
    )
    done = apply_request(state, parse_request({"gpu": 1, "xid": 31, "mig_instance": "3:1"}))
    assert "GPU-I:03 GPU-CI:01" in done["done"][0]
    apply_request(state, parse_request({"gpu": 0, "ecc_dbe": 2, "nvlink_down": 3}))
    assert (state.gpus[0].dbe, state.gpus[0].nvlinks_down) == (2, {3})
    with pytest.raises(InvalidInputError, match="links 0-3"):
        apply_request(state, parse_request({"gpu": 0, "nvlink_down": 9}))
    with pytest.raises(InvalidInputError, match="no GPU 5"):
        apply_request(state, parse_request({"gpu": 5, "xid": 79}))
    apply_request(state, parse_request({"clear": True}))
    assert (state.gpus[0].dbe, state.gpus[0].nvlinks_down) == (0, set())


def test_an_injected_reset_failure_keeps_the_gpu_off_the_bus(tmp_path: Path) -> None:
    state = SimHealthState([("GPU-0", "00000000:05:00.0", 4)], kmsg_path=tmp_path / "kmsg")
    done = apply_request(state, parse_request({"gpu": 0, "xid": 79, "reset_fails": True}))
    assert "GPU 0: resets fail from now on" in done["done"]
    with pytest.raises(SimNvmlCallError, match="did not come back"):
        state.reset(0)
    assert state.gpus[0].lost  # still off the bus: only a reboot or a new machine tells more
    with pytest.raises(InvalidInputError, match="need --gpu"):
        parse_request({"reset_fails": True})
    apply_request(state, parse_request({"clear": True}))
    state.reset(0)
    assert not state.gpus[0].lost


def test_metrics_by_state_and_cause() -> None:
    registry = CollectorRegistry()
    metrics = HealthMetrics(registry)
    failed = DeviceRecord(state=DeviceState.FAILED, since=100.0, cause=Cause.HARDWARE, last_xid=79)
    snap = HealthSnapshot(gpus={"GPU-a": failed, "GPU-b": DeviceRecord()}, startup_pending=False)
    metrics.observe(snap, now=110.0)
    metrics.observe(snap, now=115.0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gpuweave_health_device_state", device="GPU-a", kind="gpu", state="Failed") == 1
    assert value("gpuweave_health_device_state", device="GPU-a", kind="gpu", state="Healthy") == 0
    assert value("gpuweave_health_last_xid", device="GPU-a") == 79
    assert value("gpuweave_health_seconds_unhealthy", device="GPU-a") == 15
    assert value("gpuweave_health_seconds_unhealthy", device="GPU-b") == 0
    assert value("gpuweave_health_device_unavailable_seconds_total", cause="hardware") == 5
    assert value("gpuweave_health_startup_pending") == 0
