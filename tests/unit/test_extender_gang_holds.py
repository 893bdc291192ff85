"""What a gang's pods can make the extender hold, and which gang counts as recovering.

A gang is planned, and devices held for it, only once the extender knows all the members it
declares; a hold goes at once when its members are deleted; one namespace's holds take at most a
share of the cluster; and only the same gang (name, size, owner) that ran and lost a member to a
fault or a preemption is recovering.

The cluster: five free DGX H100 nodes (40 GPUs), ``a1``, ``a2`` in layer-3 block A, ``b1``, ``b2``
in B, ``c1`` in C (``test_extender_gangs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import LABEL_JOBSET_UID, gang_of
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.gangs.limits import HoldLimit
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.kube import watched_kinds
from scheduler_ext.serving.events import HOLD_LIMIT_REASON, PodEvent
from tests.support.waiting import wait_until
from tests.unit.test_extender_gang_of_one import NAMES, TRAINING, _cluster, _fill, _solo
from tests.unit.test_extender_gangs import (
    NODES,
    TIERS,
    TTL_S,
    Clock,
    _bind,
    _created,
    _evict,
    _extender,
    _filter,
    _gang,
    _jobset_member,
    _member,
    _nodes,
    _preempt,
    _slot_devices,
    _uid,
)


def _metric(extender: Extender, outcome: str) -> bytes:
    return f'gpuweave_extender_gangs_total{{outcome="{outcome}"}}'.encode()


# ---- members first ----------------------------------------------------------------------------
def test_a_phantom_gang_holds_nothing_on_any_retry(tmp_path: Path) -> None:
    """One 8-GPU pod declaring ``gpuweave.io/gang-size: 5`` on the five free nodes: planned at once,
    it held all 40 GPUs for four members that did not exist, and another namespace's 1-GPU pod
    passed no node, again after every retry. Now each retry (every 10 s, past the TTL) refuses it
    with the count, holds nothing, and the other pod passes every node; once the four other
    members are created the gang is planned."""
    clock = Clock()
    extender = _extender(tmp_path, clock, _nodes(), hold_limit=HoldLimit(share=1.0))
    phantom = _member("phantom", 0, size=5)
    other = pod_object("other", namespace="team-b", limits={RESOURCE_GPU: 1})
    for _ in range(8):
        result = _filter(extender.service, phantom)
        assert not result.NodeNames and not result.FailedNodes
        assert set(result.FailedAndUnresolvableNodes.values()) == {
            "gang ml/gang:phantom: 1 of its 5 members exist; a gang is planned, and devices held for "
            "it, only once all its members are created; no device is held for it"
        }
        assert _slot_devices(extender) == 0
        assert set(_filter(extender.service, other).NodeNames or []) == set(NODES)
        clock.now += 10
    assert extender.gangs is not None and not extender.gangs.book.reservations()
    assert _metric(extender, "incomplete") + b" 8.0" in extender.metrics.render()
    _created(extender, *[_member("phantom", i, size=5) for i in range(1, 5)])
    assert len(_filter(extender.service, phantom).NodeNames or []) == 1
    assert _slot_devices(extender) == 40
    extender.close()


def test_a_recovering_gang_whose_members_are_missing_preempts_nothing(tmp_path: Path) -> None:
    """The JobSet of ``test_extender_gangs``'s recovery ran and was evicted; of attempt 1 only one
    member exists: it is refused with the count and its preemption answers no node."""
    extender = _extender(tmp_path, Clock(), _nodes())
    first = [_jobset_member(i, attempt=0, priority=1000) for i in range(2)]
    _created(extender, *first)
    for pod in first:
        _bind(extender.service, pod)
    for pod in first:
        _evict(extender, pod)
    for node in NODES:
        _bind(extender.service, pod_object(f"fill-{node}", limits={RESOURCE_GPU: 8}), [node])
    lone = _jobset_member(0, attempt=1, priority=1000)
    result = _filter(extender.service, lone)
    assert not result.FailedNodes and "1 of its 2 members exist" in next(
        iter(result.FailedAndUnresolvableNodes.values())
    )
    assert _preempt(extender.service, lone, {"b1": [_uid(extender, "fill-b1")]}) == {}
    extender.close()


# ---- released at once -------------------------------------------------------------------------
@pytest.mark.parametrize("first_bound", [False, True])
def test_a_hold_is_released_at_once_when_a_member_is_deleted(tmp_path: Path, first_bound: bool) -> None:
    """A gang of two, both created: member 0's filter holds both places (16 GPUs). Member 1 is
    deleted before its filter (member 0 pending or bound): fewer pods than the gang declares are
    left, so the open places go at that delete, not after the TTL, and a plain 8-GPU pod passes
    the freed node; member 0, if pending, is refused with the count."""
    clock = Clock()
    extender = _extender(tmp_path, clock, _nodes())
    first, second = _gang(extender, "pair", size=2)
    planned = _bind(extender.service, first) if first_bound else _filter(extender.service, first).NodeNames
    assert planned and _slot_devices(extender) == (8 if first_bound else 16)
    extender.cache.delete_pod(second["metadata"]["uid"])  # the watch's delete, well inside the TTL
    assert _slot_devices(extender) == 0
    assert extender.gangs is not None and not extender.gangs.book.reservations()
    assert _metric(extender, "released") + b" 1.0" in extender.metrics.render()
    plain = pod_object("plain", limits={RESOURCE_GPU: 8})
    assert len(_filter(extender.service, plain).NodeNames or []) == (4 if first_bound else 5)
    if not first_bound:
        assert "1 of its 2 members exist" in next(
            iter(_filter(extender.service, first).FailedAndUnresolvableNodes.values())
        )
    extender.close()


def test_the_pod_watchs_delete_releases_the_hold(tmp_path: Path) -> None:
    """Cluster mode's pod handler (``kube.watched_kinds``): a DELETED event of a pending member
    releases its gang's hold at once."""
    extender = _extender(tmp_path, Clock(), _nodes())
    first, second = _gang(extender, "pair", size=2)
    assert _filter(extender.service, first).NodeNames and _slot_devices(extender) == 16
    api = client.ApiClient()
    try:
        pods = next(k for k in watched_kinds(extender.cache, api) if k.name == "pods")
        pods.apply("DELETED", second)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert _slot_devices(extender) == 0
    extender.close()


