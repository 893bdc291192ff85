"""Node replacement against the API server: read the facts, hand nodes to their engine.

Each round lists the Nodes (from the API server's watch cache) and looks closer only at nodes
whose agent says ``GpuweaveNodeServiceable=False`` or that were handed over earlier: their pods
(field selector ``spec.nodeName``), the PodDisruptionBudgets of those pods' namespaces, and the
engine object that owns the machine (the NodeClaim whose ``status.nodeName`` or ``providerID``
names the node; else the Machine the node's ``cluster.x-k8s.io/machine`` annotation names).

Handing a node over is idempotent and ordered so a crash half-way is finished by the next round:
the node annotation ``gpuweave.io/replacement`` (what, when, to which engine object) first, then
the condition ``AcceleratedHardwareReady=False`` (what Karpenter's AWS repair policy and other
engines act on), the failed GPUs' ``GpuBadHardware`` entries (by UUID, so they stay out wherever
they reappear), then the delete of the NodeClaim or Machine, and one Event on the node.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import (
    ANNOTATION_OPT_OUT_EVICTION,
    ANNOTATION_REPLACEMENT,
    API_GROUP,
    API_VERSION,
    BAD_HARDWARE_KIND,
    BAD_HARDWARE_PLURAL,
    CONDITION_ACCELERATED_HARDWARE_READY,
    CONDITION_NODE_SERVICEABLE,
    LABEL_OPT_OUT_REPLACEMENT,
    NODE_INVENTORY_PLURAL,
)
from devicemodel.errors import clip
from gpuweave.lifecycle.replace import Act, Decision, Engine, EngineHandle, NodeFacts, PodFacts
from gpuweave.lifecycle.selectors import selects
from health.kube import bad_hardware_name
from kubeio.client import finish
from kubeio.errors import CONFLICT, NOT_FOUND, status_of

log = logging.getLogger(__name__)
Object = dict[str, Any]
NODECLAIMS = ("karpenter.sh", "v1", "nodeclaims")
MACHINES = ("cluster.x-k8s.io", "v1beta1", "machines")
ANNOTATION_CAPI_MACHINE = "cluster.x-k8s.io/machine"
ANNOTATION_CAPI_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"
COMPONENT = "gpuweave-lifecycle"
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Handover:
    """The node annotation's record of a handover."""

    since: str
    verdict: str
    engine: str
    object: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


