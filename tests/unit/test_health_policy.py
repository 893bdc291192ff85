"""The per-device state machine and tolerance windows, table-driven on a fake timeline."""

from __future__ import annotations

import pytest

from health.policy import (
    DeviceRecord,
    DeviceState,
    Event,
    Fault,
    MarkedBad,
    PolicySettings,
    RemediationFinished,
    RemediationStarted,
    RoundCompleted,
    Window,
    WindowCounter,
    step,
)
from health.xid import Action, Severity

S = DeviceState
SETTINGS = PolicySettings(probation_rounds=2, strike_limit=3)


def fatal(at: float, *, strike: bool = True) -> Fault:
    return Fault(
        at,
        "xid",
        Severity.FATAL,
        "Xid 79",
        ladder=(Action.RESET_GPU, Action.REBOOT_NODE),
        strike=strike,
        xid=79,
    )


def suspect(at: float) -> Fault:
    return Fault(at, "check-timeout", Severity.SUSPECT, "check timed out")


def run(events: list[Event], start: DeviceRecord | None = None) -> list[DeviceState]:
    record = start or DeviceRecord()
    states = []
    for event in events:
        record = step(record, event, SETTINGS)
        states.append(record.state)
    return states


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([suspect(1)], [S.SUSPECT]),
        ([suspect(1), RoundCompleted(2, clean=False)], [S.SUSPECT, S.SUSPECT]),
        (
            [suspect(1), RoundCompleted(2, True), RoundCompleted(3, True), RoundCompleted(4, True)],
            [S.SUSPECT, S.PROBATION, S.PROBATION, S.HEALTHY],
        ),
        ([suspect(1), RoundCompleted(2, True), suspect(3)], [S.SUSPECT, S.PROBATION, S.SUSPECT]),
        ([fatal(1)], [S.FAILED]),
        ([fatal(1), RoundCompleted(2, True)], [S.FAILED, S.FAILED]),  # rounds never heal a Failed device
        ([fatal(1), suspect(2)], [S.FAILED, S.FAILED]),
        (
            [
                fatal(1),
                RemediationStarted(2, Action.RESET_GPU),
                RemediationFinished(3, ok=True),
                RoundCompleted(4, True),
                RoundCompleted(5, True),
            ],
            [S.FAILED, S.REMEDIATING, S.PROBATION, S.PROBATION, S.HEALTHY],
        ),
        (
            [fatal(1), RemediationStarted(2, Action.RESET_GPU), RemediationFinished(3, ok=False)],
            [S.FAILED, S.REMEDIATING, S.FAILED],
        ),
        (
            [fatal(1), RemediationStarted(2, Action.RESET_GPU), RemediationFinished(3, True), fatal(4)],
            [S.FAILED, S.REMEDIATING, S.PROBATION, S.FAILED],
        ),
        (
            [fatal(1), RemediationStarted(2, Action.RESET_GPU), fatal(3)],
            [S.FAILED, S.REMEDIATING, S.REMEDIATING],
        ),
        ([MarkedBad(1, "listed"), RoundCompleted(2, True), suspect(3)], [S.RETIRED, S.RETIRED, S.RETIRED]),
        ([RemediationFinished(1, ok=True)], [S.HEALTHY]),
        ([RemediationStarted(1, Action.RESET_GPU)], [S.HEALTHY]),
        ([Fault(1, "xid", Severity.APPLICATION, "Xid 13", xid=13)], [S.HEALTHY]),
        ([Fault(1, "xid", Severity.INFORMATIONAL, "Xid 92", xid=92)], [S.HEALTHY]),
    ],
)
def test_state_machine_table(events: list[Event], expected: list[DeviceState]) -> None:
    assert run(events) == expected


def fail_and_recover(record: DeviceRecord, at: float) -> DeviceRecord:
    for event in (
        fatal(at),
        RemediationStarted(at + 1, Action.RESET_GPU),
        RemediationFinished(at + 2, ok=True),
        RoundCompleted(at + 3, True),
        RoundCompleted(at + 4, True),
    ):
        record = step(record, event, SETTINGS)
    return record


def test_third_failure_retires_the_device() -> None:
    record = fail_and_recover(fail_and_recover(DeviceRecord(), 0), 10)
    assert record.state is S.HEALTHY
    assert record.strikes == 2
    record = step(record, fatal(20), SETTINGS)
    assert record.state is S.RETIRED
    assert "bad hardware" in record.reason


def test_failures_without_strike_do_not_count() -> None:
    record = DeviceRecord()
    for at in (0, 10, 20, 30):
        record = step(record, fatal(at, strike=False), SETTINGS)
        record = step(record, RemediationStarted(at + 1, Action.RESET_GPU), SETTINGS)
        record = step(record, RemediationFinished(at + 2, True), SETTINGS)
    assert record.strikes == 0
    assert record.state is S.PROBATION


def test_a_burst_on_a_failed_device_is_one_strike() -> None:
    record = DeviceRecord()
    for at in (0, 0.1, 0.2):
        record = step(record, fatal(at), SETTINGS)
    assert (record.state, record.strikes) == (S.FAILED, 1)


def test_ladder_advances_per_failed_attempt_and_resets_when_healthy() -> None:
    record = step(DeviceRecord(), fatal(0), SETTINGS)
    assert record.next_action() is Action.RESET_GPU
    record = step(record, RemediationStarted(1, Action.RESET_GPU), SETTINGS)
    assert record.next_action() is None
    record = step(record, RemediationFinished(2, ok=False, detail="reset refused"), SETTINGS)
    assert record.next_action() is Action.REBOOT_NODE
    assert record.reason == "reset refused"
    record = step(record, RemediationStarted(3, Action.REBOOT_NODE), SETTINGS)
    record = step(record, RemediationFinished(4, ok=False), SETTINGS)
    assert record.next_action() is Action.REBOOT_NODE  # the last step repeats
    record = fail_and_recover(DeviceRecord(), 0)
    assert record.attempts == 0


def test_last_xid_is_kept_for_visibility() -> None:
    record = step(DeviceRecord(), Fault(5, "xid", Severity.APPLICATION, "Xid 31", xid=31), SETTINGS)
    assert record.last_xid == 31
    assert record.state is S.HEALTHY


@pytest.mark.parametrize(
    ("times", "trips"),
    [
        ([0, 1, 2], [False, False, True]),
        ([0, 20, 40], [False, False, False]),  # spread wider than the window
        ([0, 1, 2, 3, 4, 5], [False, False, True, False, False, True]),  # starts over after a trip
        ([0, 5, 12, 13], [False, False, False, True]),  # 0 ages out at 10
    ],
)
def test_tolerance_window(times: list[float], trips: list[bool]) -> None:
    counter, seen = WindowCounter(), []
    for at in times:
        counter, tripped = counter.observe(at, Window(threshold=3, seconds=10))
        seen.append(tripped)
    assert seen == trips


def test_probation_after_a_remediation_keeps_the_action_and_the_fault_in_its_reason() -> None:
    record = DeviceRecord()
    for event in (fatal(1), RemediationStarted(2, Action.RESET_GPU), RemediationFinished(3, ok=True)):
        record = step(record, event, SETTINGS)
    assert record.state is S.PROBATION
    assert record.reason == "probation after reset-gpu: Xid 79"
    record = step(record, RoundCompleted(4, True), SETTINGS)
    assert record.reason == "probation after reset-gpu: Xid 79"  # kept through the clean rounds
    assert step(record, RoundCompleted(5, True), SETTINGS).reason == ""  # Healthy again