def test_a_waiting_gangs_kept_nodes_go_when_its_members_are_deleted(tmp_path: Path) -> None:
    """Eight nodes, two free in block B: a gang of three that does not fit keeps them from pods that
    fit elsewhere (``test_extender_gangs``); deleting one of its members frees them at once."""
    blocks = {**{f"a{i}": "block-a" for i in range(3)}, **{f"b{i}": "block-b" for i in range(3)}}
    blocks |= {"c0": "c", "c1": "c"}
    extender = _extender(tmp_path, Clock(), _nodes(blocks=blocks))
    for node in ("a0", "a1", "a2", "b0", "c0", "c1"):
        _bind(extender.service, pod_object(f"busy-{node}", limits={RESOURCE_GPU: 8}), [node])
    members = _gang(extender, "wide", size=3)
    assert not _filter(extender.service, members[0], list(blocks)).NodeNames
    assert extender.gangs is not None and extender.gangs.book.kept_nodes() == {"b1", "b2"}
    extender.cache.delete_pod(members[2]["metadata"]["uid"])
    assert not extender.gangs.book.kept_nodes()
    extender.close()


# ---- one namespace's share ----------------------------------------------------------------------
def _with_events(limit: HoldLimit) -> tuple[Extender, list[PodEvent]]:
    written: list[PodEvent] = []
    settings = GangSettings(ttl_s=TTL_S, clock=Clock(), hold_limit=limit)
    cache, core = build_core(gangs=settings)
    apply_objects(iter(_nodes()), cache)
    return assemble(cache, core, SnapshotBinder(cache), event_sink=written.append, gangs=settings), written


