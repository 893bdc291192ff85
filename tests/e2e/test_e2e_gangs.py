"""Gangs through the real kube-scheduler: all or nothing, in the one network block that holds them.

Four Nodes of 8 H100 GPUs each (Node objects with their status and GpuNodeInventory objects, no
kubelet: bound pods stay Pending, which is all scheduling needs), in two network blocks
(``topology.k8s.aws/network-node-layer-3``): block A holds ``gang-a1`` (free, but half its CPUs
taken by a CPU-only pod, so kube-scheduler's MostAllocated prefers it for a lone 8-GPU pod) and
``gang-a2`` (4 of 8 GPUs taken); block B holds ``gang-b1`` and ``gang-b2``, both free. Only
block B can hold a gang of two 8-GPU pods.

A second kube-scheduler (profile ``gpuweave-gang-scheduler``, manifests/scheduler/'s
configuration otherwise) calls its own ``gpuweave extender --gang-ttl 15``, so these tests run
beside the session's scheduler without sharing pods; the Nodes carry a taint only these pods
tolerate.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from gpuweave.simulate.cluster_objects import profile_inventory
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.gpu_nodes import create_gpu_node, held_devices
from tests.e2e.pods import GPU, scheduling_failure
from tests.support.pods import pod_body
from tests.support.waiting import wait_until
from topology.network import LABEL_AWS_LAYER_3

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-gang"
SCHEDULER = "gpuweave-gang-scheduler"
TTL_S = 15
BLOCKS = {
    "gang-a1": "e2e-block-a",
    "gang-a2": "e2e-block-a",
    "gang-b1": "e2e-block-b",
    "gang-b2": "e2e-block-b",
}
NODE_LABEL = "e2e.gpuweave.io/gang-node"
TAINT = {"key": "e2e.gpuweave.io/gang-tests", "value": "only", "effect": "NoSchedule"}
FILLERS = ("filler-a1-cpu", "filler-a2-gpus")


class GangCluster:
    """The gang scheduler and its extender; ``restart_extender`` replaces the extender process."""

    def __init__(self, plane: ControlPlane, kubeconfig: Path) -> None:
        self.plane = plane
        self._kubeconfig = kubeconfig
        self.starts = 0
        self.extender, self.url = self._start_extender(port=None)
        config = render_scheduler_config(
            plane, extender_url=self.url, kubeconfig=kubeconfig, scheduler_name=SCHEDULER
        )
        self.scheduler = start_scheduler(plane, config_path=config, name="gang-kube-scheduler")

    def _start_extender(self, *, port: int | None) -> tuple[Process, str]:
        self.starts += 1
        return start_extender(
            self.plane,
            kubeconfig=self._kubeconfig,
            port=port,
            extra_args=("--gang-ttl", str(TTL_S)),
            name=f"gang-extender-{self.starts}",
        )

    def restart_extender(self) -> None:
        port = int(self.url.rsplit(":", 1)[1])
        self.extender.stop()
        self.extender, self.url = self._start_extender(port=port)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()


def _create_node(plane: ControlPlane, name: str) -> PodAssignment:
    """A Node with 8 GPUs in its block, and its GpuNodeInventory; returns its 8 GPUs as one set."""
    labels = {"kubernetes.io/hostname": name, NODE_LABEL: "true", LABEL_AWS_LAYER_3: BLOCKS[name]}
    inventory = profile_inventory("dgx-h100", name)
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"}
    create_gpu_node(
        plane, inventory, labels=labels, taint=TAINT, resources=resources, message="e2e gang node"
    )
    gpus = [g.uuid for g in inventory.gpus]
    return PodAssignment(node=name, containers={"main": ContainerAssignment(devices={GPU: gpus})})


def _admitted_with(plane: ControlPlane, priority_class: str) -> bool:
    """Whether a pod naming ``priority_class`` passes admission now (a dry run, nothing created)."""
    probe = _pod("priority-probe", gpus=1)
    probe["spec"]["priorityClassName"] = priority_class
    try:
        plane.core.create_namespaced_pod(NAMESPACE, probe, dry_run="All")
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True


def _create_high_priority(plane: ControlPlane, scheduling: client.SchedulingV1Api) -> None:
    """The PriorityClass ``HIGH``, once the API server's Priority admission knows it: that plugin
    reads classes from its informer, so a pod created right after the class can be refused with
    "no PriorityClass with name ... was found" (403)."""
    scheduling.create_priority_class(
        {"metadata": {"name": HIGH}, "value": 1000, "preemptionPolicy": "PreemptLowerPriority"}
    )
    wait_until(f"admission to know PriorityClass {HIGH}", lambda: _admitted_with(plane, HIGH), timeout=30)


def _pod(
    name: str, *, gpus: int = 8, gang: str | None = None, size: int = 2, only_on: str | None = None
) -> dict[str, Any]:
    annotations = {ANNOTATION_GANG: gang, ANNOTATION_GANG_SIZE: str(size)} if gang else {}
    selector = {NODE_LABEL: "true", **({"kubernetes.io/hostname": only_on} if only_on else {})}
    return pod_body(
        name,
        scheduler=SCHEDULER,
        grace_s=0,
        tolerations=[TAINT],
        node_selector=selector,
        limits={GPU: gpus},
        annotations=annotations,
        container="main",
        image="e2e/none",
    )


def _bound_filler(
    name: str, node: str, *, limits: dict[str, str], annotations: dict[str, str]
) -> dict[str, Any]:
    pod = _pod(name)
    pod["metadata"]["annotations"] = annotations
    pod["spec"]["nodeName"] = node
    pod["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": limits}
    return pod


@pytest.fixture(scope="module")
def gangs(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[GangCluster]:
    plane.ensure_namespace(NAMESPACE)
    whole = {name: _create_node(plane, name) for name in BLOCKS}
    half = PodAssignment(
        node="gang-a2",
        containers={
            "main": ContainerAssignment(devices={GPU: sorted(whole["gang-a2"].all_device_ids())[:4]})
        },
    )
    plane.core.create_namespaced_pod(
        NAMESPACE, _bound_filler(FILLERS[0], "gang-a1", limits={"cpu": "48"}, annotations={})
    )
    plane.core.create_namespaced_pod(
        NAMESPACE,
        _bound_filler(
            FILLERS[1],
            "gang-a2",
            limits={GPU: "4"},
            annotations={ANNOTATION_ASSIGNMENT: half.to_annotation()},
        ),
    )
    cluster = GangCluster(plane, scheduler_kubeconfig)
    try:
        yield cluster
    finally:
        cluster.stop()
        _delete_pods(plane, keep=())
        custom = client.CustomObjectsApi(plane.api)
        for name in BLOCKS:
            plane.core.delete_node(name)
            custom.delete_cluster_custom_object("gpuweave.io", "v1alpha1", "gpunodeinventories", name)


def _delete_pods(plane: ControlPlane, *, keep: tuple[str, ...] = FILLERS) -> None:
    names = [
        p.metadata.name
        for p in plane.core.list_namespaced_pod(NAMESPACE).items
        if p.metadata.name not in keep
    ]
    for name in names:
        try:
            plane.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(
        "gang test pods to be deleted",
        lambda: not {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items} & set(names),
    )


def _evict_pods(plane: ControlPlane, names: list[str]) -> None:
    """Evict the pods through the Eviction API, as the node agent does for a failed device and as
    kube-scheduler's preemption marks its victims: the API server sets the ``DisruptionTarget``
    condition, then deletes each pod (grace period 0: no kubelet here to wait for)."""
    for name in names:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
            delete_options=client.V1DeleteOptions(grace_period_seconds=0),
        )
        plane.core.create_namespaced_pod_eviction(name, NAMESPACE, body)
    wait_for(
        "evicted pods to be deleted",
        lambda: not {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items} & set(names),
    )


def _bound_node(plane: ControlPlane, name: str) -> str | None:
    return plane.core.read_namespaced_pod(name, NAMESPACE).spec.node_name or None


def _wait_bound(plane: ControlPlane, name: str, *, timeout: float = 60) -> str:
    return wait_for(f"pod {NAMESPACE}/{name} to be bound", lambda: _bound_node(plane, name), timeout=timeout)


def _create_together(plane: ControlPlane, pods: list[dict[str, Any]]) -> None:
    """Create ``pods`` held by a scheduling gate, then lift the gates: kube-scheduler sees none of
    them before all exist, so the first filter already counts every member."""
    for pod in pods:
        pod["spec"]["schedulingGates"] = [{"name": "e2e.gpuweave.io/together"}]
        plane.core.create_namespaced_pod(NAMESPACE, pod)
    for pod in pods:
        lift = [{"op": "remove", "path": "/spec/schedulingGates"}]  # a JSON patch: the list goes whole
        plane.core.patch_namespaced_pod(pod["metadata"]["name"], NAMESPACE, lift)


def _wait_unschedulable(plane: ControlPlane, name: str) -> str:
    return wait_for(f"{name} declared unschedulable", lambda: scheduling_failure(plane, NAMESPACE, name))


def _held_devices(plane: ControlPlane) -> dict[str, list[str]]:
    return held_devices(plane, NAMESPACE)


def test_gang_lands_all_or_nothing_in_the_one_block_that_holds_it(
    plane: ControlPlane, gangs: GangCluster
) -> None:
    try:
        for index in range(2):
            plane.core.create_namespaced_pod(NAMESPACE, _pod(f"train-{index}", gang="train"))
        nodes = {_wait_bound(plane, f"train-{index}") for index in range(2)}
        print(f"gang train bound to {sorted(nodes)}")
        assert nodes == {"gang-b1", "gang-b2"}
        held = _held_devices(plane)
        assert all(len(pods) == 1 for pods in held.values())
        assert sum(1 for pods in held.values() if pods[0].startswith("train-")) == 16
        assert gangs.metric('gpuweave_extender_gangs_total{outcome="completed"}') == 1
        assert gangs.metric("gpuweave_extender_gang_reserved_devices") == 0
    finally:
        _delete_pods(plane)


def test_gang_that_cannot_fit_leaves_every_member_pending_and_holds_nothing(
    plane: ControlPlane, gangs: GangCluster
) -> None:
    """With block B taken, no domain holds two 8-GPU members (gang-a2 has 4 free): none is bound."""
    try:
        for node in ("gang-b1", "gang-b2"):
            plane.core.create_namespaced_pod(NAMESPACE, _pod(f"holder-{node}", only_on=node))
            assert _wait_bound(plane, f"holder-{node}") == node
        started = time.monotonic()
        _create_together(plane, [_pod(f"big-{index}", gang="big") for index in range(2)])
        for index in range(2):
            message = _wait_unschedulable(plane, f"big-{index}")
            print(f"big-{index}: {message}")
            assert "gang e2e-gang/gang:big needs 2 more member(s)" in message
            assert "no device is held for it" in message
        time.sleep(max(0.0, TTL_S + 1 - (time.monotonic() - started)))
        assert all(_bound_node(plane, f"big-{index}") is None for index in range(2))
        assert gangs.metric("gpuweave_extender_gang_reserved_devices") == 0
        assert gangs.metric("gpuweave_extender_gang_reservations") == 0
        # nothing is held for the gang: a lone 8-GPU pod takes gang-a1 at once
        plane.core.create_namespaced_pod(NAMESPACE, _pod("lone"))
        assert _wait_bound(plane, "lone") == "gang-a1"
        assert all(len(pods) == 1 for pods in _held_devices(plane).values())
    finally:
        _delete_pods(plane)


def test_after_an_extender_restart_no_device_is_held_twice(plane: ControlPlane, gangs: GangCluster) -> None:
    """A second member kube-scheduler cannot place (a node selector no node matches) and the first
    are created; the first binds and the second's place is held. The extender restarts: the new
    extender holds the open place again from the cluster's pods, so a lone pod created then does
    not take it. The stuck member is deleted (its place goes with it) and a second member created
    later is placed beside the first."""
    try:
        stuck = _pod("resume-stuck", gang="resume")
        stuck["spec"]["nodeSelector"]["e2e.gpuweave.io/no-such-label"] = "x"
        plane.core.create_namespaced_pod(NAMESPACE, stuck)
        plane.core.create_namespaced_pod(NAMESPACE, _pod("resume-0", gang="resume"))
        first = _wait_bound(plane, "resume-0")
        assert first in ("gang-b1", "gang-b2")
        wait_for("the bind seen", lambda: gangs.metric("gpuweave_extender_gang_reserved_devices") == 8)
        gangs.restart_extender()
        wait_for(
            "the open place held again", lambda: gangs.metric("gpuweave_extender_gang_reserved_devices") == 8
        )
        plane.core.create_namespaced_pod(NAMESPACE, _pod("after"))
        assert _wait_bound(plane, "after") == "gang-a1"  # not the gang's held place
        plane.core.delete_namespaced_pod("resume-stuck", NAMESPACE, grace_period_seconds=0)
        plane.core.create_namespaced_pod(NAMESPACE, _pod("resume-1", gang="resume"))
        second = _wait_bound(plane, "resume-1")
        print(f"gang resume: {first} before the restart, {second} after; the lone pod on gang-a1")
        assert {first, second} == {"gang-b1", "gang-b2"}
        held = _held_devices(plane)
        assert all(len(pods) == 1 for pods in held.values()), {d: p for d, p in held.items() if len(p) > 1}
        assert len(held) == 4 + 3 * 8  # the filler's 4 GPUs, two members and the lone pod
        assert gangs.metric("gpuweave_extender_gang_reserved_devices") == 0
    finally:
        _delete_pods(plane)


HIGH = "e2e-gang-high"


def test_a_recovering_gang_preempts_a_lower_priority_pod_in_its_block(
    plane: ControlPlane, gangs: GangCluster
) -> None:
    """The gang (PriorityClass value 1000) runs on gang-b1 and gang-b2, and both members are
    re-created, as JobSet re-creates every member after a fault. Meanwhile a priority-0 pod took a
    GPU of gang-b2 and a priority-1000 one a GPU of gang-a1, so no block holds the gang (gang-a2 has
    4 free). kube-scheduler's preemption proposes gang-b2 and gang-a2 (its own filters rejected
    both, so the extender's filter never saw them); the extender narrows it to the gang's block:
    the priority-0 pod on gang-b2 is evicted, gang-a2's filler stays, and the gang runs again on
    gang-b1 and gang-b2."""
    scheduling = client.SchedulingV1Api(plane.api)
    _create_high_priority(plane, scheduling)
    try:
        members = [_pod(f"rec-{index}", gang="rec") for index in range(2)]
        for member in members:
            member["spec"]["priorityClassName"] = HIGH
            plane.core.create_namespaced_pod(NAMESPACE, member)
        assert {_wait_bound(plane, f"rec-{index}") for index in range(2)} == {"gang-b1", "gang-b2"}
        _evict_pods(plane, ["rec-0", "rec-1"])  # a fault's eviction: the gang's nodes stay remembered
        squat_a1 = _pod("squat-a1", gpus=1, only_on="gang-a1")
        squat_a1["spec"]["priorityClassName"] = HIGH
        for pod in (squat_a1, _pod("squat-b2", gpus=1, only_on="gang-b2")):
            plane.core.create_namespaced_pod(NAMESPACE, pod)
            assert (
                _wait_bound(plane, pod["metadata"]["name"])
                == pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            )
        started = time.monotonic()
        for member in members:
            plane.core.create_namespaced_pod(NAMESPACE, member)
        nodes = {_wait_bound(plane, f"rec-{index}", timeout=90) for index in range(2)}
        print(
            f"gang rec ran again on {sorted(nodes)} {time.monotonic() - started:.1f} s after its re-creation"
        )
        assert nodes == {"gang-b1", "gang-b2"}
        preempted = {
            e.involved_object.name: e.message
            for e in plane.core.list_namespaced_event(NAMESPACE).items
            if e.reason == "Preempted"
        }
        print(f"kube-scheduler's Preempted events: {preempted}")
        assert list(preempted) == ["squat-b2"]
        left = {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items}
        assert "squat-b2" not in left and {"squat-a1", *FILLERS} <= left
        held = _held_devices(plane)
        assert all(len(pods) == 1 for pods in held.values())
    finally:
        _delete_pods(plane)
        scheduling.delete_priority_class(HIGH)


def _preempted(plane: ControlPlane, names: set[str]) -> list[str]:
    """The pods of ``names`` kube-scheduler's Preempted events name."""
    return sorted(
        e.involved_object.name
        for e in plane.core.list_namespaced_event(NAMESPACE).items
        if e.reason == "Preempted" and e.involved_object.name in names
    )


