"""Gangs: identity from annotations, PodGroups and JobSets; all-or-nothing planning in the tightest
network domain; reservations that steer members, expire and never hold a device twice."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from devicemodel.gangs import (
    ANNOTATION_GANG,
    ANNOTATION_GANG_SIZE,
    ANNOTATION_KUEUE_GROUP_COUNT,
    ANNOTATION_KUEUE_WORKLOAD,
    KUEUE_TOPOLOGY_ANNOTATIONS,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICAS,
    LABEL_JOBSET_RESTART,
    LABEL_KUEUE_POD_GROUP,
    LABEL_POD_GROUP,
    LABEL_REPLICATED_JOB,
    BadGangError,
    Gang,
    gang_key,
    gang_of,
)
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender
from scheduler_ext.gangs.book import SLOT_PREFIX, GangBook, Slot
from scheduler_ext.gangs.limits import HoldLimit
from scheduler_ext.gangs.service import GangSettings, PodGroupSizes
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, parse
from topology.network import DEFAULT_TIER_LABELS, LABEL_AWS_LAYER_2, LABEL_AWS_LAYER_3

BLOCKS = {"a1": "block-a", "a2": "block-a", "b1": "block-b", "b2": "block-b", "c1": "block-c"}
NODES = list(BLOCKS)
TTL_S = 60.0
TIERS = DEFAULT_TIER_LABELS


# ---- identity ---------------------------------------------------------------------------------
def _pod(*, labels: Mapping[str, str] = {}, annotations: Mapping[str, str] = {}, ns: str = "ml") -> Any:
    pod = pod_object("w-0", namespace=ns, annotations=annotations)
    pod["metadata"]["labels"] = dict(labels)
    return pod


@pytest.mark.parametrize(
    ("labels", "annotations", "groups", "expected"),
    [
        ({}, {ANNOTATION_GANG: "job", ANNOTATION_GANG_SIZE: "4"}, {}, Gang("ml/gang:job", 4, "annotation")),
        ({LABEL_POD_GROUP: "pg"}, {}, {"ml/pg": 3}, Gang("ml/pod-group:pg", 3, "pod-group")),
        ({LABEL_POD_GROUP: "pg"}, {ANNOTATION_GANG_SIZE: "2"}, {}, Gang("ml/pod-group:pg", 2, "pod-group")),
        ({LABEL_POD_GROUP: "pg"}, {}, {}, None),  # PodGroup unseen, no size: placed alone
        ({LABEL_POD_GROUP: "pg"}, {}, {"other/pg": 3}, None),  # another namespace's PodGroup
        (
            {LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "workers", LABEL_JOBSET_REPLICAS: "8"},
            {},
            {},
            Gang("ml/jobset:js/workers/0", 8, "jobset"),
        ),
        (
            {
                LABEL_JOBSET_NAME: "js",
                LABEL_REPLICATED_JOB: "w",
                LABEL_JOBSET_REPLICAS: "2",
                LABEL_JOBSET_RESTART: "3",
            },
            {ANNOTATION_GANG_SIZE: "16"},
            {},
            Gang("ml/jobset:js/w/3", 16, "jobset"),
        ),
        ({LABEL_JOBSET_NAME: "js"}, {}, {}, None),  # no replicated job: no gang
        (
            {LABEL_KUEUE_POD_GROUP: "kg"},
            {ANNOTATION_KUEUE_GROUP_COUNT: "4"},
            {},
            Gang("ml/kueue-pod-group:kg", 4, "kueue-pod-group"),
        ),
        (
            {LABEL_KUEUE_POD_GROUP: "kg"},
            {ANNOTATION_KUEUE_GROUP_COUNT: "4", ANNOTATION_GANG_SIZE: "2"},
            {},
            Gang("ml/kueue-pod-group:kg", 2, "kueue-pod-group"),
        ),
        ({LABEL_KUEUE_POD_GROUP: "kg"}, {}, {}, None),  # no count: a group of one
        (  # a gang of one: placed like any pod, preempting by the gang rules
            {},
            {ANNOTATION_GANG: "solo", ANNOTATION_GANG_SIZE: "1"},
            {},
            Gang("ml/gang:solo", 1, "annotation"),
        ),
        ({LABEL_POD_GROUP: "pg"}, {}, {"ml/pg": 1}, None),  # a size of 1 from a PodGroup: no gang
        ({}, {}, {}, None),
    ],
)
def test_gang_identity(
    labels: dict[str, str], annotations: dict[str, str], groups: dict[str, int], expected: Gang | None
) -> None:
    pod = _pod(labels=labels, annotations=annotations)
    assert gang_of(pod, min_members=groups, tier_labels=TIERS) == expected
    assert gang_key(pod) == (expected.key if expected else gang_key(pod))


@pytest.mark.parametrize("topology", KUEUE_TOPOLOGY_ANNOTATIONS)
def test_a_gang_kueues_topology_aware_scheduling_placed_is_not_planned_again(topology: str) -> None:
    labels = {LABEL_JOBSET_NAME: "js", LABEL_REPLICATED_JOB: "workers", LABEL_JOBSET_REPLICAS: "2"}
    admitted = _pod(labels=labels, annotations={ANNOTATION_KUEUE_WORKLOAD: "jobset-js-1"})
    assert gang_of(admitted, min_members={}, tier_labels=TIERS) == Gang(
        "ml/jobset:js/workers/0", 2, "jobset", owner="workload:jobset-js-1"
    )
    placed = _pod(labels=labels, annotations={ANNOTATION_KUEUE_WORKLOAD: "jobset-js-1", topology: "block"})
    assert gang_of(placed, min_members={}, tier_labels=TIERS) is None  # Kueue placed the gang
    assert gang_key(placed) == "ml/jobset:js/workers/0"  # still one gang for a fault's whole-gang eviction
    asked = _pod(labels=labels, annotations={topology: "block"})  # not admitted by Kueue: a gang
    assert gang_of(asked, min_members={}, tier_labels=TIERS) is not None


@pytest.mark.parametrize("size", ["0", "4097", "1.5", "-2", "two", "", "٣", "99999999999999999999"])
def test_bad_gang_sizes_are_refused_with_the_annotation_and_the_range(size: str) -> None:
    pod = _pod(annotations={ANNOTATION_GANG: "job", ANNOTATION_GANG_SIZE: size})
    with pytest.raises(BadGangError, match=r"gpuweave.io/gang-size is .*(1\.\.4096|members)"):
        gang_of(pod, min_members={}, tier_labels=TIERS)
    assert gang_key(pod) == "ml/gang:job"  # the identity stays readable


def test_a_gang_name_without_a_size_or_with_a_bad_name_is_refused() -> None:
    with pytest.raises(BadGangError, match=r"no gpuweave\.io/gang-size"):
        gang_of(_pod(annotations={ANNOTATION_GANG: "job"}), min_members={}, tier_labels=TIERS)
    with pytest.raises(BadGangError, match="limit is 253"):
        gang_of(
            _pod(annotations={ANNOTATION_GANG: "x" * 300, ANNOTATION_GANG_SIZE: "2"}),
            min_members={},
            tier_labels=TIERS,
        )
    assert gang_key(_pod(annotations={ANNOTATION_GANG: " "})) == ""  # never raises


def test_equal_gang_names_in_two_namespaces_are_two_gangs() -> None:
    annotations = {ANNOTATION_GANG: "job", ANNOTATION_GANG_SIZE: "2"}
    assert gang_key(_pod(annotations=annotations, ns="a")) != gang_key(_pod(annotations=annotations, ns="b"))


# ---- a five-node cluster: two free DGX H100 in block B, one free and one half-used in A ----------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _nodes(
    layer2: Mapping[str, str] | None = None, blocks: Mapping[str, str] = BLOCKS
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for name, block in blocks.items():
        labels = {LABEL_AWS_LAYER_3: block, LABEL_AWS_LAYER_2: (layer2 or {}).get(name, "spine-1")}
        items += [
            node_object(name, gpus=8, labels=labels),
            inventory_object(profile_inventory("dgx-h100", name)),
        ]
    return items


def _extender(
    tmp_path: Path,
    clock: Clock,
    items: list[dict[str, Any]],
    *,
    ttl_s: float = TTL_S,
    hold_limit: HoldLimit | None = None,
) -> Extender:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    settings = GangSettings(ttl_s=ttl_s, clock=clock, hold_limit=hold_limit or HoldLimit())
    return build_snapshot_extender(path, gangs=settings)


def _busy(extender: Extender, node: str, gpus: int) -> None:
    """A plain pod holding ``gpus`` GPUs on ``node``."""
    _bind(extender.service, pod_object(f"busy-{node}", limits={RESOURCE_GPU: gpus}), [node])


def _member(gang: str, index: int, *, size: int, gpus: int = 8) -> dict[str, Any]:
    annotations = {ANNOTATION_GANG: gang, ANNOTATION_GANG_SIZE: str(size)}
    return pod_object(f"{gang}-{index}", namespace="ml", limits={RESOURCE_GPU: gpus}, annotations=annotations)


def _created(extender: Extender, *pods: dict[str, Any]) -> None:
    """The pods are created: the extender's watch delivers them, pending (a gang is planned only
    once the extender knows all its members)."""
    for pod in pods:
        extender.cache.upsert_pod(pod)


def _gang(extender: Extender, name: str, *, size: int, gpus: int = 8) -> list[dict[str, Any]]:
    """Every member of gang ``name``, created."""
    members = [_member(name, i, size=size, gpus=gpus) for i in range(size)]
    _created(extender, *members)
    return members


def _evict(extender: Extender, pod: dict[str, Any] | str) -> None:
    """The pod is evicted (a fault's eviction, or kube-scheduler's preemption): the watch delivers
    its delete, whose object carries the ``DisruptionTarget`` condition."""
    uid = pod if isinstance(pod, str) else pod["metadata"]["uid"]
    extender.cache.delete_pod(uid, disrupted=True)


def _filter(service: ExtenderService, pod: dict[str, Any], names: list[str] = NODES) -> Any:
    return service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": names}), pod)


def _bind(service: ExtenderService, pod: dict[str, Any], names: list[str] = NODES) -> str:
    """Filter, then bind to the first passing node (kube-scheduler's choice among one); the node."""
    passed = _filter(service, pod, names).NodeNames
    assert passed, _filter(service, pod, names).FailedAndUnresolvableNodes
    meta = pod["metadata"]
    args = ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=passed[0]
    )
    assert service.bind(args) == ""
    return str(passed[0])


