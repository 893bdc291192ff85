"""Kueue admits, gpuweave places: a JobSet through the real Kueue and JobSet controllers.

The real Kueue controller manager and JobSet controller (tests/e2e/queueing, their CRDs from
their Go modules), the Job controller (``harness controllers --jobs``), and a kube-scheduler
(profile ``gpuweave-kueue-scheduler``) with its own ``gpuweave extender``. Four Nodes of 8 H100
GPUs (Node objects and GpuNodeInventory objects, no kubelet: bound pods stay Pending, which is all
admission and scheduling need) in three ``topology.k8s.aws/network-node-layer-3`` blocks: block A
holds ``kq-a1`` and ``kq-a2``, block B ``kq-b1``, block C ``kq-c1`` (half its CPUs taken, so
kube-scheduler's MostAllocated would send a lone 8-GPU pod there). Only block A can hold two
8-GPU pods. A fifth Node, ``kq-s1`` (8 H100 GPUs published in fractional sharing mode), has its own
ResourceFlavor, ClusterQueue (100 ``gpuweave.io/gpu-compute``) and LocalQueue for the GPU-share test.
A sixth, ``kq-p1`` (8 H100 GPUs), has the preemption test's flavor and two ClusterQueues in one cohort.

Kueue: a ResourceFlavor whose node labels and toleration are the only way onto these Nodes (they
carry a taint no pod template here tolerates: Kueue injects it at admission), a ClusterQueue with
a nominal quota of 16 ``nvidia.com/gpu`` and a LocalQueue. No webhook of Kueue's or JobSet's is
registered with the API server, so workloads are created as their webhooks would leave them:
``suspend: true`` with ``kueue.x-k8s.io/queue-name``, the JobSet with JobSet's defaults.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devicemodel.assignment import PodAssignment, fits_resource, parent_gpu_of_share
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    mig_resource_name,
)
from devicemodel.gangs import LABEL_JOBSET_NAME, LABEL_JOBSET_REPLICAS, LABEL_REPLICATED_JOB
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.simulate.cluster_objects import profile_inventory
from nodeagent.devices import build_catalogue
from scheduler_ext.kueue.checks import CONTROLLER_NAME
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    delete_jobs_and_pods,
    queueing_crds,
    render_scheduler_config,
    start_controllers,
    start_extender,
    start_jobset,
    start_kueue,
    start_scheduler,
    wait_for,
)
from tests.e2e.gpu_nodes import INVENTORIES, create_gpu_node, publish_inventory
from tests.e2e.pods import GPU
from tests.support.small_inventory import small_inventory
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
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets")
SHARE_NODE, SHARE_NODE_LABEL = "kq-s1", "e2e.gpuweave.io/kueue-share-node"
SHARE_FLAVOR, SHARE_CLUSTER_QUEUE, SHARE_LOCAL_QUEUE = "e2e-h100-shares", "e2e-gpu-shares", "e2e-share-queue"
FRACTIONAL = SharingPlan(default=GpuSharing(SharingMode.FRACTIONAL))


def _create_node(plane: ControlPlane, name: str, *, block: str, node_label: str = NODE_LABEL) -> None:
    """A Node with 8 GPUs in its block, tainted, and its GpuNodeInventory (spec and status)."""
    labels = {"kubernetes.io/hostname": name, node_label: "true", LABEL_AWS_LAYER_3: block}
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"}
    inventory = profile_inventory("dgx-h100", name)
    create_gpu_node(
        plane, inventory, labels=labels, taint=TAINT, resources=resources, message="e2e kueue node"
    )


def _flavor(name: str, node_label: str) -> dict[str, Any]:
    """A ResourceFlavor whose node label and toleration are the only way onto its Nodes."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {node_label: "true"}, "tolerations": [{**TAINT, "operator": "Equal"}]},
    }


def _queues(
    cluster_queue: str, local_queue: str, *, flavor: str, resource: str, nominal: int, **spec: Any
) -> list[dict[str, Any]]:
    """A ClusterQueue with ``nominal`` of ``resource`` on ``flavor`` (``spec``: more of its spec,
    e.g. a cohort), and a LocalQueue of the test namespace pointing at it."""
    quota = {"name": resource, "nominalQuota": nominal}
    groups = [{"coveredResources": [resource], "flavors": [{"name": flavor, "resources": [quota]}]}]
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {"namespaceSelector": {}, "resourceGroups": groups, **spec},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": NAMESPACE},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


def _kueue_objects() -> list[dict[str, Any]]:
    return [
        _flavor(FLAVOR, NODE_LABEL),
        *_queues(CLUSTER_QUEUE, LOCAL_QUEUE, flavor=FLAVOR, resource=GPU, nominal=16),
    ]


def _pod_spec(count: int, *, resource: str = GPU, **extra: Any) -> dict[str, Any]:
    """One container asking for ``count`` of ``resource``; ``extra``: more pod spec fields."""
    limits = {resource: str(count)}
    container = {"name": "main", "image": "e2e/none", "resources": {"limits": limits, "requests": limits}}
    return {
        "schedulerName": SCHEDULER,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
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


def _jobset(name: str, local_queue: str = LOCAL_QUEUE) -> dict[str, Any]:
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
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {QUEUE_LABEL: local_queue}},
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
    for name, block in BLOCKS.items():
        _create_node(plane, name, block=block)
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
    delete_jobs_and_pods(plane, NAMESPACE)