def test_a_gang_of_one_preempts_only_once_it_ran(plane: ControlPlane, gangs: GangCluster) -> None:
    """A one-pod training job (``gpuweave.io/gang: solo``, size 1, PriorityClass value 1000) while
    a priority-0 1-GPU pod sits on gang-a1, gang-b1 and gang-b2 (gang-a2 has 4 free): no node has
    8 free GPUs. Before it ran it preempts nothing (the extender answers kube-scheduler's
    preemption with no node). Once one squatter is gone it binds on gang-b1; evicted (as for a
    fault) and created again while a squatter is back there, it is a recovering gang: the
    extender lets kube-scheduler evict one priority-0 pod of its block (gang-b1 or gang-b2), and it
    runs there."""
    scheduling = client.SchedulingV1Api(plane.api)
    _create_high_priority(plane, scheduling)
    squatters = {f"one-squat-{n.removeprefix('gang-')}": n for n in ("gang-a1", "gang-b1", "gang-b2")}

    def solo() -> dict[str, Any]:
        pod = _pod("solo", gang="solo", size=1)
        pod["spec"]["priorityClassName"] = HIGH
        return pod

    def squat(name: str) -> None:
        plane.core.create_namespaced_pod(NAMESPACE, _pod(name, gpus=1, only_on=squatters[name]))
        assert _wait_bound(plane, name) == squatters[name]

    try:
        for name in squatters:
            squat(name)
        plane.core.create_namespaced_pod(NAMESPACE, solo())
        print(f"solo before it ran: {_wait_unschedulable(plane, 'solo')}")
        time.sleep(3)  # a preemption would have evicted a squatter by now
        assert _bound_node(plane, "solo") is None and not _preempted(plane, set(squatters))
        left = {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items}
        assert set(squatters) <= left
        plane.core.delete_namespaced_pod("one-squat-b1", NAMESPACE, grace_period_seconds=0)
        assert _wait_bound(plane, "solo") == "gang-b1"
        _evict_pods(plane, ["solo"])  # as the node agent evicts it for a failed device
        # as its Job controller would, it is created again once the loss is seen (here: by the extender)
        wait_for("the extender to see solo's loss", lambda: gangs.metric(RECOVERING) >= 1)
        squat("one-squat-b1")
        started = time.monotonic()
        plane.core.create_namespaced_pod(NAMESPACE, solo())
        node = _wait_bound(plane, "solo", timeout=90)
        preempted = _preempted(plane, set(squatters))
        print(
            f"solo ran again on {node} {time.monotonic() - started:.1f} s after its re-creation; "
            f"preempted {preempted}"
        )
        assert node in ("gang-b1", "gang-b2") and preempted == [f"one-squat-{node.removeprefix('gang-')}"]
        left = {p.metadata.name for p in plane.core.list_namespaced_pod(NAMESPACE).items}
        assert {"one-squat-a1", *FILLERS} <= left
        assert all(len(pods) == 1 for pods in _held_devices(plane).values())
    finally:
        _delete_pods(plane)
        scheduling.delete_priority_class(HIGH)


