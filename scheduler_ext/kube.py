"""Cluster mode: list+watch Nodes, GpuNodeInventory objects and Pods; bind through the API.

Each kind runs one watcher thread: list (remembering the resourceVersion), then watch from it;
on 410 Gone or a broken stream it lists again and replaces what it knew, so a missed delete
cannot leave a phantom holding. The cache counts as synced (``/readyz``) once every kind's first
list is in. Bind writes the assignment annotation first and then the Binding; if the Binding
fails the annotation is taken back, so no pod is ever left half-bound.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cache import ClusterCache
from scheduler_ext.service import BindError
from topology.assignment import PodAssignment
from topology.contracts import ANNOTATION_ASSIGNMENT, API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL
from topology.errors import InvalidInputError
from topology.fragmentation import TargetWorkload

LOG = logging.getLogger(__name__)
WATCH_TIMEOUT_S = 240
RETRY_DELAY_S = 2.0

Handler = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class WatchedKind:
    """One kind to mirror: how to list it, and what to do with each object."""

    name: str
    list_call: Callable[..., Any]
    apply: Handler  # (event type ADDED/MODIFIED/DELETED, object)
    key: Callable[[Mapping[str, Any]], str]


class Watcher(threading.Thread):
    """List once, then watch, resuming from the last resourceVersion seen; list again on 410 Gone.

    A relist replaces what the watcher knew (objects missing from the new list are deleted), so
    an event lost while the watch was expired cannot leave a phantom holding behind.
    """

    def __init__(
        self,
        kind: WatchedKind,
        *,
        on_first_list: Callable[[], None],
        stop: threading.Event,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        super().__init__(name=f"gpuweave-watch-{kind.name}", daemon=True)
        self.kind = kind
        self.relists = 0
        self._on_first_list = on_first_list
        self._halt = stop
        self._timeout_s = watch_timeout_s
        self._known: dict[str, Mapping[str, Any]] = {}
        self._watch: watch.Watch | None = None

    def run(self) -> None:
        version: str | None = None
        while not self._halt.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._follow(version)
            except ApiException as exc:
                if exc.status == 410:  # expired: the events since `version` are gone
                    LOG.info(
                        "watch of %s expired at resourceVersion %s; listing again", self.kind.name, version
                    )
                    version = None
                    continue
                self._pause(exc)
            except Exception as exc:  # any other failure (network, a closed client): retry, never die
                self._pause(exc)

    def _pause(self, exc: Exception) -> None:
        if not self._halt.is_set() and not isinstance(exc, ApiException | HTTPError | OSError | ValueError):
            LOG.error("watch of %s failed unexpectedly", self.kind.name, exc_info=exc)
        if not self._halt.is_set():
            LOG.warning("watch of %s broke (%s); retrying in %.0fs", self.kind.name, exc, RETRY_DELAY_S)
            self._halt.wait(RETRY_DELAY_S)

    def stop(self) -> None:
        self._halt.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]

    def _relist(self) -> str:
        response = self.kind.list_call(_preload_content=False)
        body = json.loads(response.data)
        items = body.get("items") or []
        fresh = {self.kind.key(item): item for item in items}
        for key, old in list(self._known.items()):
            if key not in fresh:
                self.kind.apply("DELETED", old)
        for item in items:
            self.kind.apply("MODIFIED", item)
        self._known = fresh
        self.relists += 1
        if self.relists == 1:
            self._on_first_list()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> str:
        """Apply events from ``version`` until the server ends the watch; returns the last version."""
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        stream = self._watch.stream(  # type: ignore[no-untyped-call]
            self.kind.list_call,
            resource_version=version,
            timeout_seconds=self._timeout_s,
            allow_watch_bookmarks=True,
        )
        for event in stream:
            if self._halt.is_set():
                break
            kind, raw = str(event.get("type")), event.get("raw_object")
            if kind == "ERROR" or not isinstance(raw, Mapping):
                code = raw.get("code") if isinstance(raw, Mapping) else None
                raise ApiException(status=code or 500, reason=f"watch error event: {raw}")
            version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "BOOKMARK":
                continue
            key = self.kind.key(raw)
            if kind == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = raw
            self.kind.apply(kind, raw)
        return version


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def watched_kinds(cache: ClusterCache, api: client.ApiClient) -> tuple[WatchedKind, ...]:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def list_inventories(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL, **kwargs)

    def on_node(kind: str, obj: Mapping[str, Any]) -> None:
        cache.delete_node(_name(obj)) if kind == "DELETED" else cache.upsert_node(obj)

    def on_inventory(kind: str, obj: Mapping[str, Any]) -> None:
        cache.delete_inventory(_name(obj)) if kind == "DELETED" else cache.upsert_inventory(obj)

    def on_pod(kind: str, obj: Mapping[str, Any]) -> None:
        cache.delete_pod(_uid(obj)) if kind == "DELETED" else cache.upsert_pod(obj)

    return (
        WatchedKind("nodes", core.list_node, on_node, _name),
        WatchedKind("gpunodeinventories", list_inventories, on_inventory, _name),
        WatchedKind("pods", core.list_pod_for_all_namespaces, on_pod, _uid),
    )


class KubeBinder:
    """Annotation, then Binding; the annotation is rolled back if the Binding fails."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None:
        metadata = pod.get("metadata") or {}
        name, namespace = str(metadata.get("name")), str(metadata.get("namespace") or "default")
        uid = str(metadata.get("uid") or "")
        if assignment is not None:
            self._annotate(namespace, name, uid, assignment.to_annotation(), what="record the assignment")
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            self._core.create_namespaced_binding(namespace, body, _preload_content=False)
        except (ApiException, HTTPError) as exc:
            if assignment is not None:
                try:
                    self._annotate(namespace, name, uid, None, what="roll back the assignment")
                except BindError as rollback:
                    LOG.error("%s", rollback)
            raise BindError(f"binding pod {namespace}/{name} to node {node} failed: {_why(exc)}") from None

    def _annotate(self, namespace: str, name: str, uid: str, value: str | None, *, what: str) -> None:
        """Set (or with None remove) the annotation; the UID makes the patch fail on a re-created pod."""
        metadata: dict[str, Any] = {"annotations": {ANNOTATION_ASSIGNMENT: value}}
        if uid:
            metadata["uid"] = uid
        patch = {"metadata": metadata}
        try:
            self._core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
        except (ApiException, HTTPError) as exc:
            raise BindError(f"could not {what} on pod {namespace}/{name}: {_why(exc)}") from None