def _holders(extender: Extender) -> dict[str, set[str]]:
    """Device -> every holder ID the cache knows for it (one each, or it is held twice)."""
    seen: dict[str, set[str]] = {}
    for name in NODES:
        for record in extender.cache.holdings_on(name):
            for device in record.devices:
                seen.setdefault(f"{name}/{device}", set()).add(record.uid)
    return seen


def _slot_devices(extender: Extender) -> int:
    return sum(
        len(r.devices) for n in NODES for r in extender.cache.holdings_on(n) if r.uid.startswith(SLOT_PREFIX)
    )


def test_a_gang_goes_all_or_nothing_to_the_one_block_that_holds_it(tmp_path: Path) -> None:
    extender = _extender(tmp_path, Clock(), _nodes())
    _busy(extender, "a2", 4)
    _busy(extender, "c1", 1)
    first, second = _gang(extender, "train", size=2)
    passed = _filter(extender.service, first).NodeNames
    assert passed is not None and len(passed) == 1 and passed[0] in ("b1", "b2")
    assert _slot_devices(extender) == 16  # both members' GPUs held from the first filter on
    plain = pod_object("plain", limits={RESOURCE_GPU: 8})  # may not take a planned node
    assert set(_filter(extender.service, plain).NodeNames or []) == {"a1"}
    nodes = {_bind(extender.service, first), _bind(extender.service, second)}
    assert nodes == {"b1", "b2"}
    assert (
        _slot_devices(extender) == 0 and extender.gangs is not None and not extender.gangs.book.reservations()
    )
    assert all(len(holders) == 1 for holders in _holders(extender).values())
    extender.close()