@dataclass
class KubeReplacement:
    """Reads the facts for ``replace.decide`` and carries out its decisions."""

    api: client.ApiClient
    engine_mode: Literal["auto", "condition"] = "auto"
    wall_clock: Callable[[], datetime.datetime] = field(default=lambda: datetime.datetime.now(datetime.UTC))
    _core: Any = field(init=False)
    _custom: Any = field(init=False)
    _policy: Any = field(init=False)
    _said: dict[str, str] = field(default_factory=dict)  # node -> the last reason an Event gave

    def __post_init__(self) -> None:
        self._core = client.CoreV1Api(self.api)
        self._custom = client.CustomObjectsApi(self.api)
        self._policy = client.PolicyV1Api(self.api)

    # --- facts ----------------------------------------------------------------------------------

    def facts(self) -> tuple[list[NodeFacts], int, dict[str, Object]]:
        """The candidates, the number of GPU nodes (nodes whose agent publishes the verdict) and
        the candidates' Node objects by name."""
        nodes = _items(self._core.list_node(resource_version="0", _preload_content=False))
        gpu_nodes = [n for n in nodes if _condition(n, CONDITION_NODE_SERVICEABLE) is not None]
        flagged = {n["metadata"]["name"]: n for n in gpu_nodes if _verdict(n) or _handover(n)}
        if not flagged:
            return [], len(gpu_nodes), {}
        claims = self._nodeclaims()
        budgets: dict[str, list[Object]] = {}
        facts = []
        for name, node in sorted(flagged.items()):
            verdict, detail = _verdict(node) or (str((_handover(node) or {}).get("verdict", "")), "")
            facts.append(
                NodeFacts(
                    name=name,
                    verdict=verdict,
                    detail=detail,
                    handle=self._handle(node, claims),
                    pods=tuple(self._pods(name, budgets)),
                    handed_over=_handover(node) is not None,
                )
            )
        return facts, len(gpu_nodes), flagged

    def _nodeclaims(self) -> list[Object]:
        if self.engine_mode == "condition":
            return []
        try:
            listed = self._custom.list_cluster_custom_object(*NODECLAIMS)
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:  # Karpenter is not installed
                return []
            raise
        return list(listed.get("items") or [])

    def _handle(self, node: Object, claims: Sequence[Object]) -> EngineHandle:
        if self.engine_mode == "condition":
            return EngineHandle(Engine.CONDITION)
        name = node["metadata"]["name"]
        provider = (node.get("spec") or {}).get("providerID") or ""
        for claim in claims:
            status = claim.get("status") or {}
            if status.get("nodeName") == name or (provider and status.get("providerID") == provider):
                return EngineHandle(Engine.KARPENTER, claim["metadata"]["name"])
        annotations = node["metadata"].get("annotations") or {}
        machine = annotations.get(ANNOTATION_CAPI_MACHINE)
        if machine:
            namespace = annotations.get(ANNOTATION_CAPI_NAMESPACE) or "default"
            return EngineHandle(Engine.CLUSTER_API, machine, namespace)
        return EngineHandle(Engine.CONDITION)

    def _pods(self, node: str, budgets: dict[str, list[Object]]) -> list[PodFacts]:
        listed = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        facts = []
        for pod in _items(listed):
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            opted = "true" in (labels.get(LABEL_OPT_OUT_REPLACEMENT), labels.get(ANNOTATION_OPT_OUT_EVICTION))
            namespace = meta["namespace"]
            if namespace not in budgets:
                budgets[namespace] = _items(
                    self._policy.list_namespaced_pod_disruption_budget(namespace, _preload_content=False)
                )
            blocking = next(
                (
                    b["metadata"]["name"]
                    for b in budgets[namespace]
                    if selects((b.get("spec") or {}).get("selector"), labels)
                    and int((b.get("status") or {}).get("disruptionsAllowed") or 0) <= 0
                ),
                "",
            )
            facts.append(PodFacts(f"{namespace}/{meta['name']}", opted_out=opted, pdb_blocking=blocking))
        return facts

    # --- acts -----------------------------------------------------------------------------------

    def carry_out(self, decision: Decision, node: Object) -> None:
        if decision.act is Act.HAND_OVER and decision.handle is not None:
            self._hand_over(decision, node)
        elif decision.act is Act.WAIT:
            self._say(decision.node, "GpuweaveReplacementWaiting", decision.reason)

    def _hand_over(self, decision: Decision, node: Object) -> None:
        handle = decision.handle
        assert handle is not None
        first = _handover(node) is None
        verdict, detail = _verdict(node) or ("", "")
        if first:
            record = Handover(self._now(), verdict, handle.engine.value, handle.describe())
            patch = {"metadata": {"annotations": {ANNOTATION_REPLACEMENT: record.to_json()}}}
            self._core.patch_node(decision.node, patch)
        self._set_condition(decision.node, verdict, detail)
        self._list_bad_gpus(decision.node, f"node handed to its engine: {verdict}: {detail}")
        self._delete(handle)
        if first:
            self._say(decision.node, "GpuweaveNodeHandedOver", decision.reason, warning=True)

    def _set_condition(self, node: str, verdict: str, detail: str) -> None:
        now = self._now()
        condition = {
            "type": CONDITION_ACCELERATED_HARDWARE_READY,
            "status": "False",
            "reason": f"Gpuweave{verdict}" if verdict else "GpuweaveReplacement",
            "message": clip(detail or "gpuweave handed the node to its engine", limit=900),
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        read = orjson.loads(finish(self._core.read_node_status(node, _preload_content=False)))
        current = _condition(read, CONDITION_ACCELERATED_HARDWARE_READY)
        if current is not None and current.get("status") == "False":
            return
        self._core.patch_node_status(node, {"status": {"conditions": [condition]}})

    def _list_bad_gpus(self, node: str, reason: str) -> None:
        """The node's failed GPUs (its inventory's Unhealthy GPUs) go on the bad-hardware list."""
        try:
            inventory = self._custom.get_cluster_custom_object(
                API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL, node
            )
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:
                return
            raise
        devices = (inventory.get("status") or {}).get("devices") or []
        failed = [d for d in devices if d.get("kind") == "gpu" and d.get("health") == "Unhealthy"]
        for device in failed:
            uuid = str(device.get("id") or "")
            body = {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": BAD_HARDWARE_KIND,
                "metadata": {"name": bad_hardware_name(uuid)},
                "spec": {
                    "uuid": uuid,
                    "reason": clip(f"{reason}; {device.get('reason') or ''}", limit=900),
                    "node": node,
                    "since": self._now(),
                    "strikes": 0,
                },
            }
            try:
                self._custom.create_cluster_custom_object(API_GROUP, API_VERSION, BAD_HARDWARE_PLURAL, body)
            except ApiException as exc:
                if status_of(exc) != CONFLICT:  # listed already (by its agent, or earlier)
                    raise

    def _delete(self, handle: EngineHandle) -> None:
        try:
            if handle.engine is Engine.KARPENTER:
                self._custom.delete_cluster_custom_object(*NODECLAIMS, handle.name)
            elif handle.engine is Engine.CLUSTER_API:
                self._custom.delete_namespaced_custom_object(
                    *MACHINES[:2], handle.namespace, MACHINES[2], handle.name
                )
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:  # gone already: the engine finished
                raise

    def _say(self, node: str, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the node, once per distinct message."""
        if self._said.get(node) == message:
            return
        self._said[node] = message
        now = self.wall_clock()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{node}.{COMPONENT}.", namespace="default"),
            involved_object=client.V1ObjectReference(kind="Node", name=node, uid=node),
            reason=reason,
            message=clip(message, limit=900),
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=COMPONENT),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self._core.create_namespaced_event("default", event)
        except ApiException as exc:
            log.warning("cannot post event %s on %s: %s", reason, node, exc.reason)

    def forget(self, present: Mapping[str, Object]) -> None:
        for gone in set(self._said) - set(present):
            del self._said[gone]

    def _now(self) -> str:
        return self.wall_clock().astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _items(response: Any) -> list[Object]:
    """The items of a raw (``_preload_content=False``) list answer, as JSON objects."""
    listed = orjson.loads(finish(response))
    return [dict(item) for item in listed.get("items") or []]


def _condition(node: Object, kind: str) -> Object | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _verdict(node: Object) -> tuple[str, str] | None:
    """(reason, message) of the agent's verdict when it asks the engine for something."""
    condition = _condition(node, CONDITION_NODE_SERVICEABLE)
    if condition is None or condition.get("status") != "False":
        return None
    return str(condition.get("reason") or ""), str(condition.get("message") or "")


def _handover(node: Object) -> dict[str, Any] | None:
    raw = (node["metadata"].get("annotations") or {}).get(ANNOTATION_REPLACEMENT)
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"verdict": ""}
    return parsed if isinstance(parsed, dict) else {"verdict": ""}
