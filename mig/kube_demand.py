"""Demand mode's Kubernetes side: watch pending pods, claim them on the pod, run the demand loop.

``gpuweave node-agent --kubeconfig K --mig-demand`` starts a ``DemandDriver``: a cluster-wide
``kubeio.listwatch.ListWatch`` of Pending pods (field selector ``status.phase=Pending``) kept as
``PendingPod`` values, and a thread that runs ``mig.demand_runner.DemandRunner`` on every pod or
label change and every ``interval_s`` (claims expire with time, not with events). Pods arrive as
raw JSON; a pod that leaves Pending, or vanished while the watch was away (the 410 relist hands it
on as DELETED), leaves the cache. Claims are merge patches of the pod's annotations that carry the
resourceVersion the node saw, so the API server answers 409 Conflict to every node but the first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import mig_profile_of_resource
from kubeio.errors import LOST_RACE, api_error, status_of
from kubeio.listwatch import WATCH_TIMEOUT_S, ListWatch, metadata_only
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

LOG = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
DEMAND_INTERVAL_S = 10.0
RBAC_HINT = "the node agent needs pods get/patch (manifests/rbac-node-agent-mig-demand.yaml)"


MAX_MIG_REQUEST = 10**4  # past any node's MIG instances (256 GPUs x 7); a count beyond is no request


def _counts(resources: Mapping[str, Any] | None, *, pod: str) -> dict[str, int]:
    """A container's requests (limits where no request is given, as for extended resources).

    A ``nvidia.com/mig-*`` value that is not a whole count in 0..MAX_MIG_REQUEST is left out with a
    log line naming the pod; other resources that are not counts (cpu "500m") are not ours."""
    if not resources:
        return {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    counts: dict[str, int] = {}
    for name, value in merged.items():
        text = str(value)[:40]
        mig = mig_profile_of_resource(str(name)) is not None
        count = int(text) if text.isdecimal() and text.isascii() else None
        if count is not None and (count <= MAX_MIG_REQUEST or not mig):
            counts[name] = count
        elif mig:
            LOG.warning(
                "pod %s: %s request %r is not a whole count in 0..%d; its MIG demand is left out "
                "(fix the pod's resources)",
                pod,
                name,
                text,
                MAX_MIG_REQUEST,
            )
    return counts


def _unschedulable(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def pending_pod_of(pod: Mapping[str, Any]) -> PendingPod:
    """A Pod (raw JSON, as the watch delivers it) as demand mode sees it."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    key = f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"
    return PendingPod(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        phase=str(status.get("phase") or ""),
        unschedulable=_unschedulable(status),
        node_name=str(spec.get("nodeName") or ""),
        node_selector=dict(spec.get("nodeSelector") or {}),
        requests=pod_requests(
            [_counts(c.get("resources"), pod=key) for c in spec.get("containers") or []],
            [_counts(c.get("resources"), pod=key) for c in spec.get("initContainers") or []],
        ),
        claim=claim_of(metadata.get("annotations")),
    )


class KubeClaims:
    """Claims as pod annotations, written with the pod's resourceVersion as a precondition."""

    def __init__(self, api: kube_client.ApiClient) -> None:
        self._core = kube_client.CoreV1Api(api)

    def claim(self, pod: PendingPod, *, node: str, now: float) -> bool:
        metadata = {
            "resourceVersion": pod.resource_version,
            "uid": pod.uid,
            "annotations": claim_annotations(node, now),
        }
        return self._patch(pod, metadata, what="claiming")

    def release(self, pod: PendingPod, *, node: str) -> None:
        try:
            response: Any = self._core.read_namespaced_pod(pod.name, pod.namespace, _preload_content=False)
        except ApiException as exc:
            if status_of(exc) in LOST_RACE:  # gone: nothing left to release
                return
            raise api_error(
                exc, doing=f"reading pod {pod.key} to release its MIG claim", hint=RBAC_HINT
            ) from None
        metadata = orjson.loads(response.data).get("metadata") or {}
        claim = claim_of(metadata.get("annotations"))
        if claim is None or claim.node != node:
            return
        patch = {
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": {CLAIM_ANNOTATION: None, CLAIM_TIME_ANNOTATION: None},
        }
        self._patch(pod, patch, what="releasing")  # a lost race leaves the claim to expire

    def _patch(self, pod: PendingPod, metadata: dict[str, Any], *, what: str) -> bool:
        """False when the pod is gone or changed since this node saw it: another node won."""
        try:
            self._core.patch_namespaced_pod(
                pod.name, pod.namespace, {"metadata": metadata}, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if status_of(exc) in LOST_RACE:
                return False
            raise api_error(exc, doing=f"{what} MIG demand on pod {pod.key}", hint=RBAC_HINT) from None
        return True


class PodCache:
    """Pending pods by UID, fed by the watch's events (a relist's included)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._pods: dict[str, PendingPod] = {}
        self._lock = threading.Lock()
        self._on_change = on_change

    def pods(self) -> list[PendingPod]:
        with self._lock:
            return list(self._pods.values())

    def event(self, kind: str, pod: Mapping[str, Any]) -> None:
        seen = pending_pod_of(pod)
        with self._lock:
            if kind == "DELETED" or seen.phase != "Pending":
                self._pods.pop(seen.uid, None)
            else:
                self._pods[seen.uid] = seen
        self._on_change()


class DemandDriver:
    """The pod watch and the demand loop thread of one node agent; ``stop`` ends both."""

    def __init__(
        self,
        api: kube_client.ApiClient,
        node_name: str,
        service: MigService,
        *,
        clock: Callable[[], float] = time.time,
        interval_s: float = DEMAND_INTERVAL_S,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self._runner = DemandRunner(service, KubeClaims(api), node=node_name, clock=clock)
        self._cache = PodCache(self.wake)
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pods = ListWatch(
            kube_client.CoreV1Api(api).list_pod_for_all_namespaces,
            on_event=self._cache.event,
            on_synced=self.wake,
            what="pending pods",
            timeout_s=timeout_s,
            remember=metadata_only,  # a DELETED needs only the pod's UID: pending pods cluster-wide add up
            field_selector="status.phase=Pending",
        )

    def wake(self) -> None:
        self._wake.set()

    def start(self, *, labels: Callable[[], dict[str, str]]) -> None:
        self._thread = threading.Thread(target=self._loop, args=(labels,), name="mig-demand", daemon=True)
        self._thread.start()
        self.pods.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.pods.stop()
        if self._thread is not None:
            self._thread.join(timeout=self._interval_s + 10)

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
