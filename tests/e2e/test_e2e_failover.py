"""Two extender replicas, one active: the one that holds the Lease runs the Kueue admission check
controller; killed, the other takes over within the lease duration and nothing is written twice.

The real Kueue controller manager, the Job controller, a kube-scheduler (profile
``gpuweave-failover-scheduler``) and two ``gpuweave extender`` processes under the
gpuweave-scheduler service account, sharing the Lease ``gpuweave-system/gpuweave-e2e-failover``
(4 s, renewed every second). Replica A starts first and leads; kube-scheduler calls replica B,
as a scheduler whose own leader is in the other pod would: B serves filter and bind as a
standby, A writes the Workloads' check state. Two Nodes of 8 H100 GPUs (objects only: bound pods
stay Pending), reachable only through the queue's ResourceFlavor, and a ClusterQueue of 16 GPUs
that asks for gpuweave's AdmissionCheck.
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

from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from gpuweave.simulate.cluster_objects import profile_inventory
from scheduler_ext.kueue.checks import CONTROLLER_NAME
from tests.e2e.cluster import (
    NAMESPACE as GPUWEAVE_NAMESPACE,
)
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    delete_jobs_and_pods,
    queueing_crds,
    render_scheduler_config,
    start_controllers,
    start_extender,
    start_kueue,
    start_scheduler,
    wait_for,
)
from tests.e2e.conftest import own_plane_fixtures
from tests.e2e.gpu_nodes import INVENTORIES, create_gpu_node
from tests.e2e.pods import GPU

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-failover"
SCHEDULER = "gpuweave-failover-scheduler"
NODES = ("fo-1", "fo-2")
NODE_LABEL = "e2e.gpuweave.io/failover-node"
TAINT = {"key": "e2e.gpuweave.io/failover-tests", "value": "only", "effect": "NoSchedule"}
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "e2e-failover-h100", "e2e-failover", "e2e-failover-queue"
CHECK = "gpuweave-gpu-health"  # the name the admission policy lets the extender write
KUEUE = ("kueue.x-k8s.io", "v1beta2")
LEASE, DURATION_S, RETRY_S = "gpuweave-e2e-failover", 4, 1


# every extender of a cluster answers its Kueue checks: this module's replicas must be the only ones
plane, scheduler_kubeconfig = own_plane_fixtures("e2e-failover")


def _lease_args(identity: str) -> tuple[str, ...]:
    return (
        *("--leader-elect-namespace", GPUWEAVE_NAMESPACE, "--leader-elect-name", LEASE),
        *("--leader-elect-identity", identity),
        *("--leader-elect-lease-duration", str(DURATION_S), "--leader-elect-retry-period", str(RETRY_S)),
        *("--log-level", "INFO"),
    )


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


LEADER = "gpuweave_extender_leader"
BECAME_LEADER = 'gpuweave_extender_leader_transitions_total{to="leader"}'
CHECK_WRITES = 'gpuweave_extender_controller_writes_total{controller="kueue-check"}'


def _kueue_objects() -> list[dict[str, Any]]:
    quota = {"name": GPU, "nominalQuota": 16}
    groups = [{"coveredResources": [GPU], "flavors": [{"name": FLAVOR, "resources": [quota]}]}]
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {"controllerName": CONTROLLER_NAME},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": {NODE_LABEL: "true"}, "tolerations": [{**TAINT, "operator": "Equal"}]},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": groups,
                "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


def _job(name: str) -> dict[str, Any]:
    """A batch/v1 Job of one 8-GPU pod, queued as Kueue's webhook would leave it (suspended)."""
    limits = {GPU: "8"}
    container = {"name": "main", "image": "e2e/none", "resources": {"limits": limits, "requests": limits}}
    pod = {
        "schedulerName": SCHEDULER,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE},
        },
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"spec": pod},
        },
    }


