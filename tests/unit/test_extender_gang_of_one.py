"""A gang of one (``gpuweave.io/gang: NAME`` + ``gpuweave.io/gang-size: "1"``): placed like any
pod, but preempting by the gang rules: nothing before its attempt ran, and, re-created after it ran,
lower-priority pods in its network domain when it does not fit. A size of 1 from any other source
is an ordinary pod.

The cluster: five DGX H100 nodes, ``a0``, ``a1`` in EKS layer-3 block A and ``b0``..``b2`` in B.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.gangs import (
    ANNOTATION_GANG,
    ANNOTATION_GANG_SIZE,
    ANNOTATION_KUEUE_GROUP_COUNT,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICAS,
    LABEL_KUEUE_POD_GROUP,
    LABEL_POD_GROUP,
    LABEL_REPLICATED_JOB,
    Gang,
    gang_key,
    gang_of,
)
from gpuweave.simulate.cluster_objects import inventory_object, pod_object, profile_inventory
from scheduler_ext.app import Extender
from scheduler_ext.gangs.book import SLOT_PREFIX
from scheduler_ext.serving.wire import ExtenderPreemptionArgs, WireError, parse
from tests.unit.test_extender_gangs import (
    TIERS,
    Clock,
    _bind,
    _evict,
    _extender,
    _filter,
    _nodes,
    _pod,
    _preempt,
    _uid,
)

BLOCKS = {"a0": "block-a", "a1": "block-a", "b0": "block-b", "b1": "block-b", "b2": "block-b"}
NAMES = list(BLOCKS)
TRAINING = 1000  # the one-pod training job's PriorityClass value


# ---- identity ---------------------------------------------------------------------------------
def test_an_explicit_gang_of_one_is_a_gang_and_an_implicit_size_of_one_is_not() -> None:
    alone = gang_of(
        _pod(annotations={ANNOTATION_GANG: "solo", ANNOTATION_GANG_SIZE: "1"}),
        min_members={},
        tier_labels=TIERS,
    )
    assert alone == Gang("ml/gang:solo", 1, "annotation") and alone.alone
    assert not Gang("ml/gang:pair", 2, "annotation").alone
    implicit = [
        _pod(labels={LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "w", LABEL_JOBSET_REPLICAS: "1"}),
        _pod(labels={LABEL_KUEUE_POD_GROUP: "kg"}, annotations={ANNOTATION_KUEUE_GROUP_COUNT: "1"}),
        _pod(labels={LABEL_POD_GROUP: "pg"}),  # its PodGroup's minMember is 1 (below)
        # gpuweave.io/gang-size 1 on a pod whose gang another source names: still no gang
        _pod(
            labels={LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "w", LABEL_JOBSET_REPLICAS: "2"},
            annotations={ANNOTATION_GANG_SIZE: "1"},
        ),
    ]
    for pod in implicit:
        assert gang_of(pod, min_members={"ml/pg": 1}, tier_labels=TIERS) is None
        assert gang_key(pod)  # the identity stays (a fault's whole-gang eviction reads it)


# ---- the extender -------------------------------------------------------------------------------
def _solo(name: str, *, gang: str = "solo", gpus: int = 8, priority: int = TRAINING) -> dict[str, Any]:
    annotations = {ANNOTATION_GANG: gang, ANNOTATION_GANG_SIZE: "1"}
    return pod_object(
        name, namespace="ml", limits={RESOURCE_GPU: gpus}, annotations=annotations, priority=priority
    )


def _fill(extender: Extender, node: str, *, priority: int, gpus: int = 8) -> str:
    """A plain pod of ``priority`` holding ``gpus`` GPUs of ``node``; its UID."""
    _bind(
        extender.service, pod_object(f"fill-{node}", limits={RESOURCE_GPU: gpus}, priority=priority), [node]
    )
    return _uid(extender, f"fill-{node}")


def _cluster(tmp_path: Path) -> Extender:
    return _extender(tmp_path, Clock(), _nodes(blocks=BLOCKS))


def test_a_gang_of_one_that_fits_is_placed_like_any_pod(tmp_path: Path) -> None:
    """Every fitting node passes (the shortlist, not one planned node), nothing is held for it
    before its bind, and its bind remembers its node as its gang's."""
    extender = _cluster(tmp_path)
    pod = _solo("solo-0")
    passed = _filter(extender.service, pod, NAMES).NodeNames
    assert len(passed) > 1
    assert not any(r.uid.startswith(SLOT_PREFIX) for n in NAMES for r in extender.cache.holdings_on(n))
    assert extender.gangs is not None and not extender.gangs.book.reservations()
    node = _bind(extender.service, pod, NAMES)
    assert extender.gangs.book.last_nodes("ml/gang:solo#1@") == frozenset({node})  # its family's run
    assert not extender.gangs.book.recovering_nodes("ml/gang:solo#1@")  # it lost no member
    assert not extender.gangs.book.last_nodes("default/gang:other#1@")
    assert not extender.service._planned_as_gang(pod)  # prioritize's best fit across cliques applies
    assert extender.service._planned_as_gang(
        pod_object("pair-0", annotations={ANNOTATION_GANG: "pair", ANNOTATION_GANG_SIZE: "2"})
    )
    extender.close()


