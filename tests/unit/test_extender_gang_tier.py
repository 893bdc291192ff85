"""Gangs that require a network tier (``gpuweave.io/gang-tier``): every member inside one domain
of that tier (or of a closer one), else the gang waits; placed members pin the domain; a recovering
gang preempts only where a domain of that tier opens; a value that is not a tier label is refused.

The cluster: GB200 compute trays (4 GPUs each) in two NVLink cliques, A (``a0``..``a2``) and B
(``b0``..``b2``), all in one EKS layer-3 block, so a gang that does not require the clique may
span both cliques inside the block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.gangs import (
    ANNOTATION_GANG,
    ANNOTATION_GANG_SIZE,
    ANNOTATION_GANG_TIER,
    BadGangError,
    Gang,
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
from scheduler_ext.gangs.book import SLOT_PREFIX
from scheduler_ext.gangs.plan import GangMiss, GangPlan, plan_gang
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.serving.service import ExtenderService
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, parse
from tests.unit.test_extender_gangs import _created, _evict
from topology.network import DEFAULT_TIER_LABELS, LABEL_AWS_LAYER_3, LABEL_GPU_CLIQUE

PROFILE = "gb200-compute-tray"
CLUSTER_UUID = "6a2b1c3d-0000-4000-8000-00000000aaaa"
CLIQUES = {
    "a0": f"{CLUSTER_UUID}.1",
    "a1": f"{CLUSTER_UUID}.1",
    "a2": f"{CLUSTER_UUID}.1",
    "b0": f"{CLUSTER_UUID}.2",
    "b1": f"{CLUSTER_UUID}.2",
    "b2": f"{CLUSTER_UUID}.2",
}
NODES = list(CLIQUES)
TTL_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _extender(
    tmp_path: Path,
    clock: Clock | None = None,
    cliques: Mapping[str, str] = CLIQUES,
    *,
    settings: GangSettings | None = None,
) -> Extender:
    items: list[dict[str, Any]] = []
    for name, clique in cliques.items():
        labels = {LABEL_GPU_CLIQUE: clique, LABEL_AWS_LAYER_3: "block-1"}
        items += [
            node_object(name, gpus=4, labels=labels),
            inventory_object(profile_inventory(PROFILE, name)),
        ]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return build_snapshot_extender(path, gangs=settings or GangSettings(ttl_s=TTL_S, clock=clock or Clock()))


def _member(
    gang: str, index: int, *, size: int, tier: str | None = LABEL_GPU_CLIQUE, priority: int = 0, gpus: int = 4
) -> dict[str, Any]:
    annotations = {ANNOTATION_GANG: gang, ANNOTATION_GANG_SIZE: str(size)}
    if tier is not None:
        annotations[ANNOTATION_GANG_TIER] = tier
    return pod_object(
        f"{gang}-{index}",
        namespace="ml",
        limits={RESOURCE_GPU: gpus},
        annotations=annotations,
        priority=priority,
    )


def _filter(service: ExtenderService, pod: dict[str, Any], names: list[str] = NODES) -> Any:
    return service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": names}), pod)


def _bind(service: ExtenderService, pod: dict[str, Any], names: list[str] = NODES) -> str:
    """Filter, then bind to the first passing node (kube-scheduler's choice among one); the node."""
    result = _filter(service, pod, names)
    assert result.NodeNames, result.FailedAndUnresolvableNodes
    meta = pod["metadata"]
    node = str(result.NodeNames[0])
    args = ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=node
    )
    assert service.bind(args) == ""
    return node


def _busy(
    extender: Extender, node: str, *, gpus: int = 1, priority: int = 0, name: str = ""
) -> dict[str, Any]:
    """A plain pod holding ``gpus`` GPUs on ``node``."""
    pod = pod_object(name or f"busy-{node}", limits={RESOURCE_GPU: gpus}, priority=priority)
    _bind(extender.service, pod, [node])
    return pod


def _slot_devices(extender: Extender) -> int:
    return sum(
        len(r.devices) for n in NODES for r in extender.cache.holdings_on(n) if r.uid.startswith(SLOT_PREFIX)
    )


def _only_reason(result: Any) -> str:
    reasons = set(result.FailedAndUnresolvableNodes.values())
    assert len(reasons) == 1, reasons
    return str(reasons.pop())