@contextlib.contextmanager
def _queued_nodes(
    plane: ControlPlane,
    nodes: Mapping[str, str],
    *,
    node_label: str,
    objects: list[dict[str, Any]],
    cluster_queues: tuple[str, ...],
) -> Iterator[None]:
    """8-GPU Nodes (name -> layer-3 block) labelled for one flavor, and the Kueue objects over
    them, until every ClusterQueue named is active; afterwards the test namespace's workloads and
    pods, the Nodes and their inventories are deleted."""
    for name, block in nodes.items():
        _create_node(plane, name, block=block, node_label=node_label)
    try:
        plane.apply(objects)
        for cluster_queue in cluster_queues:
            wait_for(
                f"ClusterQueue {cluster_queue} active",
                lambda name=cluster_queue: _condition(_cluster_queue(plane, name), "Active") == "True",
            )
        yield None
    finally:
        _cleanup(plane)
        custom = client.CustomObjectsApi(plane.api)
        for name in nodes:
            plane.core.delete_node(name)
            custom.delete_cluster_custom_object(*INVENTORIES, name)


def _cluster_queue(plane: ControlPlane, name: str = CLUSTER_QUEUE) -> dict[str, Any]:
    return dict(client.CustomObjectsApi(plane.api).get_cluster_custom_object(*KUEUE, "clusterqueues", name))


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
    wait_for("the queue to count 16 GPUs", lambda: _gpu_usage(plane, CLUSTER_QUEUE) == {GPU: "16"})


def _create_share_node(plane: ControlPlane) -> dict[str, str]:
    """``kq-s1``: 8 H100 GPUs all in fractional mode. Its allocatable lists gpu-compute and
    gpu-memory as the node agent's device plugin advertises them (100 units and the GPU's whole GiB
    per GPU, no ``nvidia.com/gpu``), and its inventory's status says each GPU is fractional."""
    inventory = profile_inventory("dgx-h100", SHARE_NODE)
    catalogue = build_catalogue(inventory, FRACTIONAL)
    shares = {r: str(len(catalogue[r])) for r in (RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY)}
    labels = {"kubernetes.io/hostname": SHARE_NODE, SHARE_NODE_LABEL: "true"}
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", **shares}
    message = "e2e kueue share node"
    create_gpu_node(
        plane, inventory, labels=labels, taint=TAINT, resources=resources, message=message, sharing=FRACTIONAL
    )
    return shares


def _share_kueue_objects() -> list[dict[str, Any]]:
    """Flavor, ClusterQueue (100 gpu-compute, nothing else covered) and LocalQueue of the share test."""
    return [
        _flavor(SHARE_FLAVOR, SHARE_NODE_LABEL),
        *_queues(
            SHARE_CLUSTER_QUEUE,
            SHARE_LOCAL_QUEUE,
            flavor=SHARE_FLAVOR,
            resource=RESOURCE_GPU_COMPUTE,
            nominal=100,
        ),
    ]


def _share_job(name: str, compute: int) -> dict[str, Any]:
    """A Job of one pod asking for ``compute`` gpu-compute units, queued in the share queue."""
    return _queued_job(name, SHARE_LOCAL_QUEUE, resource=RESOURCE_GPU_COMPUTE, count=compute)


@pytest.fixture(scope="module")
def share_node(plane: ControlPlane, kueue: KueueCluster) -> Iterator[dict[str, str]]:
    shares = _create_share_node(plane)
    try:
        plane.apply(_share_kueue_objects())
        wait_for(
            "share ClusterQueue active",
            lambda: _condition(_cluster_queue(plane, SHARE_CLUSTER_QUEUE), "Active") == "True",
        )
        yield shares
    finally:
        _cleanup(plane)
        plane.core.delete_node(SHARE_NODE)
        client.CustomObjectsApi(plane.api).delete_cluster_custom_object(*INVENTORIES, SHARE_NODE)


def _bound_pod_of(plane: ControlPlane, job: str) -> Any:
    def bound() -> Any:
        pods = plane.core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={job}").items
        return next((p for p in pods if p.spec.node_name), None)

    return wait_for(f"{job}'s pod to be bound", bound, timeout=60)


def _job_suspended(batch: client.BatchV1Api, name: str) -> bool | None:
    spec = batch.read_namespaced_job(name, NAMESPACE).spec
    return None if spec is None else spec.suspend


def _one_gpu_share(pod: Any, units: int) -> str:
    """The GPU whose ``units`` compute shares the pod's assignment annotation names (one GPU)."""
    assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    assert assignment.node == pod.spec.node_name == SHARE_NODE
    devices = assignment.all_device_ids()
    assert len(devices) == units
    assert all(fits_resource(RESOURCE_GPU_COMPUTE, d) for d in devices)
    [gpu] = {parent_gpu_of_share(d) for d in devices}
    assert gpu is not None
    return gpu