def test_one_namespaces_holds_are_bounded_and_a_refused_gang_gets_an_event() -> None:
    """Limit 8 GPUs: gang ``first`` (2 x 4 GPUs) in ``ml`` holds 8. Gang ``second`` (2 x 4) in
    ``ml`` is refused with the numbers, holding nothing, counted, with a GpuweaveGangHoldLimit
    Event; the same gang in ``team-b`` is held. Once ``first`` binds, ``second`` is held."""
    extender, written = _with_events(HoldLimit(gpus=8))
    first = _gang(extender, "first", size=2, gpus=4)
    assert _filter(extender.service, first[0]).NodeNames and _slot_devices(extender) == 8
    second = _gang(extender, "second", size=2, gpus=4)
    result = _filter(extender.service, second[0])
    assert not result.NodeNames and set(result.FailedAndUnresolvableNodes) == set(NODES)
    reason = (
        "gang ml/gang:second would hold 8 GPU(s) for its members not placed yet and namespace ml's "
        "gangs hold 8 now; one namespace's gangs may hold at most 8 GPUs "
        "(--gang-hold-per-namespace); no device is held for it"
    )
    assert set(result.FailedAndUnresolvableNodes.values()) == {reason}
    assert _slot_devices(extender) == 8
    assert _metric(extender, "over-limit") + b" 1.0" in extender.metrics.render()
    wait_until("the limit's Event", lambda: any(e.reason == HOLD_LIMIT_REASON for e in written), timeout=10)
    event = next(e for e in written if e.reason == HOLD_LIMIT_REASON)
    assert (event.namespace, event.name, event.type, event.message) == ("ml", "second-0", "Warning", reason)
    elsewhere = [pod_object(f"b-{i}", namespace="team-b", limits={RESOURCE_GPU: 4}) for i in range(2)]
    for pod in elsewhere:
        pod["metadata"]["annotations"] = dict(second[0]["metadata"]["annotations"])
    _created(extender, *elsewhere)
    assert _filter(extender.service, elsewhere[0]).NodeNames and _slot_devices(extender) == 16
    for pod in first:
        _bind(extender.service, pod)
    assert _filter(extender.service, second[0]).NodeNames and _slot_devices(extender) == 16
    extender.close()


def test_the_default_limit_lets_a_small_cluster_run_a_gang_of_most_of_its_gpus() -> None:
    """40 GPUs: 50% would be 20, but a percentage is never below 64 GPUs, so a gang of 3 x 8 is
    held (as on any cluster of up to 128 GPUs); an explicit 20 refuses it with the numbers."""
    extender, _ = _with_events(HoldLimit())
    assert _filter(extender.service, _gang(extender, "big", size=3)[0]).NodeNames
    assert _slot_devices(extender) == 24
    extender.close()
    extender, _ = _with_events(HoldLimit(gpus=20))
    result = _filter(extender.service, _gang(extender, "big", size=3)[0])
    assert "would hold 24 GPU(s)" in next(iter(result.FailedAndUnresolvableNodes.values()))
    assert _slot_devices(extender) == 0
    extender.close()


@pytest.mark.parametrize(
    ("text", "limit", "of_1000"),
    [("64", HoldLimit(gpus=64), 64), ("8", HoldLimit(gpus=8), 8), ("50%", HoldLimit(share=0.5), 500)],
)
def test_hold_limits_parse_gpus_or_a_percentage(text: str, limit: HoldLimit, of_1000: int) -> None:
    assert HoldLimit.parse(text) == limit and limit.of(1000) == of_1000
    assert HoldLimit.parse(" 100% ") == HoldLimit(share=1.0)
    assert HoldLimit().of(40) == HoldLimit(share=0.1).of(300) == 64  # a percentage's floor
    assert HoldLimit().describe(1000) == "500 GPUs: 50% of the cluster's 1000, at least 64"


@pytest.mark.parametrize("text", ["0", "0%", "101%", "-1", "1.5", "half", "", "9" * 40])
def test_bad_hold_limits_are_refused_with_the_flag(text: str) -> None:
    with pytest.raises(InvalidInputError, match=r"--gang-hold-per-namespace is .* give a number of GPUs"):
        HoldLimit.parse(text)


# ---- recovering: the same gang, after a fault or a preemption ------------------------------------
def _full(extender: Extender) -> dict[str, str]:
    """Every node full of priority-0 8-GPU pods; their UIDs by node."""
    return {n: _fill(extender, n, priority=0) for n in NAMES if extender.cache.node(n) is not None}