# ---- identity ---------------------------------------------------------------------------------
def test_the_required_tier_is_part_of_the_gang_and_must_be_a_tier_label() -> None:
    pod = _member("job", 0, size=4, tier=f" {LABEL_GPU_CLIQUE} ")
    assert gang_of(pod, min_members={}, tier_labels=DEFAULT_TIER_LABELS) == Gang(
        "ml/gang:job", 4, "annotation", tier=LABEL_GPU_CLIQUE
    )
    assert gang_of(
        _member("job", 0, size=4, tier=None), min_members={}, tier_labels=DEFAULT_TIER_LABELS
    ) == Gang("ml/gang:job", 4, "annotation")
    ib_tiers = ("example.com/ib-leaf", "example.com/ib-spine")  # an extender configured without the clique
    with pytest.raises(
        BadGangError, match=r"gpuweave\.io/gang-tier is ' nvidia\.com/gpu\.clique '; give one"
    ):
        gang_of(pod, min_members={}, tier_labels=ib_tiers)
    assert gang_of(
        _member("job", 0, size=4, tier="example.com/ib-leaf"), min_members={}, tier_labels=ib_tiers
    )


@pytest.mark.parametrize("value", ["", "rack", "nvidia.com/gpu.product", "x" * 5000])
def test_a_tier_that_is_not_a_tier_label_rejects_every_node_with_the_reason(
    tmp_path: Path, value: str
) -> None:
    extender = _extender(tmp_path)
    result = _filter(extender.service, _member("bad", 0, size=2, tier=value))
    assert not result.NodeNames and set(result.FailedAndUnresolvableNodes) == set(NODES)
    reason = _only_reason(result)
    assert reason.startswith("gpuweave.io/gang-tier is ")
    assert f"give one of the extender's network tier labels ({', '.join(DEFAULT_TIER_LABELS)})" in reason
    assert len(reason) < 500  # a huge value is not repeated into every node's reason
    assert _slot_devices(extender) == 0
    extender.close()


# ---- planning -----------------------------------------------------------------------------------
def test_a_gang_that_requires_the_clique_goes_inside_the_one_clique_that_holds_it(tmp_path: Path) -> None:
    extender = _extender(tmp_path)
    _busy(extender, "a0")  # clique A: two whole trays free, B: three
    members = [_member("train", i, size=3) for i in range(3)]
    _created(extender, *members)
    assert {_bind(extender.service, m) for m in members} == {"b0", "b1", "b2"}
    extender.close()


@pytest.mark.parametrize(
    ("tier", "placed"),
    [
        (LABEL_GPU_CLIQUE, None),  # no clique holds 3: it waits
        (LABEL_AWS_LAYER_3, 3),  # the block holds it across both cliques
        (None, 3),  # no requirement: the tightest domain that holds it, the block
    ],
)
def test_a_gang_waits_when_only_a_wider_domain_than_its_required_tier_holds_it(
    tmp_path: Path, tier: str | None, placed: int | None
) -> None:
    extender = _extender(tmp_path)
    _busy(extender, "a0")
    _busy(extender, "b0")  # two whole trays free in each clique, four in the block
    members = [_member("big", i, size=3, tier=tier) for i in range(3)]
    _created(extender, *members)
    result = _filter(extender.service, members[0])
    if placed is None:
        assert not result.NodeNames
        reason = _only_reason(result)
        assert (
            "gang ml/gang:big needs 3 more member(s) placed together inside one nvidia.com/gpu.clique "
            "domain (its gpuweave.io/gang-tier), all or none" in reason
        )
        assert f"the most any network domain holds is 2 (nvidia.com/gpu.clique={CLUSTER_UUID}." in reason
        assert "no device is held for it" in reason
        assert _slot_devices(extender) == 0
    else:
        assert result.NodeNames and len(result.NodeNames) == 1
        assert extender.gangs is not None
        (reservation,) = extender.gangs.book.reservations()
        assert reservation.tier == DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3)
        assert len({CLIQUES[s.node] for s in reservation.slots}) == 2  # across the cliques
        assert _slot_devices(extender) == 4 * placed
    extender.close()


def test_the_planner_stops_at_the_required_tier(tmp_path: Path) -> None:
    """plan_gang itself: over the same states, a clique requirement misses where no requirement
    plans across the cliques at the block tier."""
    extender = _extender(tmp_path)
    _busy(extender, "a0")
    _busy(extender, "b0")
    member = _member("p", 0, size=3)
    request = extender.service.parsed.of(member).checked()

    def plan(required: str) -> GangPlan | GangMiss:
        return plan_gang(
            key="ml/gang:p",
            needed=3,
            candidates=NODES,
            states=extender.cache.states(),
            labels=extender.cache.node_labels(),
            decide=lambda state: extender.core.decide(request, state),
            required_tier=required,
        )

    free = plan("")
    assert isinstance(free, GangPlan) and free.tier == 1 and free.domain == "block-1"
    missed = plan(LABEL_GPU_CLIQUE)
    assert isinstance(missed, GangMiss) and "inside one nvidia.com/gpu.clique domain" in missed.reason
    assert isinstance(plan(LABEL_AWS_LAYER_3), GangPlan)
    extender.close()