def test_kueue_quota_on_gpu_compute_admits_gpu_shares_and_gpuweave_places_them_on_one_gpu(
    plane: ControlPlane, kueue: KueueCluster, share_node: dict[str, str]
) -> None:
    batch = client.BatchV1Api(plane.api)
    node = plane.core.read_node(SHARE_NODE)
    assert node.status.allocatable[RESOURCE_GPU_COMPUTE] == share_node[RESOURCE_GPU_COMPUTE] == "800"
    assert node.status.allocatable[RESOURCE_GPU_MEMORY] == share_node[RESOURCE_GPU_MEMORY]
    gpus = {g.uuid for g in profile_inventory("dgx-h100", SHARE_NODE).gpus}

    # 1. The first Job's 60 units fit the ClusterQueue's 100: admitted on the share flavor, its pod
    # bound to kq-s1 by kube-scheduler with the extender, 60 compute shares of one GPU.
    started = time.monotonic()
    batch.create_namespaced_job(NAMESPACE, _share_job("shares-first", 60))
    first = _wait_workload(
        plane, "Job", "shares-first", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    [podset] = first["status"]["admission"]["podSetAssignments"]
    assert first["status"]["admission"]["clusterQueue"] == SHARE_CLUSTER_QUEUE
    assert podset["flavors"] == {RESOURCE_GPU_COMPUTE: SHARE_FLAVOR}
    assert podset["resourceUsage"] == {RESOURCE_GPU_COMPUTE: "60"}
    first_pod = _bound_pod_of(plane, "shares-first")
    assert first_pod.spec.node_selector[SHARE_NODE_LABEL] == "true"  # the share flavor, through Kueue
    first_gpu = _one_gpu_share(first_pod, 60)
    assert first_gpu in gpus

    # 2. The second Job's 60 more would make 120 of 100: it waits, suspended, without quota.
    batch.create_namespaced_job(NAMESPACE, _share_job("shares-second", 60))
    pending = _wait_workload(
        plane,
        "Job",
        "shares-second",
        lambda w: _condition(w, "QuotaReserved") == "False",
        "pending for quota",
    )
    reserved = next(c for c in pending["status"]["conditions"] if c["type"] == "QuotaReserved")
    print(f"Job shares-second waits: {reserved['reason']}: {reserved['message']}")
    assert RESOURCE_GPU_COMPUTE in reserved["message"]
    assert _condition(pending, "Admitted") != "True"
    time.sleep(2)  # give Kueue and the Job controller time to do anything they would
    assert _job_suspended(batch, "shares-second") is True
    assert plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=shares-second").items == []
    wait_for(
        "the share queue to count 60 units",
        lambda: _gpu_usage(plane, SHARE_CLUSTER_QUEUE) == {RESOURCE_GPU_COMPUTE: "60"},
    )
    kueue.check_alive()

    # 3. The first pod finishes: Kueue releases its 60 units and admits the second, whose pod is
    # placed on one GPU of kq-s1 in turn.
    freed = time.monotonic()
    _succeed(plane, first_pod)
    second = _wait_workload(
        plane, "Job", "shares-second", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    [podset] = second["status"]["admission"]["podSetAssignments"]
    assert podset["flavors"] == {RESOURCE_GPU_COMPUTE: SHARE_FLAVOR}
    assert podset["resourceUsage"] == {RESOURCE_GPU_COMPUTE: "60"}
    second_pod = _bound_pod_of(plane, "shares-second")
    placed_s = time.monotonic() - freed
    second_gpu = _one_gpu_share(second_pod, 60)
    assert second_gpu in gpus
    assert _job_suspended(batch, "shares-second") is False
    wait_for(
        "the share queue to count 60 units",
        lambda: _gpu_usage(plane, SHARE_CLUSTER_QUEUE) == {RESOURCE_GPU_COMPUTE: "60"},
    )
    print(
        f"Job shares-second admitted and bound {placed_s:.1f} s after the first pod finished"
        f" ({time.monotonic() - started:.1f} s for the test); GPUs {first_gpu}, then {second_gpu}"
    )


PREEMPT_NODE, PREEMPT_NODE_LABEL = "kq-p1", "e2e.gpuweave.io/kueue-preempt-node"
PREEMPT_FLAVOR, PREEMPT_COHORT = "e2e-h100-preempt", "e2e-preempt-cohort"
LOW_QUEUES, HIGH_QUEUES = ("e2e-low", "e2e-low-queue"), ("e2e-high", "e2e-high-queue")


def _preempt_kueue_objects() -> list[dict[str, Any]]:
    """One flavor on kq-p1 and two ClusterQueues in one cohort: ``e2e-low`` has no quota of its own
    (everything it runs is borrowed), ``e2e-high`` has the node's 8 GPUs and reclaims them from any
    borrower (``preemption.reclaimWithinCohort: Any``); a LocalQueue for each."""
    low = _queues(*LOW_QUEUES, flavor=PREEMPT_FLAVOR, resource=GPU, nominal=0, cohortName=PREEMPT_COHORT)
    high = _queues(
        *HIGH_QUEUES,
        flavor=PREEMPT_FLAVOR,
        resource=GPU,
        nominal=8,
        cohortName=PREEMPT_COHORT,
        preemption={"reclaimWithinCohort": "Any"},
    )
    return [_flavor(PREEMPT_FLAVOR, PREEMPT_NODE_LABEL), *low, *high]


def _queued_job(
    name: str, local_queue: str, *, priority_class: str = "", resource: str = GPU, count: int = 8
) -> dict[str, Any]:
    """A batch/v1 Job of one pod asking for ``count`` of ``resource`` (8 GPUs), suspended and
    labelled for ``local_queue`` (and a Kueue WorkloadPriorityClass)."""
    labels = {QUEUE_LABEL: local_queue}
    if priority_class:
        labels[PRIORITY_CLASS_LABEL] = priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"spec": _pod_spec(count, resource=resource)},
        },
    }


