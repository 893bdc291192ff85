"""Kueue admits, gpuweave places: a JobSet through the real Kueue and JobSet controllers.

The real Kueue controller manager and JobSet controller (tests/e2e/queueing, their CRDs from
their Go modules), the Job controller (``harness controllers --jobs``), and a kube-scheduler
(profile ``gpuweave-kueue-scheduler``) with its own ``gpuweave extender``. Four Nodes of 8 H100
GPUs (Node objects and GpuNodeInventory objects, no kubelet: bound pods stay Pending, which is all
admission and scheduling need) in three ``topology.k8s.aws/network-node-layer-3`` blocks: block A
holds ``kq-a1`` and ``kq-a2``, block B ``kq-b1``, block C ``kq-c1`` (half its CPUs taken, so
kube-scheduler's MostAllocated would send a lone 8-GPU pod there). Only block A can hold two
8-GPU pods.

Kueue: a ResourceFlavor whose node labels and toleration are the only way onto these Nodes (they
carry a taint no pod template here tolerates: Kueue injects it at admission), a ClusterQueue with
a nominal quota of 16 ``nvidia.com/gpu`` and a LocalQueue. No webhook of Kueue's or JobSet's is
registered with the API server, so workloads are created as their webhooks would leave them:
``suspend: true`` with ``kueue.x-k8s.io/queue-name``, the JobSet with JobSet's defaults.
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

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from devicemodel.gangs import LABEL_JOBSET_NAME, LABEL_JOBSET_REPLICAS, LABEL_REPLICATED_JOB
from gpuweave.simulate.cluster_objects import inventory_object, profile_inventory
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    queueing_crds,
    render_scheduler_config,
    start_controllers,
    start_extender,
    start_jobset,
    start_kueue,
    start_scheduler,
    wait_for,
)
from tests.e2e.pods import GPU
from topology.network import LABEL_AWS_LAYER_3

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-kueue"
SCHEDULER = "gpuweave-kueue-scheduler"
BLOCKS = {
    "kq-a1": "e2e-kq-block-a",
    "kq-a2": "e2e-kq-block-a",
    "kq-b1": "e2e-kq-block-b",
    "kq-c1": "e2e-kq-block-c",
}
NODE_LABEL = "e2e.gpuweave.io/kueue-node"
TAINT = {"key": "e2e.gpuweave.io/kueue-tests", "value": "only", "effect": "NoSchedule"}
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "e2e-h100", "e2e-gpus", "e2e-queue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets")
INVENTORIES = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


def _create_node(plane: ControlPlane, name: str) -> None:
    """A Node with 8 GPUs in its block, tainted, and its GpuNodeInventory (spec and status)."""
    labels = {"kubernetes.io/hostname": name, NODE_LABEL: "true", LABEL_AWS_LAYER_3: BLOCKS[name]}
    plane.core.create_node({"metadata": {"name": name, "labels": labels}, "spec": {"taints": [TAINT]}})
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e kueue node"}
    plane.core.patch_node_status(
        name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    )
    body = inventory_object(profile_inventory("dgx-h100", name))
    custom = client.CustomObjectsApi(plane.api)
    custom.create_cluster_custom_object(*INVENTORIES, {k: v for k, v in body.items() if k != "status"})
    custom.patch_cluster_custom_object_status(*INVENTORIES, name, {"status": body["status"]})


def _kueue_objects() -> list[dict[str, Any]]:
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        "spec": {"nodeLabels": {NODE_LABEL: "true"}, "tolerations": [{**TAINT, "operator": "Equal"}]},
    }
    quota = {"name": GPU, "nominalQuota": 16}
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {"coveredResources": [GPU], "flavors": [{"name": FLAVOR, "resources": [quota]}]}
            ],
        },
    }
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }
    return [flavor, cluster_queue, local_queue]


def _container(gpus: int) -> dict[str, Any]:
    limits = {GPU: str(gpus)}
    return {"name": "main", "image": "e2e/none", "resources": {"limits": limits, "requests": limits}}


def _pod_spec(gpus: int, **extra: Any) -> dict[str, Any]:
    return {
        "schedulerName": SCHEDULER,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [_container(gpus)],
        **extra,
    }


def _blocker_job() -> dict[str, Any]:
    """A batch/v1 Job of one 8-GPU pod on kq-b1, queued in the same LocalQueue."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "blocker", "namespace": NAMESPACE, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"spec": _pod_spec(8, nodeSelector={"kubernetes.io/hostname": "kq-b1"})},
        },
    }