def test_a_gang_of_one_that_ran_makes_no_larger_gang_of_its_name_recovering(tmp_path: Path) -> None:
    """``train`` ran as a gang of one on b0 and was evicted by a fault. A size-3 ``train`` gang
    that never ran, its three members created, fits nowhere (every node full of priority-0 pods):
    it is a new gang, so no node is resolvable and its preemption answers no node. The gang of one
    re-created is recovering."""
    extender = _cluster(tmp_path)
    solo = _solo("train-0", gang="train")
    _bind(extender.service, solo, NAMES)
    _evict(extender, solo)
    fills = _full(extender)
    three = [
        pod_object(
            f"train-big-{i}",
            namespace="ml",
            limits={RESOURCE_GPU: 8},
            annotations={"gpuweave.io/gang": "train", "gpuweave.io/gang-size": "3"},
            priority=TRAINING,
        )
        for i in range(3)
    ]
    _created(extender, *three)
    result = _filter(extender.service, three[0], NAMES)
    assert not result.NodeNames and not result.FailedNodes
    assert set(result.FailedAndUnresolvableNodes) == set(NAMES)
    assert _preempt(extender.service, three[0], {n: [u] for n, u in fills.items()}) == {}
    again = _solo("train-0-again", gang="train")
    assert _filter(extender.service, again, NAMES).FailedNodes  # the same gang of one: recovering
    extender.close()


def test_a_gang_that_ran_and_ended_on_its_own_is_not_recovering(tmp_path: Path) -> None:
    """The gang of one ran and its pod was deleted without a disruption (the job finished, or its
    owner deleted it): created again under the same name it is a new gang and preempts nothing."""
    extender = _cluster(tmp_path)
    solo = _solo("solo-0")
    _bind(extender.service, solo, NAMES)
    extender.cache.delete_pod(solo["metadata"]["uid"])
    fills = _full(extender)
    again = _solo("solo-0-again")
    result = _filter(extender.service, again, NAMES)
    assert not result.FailedNodes and set(result.FailedAndUnresolvableNodes) == set(NAMES)
    assert _preempt(extender.service, again, {n: [u] for n, u in fills.items()}) == {}
    extender.close()


def _jobset(index: int, *, attempt: int, uid: str) -> dict[str, Any]:
    pod = _jobset_member(index, attempt=attempt, priority=1000)
    pod["metadata"]["labels"][LABEL_JOBSET_UID] = uid
    pod["metadata"]["name"] = pod["metadata"]["uid"] = f"js-{uid}-{attempt}-{index}"
    return pod


def test_a_jobset_recreated_under_its_name_is_a_new_gang(tmp_path: Path) -> None:
    """JobSet ``js`` (UID u1) ran and a fault evicted it. Its attempt 1 is recovering; a JobSet
    created again as ``js`` (UID u2, attempt 0) is not, though its gang key is attempt 0's."""
    extender = _extender(tmp_path, Clock(), _nodes())
    ran = [_jobset(i, attempt=0, uid="u1") for i in range(2)]
    _created(extender, *ran)
    for pod in ran:
        _bind(extender.service, pod)
    for pod in ran:
        _evict(extender, pod)
    for node in NODES:
        _bind(extender.service, pod_object(f"fill-{node}", limits={RESOURCE_GPU: 8}), [node])
    gangs = extender.gangs
    assert gangs is not None
    assert b"gpuweave_extender_gangs_recovering 1.0" in extender.metrics.render()  # one family
    retry = gang_of(_jobset(0, attempt=1, uid="u1"), min_members={}, tier_labels=TIERS)
    fresh = gang_of(_jobset(0, attempt=0, uid="u2"), min_members={}, tier_labels=TIERS)
    assert retry is not None and fresh is not None and retry.owner == "jobset:u1"
    assert fresh.key == "ml/jobset:js/workers/0"  # the key of the JobSet that ran: another owner
    assert gangs.book.recovering_nodes(retry.family) and not gangs.book.recovering_nodes(fresh.family)
    recreated = [_jobset(i, attempt=0, uid="u2") for i in range(2)]
    _created(extender, *recreated)
    result = _filter(extender.service, recreated[0])
    assert not result.FailedNodes and set(result.FailedAndUnresolvableNodes) == set(NODES)
    extender.close()
