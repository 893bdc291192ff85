"""Demand mode's Kubernetes side: watch pending pods, claim them on the pod, run the demand loop.

``gpuweave node-agent --kubeconfig K --mig-demand`` starts a ``DemandDriver``: a cluster-wide
watch of Pending pods (field selector ``status.phase=Pending``, relist on 410 Gone) kept as
``PendingPod`` values, and a thread that runs ``mig.demand_runner.DemandRunner`` on every pod or
label change and every ``interval_s`` (claims expire with time, not with events). Claims are
merge patches of the pod's annotations that carry the resourceVersion the node saw, so the API
server answers 409 Conflict to every node but the first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from deviceplugin.listwatch import WATCH_TIMEOUT_S, ListWatch
from mig.demand import (
    CLAIM_ANNOTATION,
    CLAIM_TIME_ANNOTATION,
    PendingPod,
    claim_annotations,
    claim_of,
    pod_requests,
)
from mig.demand_runner import DemandRunner
from mig.service import MigService
from topology.errors import GpuweaveError

LOG = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
DEMAND_INTERVAL_S = 10.0


class DemandClaimError(GpuweaveError):
    """The API server refused a claim or release for a reason other than a lost race."""


def _counts(resources: Any) -> dict[str, int]:
    """A container's requests (limits where no request is given, as for extended resources)."""
    if resources is None:
        return {}
    merged = {**(resources.limits or {}), **(resources.requests or {})}
    counts: dict[str, int] = {}
    for name, value in merged.items():
        try:
            counts[name] = int(str(value))
        except ValueError:
            continue  # cpu "500m", memory "1Gi": not a device count, and not ours
    return counts


def pending_pod_of(pod: Any) -> PendingPod:
    """A ``V1Pod`` as demand mode sees it."""
    metadata, spec, status = pod.metadata, pod.spec, pod.status
    conditions = (status.conditions if status is not None else None) or []
    unschedulable = any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions
    )
    return PendingPod(
        namespace=metadata.namespace or "",
        name=metadata.name or "",
        uid=metadata.uid or "",
        resource_version=metadata.resource_version or "",
        phase=(status.phase if status is not None else None) or "",
        unschedulable=unschedulable,
        node_name=(spec.node_name if spec is not None else None) or "",
        node_selector=dict((spec.node_selector if spec is not None else None) or {}),
        requests=pod_requests(
            [_counts(c.resources) for c in (spec.containers or [])] if spec is not None else [],
            [_counts(c.resources) for c in (spec.init_containers or [])] if spec is not None else [],
        ),
        claim=claim_of(metadata.annotations),
    )


class KubeClaims:
    """Claims as pod annotations, written with the pod's resourceVersion as a precondition."""

    def __init__(self, api: Any) -> None:
        self._core = kube_client.CoreV1Api(api)

    def claim(self, pod: PendingPod, *, node: str, now: float) -> bool:
        metadata = {
            "resourceVersion": pod.resource_version,
            "uid": pod.uid,
            "annotations": claim_annotations(node, now),
        }
        return self._patch(pod, metadata, what="claim")

    def release(self, pod: PendingPod, *, node: str) -> None:
        try:
            current = self._core.read_namespaced_pod(pod.name, pod.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise DemandClaimError(f"reading pod {pod.key} to release its claim: HTTP {exc.status}") from None
        meta = current.metadata
        claim = claim_of(meta.annotations if meta is not None else None)
        if meta is None or claim is None or claim.node != node:
            return
        metadata = {
            "resourceVersion": meta.resource_version,
            "annotations": {CLAIM_ANNOTATION: None, CLAIM_TIME_ANNOTATION: None},
        }
        self._patch(pod, metadata, what="release")  # a lost race leaves the claim to expire

    def _patch(self, pod: PendingPod, metadata: dict[str, Any], *, what: str) -> bool:
        try:
            self._core.patch_namespaced_pod(
                pod.name, pod.namespace, {"metadata": metadata}, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or changed since we saw it: another node won
                return False
            raise DemandClaimError(
                f"could not {what} MIG demand on pod {pod.key}: HTTP {exc.status} {exc.reason}; "
                "the node agent needs pods get/patch (manifests/rbac-node-agent-mig-demand.yaml)"
            ) from None
        return True


class PodCache:
    """Pending pods by UID, fed by the watch."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._pods: dict[str, PendingPod] = {}
        self._lock = threading.Lock()
        self._on_change = on_change

    def pods(self) -> list[PendingPod]:
        with self._lock:
            return list(self._pods.values())

    def replace(self, pods: Sequence[Any]) -> None:
        seen = {p.uid: p for p in (pending_pod_of(pod) for pod in pods)}
        with self._lock:
            self._pods = seen
        self._on_change()

    def event(self, kind: str, pod: Any) -> None:
        seen = pending_pod_of(pod)
        with self._lock:
            if kind == "DELETED" or seen.phase != "Pending":
                self._pods.pop(seen.uid, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._pods[seen.uid] = seen
        self._on_change()


class DemandDriver:
    """The pod watch and the demand loop thread of one node agent; ``stop`` ends both."""

    def __init__(
        self,
        api: Any,
        node_name: str,
        service: MigService,
        *,
        clock: Callable[[], float] = time.time,
        interval_s: float = DEMAND_INTERVAL_S,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._core = kube_client.CoreV1Api(api)
        self._runner = DemandRunner(service, KubeClaims(api), node=node_name, clock=clock)
        self._cache = PodCache(self.wake)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods = ListWatch(
            self._core.list_pod_for_all_namespaces,
            on_list=self._cache.replace,
            on_event=self._cache.event,
            what="pending pods",
            timeout_s=timeout_s,
            field_selector="status.phase=Pending",
        )

    def wake(self) -> None:
        self._wake.set()

    def start(self, *, labels: Callable[[], dict[str, str]]) -> None:
        self._threads = [
            threading.Thread(target=self._pods.run, name="mig-demand-pods", daemon=True),
            threading.Thread(target=self._loop, args=(labels,), name="mig-demand", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pods.stop()
        for thread in self._threads:
            thread.join(timeout=self._timeout_s + 10)

    def _loop(self, labels: Callable[[], dict[str, str]]) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._runner.run_once(self._cache.pods(), labels())
            except Exception as exc:  # the API server or NVML failed; the next round retries
                LOG.warning("MIG demand round failed: %s", exc)
