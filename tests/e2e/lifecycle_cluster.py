"""A cluster of its own for the node-lifecycle tests: Karpenter's real controllers (kwok
provider) make the GPU nodes, every node runs the kubelet side and our simulated node agent,
gpuweave-scheduler places the pods, the Job controller runs Jobs, and ``gpuweave lifecycle``
(its own service account, manifests/lifecycle/rbac.yaml) hands broken nodes to Karpenter and asks
it for capacity with CapacityBuffers.

Its own control plane: Karpenter and the lifecycle controller look at every Node and pending Pod
of the cluster, so the session's nodes and pods must not be in their sight.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e import karpenter as kp
from tests.e2e.cluster import (
    ControlPlane,
    Process,
    gpuweave_command,
    render_scheduler_config,
    start_controllers,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.support.control_plane import REPO

NAMESPACE = "e2e-lifecycle"
POOL_TAINT = {"key": "e2e.gpuweave.io/karpenter", "value": "only", "effect": "NoSchedule"}
STARTUP_TAINT = {"key": "gpuweave.io/health-pending", "effect": "NoSchedule"}
TOLERATIONS = [{"key": POOL_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
BLOCKS = ("e2e-block-a", "e2e-block-b")
EVICTION_GRACE_S = 3


class LifecycleCluster:
    """The processes above; ``stop`` ends them in reverse order."""

    def __init__(
        self,
        work: Path,
        *,
        pools: Sequence[Mapping[str, Any]],
        lifecycle_args: Sequence[str],
        agent_args: Mapping[str, tuple[str, ...]] | None = None,
        manifests: Sequence[str] = (),
    ) -> None:
        """``agent_args``: NodePool -> extra node-agent arguments of its machines; ``manifests``:
        files under manifests/ applied besides the base and the lifecycle RBAC."""
        self.plane = ControlPlane(work)
        self._stack: list[Any] = [self.plane]
        self.agent_args = dict(agent_args or {})
        try:
            self._start(pools, lifecycle_args, manifests)
        except BaseException:
            self.stop()
            raise

    def _start(
        self, pools: Sequence[Mapping[str, Any]], lifecycle_args: Sequence[str], manifests: Sequence[str]
    ) -> None:
        plane = self.plane
        plane.apply(plane.kustomize(REPO / "manifests"))
        plane.apply(kp.karpenter_crds())
        for name in ("lifecycle/rbac.yaml", *manifests):
            plane.apply([d for d in yaml.safe_load_all((REPO / "manifests" / name).read_text()) if d])
        plane.ensure_namespace(NAMESPACE)
        self.custom = client.CustomObjectsApi(plane.api)
        self.custom.create_cluster_custom_object(*kp.NODECLASSES, kp.node_class())
        for pool in pools:
            self.custom.create_cluster_custom_object(*kp.NODEPOOLS, dict(pool))
        self.karpenter = self._push(kp.start_karpenter(plane, blocks=BLOCKS))
        for pool in pools:
            kp.wait_pool_ready(plane, pool["metadata"]["name"], self.karpenter)
        scheduler_kubeconfig = plane.service_account_kubeconfig("gpuweave-scheduler")
        extender, url = start_extender(
            plane, kubeconfig=scheduler_kubeconfig, extra_args=("--gang-ttl", "60")
        )
        self._push(extender)
        config = render_scheduler_config(plane, extender_url=url, kubeconfig=scheduler_kubeconfig)
        self._push(start_scheduler(plane, config_path=config))
        self._push(start_controllers(plane, jobs=True))
        health = plane.work / "health.yaml"
        settings = {"round_interval_s": 1, "startup_rounds": 1, "eviction_grace_s": EVICTION_GRACE_S}
        health.write_text(yaml.safe_dump({"health": settings}))
        self.machines = self._push(
            kp.KwokMachines(
                plane,
                agent_kubeconfig=plane.service_account_kubeconfig("gpuweave-node-agent"),
                health_config=health,
                agent_args=self.agent_args,
            )
        )
        lifecycle_kubeconfig = plane.service_account_kubeconfig("gpuweave-lifecycle")
        argv = [
            *gpuweave_command(),
            "--log-level",
            "INFO",
            "lifecycle",
            "--kubeconfig",
            str(lifecycle_kubeconfig),
        ]
        self.lifecycle = self._push(
            Process("lifecycle", [*argv, "--interval", "1", *lifecycle_args], log_dir=plane.work)
        )

    def _push(self, thing: Any) -> Any:
        self._stack.append(thing)
        return thing

    def check(self) -> None:
        self.karpenter.check_alive()
        self.lifecycle.check_alive()
        self.machines.check()

    def stop(self) -> None:
        while self._stack:
            self._stack.pop().stop()

    # --- objects ----------------------------------------------------------------------------------

    def create_job(
        self,
        name: str,
        *,
        members: int,
        limits: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, str]] = TOLERATIONS,
        node_selector: Mapping[str, str] | None = None,
    ) -> None:
        """An Indexed Job of ``members`` pods, each with ``limits``, as a training gang or a batch
        of small jobs runs; an eviction (the pod's DisruptionTarget condition) is not counted as a
        failure."""
        template = {
            "metadata": {"annotations": dict(annotations or {})},
            "spec": {
                "schedulerName": "gpuweave-scheduler",
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "tolerations": [dict(t) for t in tolerations],
                "nodeSelector": dict(node_selector or {}),
                "containers": [{"name": "worker", "image": "trainer", "resources": {"limits": dict(limits)}}],
            },
        }
        job: Any = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "completions": members,
                "parallelism": members,
                "completionMode": "Indexed",
                "backoffLimit": 6,
                "podFailurePolicy": {
                    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
                },
                "template": template,
            },
        }
        client.BatchV1Api(self.plane.api).create_namespaced_job(NAMESPACE, job)

    def job_pods(self, job: str) -> list[Any]:
        pods = self.plane.core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={job}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def running(self, pods: Sequence[Any]) -> bool:
        return all(p.status.phase == "Running" for p in pods)

    def wait_job_running(self, job: str, members: int, *, timeout: float = 180) -> list[Any]:
        def check() -> list[Any] | None:
            self.check()
            pods = self.job_pods(job)
            return pods if len(pods) == members and self.running(pods) else None

        pods: list[Any] = wait_for(f"Job {job}'s {members} pods Running", check, timeout=timeout)
        return pods


class Clock:
    """Seconds since a start, by name: the phases a test times."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> float:
        self.marks.setdefault(name, round(time.monotonic() - self.start, 2))
        return self.marks[name]


def node_condition(node: Any, kind: str) -> Any | None:
    return next((c for c in node.status.conditions or [] if c.type == kind), None)


def read_node(plane: ControlPlane, name: str) -> Any | None:
    try:
        return plane.core.read_node(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
