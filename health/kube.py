"""The Kubernetes side of health, behind ``ClusterActions``: the only health module importing kubernetes.

- Pods on a device are found from the extender's assignment annotation (``gpuweave.io/assignment``)
  on pods bound to this node, joined by remediation with what the kubelet's pod-resources API says
  (``Remediator.pod_devices``), so pods placed without the extender are found too. Pods without
  the annotation are listed with no devices: the join adds theirs and keeps their opt-out label.
- Eviction uses ``policy/v1`` Eviction with ``gracePeriodSeconds`` and the pod's UID as a
  precondition, labelled ``gpuweave.io/node-agent-eviction=true``: the admission policy
  (``manifests/admission-node-agent.yaml``) requires both and holds the agent to pods of its node
  and of gangs that go together. HTTP 429 (a PodDisruptionBudget refused) is reported as blocked
  and retried by the caller next round; 404, or 409 (another pod holds the name now), as gone.
- Conditions go to the node status; Events to the node or the pod; taints on ``spec.taints``, the
  other taints sent back exactly as read and the patch preconditioned on the Node's
  resourceVersion, so a taint another writer changed meanwhile is never undone (a conflict is
  read again a few times, then left to the next round).
- The bad-hardware list is shared as cluster-scoped ``GpuBadHardware`` objects, one per GPU
  (``manifests/crds/gpubadhardware.yaml``).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_OPT_OUT_EVICTION,
    API_GROUP,
    API_VERSION,
    BAD_HARDWARE_KIND,
    BAD_HARDWARE_PLURAL,
)
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import evicts_whole_gang, gang_key
from devicemodel.text import MAX_EVENT_CHARS, safe_text
from health.badlist import BadGpu
from health.remediation import EvictionOutcome, PodRef
from health.scope import NodeCondition
from kubeio.errors import CONFLICT, NOT_FOUND, TOO_MANY_REQUESTS, describe, status_of

log = logging.getLogger(__name__)
COMPONENT = "gpuweave-health"
CORDON_ANNOTATION = "gpuweave.io/cordoned-by-health"
EVICTION_LABEL = "gpuweave.io/node-agent-eviction"  # on every Eviction the agent sends
NODE_PATCH_ATTEMPTS = 4  # reads and preconditioned patches of the Node before a conflict waits a round


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def bad_hardware_name(uuid: str) -> str:
    """Object name of a GPU's ``GpuBadHardware`` (DNS-1123: lower case)."""
    return uuid.lower()


def _running(pod: Any) -> bool:
    """Not ended: a pod that Succeeded or Failed holds nothing and is not evicted."""
    return pod.status is None or pod.status.phase not in ("Succeeded", "Failed")


def _pod_ref(pod: Any, devices: frozenset[str]) -> PodRef:
    meta = pod.metadata
    labels, annotations = dict(meta.labels or {}), dict(meta.annotations or {})
    view = {"metadata": {"namespace": meta.namespace, "labels": labels, "annotations": annotations}}
    return PodRef(
        meta.namespace,
        meta.name,
        devices,
        labels.get(ANNOTATION_OPT_OUT_EVICTION) == "true",
        gang=gang_key(view),
        whole_gang=evicts_whole_gang(view),
        uid=str(meta.uid or ""),
    )


