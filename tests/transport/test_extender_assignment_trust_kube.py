"""The extender's trust in pods' gpuweave.io/assignment, against a real kube-apiserver.

Anyone who may create a pod can write the annotation. Through the real ``kubernetes`` client and
watch: a Pending pod's forged annotation holds nothing, a bound pod holds at most what it
requests, the later of two bound pods naming one GPU is counted as a conflict (metric and an Event
on the pod in the API), and a bind whose PodUID belongs to another pod than PodName binds nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import pod_object, profile_inventory
from scheduler_ext.app import Extender
from scheduler_ext.kube import build_kube_extender
from scheduler_ext.serving.events import CONFLICT_REASON
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support.control_plane import REPO, ControlPlane, create_gpu_node
from tests.support.raw_pods import api_client as _api
from tests.support.raw_pods import create_pod, read_pod
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CRD = REPO / "manifests" / "crds" / "gpunodeinventories.yaml"
NODES = ("trust-a", "trust-b")
PROFILE = "p5.48xlarge"  # 8 GPUs per node


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        plane.apply([yaml.safe_load(CRD.read_text())])
        _seed(str(plane.admin_kubeconfig))
        yield str(plane.admin_kubeconfig)
    finally:
        plane.stop()


def _seed(kubeconfig: str) -> None:
    with _api(kubeconfig) as api:
        client.CoreV1Api(api).create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        for name in NODES:
            create_gpu_node(api, name, PROFILE)


@pytest.fixture
def extender(kubeconfig: str) -> Iterator[Extender]:
    built = build_kube_extender(kubeconfig=kubeconfig)
    try:
        wait_until("the extender's first lists", built.cache.synced.is_set)
        wait_until(
            "both nodes' inventories in the cache",
            lambda: all((s := built.cache.node(n)) is not None and s.layout is not None for n in NODES),
        )
        yield built
    finally:
        built.close()
        with _api(kubeconfig) as api:
            client.CoreV1Api(api).delete_collection_namespaced_pod("default", grace_period_seconds=0)


def _gpus(node: str) -> list[str]:
    return [g.uuid for g in profile_inventory(PROFILE, node).gpus]


def _annotation(node: str, devices: list[str]) -> dict[str, str]:
    chosen = ContainerAssignment(devices={RESOURCE_GPU: devices})
    return {ANNOTATION_ASSIGNMENT: PodAssignment(node=node, containers={"main": chosen}).to_annotation()}


def _create(
    kubeconfig: str, name: str, *, node_selector: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    body = pod_object(name, **kwargs)
    if node_selector:
        body["spec"]["nodeSelector"] = node_selector
        body["spec"]["schedulerName"] = "default-scheduler"
    return create_pod(kubeconfig, body)


def _seen(extender: Extender, pod: dict[str, Any]) -> None:
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    wait_until(
        f"the extender's pod watch to show pod {name}",
        lambda: extender.cache.pod_object(uid=uid) is not None or extender.cache.holding(uid) is not None,
    )


def _counted(extender: Extender, node: str, pod: dict[str, Any]) -> None:
    """Wait until the node's state counts the pod as a holder.

    The cache publishes a pod's holding before it rebuilds the node's state from it (both under
    the node's lock; reads take no lock), so a test that reads the state waits for the state.
    """
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]

    def counted() -> bool:
        state = extender.cache.node(node)
        return extender.cache.holding(uid) is not None and state is not None and uid in state.holders.values()

    wait_until(f"node {node}'s state to count pod {name}", counted)


def _passing(extender: Extender, gpus: int) -> list[str]:
    probe = pod_object(f"probe-{gpus}", limits={RESOURCE_GPU: gpus})
    args = ExtenderArgs.model_validate({"Pod": probe, "NodeNames": list(NODES)})
    return list(extender.service.filter(args, probe).NodeNames or [])


def _conflicts(extender: Extender) -> float:
    text = extender.metrics.render().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gpuweave_extender_assignment_conflicts_total"
    )


def test_pending_pods_with_forged_assignments_reserve_nothing(kubeconfig: str, extender: Extender) -> None:
    """No GPU request, a nodeSelector no node matches, annotations naming all 8 GPUs of a node."""
    for node in NODES:
        forged = _annotation(node, _gpus(node))
        squatter = _create(
            kubeconfig, f"squatter-{node}", node_selector={"nowhere": "true"}, annotations=forged
        )
        _seen(extender, squatter)
    assert _passing(extender, 1) == list(NODES)
    assert _passing(extender, 8) == list(NODES)


def test_a_bound_pod_holds_at_most_its_request(kubeconfig: str, extender: Extender) -> None:
    gpus = _gpus("trust-a")
    greedy = _create(
        kubeconfig,
        "greedy",
        limits={RESOURCE_GPU: 1},
        node="trust-a",
        annotations=_annotation("trust-a", gpus),
    )
    uid = greedy["metadata"]["uid"]
    _counted(extender, "trust-a", greedy)
    holding = extender.cache.holding(uid)
    assert holding is not None and holding.record.devices == {gpus[0]}
    assert _passing(extender, 7) == list(NODES)
    assert _passing(extender, 8) == ["trust-b"]


def test_the_later_of_two_bound_pods_on_one_gpu_is_a_conflict(kubeconfig: str, extender: Extender) -> None:
    gpus = _gpus("trust-b")
    first = _create(
        kubeconfig,
        "first",
        limits={RESOURCE_GPU: 2},
        node="trust-b",
        annotations=_annotation("trust-b", gpus[:2]),
    )
    _counted(extender, "trust-b", first)
    later = _create(
        kubeconfig,
        "later",
        limits={RESOURCE_GPU: 2},
        node="trust-b",
        annotations=_annotation("trust-b", gpus[1:3]),
    )
    _counted(extender, "trust-b", later)
    holders = extender.cache.node("trust-b").holders  # type: ignore[union-attr]
    assert holders[gpus[1]] == first["metadata"]["uid"]
    assert holders[gpus[2]] == later["metadata"]["uid"]
    assert _conflicts(extender) == 1
    assert _passing(extender, 5) == list(NODES)  # 3 of 8 held: the shared GPU counts once

    def conflict_events() -> list[Any]:
        with _api(kubeconfig) as api:
            listed = client.CoreV1Api(api).list_namespaced_event(
                "default", field_selector="involvedObject.name=later"
            )
        return [e for e in listed.items if e.reason == CONFLICT_REASON]

    wait_until(f"a {CONFLICT_REASON} Event on pod default/later in the API", conflict_events)
    (event,) = conflict_events()
    assert event.type == "Warning" and gpus[1] in event.message
    assert event.involved_object.uid == later["metadata"]["uid"]


def test_bind_refuses_one_pods_uid_with_another_pods_name(kubeconfig: str, extender: Extender) -> None:
    victim = _create(kubeconfig, "victim", limits={RESOURCE_GPU: 1})
    other = _create(kubeconfig, "other", limits={RESOURCE_GPU: 1})
    for pod in (victim, other):
        _seen(extender, pod)
    args = ExtenderBindingArgs(
        PodName="other", PodNamespace="default", PodUID=victim["metadata"]["uid"], Node="trust-a"
    )
    error = extender.service.bind(args)
    assert "is pod default/victim, not default/other" in error
    for name in ("victim", "other"):
        stored = read_pod(kubeconfig, name)
        assert not stored["spec"].get("nodeName")
        assert ANNOTATION_ASSIGNMENT not in (stored["metadata"].get("annotations") or {})
    assert extender.cache.holding(victim["metadata"]["uid"]) is None
