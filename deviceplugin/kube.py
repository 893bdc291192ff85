"""The agent's API-server side: publishing, the pod view for the handoff, and Events.

Everything here runs in background threads and tolerates an API server outage: publishing
retries with back-off, the pod watch (``kubeio.listwatch.ListWatch``) resumes from the last
resourceVersion it saw after an error, and nothing on the kubelet's gRPC path waits for the API
server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    API_GROUP,
    API_VERSION,
    NODE_INVENTORY_PLURAL,
    RESOURCE_IMEX_CHANNEL,
    requests_resource,
)
from devicemodel.inventory import DegradedLink, NodeInventory
from devicemodel.sharing import SharingPlan
from devicemodel.text import MAX_EVENT_CHARS, safe_text
from deviceplugin.handoff import Correction, HandoffMatcher, Held, PendingPod, PodView, corrections
from kubeio.client import api_client
from kubeio.errors import NOT_FOUND, describe, status_of
from kubeio.listwatch import ListWatch, metadata_only
from nodeagent.agent import NodeAgent
from nodeagent.metrics import AgentMetrics
from nodeagent.pod_usage import PodIdentities
from nodeagent.podresources import PodRef, PodResourcesUnavailableError
from nodeagent.published import inventory_object, node_labels
from topology.network import LABEL_GPU_CLIQUE

log = logging.getLogger(__name__)

RETRY_S = 5.0


class Publisher:
    """Writes the node's GpuNodeInventory (spec + status) and its labels; coalesces bursts."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        snapshot: Callable[[], tuple[NodeInventory, dict[str, str], dict[str, str]]],
        sharing: SharingPlan,
        degraded: Callable[[], tuple[DegradedLink, ...]] = tuple,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._snapshot = snapshot
        self._sharing = sharing
        self._degraded = degraded
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
        body = inventory_object(
            inventory, sharing=self._sharing, faults=faults, withheld=withheld, degraded=self._degraded()
        )
        name = inventory.name
        args = (API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL)
        # the Node's labels first, so a reader that sees this round's status sees its labels; the
        # answer is the Node, whose UID the inventory's owner reference names
        node: Any = self._core.patch_node(name, {"metadata": {"labels": node_labels(inventory)}})
        owner = node_owner(name, uid=str(node.metadata.uid))
        current: dict[str, Any]
        try:
            current = cast(dict[str, Any], self._custom.get_cluster_custom_object(*args, name))
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise
            created = {k: v for k, v in body.items() if k != "status"}
            created["metadata"] = {**body["metadata"], "ownerReferences": [owner]}
            current = cast(dict[str, Any], self._custom.create_cluster_custom_object(*args, created))
        metadata = current.get("metadata") or {}
        owners = owned_by(metadata.get("ownerReferences"), owner)
        if (
            current.get("spec") != body["spec"]
            or metadata.get("labels") != body["metadata"]["labels"]
            or owners != metadata.get("ownerReferences")
        ):
            patch = {"labels": body["metadata"]["labels"], "ownerReferences": owners}
            self._custom.patch_cluster_custom_object(*args, name, {"metadata": patch, "spec": body["spec"]})
        self._custom.patch_cluster_custom_object_status(*args, name, {"status": body["status"]})
        self.published += 1


def node_owner(node: str, *, uid: str) -> dict[str, Any]:
    """The owner reference to the agent's Node: the garbage collector deletes the node's
    GpuNodeInventory with its Node (a scale-down), so no inventory outlives its node."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


def owned_by(current: object, owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``current`` owner references with the Node's one in place of any other Node reference (a
    Node of that name deleted and created again has a new UID); other owners are kept."""
    listed = current if isinstance(current, list) else []
    kept = [dict(r) for r in listed if isinstance(r, Mapping) and r.get("kind") != "Node"]
    return [*kept, dict(owner)]


def clique_peers(api: client.ApiClient) -> Callable[[str], dict[str, str]]:
    """``peers(clique)``: node name -> InternalIP of every node labelled with that clique."""
    core = client.CoreV1Api(api)

    def peers(clique: str) -> dict[str, str]:
        listed = core.list_node(label_selector=f"{LABEL_GPU_CLIQUE}={clique}")
        found: dict[str, str] = {}
        for node in listed.items:
            addresses = (node.status.addresses or []) if node.status else []
            internal = next((a.address for a in addresses if a.type == "InternalIP"), "")
            if internal and node.metadata is not None and node.metadata.name:
                found[node.metadata.name] = internal
        return found

    return peers


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
            message=safe_text(message, limit=MAX_EVENT_CHARS),  # it names the pod's devices
            type="Warning",
            source=client.V1EventSource(component="gpuweave-node-agent", host=self._node),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(pod.namespace, event)