def _jobset(name: str) -> dict[str, Any]:
    """One replicated job of 2 Jobs x 1 pod x 8 GPUs, with what JobSet's defaulting webhook sets."""
    job = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "completionMode": "Indexed",
        "template": {"spec": _pod_spec(8)},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
        "spec": {
            "suspend": True,
            "successPolicy": {"operator": "All"},
            "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}],
        },
    }


class KueueCluster:
    """Kueue, JobSet, the Job controller, and the kueue-test kube-scheduler with its extender."""

    def __init__(self, plane: ControlPlane, kubeconfig: Path) -> None:
        self.processes: list[Process] = []
        self.processes.append(start_controllers(plane, jobs=True))
        self.processes.append(start_jobset(plane))
        self.processes.append(start_kueue(plane))
        self.extender, self.url = start_extender(plane, kubeconfig=kubeconfig, name="kueue-extender")
        self.processes.append(self.extender)
        config = render_scheduler_config(
            plane, extender_url=self.url, kubeconfig=kubeconfig, scheduler_name=SCHEDULER
        )
        self.processes.append(start_scheduler(plane, config_path=config, name="kueue-kube-scheduler"))

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture(scope="module")
def kueue(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[KueueCluster]:
    plane.ensure_namespace(NAMESPACE)
    for name in BLOCKS:
        _create_node(plane, name)
    filler = {
        "metadata": {"name": "filler-c1-cpu"},
        "spec": {
            "nodeName": "kq-c1",
            "tolerations": [{**TAINT, "operator": "Equal"}],
            "containers": [{"name": "main", "image": "e2e/none", "resources": {"requests": {"cpu": "48"}}}],
        },
    }
    plane.core.create_namespaced_pod(NAMESPACE, filler)
    plane.apply(queueing_crds())
    cluster = KueueCluster(plane, scheduler_kubeconfig)
    try:
        plane.apply(_kueue_objects())
        wait_for("ClusterQueue active", lambda: _condition(_cluster_queue(plane), "Active") == "True")
        yield cluster
    finally:
        _cleanup(plane)
        cluster.stop()
        custom = client.CustomObjectsApi(plane.api)
        for name in BLOCKS:
            plane.core.delete_node(name)
            custom.delete_cluster_custom_object(*INVENTORIES, name)


def _cleanup(plane: ControlPlane) -> None:
    """Delete the JobSets, Jobs and pods while the controllers still run (they drop their
    finalizers); no garbage collector runs here, so pods are deleted by name."""
    custom = client.CustomObjectsApi(plane.api)
    for item in custom.list_namespaced_custom_object(*JOBSET)["items"]:
        custom.delete_namespaced_custom_object(*JOBSET, item["metadata"]["name"])
    batch = client.BatchV1Api(plane.api)
    for job in batch.list_namespaced_job(NAMESPACE).items:
        batch.delete_namespaced_job(job.metadata.name, NAMESPACE, propagation_policy="Background")
    for pod in plane.core.list_namespaced_pod(NAMESPACE).items:
        try:
            plane.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for("kueue test pods to be deleted", lambda: not plane.core.list_namespaced_pod(NAMESPACE).items)


def _cluster_queue(plane: ControlPlane) -> dict[str, Any]:
    return dict(
        client.CustomObjectsApi(plane.api).get_cluster_custom_object(*KUEUE, "clusterqueues", CLUSTER_QUEUE)
    )


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == kind:
            return str(condition["status"])
    return None


def _workload_of(plane: ControlPlane, kind: str, name: str) -> dict[str, Any] | None:
    """The Workload Kueue's job reconciler created for the object (its owner reference)."""
    items = client.CustomObjectsApi(plane.api).list_namespaced_custom_object(*KUEUE, NAMESPACE, "workloads")[
        "items"
    ]
    for workload in items:
        owners = workload["metadata"].get("ownerReferences") or []
        if any(o["kind"] == kind and o["name"] == name for o in owners):
            return dict(workload)
    return None


def _wait_workload(plane: ControlPlane, kind: str, name: str, check: Any, what: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        workload = _workload_of(plane, kind, name)
        return workload if workload is not None and check(workload) else None

    return wait_for(f"{kind} {name}'s Workload {what}", found, timeout=60)


def _jobset_pods(plane: ControlPlane, name: str) -> list[Any]:
    return list(plane.core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_JOBSET_NAME}={name}").items)


def _succeed(plane: ControlPlane, pod: Any) -> None:
    """Finish the pod as its kubelet would report it: container exited 0, phase Succeeded."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
    status = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "main",
                "image": "e2e/none",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    plane.core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, {"status": status})


def test_jobset_waits_for_quota_then_kueue_admits_it_and_gpuweave_places_it_in_one_block(
    plane: ControlPlane, kueue: KueueCluster
) -> None:
    batch = client.BatchV1Api(plane.api)
    custom = client.CustomObjectsApi(plane.api)
    # 1. Another workload takes 8 of the 16 GPUs of quota: Kueue admits it, injects the flavor's
    # node labels and toleration, and its pod is placed.
    batch.create_namespaced_job(NAMESPACE, _blocker_job())
    _wait_workload(plane, "Job", "blocker", lambda w: _condition(w, "Admitted") == "True", "admitted")
    blocker = wait_for(
        "the blocker's pod to be bound",
        lambda: next(
            (
                p
                for p in plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=blocker").items
                if p.spec.node_name
            ),
            None,
        ),
    )
    assert blocker.spec.node_name == "kq-b1"
    assert blocker.spec.node_selector[NODE_LABEL] == "true"  # from the ResourceFlavor, through Kueue

    # 2. The JobSet needs 16: it waits, suspended, its Workload without quota, and no pod exists.
    custom.create_namespaced_custom_object(*JOBSET, _jobset("train"))
    pending = _wait_workload(
        plane, "JobSet", "train", lambda w: _condition(w, "QuotaReserved") == "False", "pending for quota"
    )
    reserved = next(c for c in pending["status"]["conditions"] if c["type"] == "QuotaReserved")
    print(f"JobSet train waits: {reserved['reason']}: {reserved['message']}")
    assert _condition(pending, "Admitted") != "True"
    time.sleep(3)  # give Kueue, JobSet and the Job controller time to do anything they would
    assert custom.get_namespaced_custom_object(*JOBSET, "train")["spec"]["suspend"] is True
    assert _jobset_pods(plane, "train") == []
    kueue.check_alive()

    # 3. The blocker finishes: the Job controller completes its Job, Kueue finishes its Workload and
    # releases the quota, admits the JobSet and unsuspends it; JobSet resumes its Jobs, the Job
    # controller creates the pods and gpuweave places them as one gang.
    freed = time.monotonic()
    _succeed(plane, blocker)
    admitted = _wait_workload(
        plane, "JobSet", "train", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    admitted_s = time.monotonic() - freed
    assert admitted["status"]["admission"]["clusterQueue"] == CLUSTER_QUEUE
    [podset] = admitted["status"]["admission"]["podSetAssignments"]
    assert podset["name"] == "workers" and podset["count"] == 2
    assert podset["flavors"] == {GPU: FLAVOR}
    assert podset["resourceUsage"][GPU] == "16"

    def bound() -> list[Any] | None:
        kueue.check_alive()
        pods = _jobset_pods(plane, "train")
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

    pods = wait_for("the JobSet's 2 pods to be bound", bound, timeout=90)
    placed_s = time.monotonic() - freed
    nodes = sorted(p.spec.node_name for p in pods)
    print(
        f"JobSet train admitted {admitted_s:.1f} s and both pods bound {placed_s:.1f} s"
        f" after the quota was freed: {nodes}"
    )
    assert custom.get_namespaced_custom_object(*JOBSET, "train")["spec"]["suspend"] is False
    assert nodes == ["kq-a1", "kq-a2"]  # the one layer-3 block holding both, not kq-c1 or kq-b1
    devices: list[str] = []
    for pod in pods:
        labels = pod.metadata.labels
        assert labels[LABEL_JOBSET_NAME] == "train" and labels[LABEL_REPLICATED_JOB] == "workers"
        assert labels[LABEL_JOBSET_REPLICAS] == "2"
        assert pod.spec.node_selector[NODE_LABEL] == "true"  # Kueue's flavor, through JobSet and the Job
        assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
        assert assignment.node == pod.spec.node_name
        assert len(assignment.all_device_ids()) == 8
        devices += [f"{assignment.node}/{d}" for d in assignment.all_device_ids()]
    assert len(set(devices)) == 16
    assert kueue.metric('gpuweave_extender_gangs_total{outcome="completed"}') == 1
    assert kueue.metric("gpuweave_extender_gang_reserved_devices") == 0
    usage = _cluster_queue(plane)["status"]["flavorsUsage"][0]["resources"]
    assert {r["name"]: r["total"] for r in usage} == {GPU: "16"}
