"""Cluster mode: list+watch Nodes, GpuNodeInventory objects and Pods; bind through the API.

Each kind runs one ``kubeio.listwatch.ListWatch`` (resume after a watch timeout, relist only on
410 Gone with a synthesised DELETED for whatever vanished, so a missed delete cannot leave a
phantom holding). The cache counts as synced (``/readyz``) once every kind's first list is in.
Bind is one API call: the Binding carries the assignment annotation, which kube-apiserver writes
onto the pod in the same update as spec.nodeName, under the pod's UID as a precondition; a
refused Binding changes nothing, so there is nothing to roll back. Decision Events on pods
(``events``) are written as core/v1 Events by ``KubeEventSink`` on the event writer thread.
The controllers (Kueue checks, the GpuPreflight sweep) act only while this replica holds the
extender's Lease (``scheduler_ext.leader``); each change of leadership is logged, counted and
written as an Event on the Lease (``LeaderReporter``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    API_GROUP,
    API_VERSION,
    LABEL_PREFLIGHT,
    NODE_INVENTORY_KIND,
    NODE_INVENTORY_PLURAL,
)
from devicemodel.gangs import POD_GROUP_GROUP, POD_GROUP_PLURAL, POD_GROUP_VERSION
from kubeio.client import Writer, api_client, finish
from kubeio.errors import KubeApiError, describe, status_of
from kubeio.lease import LeaseElector
from kubeio.listwatch import ListWatch, metadata_only
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import pod_disrupted, pod_preempted
from scheduler_ext.gangs.service import GangSettings, PodGroupSizes
from scheduler_ext.kueue.controller import KueueChecks
from scheduler_ext.leader import AlwaysLeading, LeaderLoop, Leadership, LeaseSettings, Transition
from scheduler_ext.preflight.book import PreflightBook, PreflightSettings
from scheduler_ext.preflight.kube import KubePreflights
from scheduler_ext.serving.events import PodEvent
from scheduler_ext.serving.service import BindError
from topology.fragmentation import TargetWorkload

LOG = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 240
EVENT_COMPONENT = "gpuweave-extender"

Handler = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class WatchedKind:
    """One kind to mirror: how to list it, and what to do with each object."""

    name: str
    list_call: Callable[..., Any]
    apply: Handler  # (event type ADDED/MODIFIED/DELETED, object)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def list_calls(api: client.ApiClient) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """(plural, kind, list call) of each kind the extender mirrors, nodes before the pods that
    hold their devices; ``gpuweave status`` lists the same kinds with the same calls."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def list_inventories(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL, **kwargs)

    return (
        ("nodes", "Node", core.list_node),
        ("gpunodeinventories", NODE_INVENTORY_KIND, list_inventories),
        ("pods", "Pod", core.list_pod_for_all_namespaces),
    )


