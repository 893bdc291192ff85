"""What a pod's gpuweave.io/assignment may count: anyone who may create a pod can write the
annotation, so the cache counts its devices only once the pod is bound to the node it names, only
up to what each container requests, and of two pods naming one device only the first; a bind
whose pod UID and name disagree binds nothing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    mig_resource_name,
)
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.serving.events import CONFLICT_REASON, PodEvent
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, parse
from tests.support.waiting import wait_until

NODES = ("n0", "n1")


def _gpus(node: str) -> list[str]:
    return [g.uuid for g in profile_inventory("dgx-h100", node).gpus]


def _forged(node: str, devices: list[str], *, container: str = "main") -> dict[str, str]:
    assignment = PodAssignment(
        node=node, containers={container: ContainerAssignment(devices={RESOURCE_GPU: devices})}
    )
    return {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}


@pytest.fixture
def extender() -> Iterator[tuple[Extender, list[PodEvent]]]:
    events: list[PodEvent] = []
    cache, core = build_core()
    objects = [
        o for n in NODES for o in (node_object(n, gpus=8), inventory_object(profile_inventory("dgx-h100", n)))
    ]
    apply_objects(iter(objects), cache)
    built = assemble(cache, core, SnapshotBinder(cache), event_sink=events.append)
    yield built, events
    built.close()


def _annotated(node: str, devices: dict[str, list[str]]) -> dict[str, str]:
    assignment = PodAssignment(node=node, containers={"main": ContainerAssignment(devices=devices)})
    return {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}


def _fits(extender: Extender, gpus: int) -> list[str]:
    pod = pod_object(f"probe-{gpus}", limits={RESOURCE_GPU: gpus})
    result = extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": list(NODES)}), pod)
    return list(result.NodeNames or [])


def _conflicts(extender: Extender) -> float:
    text = extender.metrics.render().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gpuweave_extender_assignment_conflicts_total"
    )


def test_a_pending_pods_forged_assignment_reserves_nothing(extender: tuple[Extender, list[PodEvent]]) -> None:
    """Two Pending pods without a GPU request whose annotations name every GPU of both nodes."""
    built, _ = extender
    for node in NODES:
        built.cache.upsert_pod(pod_object(f"squatter-{node}", annotations=_forged(node, _gpus(node))))
    assert _fits(built, 8) == list(NODES)
    assert all(not built.cache.node(n).holders for n in NODES)  # type: ignore[union-attr]


def test_a_bound_pod_counts_at_most_what_it_requests(extender: tuple[Extender, list[PodEvent]]) -> None:
    built, _ = extender
    gpus = _gpus("n0")
    greedy = pod_object("greedy", limits={RESOURCE_GPU: 1}, node="n0", annotations=_forged("n0", gpus))
    built.cache.upsert_pod(greedy)
    holding = built.cache.holding(greedy["metadata"]["uid"])
    assert holding is not None and holding.record.devices == {gpus[0]}  # the first ID it names
    plain = pod_object("plain", node="n0", annotations=_forged("n0", gpus[1:]))  # requests no GPU
    built.cache.upsert_pod(plain)
    assert built.cache.holding(plain["metadata"]["uid"]) is None
    elsewhere = pod_object("elsewhere", limits={RESOURCE_GPU: 8}, node="n1", annotations=_forged("n0", gpus))
    built.cache.upsert_pod(elsewhere)  # bound to n1, the annotation names n0: nothing counts
    assert built.cache.holding(elsewhere["metadata"]["uid"]) is None
    assert _fits(built, 7) == list(NODES)


def test_a_second_pod_on_a_held_device_is_a_conflict_and_not_counted(
    extender: tuple[Extender, list[PodEvent]],
) -> None:
    built, events = extender
    gpus = _gpus("n0")
    first = pod_object("first", limits={RESOURCE_GPU: 2}, node="n0", annotations=_forged("n0", gpus[:2]))
    later = pod_object("later", limits={RESOURCE_GPU: 2}, node="n0", annotations=_forged("n0", gpus[1:3]))
    built.cache.upsert_pod(first)
    built.cache.upsert_pod(later)
    holders = built.cache.node("n0").holders  # type: ignore[union-attr]
    assert holders[gpus[1]] == first["metadata"]["uid"] and holders[gpus[2]] == later["metadata"]["uid"]
    built.cache.upsert_pod(first)  # the same pods seen again: reported once, same holders
    built.cache.upsert_pod(later)
    assert built.cache.node("n0").holders[gpus[1]] == first["metadata"]["uid"]  # type: ignore[union-attr]
    assert _conflicts(built) == 1
    wait_until(
        "the conflict Event written", lambda: any(e.reason == CONFLICT_REASON for e in events), timeout=10
    )
    (event,) = [e for e in events if e.reason == CONFLICT_REASON]
    assert (event.name, event.type) == ("later", "Warning") and gpus[1] in event.message


def test_an_id_of_another_kind_than_its_resource_counts_nothing(
    extender: tuple[Extender, list[PodEvent]],
) -> None:
    """A pod holds devices of the kinds it requests only: a GPU UUID listed under a share, EFA or
    MIG resource, or a share unit of another kind, is not a device of that resource."""
    built, _ = extender
    gpus = _gpus("n0")
    disguised = {
        "as-compute": ({RESOURCE_GPU_COMPUTE: 1}, {RESOURCE_GPU_COMPUTE: [gpus[0]]}),
        "as-efa": ({RESOURCE_EFA: 1}, {RESOURCE_EFA: [gpus[1]]}),
        "as-mig": ({mig_resource_name("1g.10gb"): 1}, {mig_resource_name("1g.10gb"): [gpus[2]]}),
        "replica-as-compute": ({RESOURCE_GPU_COMPUTE: 1}, {RESOURCE_GPU_COMPUTE: [f"{gpus[3]}::replica-0"]}),
        "mig-as-gpu": ({RESOURCE_GPU: 1}, {RESOURCE_GPU: [f"MIG-{gpus[4][4:]}"]}),
    }
    for name, (limits, devices) in disguised.items():
        pod = pod_object(name, limits=limits, node="n0", annotations=_annotated("n0", devices))
        built.cache.upsert_pod(pod)
        assert built.cache.holding(pod["metadata"]["uid"]) is None, name
    assert _fits(built, 8) == list(NODES)
    units = [f"{gpus[5]}::compute-0", f"{gpus[5]}::compute-1"]
    share = pod_object(
        "share",
        limits={RESOURCE_GPU_COMPUTE: 2},
        node="n0",
        annotations=_annotated("n0", {RESOURCE_GPU_COMPUTE: units}),
    )
    built.cache.upsert_pod(share)
    holding = built.cache.holding(share["metadata"]["uid"])
    assert holding is not None and holding.record.devices == set(units)


def _bind(built: Extender, pod: Mapping[str, Any], *, name: str) -> str:
    args = ExtenderBindingArgs(PodName=name, PodNamespace="default", PodUID=pod["metadata"]["uid"], Node="n0")
    return built.service.bind(args)


def test_bind_refuses_a_uid_of_one_pod_with_the_name_of_another(
    extender: tuple[Extender, list[PodEvent]],
) -> None:
    built, _ = extender
    victim = pod_object("victim", limits={RESOURCE_GPU: 1})
    other = pod_object("other", limits={RESOURCE_GPU: 1})
    for pod in (victim, other):
        built.cache.remember_pod(pod)
    error = _bind(built, victim, name="other")
    assert "is pod default/victim, not default/other" in error
    assert built.cache.holding(victim["metadata"]["uid"]) is None and not built.cache.node("n0").holders  # type: ignore[union-attr]
    assert _bind(built, victim, name="victim") == ""