def test_the_closest_tier_wins_over_a_better_scored_wider_domain(tmp_path: Path) -> None:
    """a1+c1 share only layer 2 (spine-1); b1+b2 share layer 3: block B, a tighter domain."""
    extender = _extender(tmp_path, Clock(), _nodes(layer2={"b1": "spine-2", "b2": "spine-2"}))
    _busy(extender, "a2", 8)
    members = _gang(extender, "t", size=2)
    assert {_bind(extender.service, m) for m in members} == {"b1", "b2"}
    three = _gang(extender, "wide", size=2)  # only a1 and c1 are left: layer 2 holds them
    assert {_bind(extender.service, m) for m in three} == {"a1", "c1"}
    extender.close()


def test_a_gang_that_does_not_fit_gets_a_reason_on_every_member_and_holds_nothing(tmp_path: Path) -> None:
    extender = _extender(tmp_path, Clock(), _nodes())
    _busy(extender, "a2", 4)
    for member in _gang(extender, "big", size=5):
        result = _filter(extender.service, member)
        assert not result.NodeNames
        reasons = set(result.FailedAndUnresolvableNodes.values())
        assert len(reasons) == 1
        (reason,) = reasons
        assert "gang ml/gang:big needs 5 more member(s)" in reason and "no device is held" in reason
        assert "the most any network domain holds is 4" in reason
    assert _slot_devices(extender) == 0
    assert set(_filter(extender.service, pod_object("p", limits={RESOURCE_GPU: 8})).NodeNames or []) == {
        "a1",
        "b1",
        "b2",
        "c1",
    }
    extender.close()