class Replicas:
    """Kueue, the Job controller, replicas A and B, and the kube-scheduler that calls B."""

    def __init__(self, plane: ControlPlane, kubeconfig: Path) -> None:
        self.processes: list[Process] = [
            start_controllers(plane, jobs=True),
            start_kueue(plane, name="kueue-fo"),
        ]
        self.a, self.url_a = start_extender(
            plane, kubeconfig=kubeconfig, name="extender-fo-a", extra_args=_lease_args("replica-a")
        )
        self.processes.append(self.a)
        wait_for("replica A to lead", lambda: _metric(self.url_a, LEADER) == 1.0, timeout=30)
        self.b, self.url_b = start_extender(  # Ready while it stands by: /readyz answered
            plane, kubeconfig=kubeconfig, name="extender-fo-b", extra_args=_lease_args("replica-b")
        )
        self.processes.append(self.b)
        config = render_scheduler_config(
            plane, extender_url=self.url_b, kubeconfig=kubeconfig, scheduler_name=SCHEDULER
        )
        self.processes.append(start_scheduler(plane, config_path=config, name="failover-kube-scheduler"))

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture(scope="module")
def replicas(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[Replicas]:
    plane.ensure_namespace(NAMESPACE)
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"}
    for name in NODES:
        labels = {"kubernetes.io/hostname": name, NODE_LABEL: "true"}
        inventory = profile_inventory("dgx-h100", name)
        create_gpu_node(
            plane, inventory, labels=labels, taint=TAINT, resources=resources, message="e2e failover"
        )
    plane.apply(queueing_crds())
    running = Replicas(plane, scheduler_kubeconfig)
    try:
        plane.apply(_kueue_objects())
        yield running
    finally:
        _cleanup(plane)
        running.stop()
        custom = client.CustomObjectsApi(plane.api)
        for name in NODES:
            plane.core.delete_node(name)
            custom.delete_cluster_custom_object(*INVENTORIES, name)
        client.CoordinationV1Api(plane.api).delete_namespaced_lease(LEASE, GPUWEAVE_NAMESPACE)


def _cleanup(plane: ControlPlane) -> None:
    delete_jobs_and_pods(plane, NAMESPACE)


def _lease(plane: ControlPlane) -> Any:
    return client.CoordinationV1Api(plane.api).read_namespaced_lease(LEASE, GPUWEAVE_NAMESPACE).spec


def _placed(plane: ControlPlane, replicas: Replicas, job: str) -> Any:
    """Submit ``job``; once Kueue admitted it on gpuweave's Ready check, its pod is bound with an
    assignment by replica B's kube-scheduler."""
    client.BatchV1Api(plane.api).create_namespaced_job(NAMESPACE, _job(job))

    def admitted() -> dict[str, Any] | None:
        items = client.CustomObjectsApi(plane.api).list_namespaced_custom_object(
            *KUEUE, NAMESPACE, "workloads"
        )
        for workload in items["items"]:
            owners = workload["metadata"].get("ownerReferences") or []
            conditions = (workload.get("status") or {}).get("conditions") or []
            if any(o["name"] == job for o in owners) and any(
                c["type"] == "Admitted" and c["status"] == "True" for c in conditions
            ):
                return dict(workload)
        return None

    workload = wait_for(f"Job {job}'s Workload admitted", admitted, timeout=60)
    check = next(c for c in workload["status"]["admissionChecks"] if c["name"] == CHECK)
    assert check["state"] == "Ready", check

    def bound() -> Any:
        for process in replicas.processes:
            if process is not replicas.a:
                process.check_alive()
        pods = plane.core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={job}").items
        return pods[0] if len(pods) == 1 and pods[0].spec.node_name else None

    pod = wait_for(f"Job {job}'s pod bound", bound, timeout=90)
    assert ANNOTATION_ASSIGNMENT in (pod.metadata.annotations or {})
    return pod


def _leader_events(plane: ControlPlane) -> list[str]:
    events = plane.core.list_namespaced_event(
        GPUWEAVE_NAMESPACE, field_selector=f"involvedObject.name={LEASE},reason=LeaderElection"
    ).items
    return [e.message for e in sorted(events, key=lambda e: (e.first_timestamp, e.metadata.name))]


def test_the_standby_takes_over_within_the_lease_and_nothing_is_written_twice(
    plane: ControlPlane, replicas: Replicas
) -> None:
    # 1. A leads and writes the check; B, Ready, serves kube-scheduler's filter and bind but
    # writes nothing to Kueue.
    assert _lease(plane).holder_identity == "replica-a"
    first = _placed(plane, replicas, "before-failover")
    writes_a = _metric(replicas.url_a, CHECK_WRITES)
    assert writes_a >= 1  # the Workload's check Ready (and the AdmissionCheck Active, unless it was)
    assert _metric(replicas.url_b, LEADER) == 0.0
    assert _metric(replicas.url_b, BECAME_LEADER) == 0.0
    assert _metric(replicas.url_b, CHECK_WRITES) == 0.0

    # 2. A dies without giving the Lease up; B takes it once A's last renewal is a lease duration
    # old by B's clock: never sooner than DURATION - RETRY after the kill (A may have renewed up to
    # a retry period before it; sooner would mean two leaders), and by the rules within DURATION +
    # 2 * RETRY, here given twice that for a loaded machine's scheduling delays.
    replicas.a.popen.kill()
    replicas.a.popen.wait()
    killed = time.monotonic()
    wait_for("replica B to hold the Lease", lambda: _lease(plane).holder_identity == "replica-b", every=0.05)
    takeover_s = time.monotonic() - killed
    assert DURATION_S - RETRY_S - 0.25 <= takeover_s <= 2 * (DURATION_S + 2 * RETRY_S), takeover_s
    wait_for("replica B to lead", lambda: _metric(replicas.url_b, LEADER) == 1.0, timeout=10)
    assert _lease(plane).lease_transitions == 1

    # 3. Pods keep being placed: a Job submitted now is checked by B and placed through B.
    second = _placed(plane, replicas, "after-failover")
    assert {first.spec.node_name, second.spec.node_name} == set(NODES)
    assert _metric(replicas.url_b, CHECK_WRITES) >= 1
    assert _metric(replicas.url_b, BECAME_LEADER) == 1.0
    assert _leader_events(plane) == ["replica-a became leader", "replica-b became leader"]

    # 4. B stops cleanly: it gives the Lease up at once, for the next replica.
    replicas.b.stop()
    assert _lease(plane).holder_identity in ("", None)
    assert _leader_events(plane)[-1] == "replica-b stopped leading"
    print(f"replica B took over {takeover_s:.2f} s after replica A was killed (lease {DURATION_S} s)")
