"""The per-family Xid table: severity and remediation ladder per Xid and GPU generation."""

from __future__ import annotations

import pytest

from devicemodel.inventory import Architecture
from health.xid import (
    UNKNOWN_XID,
    Action,
    Cause,
    RecoveryAction,
    Severity,
    XidOverride,
    is_grace_part,
    recovery_rule,
    table_for,
)

A = Architecture


@pytest.mark.parametrize(
    ("arch", "xid", "severity", "first_action"),
    [
        (A.HOPPER, 79, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 13, Severity.APPLICATION, None),
        (A.HOPPER, 31, Severity.APPLICATION, None),
        (A.HOPPER, 43, Severity.APPLICATION, None),
        (A.HOPPER, 45, Severity.APPLICATION, None),
        (A.HOPPER, 48, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 63, Severity.FATAL, Action.RESET_GPU),  # row remap pending: reset activates it
        (A.VOLTA, 63, Severity.INFORMATIONAL, None),  # page retirement: driver reload, not a reset
        (A.HOPPER, 64, Severity.FATAL, Action.REPLACE),
        (A.VOLTA, 64, Severity.FATAL, Action.REPLACE),
        (A.AMPERE, 94, Severity.APPLICATION, None),  # contained to the application
        (A.VOLTA, 94, Severity.SUSPECT, None),  # no error containment before Ampere: unknown
        (A.AMPERE, 95, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 74, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 92, Severity.INFORMATIONAL, None),
        (A.VOLTA, 93, Severity.INFORMATIONAL, None),
        (A.HOPPER, 93, Severity.IGNORED, None),
        (A.HOPPER, 109, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 119, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 120, Severity.FATAL, Action.RESET_GPU),
        (A.BLACKWELL, 149, Severity.FATAL, Action.RESET_GPU),
        (A.HOPPER, 149, Severity.SUSPECT, None),  # NVLink5 Xids do not exist before Blackwell
        (A.HOPPER, 154, Severity.INFORMATIONAL, None),
        (A.HOPPER, UNKNOWN_XID, Severity.SUSPECT, None),
        (A.HOPPER, 54, Severity.FATAL, Action.REPLACE),
    ],
)
def test_xid_rule_per_family(
    arch: Architecture, xid: int, severity: Severity, first_action: Action | None
) -> None:
    rule = table_for(arch).rule(xid)
    assert rule.severity is severity
    assert (rule.ladder[0] if rule.ladder else None) == first_action


def test_xid_79_ladder_escalates_to_reboot_then_replace() -> None:
    assert table_for(A.HOPPER).rule(79).ladder == (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE)


def test_application_errors_are_charged_to_user_and_never_strike() -> None:
    for xid in (13, 31, 43, 45):
        rule = table_for(A.AMPERE).rule(xid)
        assert rule.cause is Cause.USER
        assert not rule.strike


def test_grace_parts_know_c2c() -> None:
    assert table_for(A.HOPPER).rule(121).severity is Severity.IGNORED
    assert table_for(A.HOPPER, grace=True).rule(121).severity is Severity.INFORMATIONAL
    assert is_grace_part("NVIDIA GH200 480GB")
    assert not is_grace_part("NVIDIA H100 80GB HBM3")


def test_nonfatal_hint_downgrades_a_fatal_nvlink5_xid() -> None:
    rule = table_for(A.BLACKWELL).rule(145, nonfatal_hint=True)
    assert rule.severity is Severity.INFORMATIONAL
    assert not rule.strike


def test_boot_allow_list_applies_only_at_boot() -> None:
    table = table_for(A.HOPPER, boot_ignored=[119])
    assert table.rule(119, at_boot=True).severity is Severity.INFORMATIONAL
    assert table.rule(119).severity is Severity.FATAL


def test_overrides_change_only_the_named_fields() -> None:
    table = table_for(
        A.HOPPER, overrides=[XidOverride(94, severity=Severity.FATAL, ladder=(Action.RESET_GPU,))]
    )
    rule = table.rule(94)
    assert rule.severity is Severity.FATAL
    assert rule.ladder == (Action.RESET_GPU,)
    assert rule.cause is Cause.HARDWARE
    unknown = table_for(A.HOPPER, overrides=[XidOverride(500, severity=Severity.IGNORED)]).rule(500)
    assert unknown.severity is Severity.IGNORED


@pytest.mark.parametrize(
    ("action", "severity", "ladder"),
    [
        (RecoveryAction.GPU_RESET, Severity.FATAL, (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE)),
        (
            RecoveryAction.DRAIN_AND_RESET,
            Severity.FATAL,
            (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE),
        ),
        (RecoveryAction.NODE_REBOOT, Severity.FATAL, (Action.REBOOT_NODE, Action.REPLACE)),
        (RecoveryAction.DRAIN_P2P, Severity.SUSPECT, ()),
        (RecoveryAction.RECOVER_IMEX_DOMAIN, Severity.INFORMATIONAL, ()),
        (RecoveryAction.NONE, Severity.INFORMATIONAL, ()),
        (42, Severity.SUSPECT, ()),
    ],
)
def test_recovery_action_grading(action: int, severity: Severity, ladder: tuple[Action, ...]) -> None:
    rule = recovery_rule(action)
    assert (rule.severity, rule.ladder) == (severity, ladder)