def test_a_bad_gang_size_rejects_every_node_with_the_reason(tmp_path: Path) -> None:
    extender = _extender(tmp_path, Clock(), _nodes())
    pod = pod_object(
        "x", limits={RESOURCE_GPU: 8}, annotations={ANNOTATION_GANG: "g", ANNOTATION_GANG_SIZE: "5000"}
    )
    result = _filter(extender.service, pod)
    assert not result.NodeNames
    assert set(result.FailedAndUnresolvableNodes.values()) == {
        "gpuweave.io/gang-size is 5000; a gang has 1..4096 members"
    }
    extender.close()


def test_reservations_expire_and_the_next_filter_sees_the_devices_free(tmp_path: Path) -> None:
    clock = Clock()
    extender = _extender(tmp_path, clock, _nodes())
    for node in ("a1", "a2", "c1"):
        _busy(extender, node, 8)
    first, late_member = _gang(extender, "slow", size=2)
    planned = _bind(extender.service, first)
    other = ({"b1", "b2"} - {planned}).pop()
    plain = pod_object("plain", limits={RESOURCE_GPU: 8})
    assert not _filter(extender.service, plain).NodeNames  # the second member's node is held
    clock.now += TTL_S - 1
    assert not _filter(extender.service, plain).NodeNames
    clock.now += 1
    assert _filter(extender.service, plain).NodeNames == [other]
    assert _slot_devices(extender) == 0
    assert b'gpuweave_extender_gangs_total{outcome="expired"} 1.0' in extender.metrics.render()
    # the late member is planned again around the placed one: no room left beside it now
    _bind(extender.service, plain)
    late = _filter(extender.service, late_member)
    assert not late.NodeNames and "beside its 1 placed member(s)" in next(
        iter(late.FailedAndUnresolvableNodes.values())
    )
    extender.close()


def test_after_a_restart_the_open_places_are_held_again_around_the_bound_members(tmp_path: Path) -> None:
    clock = Clock()
    extender = _extender(tmp_path, clock, _nodes())
    _busy(extender, "a2", 4)
    first, pending, last = _gang(extender, "resume", size=3, gpus=4)
    node = _bind(extender.service, first)
    bound = [extender.cache.pod_object(uid=u) for u in ("uid-default-busy-a2", first["metadata"]["uid"])]
    held_before = {n: dict(s.holders) for n in NODES if (s := extender.cache.node(n)) is not None}
    extender.close()
    # the restarted extender knows the cluster (bound pods with their annotations, a pending
    # member), not the plan: it holds the two open places again at start, inside the bound block
    restarted = _extender(
        tmp_path, Clock(), [*_nodes(), *[dict(p) for p in bound if p is not None], pending, last]
    )
    for name, holders in held_before.items():
        kept = {d: u for d, u in holders.items() if not u.startswith(SLOT_PREFIX)}
        state = restarted.cache.node(name)
        assert (
            state is not None
            and {d: u for d, u in state.holders.items() if not u.startswith(SLOT_PREFIX)} == kept
        )
    assert _slot_devices(restarted) == 8
    assert restarted.gangs is not None and {s.node for s in restarted.gangs.book.reservations()[0].slots} <= {
        n for n in NODES if BLOCKS[n] == BLOCKS[node]
    }
    nodes = [_bind(restarted.service, m) for m in (pending, last)]
    assert {BLOCKS[n] for n in (node, *nodes)} == {BLOCKS[node]}  # the placed member's block
    assert all(len(holders) == 1 for holders in _holders(restarted).values())
    assignment = PodAssignment.from_annotation(
        (restarted.cache.pod_object(uid=first["metadata"]["uid"]) or {})["metadata"]["annotations"][
            ANNOTATION_ASSIGNMENT
        ]
    )
    assert assignment.node == node
    restarted.close()