def test_a_gangs_held_place_is_released_when_its_member_is_deleted(
    plane: ControlPlane, gangs: GangCluster
) -> None:
    """A gang of two: ``hold-stuck`` (a node selector no node matches: kube-scheduler never asks the
    extender about it) and ``hold-0``. ``hold-0`` binds in block B and the other block-B node's 8
    GPUs stay held for ``hold-stuck``. Deleting ``hold-stuck`` leaves the gang fewer pods than it
    declares: the held place goes at that delete (the ``released`` outcome, not ``expired``, and
    within a third of the 15 s TTL), and an 8-GPU pod that only that node may take is bound
    there. A lone pod declaring a gang of four holds nothing: 1 of its 4 members exist."""
    try:
        stuck = _pod("hold-stuck", gang="hold")
        stuck["spec"]["nodeSelector"]["e2e.gpuweave.io/no-such-label"] = "x"
        plane.core.create_namespaced_pod(NAMESPACE, stuck)
        plane.core.create_namespaced_pod(NAMESPACE, _pod("hold-0", gang="hold"))
        first = _wait_bound(plane, "hold-0")
        assert first in ("gang-b1", "gang-b2")
        other = ({"gang-b1", "gang-b2"} - {first}).pop()
        wait_for("the open place held", lambda: gangs.metric(RESERVED) == 8)
        released, expired = _outcome(gangs, "released"), _outcome(gangs, "expired")
        started = time.monotonic()
        plane.core.delete_namespaced_pod("hold-stuck", NAMESPACE, grace_period_seconds=0)
        wait_for("the held place released", lambda: gangs.metric(RESERVED) == 0, timeout=TTL_S / 3)
        print(f"gang hold: the place on {other} released {time.monotonic() - started:.2f} s after the delete")
        assert _outcome(gangs, "released") == released + 1 and _outcome(gangs, "expired") == expired
        plane.core.create_namespaced_pod(NAMESPACE, _pod("after-hold", only_on=other))
        assert _wait_bound(plane, "after-hold") == other
        plane.core.create_namespaced_pod(NAMESPACE, _pod("phantom", gang="phantom", size=4))
        message = _wait_unschedulable(plane, "phantom")
        print(f"phantom: {message}")
        assert "1 of its 4 members exist" in message and "no device is held for it" in message
        assert gangs.metric(RESERVED) == 0
    finally:
        _delete_pods(plane)


RESERVED = "gpuweave_extender_gang_reserved_devices"
RECOVERING = "gpuweave_extender_gangs_recovering"


def _outcome(gangs: GangCluster, outcome: str) -> float:
    return gangs.metric(f'gpuweave_extender_gangs_total{{outcome="{outcome}"}}')