def watched_kinds(cache: ClusterCache, api: client.ApiClient) -> tuple[WatchedKind, ...]:
    def on_node(kind: str, obj: Mapping[str, Any]) -> None:
        cache.delete_node(_name(obj)) if kind == "DELETED" else cache.upsert_node(obj)

    def on_inventory(kind: str, obj: Mapping[str, Any]) -> None:
        cache.delete_inventory(_name(obj)) if kind == "DELETED" else cache.upsert_inventory(obj)

    def on_pod(kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":  # the deleted object says whether an eviction or preemption ended it
            cache.delete_pod(_uid(obj), disrupted=pod_disrupted(obj), preempted=pod_preempted(obj))
        else:
            cache.upsert_pod(obj)

    handlers: dict[str, Handler] = {"nodes": on_node, "gpunodeinventories": on_inventory, "pods": on_pod}
    return tuple(WatchedKind(name, call, handlers[name]) for name, _, call in list_calls(api))


class KubeBinder:
    """One Binding per pod; it carries the assignment annotation and the pod's UID as a precondition."""

    def __init__(self, api: client.ApiClient) -> None:
        self._writer = Writer(api)

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None:
        """kube-apiserver copies the Binding's annotations onto the pod in the update that sets
        spec.nodeName, so the pod is bound with its devices recorded, or not at all; a pod
        re-created under the same name (another UID) is refused with 409 Conflict."""
        metadata = pod.get("metadata") or {}
        name, namespace = str(metadata.get("name")), str(metadata.get("namespace") or "default")
        annotations = {ANNOTATION_ASSIGNMENT: assignment.to_annotation()} if assignment is not None else None
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if metadata.get("uid"):
            meta["uid"] = str(metadata["uid"])
        if annotations is not None:
            meta["annotations"] = annotations
        body: Any = {  # a plain dict: the client sends it as is (no model walk per bind)
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self._writer.post(
                f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding", body
            )
        except (ApiException, HTTPError) as exc:
            raise BindError(
                f"binding pod {namespace}/{name} to node {node} failed: {describe(exc)}"
            ) from None


class KubeEventSink:
    """Writes each decision Event as a core/v1 Event on the pod (``kubectl describe pod`` shows it).

    Called on the event writer thread only (``events.EventRecorder``), never on a request."""

    def __init__(self, api: client.ApiClient, *, instance: str | None = None) -> None:
        self._writer = Writer(api)
        self._instance = instance or socket.gethostname()

    def __call__(self, event: PodEvent) -> None:
        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {  # a plain dict: the client sends it as is
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{event.name}.{time.time_ns():x}", "namespace": event.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": event.name,
                "namespace": event.namespace,
                "uid": event.uid or None,
            },
            "reason": event.reason,
            "message": event.message,
            "type": event.type,
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._writer.post(f"/api/v1/namespaces/{quote(event.namespace, safe='')}/events", body)
        except (ApiException, HTTPError) as exc:
            raise KubeApiError(
                f"writing Event {event.reason} on pod {event.namespace}/{event.name} failed: {describe(exc)}",
                status=status_of(exc),
            ) from None


def pod_group_kind(api: client.ApiClient, sizes: PodGroupSizes) -> WatchedKind | None:
    """The scheduler-plugins PodGroups (``scheduling.x-k8s.io/v1alpha1``), when the API serves
    them: checked once at start with one list call. Without the CRD (404) or without the right
    to list them (403), pods labelled with a pod group need ``gpuweave.io/gang-size``."""
    custom = client.CustomObjectsApi(api)

    def list_pod_groups(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(
            POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL, **kwargs
        )

    try:
        finish(list_pod_groups(limit=1, _preload_content=False))
    except (ApiException, HTTPError) as exc:
        LOG.info("not watching PodGroups (%s): their pods need %s", describe(exc), "gpuweave.io/gang-size")
        return None
    return WatchedKind("podgroups", list_pod_groups, sizes.apply)


DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"


def dra_kinds(cache: ClusterCache, api: client.ApiClient) -> tuple[WatchedKind, ...]:
    """ResourceSlices (of every driver; the book keeps gpuweave.io's) and ResourceClaims, for the
    ``prioritize-claims`` scores, when the API serves ``resource.k8s.io/v1`` and lets the
    extender list them: checked once at start. Otherwise claim pods score 0 everywhere."""
    custom = client.CustomObjectsApi(api)

    def lister(plural: str) -> Callable[..., Any]:
        def list_call(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, plural, **kwargs)

        return list_call

    claims = cache.claims

    def on_slice(kind: str, obj: Mapping[str, Any]) -> None:
        claims.delete_slice(obj) if kind == "DELETED" else claims.upsert_slice(obj)

    def on_claim(kind: str, obj: Mapping[str, Any]) -> None:
        claims.delete_claim(obj) if kind == "DELETED" else claims.upsert_claim(obj)

    kinds = (
        WatchedKind("resourceslices", lister("resourceslices"), on_slice),
        WatchedKind("resourceclaims", lister("resourceclaims"), on_claim),
    )
    for kind in kinds:
        try:
            finish(kind.list_call(limit=1, _preload_content=False))
        except (ApiException, HTTPError) as exc:
            LOG.info("not watching %s (%s): ResourceClaim pods are not scored", kind.name, describe(exc))
            return ()
    return kinds


class KubeFeed:
    """The watcher threads of one extender; ``stop`` ends them."""

    def __init__(
        self,
        cache: ClusterCache,
        api: client.ApiClient,
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        pod_groups: PodGroupSizes | None = None,
    ) -> None:
        self._halt = threading.Event()
        self._api = api
        kinds = (*dra_kinds(cache, api), *watched_kinds(cache, api))
        if pod_groups is not None and (groups := pod_group_kind(api, pod_groups)) is not None:
            kinds = (groups, *kinds)  # sizes known before the pods that name them
        remaining = [len(kinds)]
        lock = threading.Lock()

        def first_list_done() -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    cache.synced.set()

        self.watchers = [
            ListWatch(
                k.list_call,
                on_event=k.apply,
                what=k.name,
                timeout_s=watch_timeout_s,
                on_synced=first_list_done,
                # every handler's DELETED reads only the name or UID; a pod's also reads the status a
                # watched delete carries (a synthesised one has none: the last update's counts)
                remember=metadata_only,
            )
            for k in kinds
        ]

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop(join_s=1)  # stop shuts the open watch connection: no wait for its timeout
        self._api.close()  # type: ignore[no-untyped-call]


def _preflights(
    api: client.ApiClient, cache: ClusterCache, settings: PreflightSettings, *, leader: Leadership
) -> KubePreflights | None:
    """Gang preflights through ``GpuPreflight`` objects (``--gang-preflight agent``), started; None
    when off. A node is asked only while it carries ``gpuweave.io/preflight=agent`` (its agent
    serves them); stale objects are swept by the replica that leads."""
    if settings.check == "off":
        return None
    port = KubePreflights(api, checks=settings.checks, leader=leader, timeout_s=settings.timeout_s)
    port.book = PreflightBook(
        port,
        serves=lambda node: cache.node_labels().get(node, {}).get(LABEL_PREFLIGHT) == "agent",
        fresh_s=settings.fresh_s,
        timeout_s=settings.timeout_s,
        avoid_s=settings.avoid_s,
    )
    port.start()
    return port


class LeaderReporter:
    """What a change of leadership leaves behind: a WARNING log line, and a core/v1 Event on the
    Lease (reason ``LeaderElection``, as kube-scheduler's), from the leader loop's thread."""

    def __init__(self, api: client.ApiClient, lease: LeaseSettings) -> None:
        self._writer = Writer(api)
        self._lease = lease

    def __call__(self, change: Transition) -> None:
        lease = self._lease
        where = f"Lease {lease.namespace}/{lease.name}"
        if change is Transition.ACQUIRED:
            message = f"{lease.identity} became leader"
            LOG.warning(
                "%s: %s; the Kueue check controller and the GpuPreflight sweep run here", where, message
            )
        else:
            message = f"{lease.identity} stopped leading"
            LOG.warning("%s: %s; its controllers stand by", where, message)
        self._event(message)

    def _event(self, message: str) -> None:
        lease = self._lease
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{lease.name}.{time.time_ns():x}", "namespace": lease.namespace},
            "involvedObject": {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "name": lease.name,
                "namespace": lease.namespace,
            },
            "reason": "LeaderElection",
            "message": message,
            "type": "Normal",
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": lease.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._writer.post(f"/api/v1/namespaces/{quote(lease.namespace, safe='')}/events", body)
        except (ApiException, HTTPError) as exc:
            LOG.info("no LeaderElection Event on %s/%s: %s", lease.namespace, lease.name, describe(exc))


def leader_loop(api: client.ApiClient, lease: LeaseSettings) -> LeaderLoop | None:
    """The election for ``lease``, not started; None when ``--no-leader-elect``."""
    if not lease.enabled:
        return None
    elector = LeaseElector(
        client.CoordinationV1Api(api),
        namespace=lease.namespace,
        name=lease.name,
        identity=lease.identity,
        duration_s=lease.duration_s,
        renew_s=lease.retry_s,
    )
    return LeaderLoop(elector, retry_s=lease.retry_s)


def build_kube_extender(
    *,
    kubeconfig: str | None,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
    workload: TargetWorkload | None = None,
    keep: int = 0,
    gangs: GangSettings | None = None,
    lease: LeaseSettings | None = None,
) -> Extender:
    """``lease``: leader election for the controllers (default: off, every write made here)."""
    api = api_client(kubeconfig)
    settings = replace(gangs or GangSettings(), pod_groups=PodGroupSizes())
    cache, core = build_core(share_workload=workload, gangs=settings)
    feed = KubeFeed(cache, api, watch_timeout_s=watch_timeout_s, pod_groups=settings.pod_groups)
    feed.start()
    lease = lease or LeaseSettings(enabled=False)
    loop = leader_loop(api, lease)
    leader: Leadership = loop if loop is not None else AlwaysLeading()
    # Kueue's AdmissionChecks of controllerName gpuweave.io/gpu-health, once served, while leading
    checks = KueueChecks(cache, api, leader=leader)
    checks.start()
    preflights = _preflights(api, cache, settings.preflight, leader=leader)
    # stopped in this order: the controllers, then the Lease given up, then the watches and client
    stoppers = (checks, *([preflights] if preflights else []), *([loop] if loop else []), feed)
    extender = assemble(
        cache,
        core,
        KubeBinder(api),
        stoppers=stoppers,
        event_sink=KubeEventSink(api),
        keep=keep,
        gangs=settings,
    )
    coordinator = extender.gangs
    extender.metrics.watch_controller_writes("kueue-check", lambda: checks.writes)
    if preflights is not None:
        checks.preflight = preflights.book
        if coordinator is not None:
            coordinator.preflight = preflights.book
    if loop is not None:
        _elect(loop, extender, reporter=LeaderReporter(api, lease), preflights=preflights)
    if coordinator is not None:  # partly bound gangs' places are held again once the lists are in
        threading.Thread(
            target=lambda: cache.synced.wait() and coordinator.rebuild(),
            name="gpuweave-gang-rebuild",
            daemon=True,
        ).start()
    return extender


def _elect(
    loop: LeaderLoop, extender: Extender, *, reporter: LeaderReporter, preflights: KubePreflights | None
) -> None:
    """Start the election with its listeners: metrics, the reporter, a sweep on taking over."""
    metrics = extender.metrics
    metrics.watch_leader(loop.leading)

    def on_change(change: Transition) -> None:
        metrics.leader_transition(change.value)
        if change is Transition.ACQUIRED and preflights is not None:
            preflights.sweep_soon()

    loop.listeners = (on_change, reporter)
    loop.start()