def test_gang_ttl_zero_places_each_member_alone(tmp_path: Path) -> None:
    extender = _extender(tmp_path, Clock(), _nodes(), ttl_s=0)
    assert extender.gangs is None
    assert len(_filter(extender.service, _member("off", 0, size=2)).NodeNames or []) == 5
    extender.close()


def test_pod_group_sizes_follow_the_watch_and_a_bad_min_member_is_a_reason() -> None:
    sizes = PodGroupSizes()
    group = {"metadata": {"name": "pg", "namespace": "ml"}, "spec": {"minMember": 4}}
    member = _pod(labels={LABEL_POD_GROUP: "pg"})
    sizes.apply("ADDED", group)
    assert sizes.sizes == {"ml/pg": 4}
    assert gang_of(member, min_members=sizes.sizes, tier_labels=TIERS) == Gang(
        "ml/pod-group:pg", 4, "pod-group"
    )
    sizes.apply("MODIFIED", {**group, "spec": {"minMember": 99999}})
    with pytest.raises(BadGangError, match=r"PodGroup ml/pg minMember is 99999; a gang has 1\.\.4096"):
        gang_of(member, min_members=sizes.sizes, tier_labels=TIERS)
    sizes.apply("MODIFIED", {**group, "spec": {"minMember": "lots"}})
    with pytest.raises(BadGangError, match="PodGroup ml/pg minMember is 'lots'"):
        gang_of(member, min_members=sizes.sizes, tier_labels=TIERS)
    sizes.apply("MODIFIED", {**group, "spec": {"minMember": 0}})
    assert gang_of(member, min_members=sizes.sizes, tier_labels=TIERS) is None  # no gang asked for
    sizes.apply("MODIFIED", {**group, "spec": {}})
    assert sizes.sizes == {}
    sizes.apply("ADDED", group)
    sizes.apply("DELETED", group)
    assert sizes.sizes == {}


def test_a_member_keeps_its_slot_across_retries_and_prefers_an_offered_node() -> None:
    clock = Clock()
    book = GangBook(ttl_s=10, clock=clock)
    slots = [Slot(holder=f"h{i}", node=f"n{i}", devices=frozenset({f"d{i}"})) for i in range(3)]
    reservation = book.new(key="k", size=3, slots=slots, tier=0, domain="x")
    book.add(reservation)
    assert reservation.claim("m1", ["n2"]) is slots[2]
    assert reservation.claim("m1", ["n1", "n2"]) is slots[2]  # its own, while offered
    assert reservation.claim("m1", ["n1"]) is slots[1] and not slots[2].member  # pinned elsewhere now
    assert reservation.claim("m2", ["n9"]) is slots[0]
    assert reservation.claim("m2", ["n8"]) is slots[0]  # no free slot on an offered node: keeps its own
    assert reservation.claim("m3", []) is slots[2]
    assert reservation.claim("m4", ["n0"]) is None
    clock.now += 9.9
    assert book.expire() == [] and book.held_devices() == 3
    clock.now += 0.1
    assert book.expire() == [reservation] and book.held_devices() == 0


