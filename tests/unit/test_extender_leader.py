"""The extender's leader election: flags checked, defaults, what a change of leadership is, stale
GpuPreflight objects, and the leader metrics."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from devicemodel.errors import InvalidInputError
from gpuweave.cli import build_parser
from gpuweave.commands.extender import _lease
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.kueue.checks import CONTROLLER_NAME
from scheduler_ext.kueue.controller import KueueChecks
from scheduler_ext.leader import (
    AlwaysLeading,
    Leadership,
    Transition,
    default_identity,
    default_namespace,
    lease_settings,
    transition,
)
from scheduler_ext.preflight.kube import stale_after_s, stale_preflights
from scheduler_ext.serving.metrics import ExtenderMetrics


def settings(**overrides: Any) -> Any:
    args: dict[str, Any] = dict(
        enabled=True,
        namespace="gpuweave-system",
        name="gpuweave-extender",
        identity="pod-a",
        duration_s=15,
        retry_s=5,
    )
    return lease_settings(**(args | overrides))


def test_the_defaults_are_client_gos_timing_for_one_replica_in_its_namespace() -> None:
    chosen = settings()
    assert (chosen.namespace, chosen.name, chosen.identity) == (
        "gpuweave-system",
        "gpuweave-extender",
        "pod-a",
    )
    assert (chosen.duration_s, chosen.retry_s, chosen.enabled) == (15, 5, True)


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"duration_s": 1}, "--leader-elect-lease-duration"),
        ({"duration_s": 15.5}, "--leader-elect-lease-duration"),
        ({"duration_s": float("nan")}, "--leader-elect-lease-duration"),
        ({"retry_s": 6}, "--leader-elect-retry-period"),  # above a third: no renewal may be missed
        ({"retry_s": 0}, "--leader-elect-retry-period"),
        ({"namespace": "Gpuweave"}, "--leader-elect-namespace"),
        ({"name": "lease/../x"}, "--leader-elect-name"),
        ({"identity": ""}, "--leader-elect-identity"),
        ({"identity": "a\nb"}, "--leader-elect-identity"),
        ({"identity": "x" * 200}, "--leader-elect-identity"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(overrides: dict[str, Any], flag: str) -> None:
    with pytest.raises(InvalidInputError, match=flag):
        settings(**overrides)


def test_turned_off_nothing_else_is_checked() -> None:
    assert not settings(enabled=False, duration_s=0, namespace="BAD").enabled


def test_the_identity_is_the_pod_name_else_the_host_name() -> None:
    assert default_identity({"POD_NAME": "gpuweave-scheduler-7c9-x2"}, "host") == "gpuweave-scheduler-7c9-x2"
    assert default_identity({}, "gpuweave-scheduler-7c9-x2") == "gpuweave-scheduler-7c9-x2"


def test_the_namespace_is_the_pods_else_its_service_accounts_else_default() -> None:
    assert default_namespace({"POD_NAMESPACE": "gpu"}, "other") == "gpu"
    assert default_namespace({}, "gpuweave-system") == "gpuweave-system"
    assert default_namespace({}, None) == "default"


def test_the_cli_elects_by_default_and_can_be_told_not_to() -> None:
    parser = build_parser()
    on = parser.parse_args(["extender", "--kubeconfig", "k", "--leader-elect-identity", "a"])
    chosen = _lease(on)
    assert chosen.enabled and chosen.identity == "a" and chosen.duration_s == 15
    off = parser.parse_args(["extender", "--kubeconfig", "k", "--no-leader-elect"])
    assert not _lease(off).enabled
    bad = parser.parse_args(["extender", "--kubeconfig", "k", "--leader-elect-retry-period", "9"])
    with pytest.raises(InvalidInputError, match="retry-period"):
        _lease(bad)


@pytest.mark.parametrize(
    ("was", "now", "expected"),
    [
        (False, False, None),
        (True, True, None),
        (False, True, Transition.ACQUIRED),
        (True, False, Transition.LOST),
    ],
)
def test_a_transition_is_a_change_of_leading(was: bool, now: bool, expected: Transition | None) -> None:
    assert transition(was=was, now=now) is expected


def preflight(name: str, created: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if created is not None:
        metadata["creationTimestamp"] = created
    return {"metadata": metadata}


def test_only_preflights_older_than_any_book_waits_for_are_stale() -> None:
    now = datetime(2026, 12, 5, 4, 0, 0, tzinfo=UTC)
    horizon = stale_after_s(30.0)
    assert horizon == 120.0  # twice the default timeout, plus a minute of clock skew
    items = [
        preflight("fresh", "2026-12-05T03:59:00Z"),  # another replica's live request: kept
        preflight("edge", "2026-12-05T03:58:00Z"),  # exactly the horizon: kept
        preflight("old", "2026-12-05T03:57:59Z"),
        preflight("unreadable", "yesterday"),
        preflight("undated", None),
        preflight("", "2026-12-05T03:00:00Z"),  # no name: nothing to delete
    ]
    assert stale_preflights(items, now=now, older_than_s=horizon) == ["old", "unreadable", "undated"]


def test_the_leader_gauge_is_read_at_scrape_and_transitions_are_counted() -> None:
    metrics = ExtenderMetrics()
    leading = [False]
    metrics.watch_leader(lambda: leading[0])
    metrics.watch_controller_writes("kueue-check", lambda: 3)
    assert b"gpuweave_extender_leader 0.0" in metrics.render()
    leading[0] = True
    metrics.leader_transition(Transition.ACQUIRED.value)
    text = metrics.render()
    assert b"gpuweave_extender_leader 1.0" in text
    assert b'gpuweave_extender_leader_transitions_total{to="leader"} 1.0' in text
    assert b'gpuweave_extender_controller_writes_total{controller="kueue-check"} 3.0' in text


class Standby:
    """Another replica holds the Lease."""

    def leading(self) -> bool:
        return False


@pytest.mark.parametrize(("leader", "tries_to_write"), [(Standby(), False), (AlwaysLeading(), True)])
def test_only_the_leader_writes_kueue_check_state(
    leader: Leadership, tries_to_write: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """An AdmissionCheck of ours not yet Active: the leader marks it (here against a closed port,
    so the write fails and says so); a standby does not try."""
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    configuration.retries = 0
    api = client.ApiClient(configuration)
    cache = ClusterCache(LayoutRegistry())
    cache.synced.set()
    checks = KueueChecks(cache, api, leader=leader)
    check = {"metadata": {"name": "gpuweave-gpu-health"}, "spec": {"controllerName": CONTROLLER_NAME}}
    checks._on_check("ADDED", check)
    with caplog.at_level(logging.WARNING, logger="scheduler_ext.kueue.controller"):
        checks.reconcile()
    tried = any(
        "cannot mark AdmissionCheck gpuweave-gpu-health Active" in r.getMessage() for r in caplog.records
    )
    assert tried is tries_to_write
    assert checks.writes == 0
    api.close()  # type: ignore[no-untyped-call]
