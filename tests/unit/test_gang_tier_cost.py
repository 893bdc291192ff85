"""The pure tier decision (``gangs.tier_cost``): wait for the tightest tier when it frees soon and
the job is long, take the looser tier when the wait is long or the job short, never wait past the
maximum; and the inputs it decides on (durations, the expected wait, the stretch)."""

from __future__ import annotations

import math

import pytest

from devicemodel.errors import InvalidInputError
from devicemodel.gangs import BadGangError, active_deadline_s, parse_expected_duration
from scheduler_ext.cluster.objects import pod_record
from scheduler_ext.gangs.tier_cost import (
    Duration,
    NodeRelease,
    TierCostSettings,
    choose_tier,
    expected_wait,
    job_duration,
    tier_stretch,
)

HOURS_4 = Duration(4 * 3600.0, "annotation")


def _choose(
    duration: Duration, *, wait_s: float, stretch: float = 1.15, waited_s: float = 0.0, max_s: float = 1800
):
    return choose_tier(
        duration=duration,
        expected_wait_s=wait_s,
        stretch=stretch,
        waited_s=waited_s,
        max_wait_s=max_s,
        tight="clique=a",
        loose="block=1",
    )


def test_a_long_job_waits_for_a_tight_tier_that_frees_soon() -> None:
    choice = _choose(HOURS_4, wait_s=300)
    assert choice.wait
    assert choice.wait_cost_s == pytest.approx(300 + 4 * 3600)
    assert choice.looser_cost_s == pytest.approx(4 * 3600 * 1.15)
    text = choice.describe()
    assert "waits for clique=a (waiting costs less)" in text
    assert "expected run 4.0h (annotation)" in text and "expected wait 5m" in text and "x1.150" in text


def test_a_long_wait_or_a_short_job_takes_the_looser_tier() -> None:
    long_wait = _choose(HOURS_4, wait_s=2400, max_s=7200)  # 40m > 0.15 x 4h = 36m
    assert not long_wait.wait
    assert "takes the looser block=1 now (the looser tier costs less)" in long_wait.describe()
    short_job = _choose(Duration(600.0, "annotation"), wait_s=300)  # 5m > 0.15 x 10m
    assert not short_job.wait
    assert not _choose(HOURS_4, wait_s=300, stretch=1.0).wait  # no stretch: never worth a wait


def test_the_maximum_wait_is_honoured() -> None:
    assert not _choose(HOURS_4, wait_s=1900).wait  # cheaper, but longer than the 30m maximum
    assert _choose(HOURS_4, wait_s=300, waited_s=1400).wait
    past = _choose(HOURS_4, wait_s=300, waited_s=1600)  # 1600 + 300 > 1800
    assert not past.wait
    assert "would pass the 30m maximum" in past.describe()
    assert not _choose(HOURS_4, wait_s=1, max_s=0).wait  # 0: never waits


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("4h", 14400.0), ("90m", 5400.0), ("1h30m", 5400.0), ("5400", 5400.0), (" 2d ", 172800.0), (600, 600.0)],
)
def test_durations_read(text: object, seconds: float) -> None:
    assert parse_expected_duration(text) == seconds


@pytest.mark.parametrize(
    "bad", ["", "4 hours", "-5m", "1.5h", "0", "31d", "h", True, 3.5, "9" * 300, "4h\x1b[2J"]
)
def test_a_bad_duration_is_refused_with_its_reason(bad: object) -> None:
    with pytest.raises(BadGangError, match=r"gpuweave\.io/expected-duration") as caught:
        parse_expected_duration(bad)
    assert "\x1b" not in str(caught.value) and len(str(caught.value)) < 200  # escaped, clipped


def test_where_the_duration_comes_from() -> None:
    assert job_duration(declared=7200.0, deadline=60.0, default_s=3600) == Duration(7200.0, "annotation")
    assert job_duration(declared=None, deadline=600.0, default_s=3600) == Duration(
        600.0, "activeDeadlineSeconds"
    )
    assert job_duration(declared=None, deadline=9000.0, default_s=3600).source == "default"  # an upper bound
    bad = job_duration(declared=None, deadline=None, default_s=3600, bad="x is 'soon'")
    assert bad == Duration(3600, "default", "x is 'soon'")
    assert "(default; x is 'soon')" in _choose(bad, wait_s=300).describe()
    assert active_deadline_s({"spec": {"activeDeadlineSeconds": 900}}) == 900.0
    assert active_deadline_s({"spec": {"activeDeadlineSeconds": "900"}}) is None
    assert active_deadline_s({"spec": {"activeDeadlineSeconds": True}}) is None


def test_a_running_pod_record_carries_its_start_and_expected_run() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u1", "annotations": {"gpuweave.io/expected-duration": "2h"}},
        "spec": {"nodeName": "n1", "activeDeadlineSeconds": 86400, "containers": []},
        "status": {"phase": "Running", "startTime": "2026-01-02T03:04:05Z"},
    }
    record = pod_record(pod)
    assert record.expected_s == 7200.0 and record.deadline_s == 86400.0
    assert record.started_s == 1767323045.0
    pod["metadata"]["annotations"]["gpuweave.io/expected-duration"] = "later"
    pod["status"]["startTime"] = "yesterday"
    assert pod_record(pod).expected_s is None and pod_record(pod).started_s is None
    assert pod_record(pod) == record  # timing is not part of the record's identity (no state rebuild)


def test_the_expected_wait_is_when_enough_nodes_free() -> None:
    nodes = [
        NodeRelease(free_gpus=4),
        NodeRelease(free_gpus=0, holders=((4, 300.0),)),
        NodeRelease(free_gpus=2, holders=((2, 60.0), (2, 7200.0))),
    ]
    assert expected_wait(nodes, needed=1, gpus_per_member=4) == 0.0
    assert expected_wait(nodes, needed=2, gpus_per_member=4) == 60.0  # the third node's 2 + 2
    assert expected_wait(nodes, needed=3, gpus_per_member=4) == 300.0
    assert math.isinf(expected_wait(nodes, needed=4, gpus_per_member=4))
    assert expected_wait([NodeRelease(0, ((8, -5.0),))], needed=1, gpus_per_member=8) == 0.0  # overran


def test_the_stretch_counts_the_tiers_the_nodes_carry() -> None:
    # tiers 0 (clique) and 1 (layer 3) carried; 2..5 not; 6 is the whole offered set
    assert tier_stretch(0, 1, carried=[0, 1], stretch_per_step=1.15) == pytest.approx(1.15)
    assert tier_stretch(0, 6, carried=[0, 1], stretch_per_step=1.15) == pytest.approx(1.15**2)
    assert tier_stretch(1, 3, carried=[1, 2, 3], stretch_per_step=1.2) == pytest.approx(1.2**2)


def test_settings_are_bounded() -> None:
    with pytest.raises(InvalidInputError, match="--gang-tier-stretch"):
        TierCostSettings(stretch_per_step=0.9)
    with pytest.raises(InvalidInputError, match="--gang-tier-stretch"):
        TierCostSettings(stretch_per_step=math.nan)
    with pytest.raises(InvalidInputError, match="--gang-max-tier-wait"):
        TierCostSettings(max_wait_s=-1)
    with pytest.raises(InvalidInputError, match="--gang-expected-duration"):
        TierCostSettings(default_duration_s=0)