def test_a_waiting_gang_keeps_its_closest_domain_from_pods_that_fit_elsewhere(tmp_path: Path) -> None:
    """Eight nodes; block B has two free nodes of the three a 3-node gang needs: those two are kept
    for it. A 4-GPU pod that fits elsewhere goes elsewhere; once it fits only there it gets them."""
    blocks = {
        **{f"a{i}": "block-a" for i in range(3)},
        **{f"b{i}": "block-b" for i in range(3)},
        "c0": "c",
        "c1": "c",
    }
    clock = Clock()
    extender = _extender(tmp_path, clock, _nodes(blocks=blocks))
    names = list(blocks)
    for node in ("a0", "a1", "a2", "b0", "c0"):
        _bind(extender.service, pod_object(f"busy-{node}", limits={RESOURCE_GPU: 8}), [node])
    _bind(extender.service, pod_object("half-c1", limits={RESOURCE_GPU: 4}), ["c1"])
    assert not _filter(extender.service, _gang(extender, "wide", size=3)[0], names).NodeNames
    assert extender.gangs is not None and extender.gangs.book.kept_nodes() == {"b1", "b2"}
    assert _bind(extender.service, pod_object("small-0", limits={RESOURCE_GPU: 4}), names) == "c1"
    assert set(
        _filter(extender.service, pod_object("small-1", limits={RESOURCE_GPU: 4}), names).NodeNames or []
    ) == {"b1", "b2"}  # fits nowhere else now
    assert b"gpuweave_extender_gang_kept_nodes 2.0" in extender.metrics.render()
    clock.now += TTL_S
    extender.gangs.sweep()
    assert not extender.gangs.book.kept_nodes() and not extender.gangs.book.waiting()
    extender.close()


def test_waiting_gangs_keep_at_most_a_quarter_of_the_nodes(tmp_path: Path) -> None:
    extender = _extender(tmp_path, Clock(), _nodes())
    _busy(extender, "a2", 4)
    _filter(extender.service, _gang(extender, "big", size=5)[0])  # its closest domain, layer 2: 4 of 5 nodes
    assert extender.gangs is not None and not extender.gangs.book.kept_nodes()
    extender.close()


def _jobset_member(index: int, *, attempt: int, priority: int = 0) -> dict[str, Any]:
    pod = pod_object(f"js-{attempt}-{index}", namespace="ml", limits={RESOURCE_GPU: 8}, priority=priority)
    pod["metadata"]["labels"] = {
        LABEL_JOBSET_NAME: "js",
        LABEL_REPLICATED_JOB: "workers",
        LABEL_JOBSET_REPLICAS: "2",
        LABEL_JOBSET_RESTART: str(attempt),
    }
    return pod


def test_a_restarted_jobset_keeps_its_surviving_node_and_adds_a_spare_beside_it(tmp_path: Path) -> None:
    """Attempt 0 runs on b0 and b1; a GPU of b0 fails and JobSet re-creates both members (attempt
    1). Blocks A and B could each hold the gang now; the plan keeps b1 and takes b2 beside it."""
    blocks = {"a0": "block-a", "a1": "block-a", "b0": "block-b", "b1": "block-b", "b2": "block-b"}
    extender = _extender(tmp_path, Clock(), _nodes(blocks=blocks))
    names = list(blocks)
    _bind(extender.service, pod_object("busy-a1", limits={RESOURCE_GPU: 8}), ["a1"])
    first = [_jobset_member(i, attempt=0) for i in range(2)]
    _created(extender, *first)
    assert {_bind(extender.service, m, names) for m in first} == {"b0", "b1"}
    for pod in first:  # the fault's eviction of the gang
        _evict(extender, pod)
    extender.cache.delete_pod(pod_object("busy-a1")["metadata"]["uid"])
    broken = profile_inventory("dgx-h100", "b0")
    extender.cache.upsert_inventory(inventory_object(broken, unhealthy=(broken.gpus[3].uuid,)))
    second = [_jobset_member(i, attempt=1) for i in range(2)]
    _created(extender, *second)
    assert {_bind(extender.service, m, names) for m in second} == {"b1", "b2"}
    extender.close()