def test_placed_members_pin_the_required_domain(tmp_path: Path) -> None:
    """The first member binds in a clique and the reservation expires. With a tray of that clique
    taken meanwhile, the clique holds only one of the two members left: the gang waits beside its
    placed member (the other clique, free, would hold both, and the block holds them all), and is
    placed there once the tray frees."""
    clock = Clock()
    extender = _extender(tmp_path, clock)
    members = [_member("pin", i, size=3) for i in range(3)]
    _created(extender, *members)
    first = _bind(extender.service, members[0])
    own = sorted(n for n, c in CLIQUES.items() if c == CLIQUES[first] and n != first)
    clock.now += TTL_S + 1
    assert extender.gangs is not None
    extender.gangs.sweep()
    assert _slot_devices(extender) == 0
    blocker = _busy(extender, own[0])
    result = _filter(extender.service, members[1])
    assert not result.NodeNames
    reason = _only_reason(result)
    assert "needs 2 more member(s) placed together inside one nvidia.com/gpu.clique domain" in reason
    assert "beside its 1 placed member(s)" in reason
    assert f"the most any network domain holds is 1 (nvidia.com/gpu.clique={CLIQUES[first]})" in reason
    extender.cache.delete_pod(blocker["metadata"]["uid"])
    assert {_bind(extender.service, m) for m in members[1:]} == set(own)
    extender.close()


# ---- recovery ---------------------------------------------------------------------------------
def _preempt(service: ExtenderService, pod: dict[str, Any], victims: Mapping[str, list[str]]) -> set[str]:
    body = {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in victims.items()
        },
    }
    answer = service.preempt(parse(ExtenderPreemptionArgs, body), pod)
    return set(answer.NodeNameToMetaVictims)


@pytest.mark.parametrize("tier", [LABEL_GPU_CLIQUE, None])
def test_a_recovering_gang_preempts_only_where_a_domain_of_its_required_tier_opens(
    tmp_path: Path, tier: str | None
) -> None:
    """Two cliques of two trays. A priority-1000 gang of two ran on clique B; then a GPU of b0
    fails and both members are re-created, while a0 and b1 hold priority-0 pods and a1 a
    priority-1000 one. Evicting the priority-0 pods opens a0 and b1: one tray in each clique, which
    the block holds together. Required to stay in one clique, the gang may not preempt at all;
    without the requirement it may, on a0 and b1."""
    cliques = {n: c for n, c in CLIQUES.items() if n[1] in "01"}
    names = list(cliques)
    extender = _extender(tmp_path, cliques=cliques)
    fillers = [_busy(extender, n, gpus=4, name=f"fill-{n}") for n in ("a0", "a1")]  # clique A: not now
    first = [_member("rec", i, size=2, tier=tier, priority=1000) for i in range(2)]
    _created(extender, *first)
    assert {_bind(extender.service, m, names) for m in first} == {"b0", "b1"}
    for pod in first:  # the fault's eviction of the gang
        _evict(extender, pod)
    for pod in fillers:
        extender.cache.delete_pod(pod["metadata"]["uid"])
    broken = profile_inventory(PROFILE, "b0")
    extender.cache.upsert_inventory(inventory_object(broken, unhealthy=(broken.gpus[0].uuid,)))
    victims = {n: [_busy(extender, n)["metadata"]["uid"]] for n in ("a0", "b1")}  # priority 0
    _busy(extender, "a1", priority=1000)
    again, _ = recreated = [
        pod_object(
            f"rec-{i}-again",
            namespace="ml",
            limits={RESOURCE_GPU: 4},
            annotations=first[0]["metadata"]["annotations"],
            priority=1000,
        )
        for i in range(2)
    ]
    _created(extender, *recreated)
    result = _filter(extender.service, again, names)
    assert not result.NodeNames
    if tier is None:
        assert set(result.FailedNodes) == {"a0", "b1"}
        assert _preempt(extender.service, again, victims) == {"a0", "b1"}
    else:
        assert not result.FailedNodes and set(result.FailedAndUnresolvableNodes) == set(names)
        assert "inside one nvidia.com/gpu.clique domain" in _only_reason(result)
        assert _preempt(extender.service, again, victims) == set()
    extender.close()