def _upsert(view: PodView, pod: Mapping[str, Any]) -> None:
    metadata = pod.get("metadata") or {}
    view.upsert(
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        phase=str((pod.get("status") or {}).get("phase") or ""),
        annotation=(metadata.get("annotations") or {}).get(ANNOTATION_ASSIGNMENT),
        created=str(metadata.get("creationTimestamp") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        requests_imex=requests_resource(pod, RESOURCE_IMEX_CHANNEL),
    )


class PodWatcher:
    """Keeps a ``PodView`` of this node's pods by list + watch (field selector spec.nodeName).

    A relist after 410 Gone arrives as events too (a pod that vanished meanwhile as DELETED), so
    pods the view already knew keep their arrival order and the resourceVersion they were bound at."""

    def __init__(
        self, api: client.ApiClient, *, node: str, view: PodView, identities: PodIdentities | None = None
    ) -> None:
        self._view = view
        self._identities = identities  # every pod by UID, for per-pod GPU use (``pod_usage``)
        self.watch = ListWatch(
            client.CoreV1Api(api).list_pod_for_all_namespaces,
            on_event=self._event,
            what=f"pods on node {node}",
            remember=metadata_only,  # a DELETED needs only the pod's UID
            field_selector=f"spec.nodeName={node}",
        )

    def start(self) -> None:
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()

    def _event(self, kind: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if kind == "DELETED":
            self._view.remove(uid)
            if self._identities is not None:
                self._identities.remove(uid)
        else:
            _upsert(self._view, pod)
            if self._identities is not None:
                self._identities.upsert(pod)


AUDIT_DELAYS_S = (0.5, 2.0, 5.0)  # after an Allocate: the kubelet lists a container's devices soon after


def held_by_pod(devices: dict[str, PodRef]) -> Held:
    """pod-resources' device -> pod map regrouped as (namespace, name) -> container -> resource -> IDs."""
    grouped: dict[tuple[str, str], dict[str, dict[str, set[str]]]] = {}
    for device_id, ref in devices.items():
        containers = grouped.setdefault((ref.namespace, ref.name), {})
        containers.setdefault(ref.container, {}).setdefault(ref.resource, set()).add(device_id)
    return {
        pod: {c: {r: frozenset(ids) for r, ids in res.items()} for c, res in containers.items()}
        for pod, containers in grouped.items()
    }


class AssignmentAuditor:
    """The handoff's backstop: after Allocate calls, compares each pod's ``gpuweave.io/assignment``
    with what the kubelet really allocated (pod-resources). A mismatch is counted (handoff outcome
    ``admitted_mismatch``) and reported as an Event on the pod; with ``correct`` the annotation is
    patched to the kubelet's devices (resourceVersion precondition), so the extender's cache and
    health eviction follow reality. Patching needs ``pods patch`` (rbac-node-agent-assignments.yaml)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        view: PodView,
        kubelet_devices: Callable[[], dict[str, PodRef]],
        metrics: AgentMetrics,
        report: Callable[[PendingPod, str, str], None],
        correct: bool,
        delays_s: tuple[float, ...] = AUDIT_DELAYS_S,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._view = view
        self._kubelet_devices = kubelet_devices
        self._metrics = metrics
        self._report = report
        self._correct = correct
        self._delays_s = delays_s
        self._reported: set[tuple[str, str]] = set()  # (pod uid, annotation seen): count each once
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="assignment-audit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def poke(self) -> None:
        """An Allocate happened: audit a few times over the next seconds."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            for delay in self._delays_s:
                if self._stop.wait(delay):
                    return
                try:
                    self.audit_once()
                except Exception:
                    log.exception("assignment audit failed; the next Allocate retries it")
                if self._wake.is_set():
                    break  # a newer Allocate restarts the schedule

    def audit_once(self) -> list[Correction]:
        """One comparison round; returns the mismatches found (corrected ones included)."""
        try:
            held = held_by_pod(self._kubelet_devices())
        except PodResourcesUnavailableError as exc:
            log.warning("assignment audit skipped: %s", exc)
            return []
        found = corrections(self._view.assigned(), held)
        live = {pod.uid for pod in self._view.assigned()}
        self._reported = {key for key in self._reported if key[0] in live}
        for correction in found:
            self._handle(correction)
        return found

    def _handle(self, correction: Correction) -> None:
        pod = correction.pod
        key = (pod.uid, pod.assignment.to_annotation())
        message = "kubelet allocated other devices than annotated: " + "; ".join(correction.changes)
        if correction.devices_differ and key not in self._reported:
            self._reported.add(key)
            self._metrics.handoff.labels(_resources(correction), "admitted_mismatch").inc()
            log.warning("pod %s/%s: %s", pod.namespace, pod.name, message)
            try:
                self._report(
                    pod,
                    "GpuAssignmentMismatch",
                    message + (" (annotation corrected)" if self._correct else ""),
                )
            except Exception:
                log.exception("cannot report the assignment mismatch of pod %s/%s", pod.namespace, pod.name)
        if self._correct:
            self._patch(correction)

    def _patch(self, correction: Correction) -> None:
        pod = correction.pod
        metadata: dict[str, Any] = {
            "uid": pod.uid,
            "annotations": {ANNOTATION_ASSIGNMENT: correction.corrected.to_annotation()},
        }
        if pod.resource_version:
            metadata["resourceVersion"] = pod.resource_version  # precondition: 409 if it changed
        try:
            self._core.patch_namespaced_pod(pod.name, pod.namespace, {"metadata": metadata})
        except ApiException as exc:
            log.warning(
                "cannot correct the assignment of pod %s/%s (%s); the next audit retries",
                pod.namespace,
                pod.name,
                describe(exc),
            )
            return
        self._metrics.handoff.labels(_resources(correction), "corrected").inc()


def _resources(correction: Correction) -> str:
    return ",".join(sorted({change.split(" ")[1].rstrip(":") for change in correction.changes}))


class KubeParts:
    """The API-server side of the agent: publisher, pod watcher (handoff) and event reporter."""

    def __init__(self, kubeconfig: Path | None, *, node: str, metrics: AgentMetrics) -> None:
        """``kubeconfig`` None: the pod's own service account (token, CA and API server address);
        credentials that cannot be loaded raise ``InvalidInputError`` naming where they were sought."""
        self.api = api_client(kubeconfig)
        self.view = PodView()
        self.handoff = HandoffMatcher(
            self.view, node=node, metrics=metrics, report=EventReporter(self.api, node=node)
        )
        self.identities = PodIdentities()
        self.pods = PodWatcher(self.api, node=node, view=self.view, identities=self.identities)
        self.publisher: Publisher | None = None
        self.audit: AssignmentAuditor | None = None
        self._metrics = metrics
        self._node = node

    def start(
        self,
        agent: NodeAgent,
        *,
        kubelet_devices: Callable[[], dict[str, PodRef]] | None = None,
        correct_assignments: bool = False,
    ) -> None:
        """Publish the agent's inventory and health from now on, and start watching pods. With
        ``kubelet_devices`` (pod-resources' ``list_devices``) audit annotations after Allocate calls,
        and with ``correct_assignments`` patch them to the kubelet's allocation."""
        self.publisher = Publisher(
            self.api,
            snapshot=lambda: (agent.inventory, *agent.health_maps()),
            sharing=agent.config.sharing,
            degraded=agent.degraded_links,
        )
        agent.add_listener(self.publisher.changed)
        self.publisher.start()
        self.pods.start()
        if kubelet_devices is not None:
            self.audit = AssignmentAuditor(
                self.api,
                view=self.view,
                kubelet_devices=kubelet_devices,
                metrics=self._metrics,
                report=EventReporter(self.api, node=self._node),
                correct=correct_assignments,
            )
            self.handoff.add_allocation_listener(self.audit.poke)
            self.audit.start()

    def clique_peers(self) -> Callable[[str], dict[str, str]]:
        """The IMEX reconciler's peer lookup over this connection (``clique_peers``)."""
        return clique_peers(self.api)

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        if self.audit is not None:
            self.audit.stop()
        self.pods.stop()
        self.api.close()  # type: ignore[no-untyped-call]