def test_a_gang_of_one_that_never_ran_preempts_nothing(tmp_path: Path) -> None:
    """Every node full of priority-0 pods: an ordinary priority-1000 pod may preempt (resolvable
    nodes, victims answered); the same pod naming a gang of one that never ran gets every node
    unresolvable and the preempt verb answers no node."""
    extender = _cluster(tmp_path)
    fills = {n: _fill(extender, n, priority=0) for n in NAMES}
    ordinary = pod_object("plain-0", namespace="ml", limits={RESOURCE_GPU: 8}, priority=TRAINING)
    result = _filter(extender.service, ordinary, NAMES)
    assert not result.NodeNames and set(result.FailedNodes) == set(NAMES)
    assert _preempt(extender.service, ordinary, {"a0": [fills["a0"]]}) == {"a0": [fills["a0"]]}
    fresh = _solo("solo-0")
    result = _filter(extender.service, fresh, NAMES)
    assert not result.NodeNames and not result.FailedNodes
    assert set(result.FailedAndUnresolvableNodes) == set(NAMES)
    assert result.FailedAndUnresolvableNodes["a0"] == result_reason(extender, ordinary, "a0")
    assert _preempt(extender.service, fresh, {n: [u] for n, u in fills.items()}) == {}
    # its victim lists are never read: an entry that is not a victim list costs nothing and no
    # error for the refused gang, while an ordinary pod's call reads it and names it
    bad = {"Pod": fresh, "NodeNameToMetaVictims": {"a0": {"Pods": "not-a-list"}}}
    assert not extender.service.preempt(parse(ExtenderPreemptionArgs, bad), fresh).NodeNameToMetaVictims
    with pytest.raises(WireError, match=r"NodeNameToMetaVictims\.a0\.Pods"):
        extender.service.preempt(parse(ExtenderPreemptionArgs, {**bad, "Pod": ordinary}), ordinary)
    extender.close()


def result_reason(extender: Extender, pod: dict[str, Any], node: str) -> str:
    """The ordinary filter's reason for ``pod`` on ``node``."""
    result = _filter(extender.service, pod, [node])
    return str({**result.FailedNodes, **result.FailedAndUnresolvableNodes}[node])


def _ran_on_b0(tmp_path: Path, *, b1_priority: int) -> tuple[Extender, dict[str, str]]:
    """The gang of one ran on b0 (every other node full then) and a GPU of b0 failed, which
    evicted it (the eviction's delete carries the ``DisruptionTarget`` condition); now b1 and
    block A hold 8-GPU pods, b1's of ``b1_priority``, block A's of priority 0, and b2 one at the
    training priority. The fill pods' UIDs by node."""
    extender = _cluster(tmp_path)
    fills = {n: _fill(extender, n, priority=0) for n in ("a0", "a1", "b1", "b2")}
    first = _solo("solo-0")
    assert _bind(extender.service, first, NAMES) == "b0"
    _evict(extender, first)  # evicted for its failed GPU
    broken = profile_inventory("dgx-h100", "b0")
    extender.cache.upsert_inventory(inventory_object(broken, unhealthy=(broken.gpus[3].uuid,)))
    for node, priority in (("b1", b1_priority), ("b2", TRAINING)):
        extender.cache.delete_pod(fills.pop(node))
        fills[node] = _fill(extender, node, priority=priority)
    return extender, fills