def _recovery_cluster(tmp_path: Path, *, spare_priority: int) -> tuple[Extender, list[str]]:
    """Attempt 0 of a priority-1000 JobSet ran on b0 and b1 and a GPU of b0 failed, which evicted
    it; JobSet created attempt 1's members. b2 holds a 1-GPU pod of ``spare_priority`` and block A
    is full of priority-0 pods."""
    blocks = {"a0": "block-a", "a1": "block-a", "b0": "block-b", "b1": "block-b", "b2": "block-b"}
    extender = _extender(tmp_path, Clock(), _nodes(blocks=blocks))
    names = list(blocks)
    first = [_jobset_member(i, attempt=0, priority=1000) for i in range(2)]
    _created(extender, *first)
    for node in ("b2", "a0", "a1"):  # keep b2 and block A from attempt 0's plan
        _bind(extender.service, pod_object(f"fill-{node}", limits={RESOURCE_GPU: 8}), [node])
    assert {_bind(extender.service, m, names) for m in first} == {"b0", "b1"}
    for pod in first:  # the fault's eviction of the gang
        _evict(extender, pod)
    extender.cache.delete_pod(pod_object("fill-b2")["metadata"]["uid"])
    spare = pod_object("low-b2", limits={RESOURCE_GPU: 1}, priority=spare_priority)
    _bind(extender.service, spare, ["b2"])
    broken = profile_inventory("dgx-h100", "b0")
    extender.cache.upsert_inventory(inventory_object(broken, unhealthy=(broken.gpus[3].uuid,)))
    _created(extender, *[_jobset_member(i, attempt=1, priority=1000) for i in range(2)])  # JobSet's restart
    return extender, names


def _preempt(
    service: ExtenderService, pod: dict[str, Any], victims: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """kube-scheduler's /preempt call with its dry run's victims (UIDs) per node; the answer's."""
    body = {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in victims.items()
        },
    }
    answer = service.preempt(parse(ExtenderPreemptionArgs, body), pod)
    return {n: [p.UID for p in meta.Pods or []] for n, meta in answer.NodeNameToMetaVictims.items()}


def test_a_recovering_gang_may_preempt_lower_priority_pods_only_in_its_domain(tmp_path: Path) -> None:
    """Attempt 1 fits nowhere now; once the priority-0 pod on b2 is gone it fits b1 + b2 (beside
    its surviving node). Only b2 is answered resolvable, the preempt verb narrows kube-scheduler's
    candidates to it, and after the eviction both members bind there."""
    extender, names = _recovery_cluster(tmp_path, spare_priority=0)
    second = [_jobset_member(i, attempt=1, priority=1000) for i in range(2)]
    result = _filter(extender.service, second[0], names)
    assert not result.NodeNames
    assert set(result.FailedNodes) == {"b2"}
    assert "is recovering and fits once pods of lower priority" in result.FailedNodes["b2"]
    assert set(result.FailedAndUnresolvableNodes) == {"a0", "a1", "b0", "b1"}
    low, fill_a0, fill_a1 = (_uid(extender, n) for n in ("low-b2", "fill-a0", "fill-a1"))
    proposed = {"b2": [low], "a0": [fill_a0], "a1": [fill_a1]}
    assert _preempt(extender.service, second[0], proposed) == {"b2": [low]}
    extender.cache.delete_pod(low)  # kube-scheduler evicted it
    assert {_bind(extender.service, m, names) for m in second} == {"b1", "b2"}
    extender.close()


def test_a_recovering_gang_preempts_on_nodes_only_kube_schedulers_preemption_offers(tmp_path: Path) -> None:
    """As the real kube-scheduler calls it: its own filters pass only b1 (b2 has 7 of 8 GPUs free,
    block A none), so the filter sees b1 alone and no room; its preemption then proposes b2, a0
    and a1 (their lower-priority pods removed), and the verb plans over the nodes offered before
    plus those: b2 beside b1."""
    extender, _ = _recovery_cluster(tmp_path, spare_priority=0)
    member = _jobset_member(0, attempt=1, priority=1000)
    result = _filter(extender.service, member, ["b1"])
    assert not result.NodeNames and not result.FailedNodes
    low, fill_a0, fill_a1 = (_uid(extender, n) for n in ("low-b2", "fill-a0", "fill-a1"))
    proposed = {"b2": [low], "a0": [fill_a0], "a1": [fill_a1]}
    assert _preempt(extender.service, member, proposed) == {"b2": [low]}
    extender.close()


