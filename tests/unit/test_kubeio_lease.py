"""Leader election's rule: create, renew, take an expired Lease by our own clock, else follow."""

from __future__ import annotations

import datetime

import pytest

from kubeio.lease import LeaseRecord, LeaseStep, micro_time, step


def record(holder: str, *, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, "2026-01-01T00:00:00.000000Z", duration, 0, "7")


@pytest.mark.parametrize(
    ("lease", "unchanged_for", "expected"),
    [
        (None, 0.0, LeaseStep.CREATE),
        (record("me"), 0.0, LeaseStep.RENEW),
        (record("me"), 99.0, LeaseStep.RENEW),
        (record("other"), 14.9, LeaseStep.FOLLOW),
        (record("other"), 15.0, LeaseStep.TAKE),
        (record(""), 0.0, LeaseStep.TAKE),  # released on a clean stop
    ],
)
def test_the_lease_rule(lease: LeaseRecord | None, unchanged_for: float, expected: LeaseStep) -> None:
    assert step(lease, me="me", unchanged_for_s=unchanged_for) is expected


def test_micro_time_has_six_fraction_digits_even_on_a_whole_second() -> None:
    whole = datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.UTC)
    assert micro_time(whole) == "2026-03-04T05:06:07.000000Z"