class KubeCluster:
    def __init__(self, api: client.ApiClient, *, node_name: str) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self.node_name = node_name

    # --- pods -----------------------------------------------------------------------------------

    def pods_on_node(self) -> list[PodRef]:
        pods: Any = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node_name}")
        found = []
        for pod in filter(_running, pods.items):
            meta = pod.metadata
            raw = (meta.annotations or {}).get(ANNOTATION_ASSIGNMENT)
            devices: frozenset[str] = frozenset()
            try:
                if raw:
                    devices = frozenset(PodAssignment.from_annotation(raw).all_device_ids())
            except InvalidInputError as exc:
                log.warning("pod %s/%s: %s", meta.namespace, meta.name, exc)
            found.append(_pod_ref(pod, devices))
        return found

    def gang_pods(self, namespace: str, gang: str) -> list[PodRef]:
        """The running pods of gang ``gang`` in ``namespace``, on any node."""
        pods: Any = self._core.list_namespaced_pod(namespace)
        return [
            ref for pod in filter(_running, pods.items) if (ref := _pod_ref(pod, frozenset())).gang == gang
        ]

    def evict(self, pod: PodRef, *, grace_s: int) -> str:
        """Evict exactly the pod the API server listed (its UID a precondition). A pod without a UID
        is one only the kubelet still names: the API server no longer lists it, so it is gone."""
        if not pod.uid:
            return EvictionOutcome.GONE
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(
                name=pod.name, namespace=pod.namespace, labels={EVICTION_LABEL: "true"}
            ),
            delete_options=client.V1DeleteOptions(
                grace_period_seconds=grace_s, preconditions=client.V1Preconditions(uid=pod.uid)
            ),
        )
        try:
            self._core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
        except ApiException as exc:
            status = status_of(exc)
            if status == TOO_MANY_REQUESTS:
                return EvictionOutcome.BLOCKED
            if status in (NOT_FOUND, CONFLICT):  # 409: the UID differs, another pod has the name now
                return EvictionOutcome.GONE
            log.warning("eviction of %s/%s failed: %s", pod.namespace, pod.name, describe(exc))
            return EvictionOutcome.FAILED
        return EvictionOutcome.EVICTED

    # --- node -----------------------------------------------------------------------------------

    def post_event(
        self, *, reason: str, message: str, pod: PodRef | None = None, warning: bool = True
    ) -> None:
        namespace = pod.namespace if pod else "default"
        involved = (
            client.V1ObjectReference(kind="Pod", namespace=pod.namespace, name=pod.name)
            if pod
            else client.V1ObjectReference(kind="Node", name=self.node_name, uid=self.node_name)
        )
        now = _now()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{self.node_name}.gpuweave-health.", namespace=namespace
            ),
            involved_object=involved,
            reason=reason,
            message=safe_text(message, limit=MAX_EVENT_CHARS),  # a gang's name is the pod's text
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=COMPONENT, host=self.node_name),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(namespace, event)

    def set_conditions(self, conditions: tuple[NodeCondition, ...]) -> None:
        node: Any = self._core.read_node_status(self.node_name)
        current: dict[str, Any] = {c.type: c for c in (node.status.conditions or [])}
        now = _now().isoformat()
        patch = []
        for cond in conditions:
            old = current.get(cond.type)
            changed = old is None or old.status != cond.status
            patch.append(
                {
                    "type": cond.type,
                    "status": cond.status,
                    "reason": cond.reason,
                    "message": cond.message[:1024],
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now if old is None or changed else _iso(old.last_transition_time),
                }
            )
        self._core.patch_node_status(self.node_name, {"status": {"conditions": patch}})

    def taint_counts(self, key: str) -> tuple[int, int, bool]:
        nodes: list[Any] = self._core.list_node().items
        tainted = {n.metadata.name for n in nodes if any(t.key == key for t in (n.spec.taints or []))}
        return len(nodes), len(tainted), self.node_name in tainted

    def set_taint(self, key: str, *, present: bool, value: str = "") -> None:
        """Add or remove one of the agent's taints; every other taint goes back exactly as read
        (``timeAdded`` included)."""

        def body(node: Any) -> dict[str, Any] | None:
            taints: list[Any] = [t for t in (node.spec.taints or []) if t.key != key]
            if present:
                taints.append(client.V1Taint(key=key, value=value or None, effect="NoSchedule"))
            elif len(taints) == len(node.spec.taints or []):
                return None
            serialize = self._core.api_client.sanitize_for_serialization
            return {"spec": {"taints": [serialize(t) for t in taints]}}

        self._patch_node(body)

    def set_cordon(self, cordoned: bool) -> None:
        def body(node: Any) -> dict[str, Any] | None:
            ours = (node.metadata.annotations or {}).get(CORDON_ANNOTATION) == "true"
            if not cordoned and not ours:
                return None  # someone else cordoned the node: not ours to undo
            annotations = {CORDON_ANNOTATION: "true" if cordoned else None}
            return {"spec": {"unschedulable": cordoned}, "metadata": {"annotations": annotations}}

        self._patch_node(body)

    def _patch_node(self, body: Callable[[Any], dict[str, Any] | None]) -> None:
        """Read the Node, patch what ``body`` makes of it (None: nothing to do) with the Node's
        resourceVersion as a precondition, so a change made in between (the kubelet's status, an
        operator's taint) is never undone: on a conflict, read again, up to ``NODE_PATCH_ATTEMPTS``."""
        for attempt in range(1, NODE_PATCH_ATTEMPTS + 1):
            node: Any = self._core.read_node(self.node_name)
            patch = body(node)
            if patch is None:
                return
            patch.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
            try:
                self._core.patch_node(self.node_name, patch)
                return
            except ApiException as exc:
                if status_of(exc) != CONFLICT or attempt == NODE_PATCH_ATTEMPTS:
                    raise

    # --- bad hardware ---------------------------------------------------------------------------

    def list_bad_hardware(self) -> dict[str, BadGpu]:
        listed: Any = self._custom.list_cluster_custom_object(API_GROUP, API_VERSION, BAD_HARDWARE_PLURAL)
        found = {}
        for item in listed.get("items", []):
            spec = item.get("spec", {})
            try:
                entry = BadGpu(
                    str(spec["uuid"]),
                    str(spec.get("reason", "")),
                    str(spec.get("node", "")),
                    str(spec.get("since", "")),
                    int(spec.get("strikes", 0)),
                )
            except (KeyError, TypeError, ValueError):
                log.warning(
                    "ignoring malformed %s %s", BAD_HARDWARE_KIND, item.get("metadata", {}).get("name")
                )
                continue
            found[entry.uuid] = entry
        return found

    def add_bad_hardware(self, entry: BadGpu) -> None:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": BAD_HARDWARE_KIND,
            "metadata": {"name": bad_hardware_name(entry.uuid)},
            "spec": {
                "uuid": entry.uuid,
                "reason": entry.reason[:1024],
                "node": entry.node,
                "since": entry.since,
                "strikes": entry.strikes,
            },
        }
        try:
            self._custom.create_cluster_custom_object(API_GROUP, API_VERSION, BAD_HARDWARE_PLURAL, body)
        except ApiException as exc:
            if status_of(exc) != CONFLICT:  # already listed (by this node earlier, or another)
                raise


def _iso(value: object) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value) if value else _now().isoformat()