def test_the_next_member_does_not_preempt_elsewhere_before_the_nomination_is_watched(tmp_path: Path) -> None:
    """Member 0 may preempt on b2. kube-scheduler nominates it there and, counting it, proposes
    only block A for member 1, whose preempt call can come before the watch shows the nomination
    (a real kube-scheduler did so 37 ms later). The verb remembers b2 for the gang, so member 1's
    plan still sees block B and member 1 preempts nothing in block A."""
    extender, _ = _recovery_cluster(tmp_path, spare_priority=0)
    members = [_jobset_member(i, attempt=1, priority=1000) for i in range(2)]
    low, fill_a0, fill_a1 = (_uid(extender, n) for n in ("low-b2", "fill-a0", "fill-a1"))
    _filter(extender.service, members[0], ["b1"])
    assert _preempt(extender.service, members[0], {"b2": [low], "a0": [fill_a0], "a1": [fill_a1]}) == {
        "b2": [low]
    }
    _filter(extender.service, members[1], ["b1"])
    assert _preempt(extender.service, members[1], {"a0": [fill_a0], "a1": [fill_a1]}) == {}
    extender.close()


def test_a_gang_preempts_only_lower_priority_pods_and_only_when_it_ran_before(tmp_path: Path) -> None:
    """With b2's pod at the gang's own priority, block B cannot be opened: the recovering gang may
    preempt only in block A (priority-0 pods); a gang that never ran may preempt nowhere."""
    extender, names = _recovery_cluster(tmp_path, spare_priority=1000)
    second = _jobset_member(0, attempt=1, priority=1000)
    result = _filter(extender.service, second, names)
    assert set(result.FailedNodes) == {"a0", "a1"}
    low, fill_a0 = _uid(extender, "low-b2"), _uid(extender, "fill-a0")
    assert _preempt(extender.service, second, {"b2": [low], "a0": [fill_a0]}) == {"a0": [fill_a0]}
    extender.close()
    extender, names = _recovery_cluster(tmp_path, spare_priority=0)
    fresh, other = (
        pod_object(f"new-{i}", namespace="ml", limits={RESOURCE_GPU: 8}, priority=1000) for i in range(2)
    )
    for pod in (fresh, other):
        pod["metadata"]["annotations"] = {ANNOTATION_GANG: "new", ANNOTATION_GANG_SIZE: "2"}
    _created(extender, fresh, other)
    result = _filter(extender.service, fresh, names)
    assert not result.FailedNodes and set(result.FailedAndUnresolvableNodes) == set(names)
    assert _preempt(extender.service, fresh, {"b2": [_uid(extender, "low-b2")]}) == {}
    extender.close()


def _uid(extender: Extender, name: str) -> str:
    return next(
        r.uid for n in extender.cache.states() for r in extender.cache.holdings_on(n) if r.name == name
    )


def test_a_gang_pinned_to_a_block_is_planned_only_there(tmp_path: Path) -> None:
    """Kueue TAS pins a gang with a node selector on a tier label; kube-scheduler then offers only
    that block's nodes, and the plan stays inside them even where block B would hold the gang."""
    extender = _extender(tmp_path, Clock(), _nodes())
    block_a = ["a1", "a2"]
    assert {_bind(extender.service, m, block_a) for m in _gang(extender, "pinned", size=2)} == {"a1", "a2"}
    _busy(extender, "b1", 1)
    result = _filter(extender.service, _gang(extender, "pinned-b", size=2)[0], ["a1", "a2", "b1"])
    assert not result.NodeNames  # b2 is not offered: no domain of the offered nodes holds it
    assert "the 3 node(s) offered do not hold them" in next(iter(result.FailedAndUnresolvableNodes.values()))
    extender.close()


def test_a_member_deleted_before_its_bind_leaves_its_slot_to_its_replacement(tmp_path: Path) -> None:
    """The Job controller creates the replacement while the old pod terminates: the gang never has
    fewer pods than it declares, so its reservation stays, and the replacement takes the slot the
    deleted member had claimed."""
    extender = _extender(tmp_path, Clock(), _nodes())
    members = _gang(extender, "swap", size=2)
    planned = [(_filter(extender.service, m).NodeNames or [""])[0] for m in members]
    assert {BLOCKS[n] for n in planned} == {"block-a"} and len(set(planned)) == 2
    replacement = pod_object(
        "swap-0",
        namespace="ml",
        uid="uid-swap-0-again",
        limits={RESOURCE_GPU: 8},
        annotations=members[0]["metadata"]["annotations"],
    )
    _created(extender, replacement)
    extender.cache.delete_pod(members[0]["metadata"]["uid"])
    assert _slot_devices(extender) == 16
    assert _filter(extender.service, replacement).NodeNames == [planned[0]]
    extender.close()
