"""The handoff's backstop against a real kube-apiserver and a pod-resources API on a unix socket.

A pod whose ``gpuweave.io/assignment`` names other devices than the kubelet allocated (as when the
agent hinted another pod's assignment in a burst) gets its annotation corrected to the kubelet's
devices, a Warning Event and a count; a patch whose resourceVersion precondition is stale is
refused by the API server and leaves the annotation alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import ContainerAssignment, PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, RESOURCE_GPU
from deviceplugin.handoff import PodView
from deviceplugin.kube import AssignmentAuditor, EventReporter, PodWatcher
from nodeagent.metrics import AgentMetrics
from nodeagent.podresources import PodResourcesClient
from tests.support.control_plane import ControlPlane
from tests.support.podresources_server import PodResourcesServer
from tests.support.small_inventory import gpu_uuid
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

NODE = "audit-node"
NAMESPACE = "ml"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    control = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        control.ensure_namespace(NAMESPACE)
        wait_until(  # pods need it; the control plane's controllers create it
            "the namespace's default service account",
            lambda: control.core.list_namespaced_service_account(NAMESPACE).items,
        )
        control.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield control
    finally:
        control.stop()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(tmp_path / "pod-resources" / "kubelet.sock") as server:
        yield server


def annotated_pod(plane: ControlPlane, name: str, ids: list[str]) -> Any:
    assignment = PodAssignment(
        node=NODE, containers={"main": ContainerAssignment(devices={RESOURCE_GPU: ids})}
    )
    body = {
        "metadata": {"name": name, "annotations": {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    return plane.core.create_namespaced_pod(NAMESPACE, body)


def annotated_ids(plane: ControlPlane, name: str) -> list[str]:
    pod = plane.core.read_namespaced_pod(name, NAMESPACE)
    assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    return assignment.containers["main"].devices[RESOURCE_GPU]


def auditor(
    plane: ControlPlane, view: PodView, kubelet: PodResourcesServer, metrics: AgentMetrics
) -> AssignmentAuditor:
    return AssignmentAuditor(
        plane.api,
        view=view,
        kubelet_devices=PodResourcesClient(kubelet.socket_path).list_devices,
        metrics=metrics,
        report=EventReporter(plane.api, node=NODE),
        correct=True,
        delays_s=(0.0, 0.2),
    )


def test_a_wrong_annotation_is_corrected_to_the_kubelets_allocation(
    plane: ControlPlane, kubelet: PodResourcesServer
) -> None:
    view, metrics = PodView(), AgentMetrics()
    watcher = PodWatcher(plane.api, node=NODE, view=view)
    audit = auditor(plane, view, kubelet, metrics)
    watcher.start()
    audit.start()
    try:
        annotated_pod(plane, "burst-1", [gpu_uuid(0), gpu_uuid(1)])
        wait_until(
            "the agent's watch shows the pod", lambda: [p.name for p in view.assigned()] == ["burst-1"]
        )
        kubelet.admit(NAMESPACE, "burst-1", {"main": {RESOURCE_GPU: [gpu_uuid(2), gpu_uuid(3)]}})
        audit.poke()  # as after an Allocate
        wait_until(
            "the annotation follows the kubelet",
            lambda: annotated_ids(plane, "burst-1") == sorted([gpu_uuid(2), gpu_uuid(3)]),
        )
    finally:
        audit.stop()
        watcher.stop()
    events = plane.core.list_namespaced_event(NAMESPACE, field_selector="involvedObject.name=burst-1").items
    assert [e.reason for e in events] == ["GpuAssignmentMismatch"]
    assert gpu_uuid(2) in events[0].message and "corrected" in events[0].message
    sample = metrics.registry.get_sample_value
    labels = {"resource": RESOURCE_GPU}
    assert sample("gpuweave_deviceplugin_handoff_total", {**labels, "outcome": "admitted_mismatch"}) == 1
    assert sample("gpuweave_deviceplugin_handoff_total", {**labels, "outcome": "corrected"}) == 1


def test_a_stale_view_does_not_overwrite_a_newer_pod(
    plane: ControlPlane, kubelet: PodResourcesServer
) -> None:
    created = annotated_pod(plane, "stale", [gpu_uuid(4)])
    view, metrics = PodView(), AgentMetrics()
    view.upsert(
        uid=created.metadata.uid,
        namespace=NAMESPACE,
        name="stale",
        phase="Pending",
        annotation=created.metadata.annotations[ANNOTATION_ASSIGNMENT],
        resource_version=created.metadata.resource_version,
    )
    plane.core.patch_namespaced_pod("stale", NAMESPACE, {"metadata": {"labels": {"touched": "yes"}}})
    kubelet.admit(NAMESPACE, "stale", {"main": {RESOURCE_GPU: [gpu_uuid(5)]}})
    found = auditor(plane, view, kubelet, metrics).audit_once()
    assert [c.pod.name for c in found] == ["stale"]
    assert annotated_ids(plane, "stale") == [gpu_uuid(4)]  # 409: the next audit sees the new version
    labels = {"resource": RESOURCE_GPU, "outcome": "corrected"}
    assert metrics.registry.get_sample_value("gpuweave_deviceplugin_handoff_total", labels) is None
