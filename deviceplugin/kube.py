"""The agent's API-server side: publishing, the pod view for the handoff, and Events.

Everything here runs in background threads and tolerates an API server outage: publishing
retries with back-off, the pod watcher re-lists after an error, and nothing on the kubelet's
gRPC path waits for the API server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client, watch
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from deviceplugin.agent import NodeAgent
from deviceplugin.errors import DevicePluginError
from deviceplugin.handoff import HandoffMatcher, PendingPod, PodView
from deviceplugin.metrics import AgentMetrics
from deviceplugin.published import inventory_object, node_labels
from deviceplugin.sharing import SharingPlan
from topology.contracts import ANNOTATION_ASSIGNMENT, API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL
from topology.inventory import NodeInventory

log = logging.getLogger(__name__)

RETRY_S = 5.0
WATCH_TIMEOUT_S = 60


class Publisher:
    """Writes the node's GpuNodeInventory (spec + status) and its labels; coalesces bursts."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        snapshot: Callable[[], tuple[NodeInventory, dict[str, str], dict[str, str]]],
        sharing: SharingPlan,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._snapshot = snapshot
        self._sharing = sharing
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self.published = 0

    def start(self) -> None:
        self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def changed(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.publish_once()
            except Exception as exc:  # API outage: keep serving the kubelet, retry later
                log.warning("publishing failed (%s); retrying in %.0f s", exc, RETRY_S)
                if self._stop.wait(RETRY_S):
                    return
                self._wake.set()

    def publish_once(self) -> None:
        inventory, faults, withheld = self._snapshot()
        body = inventory_object(inventory, sharing=self._sharing, faults=faults, withheld=withheld)
        name = inventory.name
        args = (API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL)
        current: dict[str, Any]
        try:
            current = cast(dict[str, Any], self._custom.get_cluster_custom_object(*args, name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            created = self._custom.create_cluster_custom_object(
                *args, {k: v for k, v in body.items() if k != "status"}
            )
            current = cast(dict[str, Any], created)
        if (
            current.get("spec") != body["spec"]
            or current.get("metadata", {}).get("labels") != body["metadata"]["labels"]
        ):
            self._custom.patch_cluster_custom_object(
                *args, name, {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]}
            )
        self._custom.patch_cluster_custom_object_status(*args, name, {"status": body["status"]})
        self._core.patch_node(name, {"metadata": {"labels": node_labels(inventory)}})
        self.published += 1


class EventReporter:
    """Creates core/v1 Events about pods (handoff mismatches)."""

    def __init__(self, api: client.ApiClient, *, node: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node = node

    def __call__(self, pod: PendingPod, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                kind="Pod", namespace=pod.namespace, name=pod.name, uid=pod.uid, api_version="v1"
            ),
            reason=reason,
            message=message[:1000],
            type="Warning",
            source=client.V1EventSource(component="gpuweave-node-agent", host=self._node),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(pod.namespace, event)


def _upsert(view: PodView, pod: Any) -> None:
    annotations = pod.metadata.annotations or {}
    view.upsert(
        uid=pod.metadata.uid,
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        phase=(pod.status.phase if pod.status else "") or "",
        annotation=annotations.get(ANNOTATION_ASSIGNMENT),
        created=pod.metadata.creation_timestamp.isoformat() if pod.metadata.creation_timestamp else "",
    )


class PodWatcher:
    """Keeps a ``PodView`` of this node's pods by list + watch (field selector spec.nodeName)."""

    def __init__(self, api: client.ApiClient, *, node: str, view: PodView) -> None:
        self._core = client.CoreV1Api(api)
        self._selector = f"spec.nodeName={node}"
        self._view = view
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]
        self._thread.join(timeout=WATCH_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except Exception as exc:
                log.warning("pod watch on this node failed (%s); re-listing in %.0f s", exc, RETRY_S)
                self._stop.wait(RETRY_S)

    def _list_and_watch(self) -> None:
        listed = self._core.list_pod_for_all_namespaces(field_selector=self._selector)
        fresh = PodView()
        for pod in listed.items:
            _upsert(fresh, pod)
        self._view.replace_all(fresh.pending())
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        for event in self._watch.stream(  # type: ignore[no-untyped-call]
            self._core.list_pod_for_all_namespaces,
            field_selector=self._selector,
            resource_version=listed.metadata.resource_version if listed.metadata else None,
            timeout_seconds=WATCH_TIMEOUT_S,
        ):
            if self._stop.is_set():
                return
            pod = event["object"]
            if event["type"] == "DELETED":
                self._view.remove(pod.metadata.uid)
            else:
                _upsert(self._view, pod)


def _api_client(kubeconfig: Path | None) -> client.ApiClient:
    if kubeconfig is not None:
        loaded: client.ApiClient = kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        return loaded
    configuration = client.Configuration()
    kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


class KubeParts:
    """The API-server side of the agent: publisher, pod watcher (handoff) and event reporter."""

    def __init__(self, kubeconfig: Path | None, *, node: str, metrics: AgentMetrics) -> None:
        """``kubeconfig`` None: the pod's own service account (token, CA and API server address)."""
        try:
            self.api = _api_client(kubeconfig)
        except Exception as exc:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
            raise DevicePluginError(f"cannot load {where}: {exc}") from exc
        self.view = PodView()
        self.handoff = HandoffMatcher(
            self.view, node=node, metrics=metrics, report=EventReporter(self.api, node=node)
        )
        self.pods = PodWatcher(self.api, node=node, view=self.view)
        self.publisher: Publisher | None = None

    def start(self, agent: NodeAgent) -> None:
        """Publish the agent's inventory and health from now on, and start watching pods."""
        self.publisher = Publisher(
            self.api, snapshot=lambda: (agent.inventory, *agent.health_maps()), sharing=agent.config.sharing
        )
        agent.add_listener(self.publisher.changed)
        self.publisher.start()
        self.pods.start()

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.pods.stop()
        self.api.close()  # type: ignore[no-untyped-call]