def _why(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return str(exc)


class KubeFeed:
    """The watcher threads of one extender; ``stop`` ends them."""

    def __init__(
        self, cache: ClusterCache, api: client.ApiClient, *, watch_timeout_s: int = WATCH_TIMEOUT_S
    ) -> None:
        self._halt = threading.Event()
        self._api = api
        kinds = watched_kinds(cache, api)
        remaining = [len(kinds)]
        lock = threading.Lock()

        def first_list_done() -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    cache.synced.set()

        self.watchers = [
            Watcher(k, on_first_list=first_list_done, stop=self._halt, watch_timeout_s=watch_timeout_s)
            for k in kinds
        ]

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()
        for watcher in self.watchers:
            watcher.join(timeout=1)  # a watch blocked on a quiet stream ends at its server-side timeout
        self._api.close()  # type: ignore[no-untyped-call]


def api_client(kubeconfig: str | None) -> client.ApiClient:
    try:
        if kubeconfig:
            loaded: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig
            )
            return loaded
        configuration = client.Configuration()  # not the process-wide default: explicit wiring
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = kubeconfig or "the in-cluster service account"
        raise InvalidInputError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    return client.ApiClient(configuration)


def build_kube_extender(
    *, kubeconfig: str | None, watch_timeout_s: int = WATCH_TIMEOUT_S, workload: TargetWorkload | None = None
) -> Extender:
    api = api_client(kubeconfig)
    cache, core = build_core(share_workload=workload)
    feed = KubeFeed(cache, api, watch_timeout_s=watch_timeout_s)
    feed.start()
    return assemble(cache, core, KubeBinder(api), stoppers=(feed,))