def test_a_gang_of_one_recreated_after_it_ran_preempts_lower_priority_pods_in_its_domain(
    tmp_path: Path,
) -> None:
    """Re-created (same gang name, a new pod), it fits nowhere. Planned as a recovering gang, as if
    the lower-priority pods were gone, it fits b1 and each node of block A; block B, the domain
    that holds it with less spare room, wins as for any gang. Only b1 is resolvable (block A's
    pods are lower priority too, but outside that domain), the preempt verb narrows
    kube-scheduler's candidates to b1, and after the eviction it binds there."""
    extender, fills = _ran_on_b0(tmp_path, b1_priority=0)
    again = _solo("solo-0", gang="solo")
    again["metadata"]["uid"] = "uid-solo-0-again"
    result = _filter(extender.service, again, NAMES)
    assert not result.NodeNames
    assert set(result.FailedNodes) == {"b1"}
    assert "is recovering and fits once pods of lower priority" in result.FailedNodes["b1"]
    assert set(result.FailedAndUnresolvableNodes) == {"a0", "a1", "b0", "b2"}
    proposed = {n: [fills[n]] for n in ("a0", "a1", "b1")}
    assert _preempt(extender.service, again, proposed) == {"b1": [fills["b1"]]}
    extender.cache.delete_pod(fills["b1"])  # kube-scheduler evicted it
    assert _bind(extender.service, again, NAMES) == "b1"
    assert extender.gangs is not None and extender.gangs.book.last_nodes("ml/gang:solo#1@") == {"b1"}
    extender.close()


def test_a_recovering_gang_of_one_preempts_only_lower_priority_pods(tmp_path: Path) -> None:
    """With b1's pod at the training priority, block B cannot be opened: the gang of one may
    preempt in block A only (priority-0 pods), never b1 or b2."""
    extender, fills = _ran_on_b0(tmp_path, b1_priority=TRAINING)
    again = _solo("solo-0")
    result = _filter(extender.service, again, NAMES)
    assert set(result.FailedNodes) == {"a0", "a1"}
    proposed = {n: [fills[n]] for n in ("a0", "b1", "b2")}
    assert _preempt(extender.service, again, proposed) == {"a0": [fills["a0"]]}
    extender.close()


@pytest.mark.parametrize(
    "labels",
    [
        {LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "w", LABEL_JOBSET_REPLICAS: "1"},
        {},
    ],
)
def test_a_pod_that_is_no_gang_of_one_preempts_as_before(tmp_path: Path, labels: dict[str, str]) -> None:
    """An ordinary pod (a JobSet of one replica, or no gang at all) at the training priority that
    ran on b0 before: resolvable wherever lower-priority pods hold the GPUs, inside block B or not."""
    extender, fills = _ran_on_b0(tmp_path, b1_priority=0)
    pod = pod_object("plain-0", namespace="ml", limits={RESOURCE_GPU: 8}, priority=TRAINING)
    pod["metadata"]["labels"] = labels
    result = _filter(extender.service, pod, NAMES)
    assert not result.NodeNames and set(result.FailedNodes) == {"a0", "a1", "b1", "b2"}
    proposed = {n: [fills[n]] for n in ("a0", "b1")}
    assert set(_preempt(extender.service, pod, proposed)) == {"a0", "b1"}
    extender.close()


def test_a_recovering_gang_of_one_preempts_before_the_watch_brings_its_new_pod(tmp_path: Path) -> None:
    """kube-scheduler rejects every node itself (too few free GPUs), so the first the extender
    hears of the re-created pod is the preempt verb, which may come before its watch brought the
    pod: the asking pod counts as the gang's member, and the gang preempts in its domain."""
    extender, fills = _ran_on_b0(tmp_path, b1_priority=0)
    again = _solo("solo-0", gang="solo")
    again["metadata"]["uid"] = "uid-solo-0-unseen"
    assert extender.cache.gang_member_uids("ml/gang:solo#1@") == set()  # not in the cache yet
    proposed = {n: [fills[n]] for n in ("a0", "a1", "b1")}
    assert _preempt(extender.service, again, proposed) == {"b1": [fills["b1"]]}
    extender.close()