@pytest.fixture(scope="module")
def preempt_node(plane: ControlPlane, kueue: KueueCluster) -> Iterator[None]:
    """``kq-p1``: 8 H100 GPUs, tainted like the others, labelled only for the preemption flavor."""
    with _queued_nodes(
        plane,
        {PREEMPT_NODE: "e2e-kq-block-p"},
        node_label=PREEMPT_NODE_LABEL,
        objects=_preempt_kueue_objects(),
        cluster_queues=(LOW_QUEUES[0], HIGH_QUEUES[0]),
    ):
        yield None


def _gpu_usage(plane: ControlPlane, cluster_queue: str, field: str = "total") -> dict[str, str]:
    """The ClusterQueue's ``status.flavorsUsage`` per resource (``total`` or ``borrowed``)."""
    flavors = _cluster_queue(plane, cluster_queue)["status"].get("flavorsUsage") or []
    return {r["name"]: r.get(field, "0") for f in flavors for r in f["resources"]}


def test_second_cluster_queue_reclaims_borrowed_quota_through_kueue_and_gets_the_same_gpus(
    plane: ControlPlane, kueue: KueueCluster, preempt_node: None
) -> None:
    batch = client.BatchV1Api(plane.api)
    gpus = {g.uuid for g in profile_inventory("dgx-h100", PREEMPT_NODE).gpus}

    # 1. e2e-low has no quota of its own: its 8-GPU Job borrows e2e-high's 8 through the cohort, is
    # admitted on the preemption flavor, and its pod is bound to kq-p1 with all 8 GPUs.
    started = time.monotonic()
    batch.create_namespaced_job(NAMESPACE, _queued_job("borrower", LOW_QUEUES[1]))
    low = _wait_workload(plane, "Job", "borrower", lambda w: _condition(w, "Admitted") == "True", "admitted")
    assert low["status"]["admission"]["clusterQueue"] == LOW_QUEUES[0]
    [podset] = low["status"]["admission"]["podSetAssignments"]
    assert podset["flavors"] == {GPU: PREEMPT_FLAVOR} and podset["resourceUsage"] == {GPU: "8"}
    low_pod = _bound_pod_of(plane, "borrower")
    assert low_pod.spec.node_name == PREEMPT_NODE
    assert low_pod.spec.node_selector[PREEMPT_NODE_LABEL] == "true"  # the flavor, through Kueue
    low_assignment = PodAssignment.from_annotation(low_pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    assert low_assignment.node == PREEMPT_NODE
    held = sorted(low_assignment.all_device_ids())
    assert len(held) == 8 and set(held) == gpus
    # The ClusterQueue's status follows the admission: 8 in use, all 8 borrowed.
    wait_for(
        "e2e-low to show 8 GPUs borrowed", lambda: _gpu_usage(plane, LOW_QUEUES[0], "borrowed") == {GPU: "8"}
    )
    assert _gpu_usage(plane, LOW_QUEUES[0]) == {GPU: "8"}

    # 2. e2e-high's Job needs its nominal 8, all borrowed: Kueue preempts the borrower (its Workload
    # Evicted by Preempted, the Job suspended), the Job controller deletes its pod, Kueue releases
    # the quota and admits the high Job, and kube-scheduler with the extender binds its pod to the
    # GPUs the evicted pod held.
    arrived = time.monotonic()
    batch.create_namespaced_job(NAMESPACE, _queued_job("reclaimer", HIGH_QUEUES[1]))
    high = _wait_workload(
        plane, "Job", "reclaimer", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    admitted_s = time.monotonic() - arrived
    assert high["status"]["admission"]["clusterQueue"] == HIGH_QUEUES[0]
    [podset] = high["status"]["admission"]["podSetAssignments"]
    assert podset["flavors"] == {GPU: PREEMPT_FLAVOR} and podset["resourceUsage"] == {GPU: "8"}
    evicted = _wait_workload(
        plane, "Job", "borrower", lambda w: _condition(w, "QuotaReserved") == "False", "without quota"
    )
    conditions = {c["type"]: c for c in evicted["status"]["conditions"]}
    print(
        "borrower's Workload: "
        + "; ".join(f"{t}={c['status']} {c['reason']}: {c['message']}" for t, c in sorted(conditions.items()))
    )
    assert conditions["Evicted"]["status"] == "True" and conditions["Evicted"]["reason"] == "Preempted"
    assert conditions["Preempted"]["status"] == "True"
    assert conditions["Admitted"]["status"] == "False"
    assert _job_suspended(batch, "borrower") is True
    wait_for(
        "the borrower's pod to be deleted",
        lambda: not plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=borrower").items,
    )
    high_pod = _bound_pod_of(plane, "reclaimer")
    placed_s = time.monotonic() - arrived
    assert high_pod.spec.node_name == PREEMPT_NODE
    assert high_pod.spec.node_selector[PREEMPT_NODE_LABEL] == "true"
    high_assignment = PodAssignment.from_annotation(high_pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    assert high_assignment.node == PREEMPT_NODE
    assert sorted(high_assignment.all_device_ids()) == held  # the devices the evicted pod held
    assert _job_suspended(batch, "reclaimer") is False
    wait_for(
        "the cohort's usage to follow",
        lambda: (
            _gpu_usage(plane, HIGH_QUEUES[0]) == {GPU: "8"} and _gpu_usage(plane, LOW_QUEUES[0]) == {GPU: "0"}
        ),
    )
    assert _gpu_usage(plane, HIGH_QUEUES[0], "borrowed") == {GPU: "0"}

    # 3. The borrower stays queued: the cohort's 8 GPUs are e2e-high's and in use.
    time.sleep(2)
    assert _condition(_workload_of(plane, "Job", "borrower") or {}, "QuotaReserved") == "False"
    assert plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=borrower").items == []
    kueue.check_alive()
    print(
        f"Job reclaimer admitted {admitted_s:.1f} s and bound {placed_s:.1f} s after it was created"
        f" ({time.monotonic() - started:.1f} s for the test), on the {len(held)} GPUs the evicted pod held"
    )


FAULT_NODES, FAULT_BLOCK = ("kq-f1", "kq-f2", "kq-f3"), "e2e-kq-block-f"
FAULT_NODE_LABEL, FAULT_FLAVOR = "e2e.gpuweave.io/kueue-fault-node", "e2e-h100-checked"
CHECKED_QUEUES, CHECK = ("e2e-checked", "e2e-checked-queue"), "gpuweave-gpu-health"  # the policy lists it
XID_79 = "Xid 79: GPU has fallen off the bus"


def _checked_kueue_objects() -> list[dict[str, Any]]:
    """gpuweave's AdmissionCheck (controllerName ``gpuweave.io/gpu-health``), a flavor on the three
    fault-test nodes, and a ClusterQueue of 24 GPUs that asks for the check."""
    check = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {"controllerName": CONTROLLER_NAME},
    }
    strategy = {"admissionChecks": [{"name": CHECK}]}
    queues = _queues(
        *CHECKED_QUEUES, flavor=FAULT_FLAVOR, resource=GPU, nominal=24, admissionChecksStrategy=strategy
    )
    return [check, _flavor(FAULT_FLAVOR, FAULT_NODE_LABEL), *queues]


@pytest.fixture(scope="module")
def checked_queue(plane: ControlPlane, kueue: KueueCluster) -> Iterator[None]:
    nodes = dict.fromkeys(FAULT_NODES, FAULT_BLOCK)
    objects = _checked_kueue_objects()
    with _queued_nodes(
        plane, nodes, node_label=FAULT_NODE_LABEL, objects=objects, cluster_queues=(CHECKED_QUEUES[0],)
    ):
        # the ClusterQueue is active only once the extender has marked its AdmissionCheck Active
        check = client.CustomObjectsApi(plane.api).get_cluster_custom_object(*KUEUE, "admissionchecks", CHECK)
        assert _condition(check, "Active") == "True"
        yield None


def _check_state(workload: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in workload["status"].get("admissionChecks") or [] if c["name"] == CHECK)


def test_gpu_fault_under_one_member_requeues_the_whole_jobset_through_kueue_and_it_runs_again(
    plane: ControlPlane, kueue: KueueCluster, checked_queue: None
) -> None:
    custom = client.CustomObjectsApi(plane.api)

    # 1. Quota reserved, the check Pending: gpuweave finds 2 x 8 healthy free GPUs on the flavor's
    # nodes and sets it Ready; Kueue admits the JobSet and gpuweave places it as one gang.
    started = time.monotonic()
    custom.create_namespaced_custom_object(*JOBSET, _jobset("healthy", CHECKED_QUEUES[1]))
    admitted = _wait_workload(
        plane, "JobSet", "healthy", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    first_check = _check_state(admitted)
    assert first_check["state"] == "Ready"
    assert "16 GPUs fit on healthy free devices" in first_check["message"]
    assert admitted["status"]["admission"]["clusterQueue"] == CHECKED_QUEUES[0]

    def bound() -> list[Any] | None:
        kueue.check_alive()
        pods = _jobset_pods(plane, "healthy")
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

    pods = wait_for("the JobSet's 2 pods to be bound", bound, timeout=90)
    first_uids = {p.metadata.uid for p in pods}
    first_nodes = sorted(p.spec.node_name for p in pods)
    assert set(first_nodes) < set(FAULT_NODES)
    member = pods[0]
    assignment = PodAssignment.from_annotation(member.metadata.annotations[ANNOTATION_ASSIGNMENT])
    failed_gpu = sorted(assignment.all_device_ids())[0]

    # 2. One GPU under one member fails (its node agent publishes it unhealthy): gpuweave sets the
    # check Retry, Kueue evicts the Workload (the JobSet is suspended, both pods go) and requeues it
    # whole; quota is reserved again, the check is Pending, gpuweave finds room on healthy GPUs
    # (the failed node has 7) and sets it Ready; Kueue admits it and both pods are placed again.
    faulted = time.monotonic()
    inventory = profile_inventory("dgx-h100", member.spec.node_name)
    publish_inventory(plane, inventory, faults={failed_gpu: XID_79})

    def running_again() -> list[Any] | None:
        kueue.check_alive()
        pods = _jobset_pods(plane, "healthy")
        fresh = [p for p in pods if p.metadata.uid not in first_uids and p.spec.node_name]
        return fresh if len(fresh) == 2 and len(pods) == 2 else None

    again = wait_for("the requeued JobSet's 2 new pods to be bound", running_again, timeout=120)
    back_s = time.monotonic() - faulted
    workload = _wait_workload(
        plane, "JobSet", "healthy", lambda w: _condition(w, "Admitted") == "True", "admitted again"
    )
    evictions = (workload["status"].get("schedulingStats") or {}).get("evictions") or []
    print(f"Workload after the fault: check {_check_state(workload)}; evictions {evictions}")
    assert {e["reason"]: e["count"] for e in evictions} == {"AdmissionCheck": 1}  # evicted once, by the check
    check = _check_state(workload)
    assert check["state"] == "Ready" and check.get("retryCount") == 1
    new_nodes = sorted(p.spec.node_name for p in again)
    assert member.spec.node_name not in new_nodes  # 7 healthy GPUs there: no room for an 8-GPU pod
    assert set(new_nodes) < set(FAULT_NODES)
    for pod in again:
        assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
        assert failed_gpu not in assignment.all_device_ids()
    jobset = custom.get_namespaced_custom_object(*JOBSET, "healthy")
    assert jobset["spec"]["suspend"] is False
    assert not any(
        c["type"] in ("Failed", "Completed") and c["status"] == "True"
        for c in (jobset.get("status") or {}).get("conditions") or []
    )
    # the ClusterQueue's status follows the readmission (Kueue writes it after the Workload's)
    wait_for(
        "the queue to count the 16 GPUs again", lambda: _gpu_usage(plane, CHECKED_QUEUES[0]) == {GPU: "16"}
    )
    kueue.check_alive()
    print(
        f"JobSet healthy ran on {first_nodes}; GPU {failed_gpu} on {member.spec.node_name} failed;"
        f" requeued through Kueue and both pods bound again on {new_nodes} {back_s:.1f} s later"
        f" ({time.monotonic() - started:.1f} s for the test)"
    )


TAS_NODES = {
    "kq-t1": "e2e-kq-block-t1",
    "kq-t2": "e2e-kq-block-t1",
    "kq-t3": "e2e-kq-block-t2",
    "kq-t4": "e2e-kq-block-t2",
}
TAS_NODE_LABEL, TAS_FLAVOR, TAS_TOPOLOGY = "e2e.gpuweave.io/kueue-tas-node", "e2e-h100-tas", "e2e-blocks"
TAS_QUEUES = ("e2e-tas", "e2e-tas-queue")
HOSTNAME = "kubernetes.io/hostname"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"


def _tas_kueue_objects() -> list[dict[str, Any]]:
    """A Topology of layer-3 blocks over hosts, a TAS flavor on the four TAS nodes, and a ClusterQueue
    of 32 GPUs on it."""
    topology = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": TAS_TOPOLOGY},
        "spec": {"levels": [{"nodeLabel": LABEL_AWS_LAYER_3}, {"nodeLabel": HOSTNAME}]},
    }
    flavor = _flavor(TAS_FLAVOR, TAS_NODE_LABEL)
    flavor["spec"]["topologyName"] = TAS_TOPOLOGY
    return [topology, flavor, *_queues(*TAS_QUEUES, flavor=TAS_FLAVOR, resource=GPU, nominal=32)]


@pytest.fixture(scope="module")
def tas_queue(plane: ControlPlane, kueue: KueueCluster) -> Iterator[None]:
    with _queued_nodes(
        plane,
        TAS_NODES,
        node_label=TAS_NODE_LABEL,
        objects=_tas_kueue_objects(),
        cluster_queues=(TAS_QUEUES[0],),
    ):
        yield None


def test_kueue_topology_aware_scheduling_assigns_the_block_and_gpuweave_places_the_devices_there(
    plane: ControlPlane, kueue: KueueCluster, tas_queue: None
) -> None:
    custom = client.CustomObjectsApi(plane.api)
    # 1. Half of kq-t1's GPUs are taken by a pod outside Kueue (placed by the extender): block t1
    # cannot hold two 8-GPU pods any more, block t2 can.
    filler = {
        "metadata": {"name": "tas-filler"},
        "spec": _pod_spec(4, nodeSelector={HOSTNAME: "kq-t1"}, tolerations=[{**TAINT, "operator": "Equal"}]),
    }
    plane.core.create_namespaced_pod(NAMESPACE, filler)
    wait_for(
        "the filler pod to be bound",
        lambda: plane.core.read_namespaced_pod("tas-filler", NAMESPACE).spec.node_name == "kq-t1",
    )

    # 2. A JobSet of 2 x 8 GPUs asks Kueue for one layer-3 block: Kueue's TAS admits it into block t2
    # with one pod per host, its topology ungater gives each pod its host's node selector and lifts
    # the scheduling gate, and gpuweave picks each pod's 8 GPUs there (no gang planning of its own:
    # Kueue placed the gang).
    started = time.monotonic()
    jobset = _jobset("tas", TAS_QUEUES[1])
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"] = {"annotations": {REQUIRED_TOPOLOGY: LABEL_AWS_LAYER_3}}
    custom.create_namespaced_custom_object(*JOBSET, jobset)
    admitted = _wait_workload(
        plane, "JobSet", "tas", lambda w: _condition(w, "Admitted") == "True", "admitted"
    )
    [podset] = admitted["status"]["admission"]["podSetAssignments"]
    assert podset["topologyAssignment"], podset  # Kueue's TAS assigned the pods' domains

    def bound() -> list[Any] | None:
        kueue.check_alive()
        pods = _jobset_pods(plane, "tas")
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else None

    pods = wait_for("the TAS JobSet's 2 pods to be bound", bound, timeout=90)
    placed_s = time.monotonic() - started
    nodes = sorted(p.spec.node_name for p in pods)
    assert nodes == ["kq-t3", "kq-t4"]
    devices: set[str] = set()
    for pod in pods:
        assert pod.spec.node_selector[HOSTNAME] == pod.spec.node_name  # Kueue's ungater pinned its host
        assert not pod.spec.scheduling_gates
        assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
        assert assignment.node == pod.spec.node_name and len(assignment.all_device_ids()) == 8
        devices |= {f"{assignment.node}/{d}" for d in assignment.all_device_ids()}
    assert len(devices) == 16
    print(
        f"TAS JobSet admitted into block e2e-kq-block-t2 and bound to {nodes} {placed_s:.1f} s after creation"
    )


PRIORITY_NODE, PRIORITY_NODE_LABEL = "kq-q1", "e2e.gpuweave.io/kueue-priority-node"
PRIORITY_FLAVOR, PRIORITY_QUEUES = "e2e-h100-priority", ("e2e-prio", "e2e-prio-queue")


def _priority_kueue_objects() -> list[dict[str, Any]]:
    """Two WorkloadPriorityClasses and one ClusterQueue of 8 GPUs that preempts lower-priority
    Workloads of its own (``preemption.withinClusterQueue: LowerPriority``)."""
    classes = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in (("e2e-batch", 10), ("e2e-urgent", 1000))
    ]
    queues = _queues(
        *PRIORITY_QUEUES,
        flavor=PRIORITY_FLAVOR,
        resource=GPU,
        nominal=8,
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    return [*classes, _flavor(PRIORITY_FLAVOR, PRIORITY_NODE_LABEL), *queues]


@pytest.fixture(scope="module")
def priority_queue(plane: ControlPlane, kueue: KueueCluster) -> Iterator[None]:
    with _queued_nodes(
        plane,
        {PRIORITY_NODE: "e2e-kq-block-q"},
        node_label=PRIORITY_NODE_LABEL,
        objects=_priority_kueue_objects(),
        cluster_queues=(PRIORITY_QUEUES[0],),
    ):
        yield None


def test_a_higher_priority_job_preempts_through_kueue_within_its_cluster_queue_and_gets_the_gpus(
    plane: ControlPlane, kueue: KueueCluster, priority_queue: None
) -> None:
    batch = client.BatchV1Api(plane.api)
    gpus = {g.uuid for g in profile_inventory("dgx-h100", PRIORITY_NODE).gpus}
    batch.create_namespaced_job(
        NAMESPACE, _queued_job("batch", PRIORITY_QUEUES[1], priority_class="e2e-batch")
    )
    _wait_workload(plane, "Job", "batch", lambda w: _condition(w, "Admitted") == "True", "admitted")
    low_pod = _bound_pod_of(plane, "batch")
    low = PodAssignment.from_annotation(low_pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    assert low.node == PRIORITY_NODE and low.all_device_ids() == gpus

    # The urgent Job needs the queue's 8 GPUs: Kueue preempts the batch Workload (same
    # ClusterQueue, lower priority), its Job is suspended and its pod deleted, and the extender
    # binds the urgent pod to the GPUs the batch pod held.
    arrived = time.monotonic()
    batch.create_namespaced_job(
        NAMESPACE, _queued_job("urgent", PRIORITY_QUEUES[1], priority_class="e2e-urgent")
    )
    urgent = _wait_workload(plane, "Job", "urgent", lambda w: _condition(w, "Admitted") == "True", "admitted")
    assert urgent["spec"]["priority"] == 1000
    evicted = _wait_workload(
        plane, "Job", "batch", lambda w: _condition(w, "QuotaReserved") == "False", "without quota"
    )
    conditions = {c["type"]: c for c in evicted["status"]["conditions"]}
    assert conditions["Evicted"]["reason"] == "Preempted"
    assert conditions["Preempted"]["reason"] == "InClusterQueue"
    assert _job_suspended(batch, "batch") is True
    high_pod = _bound_pod_of(plane, "urgent")
    placed_s = time.monotonic() - arrived
    high = PodAssignment.from_annotation(high_pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    assert high.node == PRIORITY_NODE and high.all_device_ids() == gpus  # the GPUs the batch pod held
    assert not plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=batch").items
    kueue.check_alive()
    print(f"urgent Job preempted the batch Job through Kueue and was bound {placed_s:.1f} s after creation")


MIG_NODE, MIG_NODE_LABEL = "kq-m1", "e2e.gpuweave.io/kueue-mig-node"
MIG_FLAVOR, MIG_QUEUES = "e2e-a100-mig", ("e2e-mig", "e2e-mig-queue")
MIG = mig_resource_name("3g.40gb")


@pytest.fixture(scope="module")
def mig_queue(plane: ControlPlane, kueue: KueueCluster) -> Iterator[set[str]]:
    """``kq-m1``: two A100s in MIG mode, two 3g.40gb slices each (allocatable 4 of the MIG
    resource, as the node agent advertises it), and a ClusterQueue of 2 such slices."""
    inventory = small_inventory(gpus=2, mig_on=(0, 1), name=MIG_NODE)
    labels = {"kubernetes.io/hostname": MIG_NODE, MIG_NODE_LABEL: "true"}
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", MIG: str(len(inventory.mig_devices))}
    create_gpu_node(
        plane, inventory, labels=labels, taint=TAINT, resources=resources, message="e2e kueue mig node"
    )
    try:
        objects = [
            _flavor(MIG_FLAVOR, MIG_NODE_LABEL),
            *_queues(*MIG_QUEUES, flavor=MIG_FLAVOR, resource=MIG, nominal=2),
        ]
        plane.apply(objects)
        wait_for(
            "MIG ClusterQueue active",
            lambda: _condition(_cluster_queue(plane, MIG_QUEUES[0]), "Active") == "True",
        )
        yield {m.uuid for m in inventory.mig_devices}
    finally:
        _cleanup(plane)
        plane.core.delete_node(MIG_NODE)
        client.CustomObjectsApi(plane.api).delete_cluster_custom_object(*INVENTORIES, MIG_NODE)


def test_kueue_quota_on_a_mig_profile_admits_slices_and_gpuweave_places_each_on_its_own_slice(
    plane: ControlPlane, kueue: KueueCluster, mig_queue: set[str]
) -> None:
    batch = client.BatchV1Api(plane.api)
    for name in ("slice-a", "slice-b", "slice-c"):
        batch.create_namespaced_job(NAMESPACE, _queued_job(name, MIG_QUEUES[1], resource=MIG, count=1))
    held: dict[str, str] = {}
    for name in ("slice-a", "slice-b"):
        admitted = _wait_workload(
            plane, "Job", name, lambda w: _condition(w, "Admitted") == "True", "admitted"
        )
        [podset] = admitted["status"]["admission"]["podSetAssignments"]
        assert podset["flavors"] == {MIG: MIG_FLAVOR} and podset["resourceUsage"] == {MIG: "1"}
        pod = _bound_pod_of(plane, name)
        assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
        [device] = assignment.all_device_ids()
        assert assignment.node == MIG_NODE and device in mig_queue
        held[name] = device
    assert len(set(held.values())) == 2  # two slices, not one twice
    # The quota is 2 slices although the node has 4: the third Job waits for quota, not for devices.
    third = _wait_workload(
        plane, "Job", "slice-c", lambda w: _condition(w, "QuotaReserved") == "False", "pending"
    )
    reserved = next(c for c in third["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert MIG in reserved["message"]
    assert plane.core.list_namespaced_pod(NAMESPACE, label_selector="job-name=slice-c").items == []
    _succeed(plane, _bound_pod_of(plane, "slice-a"))
    _wait_workload(plane, "Job", "slice-c", lambda w: _condition(w, "Admitted") == "True", "admitted")
    pod = _bound_pod_of(plane, "slice-c")
    assignment = PodAssignment.from_annotation(pod.metadata.annotations[ANNOTATION_ASSIGNMENT])
    [device] = assignment.all_device_ids()
    assert device in mig_queue and device != held["slice-b"]  # never the slice a running pod holds
    print(f"MIG quota: {reserved['message']}; slices {held}, then {device}")