def _ended(extender: Extender, pod: dict[str, Any], *, node: str, reason: str) -> None:
    """The bound pod ends by a disruption: the watch's last word on it is the object with the
    ``DisruptionTarget`` condition its writer set (``reason``) and a terminal phase."""
    ended = copy.deepcopy(pod)
    ended["spec"]["nodeName"] = node
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason}
    ended["status"] = {"phase": "Failed", "conditions": [condition]}
    extender.cache.upsert_pod(ended)


@pytest.mark.parametrize(
    ("reason", "recovering"),
    [
        ("PreemptionByScheduler", False),  # kube-scheduler's preemption, for a higher priority
        ("EvictionByEvictionAPI", True),  # a fault's eviction, a drain
        ("DeletionByTaintManager", True),  # the node's NoExecute taint
    ],
)
def test_a_gang_of_one_preempted_for_a_higher_priority_does_not_preempt_in_turn(
    tmp_path: Path, reason: str, recovering: bool
) -> None:
    """It ran on b0 and ended by a disruption; b0 then went to a priority-0 pod, and every node
    holds one. Ended by a fault (an eviction, a taint), its next attempt is recovering and may
    preempt priority-0 pods in its domain (block B). Preempted by kube-scheduler for more
    important work, it is not: every node is unresolvable, the preempt verb answers none, so the
    priority-0 pods, which had no part in it, keep their run (no chain of preemptions)."""
    extender = _cluster(tmp_path)
    fills = {n: _fill(extender, n, priority=0) for n in ("a0", "a1", "b1", "b2")}
    first = _solo("solo-0")
    assert _bind(extender.service, first, NAMES) == "b0"
    _ended(extender, first, node="b0", reason=reason)
    fills["b0"] = _fill(extender, "b0", priority=0)
    assert extender.gangs is not None
    assert bool(extender.gangs.book.recovering_nodes("ml/gang:solo#1@")) is recovering
    again = _solo("solo-0")
    again["metadata"]["uid"] = "uid-solo-0-again"
    result = _filter(extender.service, again, NAMES)
    assert not result.NodeNames
    answer = _preempt(extender.service, again, {n: [u] for n, u in fills.items()})
    if recovering:
        assert set(result.FailedNodes) == {"b0", "b1", "b2"}
        assert set(answer) == {"b0", "b1", "b2"}  # kube-scheduler picks one of them
    else:
        assert not result.FailedNodes and set(result.FailedAndUnresolvableNodes) == set(NAMES)
        assert answer == {}
    extender.close()


def test_a_recovering_gang_of_one_preempts_where_the_victims_lose_the_least_run(tmp_path: Path) -> None:
    """Block B cannot be opened (b1 and b2 at the training priority); a0 and a1 each hold one
    priority-0 8-GPU pod, so either opens block A and kube-scheduler would take either (one
    victim each). a0's pod has run 9,000 s, a1's 1,000 s: an evicted pod restarts from its
    beginning, so the preempt verb answers a1 only. With no start time known both stay."""
    extender, fills = _ran_on_b0(tmp_path, b1_priority=TRAINING)
    again = _solo("solo-0")
    assert set(_filter(extender.service, again, NAMES).FailedNodes) == {"a0", "a1"}
    proposed = {n: [fills[n]] for n in ("a0", "a1")}
    assert _preempt(extender.service, again, proposed) == proposed
    for node, started in (("a0", "2026-01-01T00:00:00Z"), ("a1", "2026-01-01T02:13:20Z")):
        bound = extender.cache.pod_object(uid=fills[node])
        assert bound is not None
        extender.cache.upsert_pod({**bound, "status": {"phase": "Running", "startTime": started}})
    assert extender.gangs is not None
    extender.gangs.recovery.wall_clock = lambda: 1_767_225_600.0 + 9_000.0  # 2026-01-01T02:30:00Z
    assert _preempt(extender.service, again, proposed) == {"a1": [fills["a1"]]}
    extender.close()
