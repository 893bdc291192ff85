"""Pending GPU demand in, CapacityBuffers out; share nodes kept from consolidation.

Each round lists what the extender watches (Nodes, GpuNodeInventory objects, Pods) into the
extender's own cache and decision core (``gpuweave.status.cluster_view``), so "does this pod fit
now" is the scheduler's answer, not a second reading. A pending pod counts as demand only when
kube-scheduler marked it unschedulable, it asks for something the autoscaler cannot read (a share,
a MIG profile, a gang with a required tier), it fits no node now (nodes still running their
start-up checks count: they are capacity on its way) and it would fit a new machine of a
configured pool (the same core, asked about an empty machine of that pool). ``capacity`` plans;
this writes one PodTemplate and CapacityBuffer per plan in the configured namespace, and deletes
the buffers no plan asks for (the pods were placed or went).

A buffer asks for whole new machines: each chunk is a virtual pod with a small CPU request that
only a machine of the pool's instance type that did not exist when the buffer was made can hold
(required node affinity ``karpenter.sh/nodepool``, ``node.kubernetes.io/instance-type``, and
``kubernetes.io/hostname`` NotIn the pool's machines of that moment, kept on the PodTemplate), one
chunk per machine (pod anti-affinity by host name). So the autoscaler launches at most the
buffer's replicas, and the machines it launched keep holding the chunks until the buffer goes (no
second round of machines, however long the MIG reshape or the start-up checks take). A gang's
chunks also share one domain of its tier label (pod affinity) and ask for a little more CPU than a
member, so the autoscaler places them first and the members join their machines. Whole GPUs
(``nvidia.com/gpu``) are not asked for: a machine whose GPUs come up as shares or MIG would never
register them, and the autoscaler would never call it initialised.

A buffer whose pods fit a node now but are not bound yet (or that a node's MIG manager claimed)
stays as it is: its virtual pods hold the new machine, which would otherwise look empty to the
autoscaler's consolidation until the scheduler placed them. It is withdrawn once they are bound or
gone.

Stale guard: a buffer whose machines are all up (initialised) while its pods still fit nowhere
for ``stale_s`` is withdrawn and not asked for again for ``cooldown_s``.

Protection: a pool machine running shares that, by gpuweave's per-GPU view, fit no other node now
gets ``karpenter.sh/do-not-disrupt: "true"`` (and gpuweave's marker annotation, so only what
gpuweave set is ever removed); the marker and the annotation go once its shares could move.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.errors import clip
from gpuweave.lifecycle.capacity import BufferPlan, GangDemand, plan_buffers
from gpuweave.lifecycle.capacity_config import CapacityConfig
from gpuweave.lifecycle.demand import NewMachines, read_demand, shares_stuck
from gpuweave.status.cluster_list import list_cluster
from gpuweave.status.cluster_view import ClusterView
from kubeio.errors import CONFLICT, NOT_FOUND, status_of

log = logging.getLogger(__name__)
Object = dict[str, Any]
BUFFERS = ("autoscaling.x-k8s.io", "v1beta1", "capacitybuffers")
NODEPOOLS = ("karpenter.sh", "v1", "nodepools")
LABEL_BUFFER = "gpuweave.io/capacity-buffer"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "gpuweave-lifecycle"
ANNOTATION_REASON = "gpuweave.io/capacity-reason"
ANNOTATION_DIGEST = "gpuweave.io/template-digest"
ANNOTATION_EXISTING = "gpuweave.io/existing-machines"
MAX_EXISTING = 1000  # host names a chunk's affinity excludes, at most (bounds the template)
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ANNOTATION_PROTECTED = "gpuweave.io/protected-shares"
LABEL_NODEPOOL = "karpenter.sh/nodepool"
LABEL_INITIALIZED = "karpenter.sh/initialized"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_HOSTNAME = "kubernetes.io/hostname"
CHUNK_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass
class KubeCapacity:
    api: client.ApiClient
    config: CapacityConfig
    cooldown_s: float = 600.0
    stale_s: float = 120.0
    gang_settle_s: float = 20.0
    monotonic: Callable[[], float] = time.monotonic
    name: str = "capacity"
    _up_since: dict[str, float] = field(default_factory=dict)  # buffer -> when all its machines were up
    _gang_seen: dict[str, float] = field(default_factory=dict)  # gang -> when its demand was first seen
    _cool: dict[str, float] = field(default_factory=dict)  # buffer -> monotonic time it may return
    _asked: dict[str, frozenset[str]] = field(default_factory=dict)  # buffer -> the pods it was for
    _arriving: frozenset[str] = frozenset()  # this round's pending pods about to be placed
    _core: Any = field(init=False)
    _custom: Any = field(init=False)
    _machines: NewMachines = field(init=False)

    def __post_init__(self) -> None:
        self._core = client.CoreV1Api(self.api)
        self._custom = client.CustomObjectsApi(self.api)
        self._machines = NewMachines(self.config)

    def round(self) -> None:
        view = ClusterView.of(list_cluster(self.api))
        nodepools = {name: pool for name in self.config.pools if (pool := self._nodepool(name))}
        demand = read_demand(view, self._machines, nodepools)
        plans = plan_buffers(
            shares=demand.shares,
            migs=demand.migs,
            gangs=self._settled(demand.gangs),
            pools=self.config.pools,
            max_nodes=self.config.max_nodes,
        )
        now = self.monotonic()
        self._arriving = demand.arriving
        self._sync([p for p in plans if self._cool.get(p.name, 0.0) <= now], view, nodepools)
        self._protect(view)

    def _settled(self, gangs: Sequence[GangDemand]) -> list[GangDemand]:
        """Gangs whose demand has stood ``gang_settle_s``: their members ask for whole GPUs, which
        the autoscaler reads and acts on by itself first; what its machines leave missing from one
        domain is asked for only once they show."""
        now = self.monotonic()
        seen = {g.gang: self._gang_seen.get(g.gang, now) for g in gangs}
        self._gang_seen = seen
        return [g for g in gangs if now - seen[g.gang] >= self.gang_settle_s]

    # --- buffers --------------------------------------------------------------------------------

    def _sync(self, plans: Sequence[BufferPlan], view: ClusterView, pools: Mapping[str, Object]) -> None:
        namespace = self.config.namespace
        listed = self._custom.list_namespaced_custom_object(
            *BUFFERS[:2], namespace, BUFFERS[2], label_selector=f"{LABEL_MANAGED}={MANAGER}"
        )
        current = {item["metadata"]["name"]: item for item in listed.get("items") or []}
        kept: set[str] = set()
        for plan in plans:
            existing = self._existing(plan, view)
            if self._stale(plan, view, existing):
                continue
            kept.add(plan.name)
            self._write(plan, pools.get(plan.pool, {}), current.get(plan.name), existing)
        for plan in plans:
            if plan.name in kept:
                self._asked[plan.name] = frozenset(plan.pods)
        for name in sorted(set(current) - kept):
            if self._asked.get(name, frozenset()) & self._arriving:
                continue  # its machine is there and its pods are about to land: it holds the machine
            self._asked.pop(name, None)
            self._withdraw(current[name])
        for gone in set(self._up_since) - kept:
            del self._up_since[gone]

    def _existing(self, plan: BufferPlan, view: ClusterView) -> list[str]:
        """The pool's machines (host names) when the buffer was made: kept on its PodTemplate."""
        try:
            template = self._core.read_namespaced_pod_template(plan.name, self.config.namespace)
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise
            return sorted(_hostnames(view, plan.pool))[:MAX_EXISTING]
        raw = (template.metadata.annotations or {}).get(ANNOTATION_EXISTING) or "[]"
        try:
            names = json.loads(raw)
        except ValueError:
            names = []
        return [str(n) for n in names][:MAX_EXISTING] if isinstance(names, list) else []

    def _stale(self, plan: BufferPlan, view: ClusterView, existing: Sequence[str]) -> bool:
        """True when the buffer's machines have been up ``stale_s`` and its pods still fit nowhere:
        it is withdrawn and cools down."""
        now = self.monotonic()
        up = _initialised(view, plan.pool) - set(existing)
        if len(up) < plan.nodes:
            self._up_since.pop(plan.name, None)
            return False
        since = self._up_since.setdefault(plan.name, now)
        if now - since < self.stale_s:
            return False
        log.warning(
            "buffer %s: its %d machine(s) are up and its pods still fit nowhere after %.0f s; "
            "withdrawn for %.0f s (%s)",
            plan.name,
            plan.nodes,
            self.stale_s,
            self.cooldown_s,
            plan.reason,
        )
        self._cool[plan.name] = now + self.cooldown_s
        return True

    def _nodepool(self, name: str) -> Object:
        try:
            pool: Object = self._custom.get_cluster_custom_object(*NODEPOOLS, name)
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:
                return {}
            raise
        return pool

    def _write(self, plan: BufferPlan, pool: Object, current: Object | None, existing: Sequence[str]) -> None:
        namespace = self.config.namespace
        template = chunk_template(plan, pool, existing=existing)
        buffer: Object = {
            "apiVersion": "/".join(BUFFERS[:2]),
            "kind": "CapacityBuffer",
            "metadata": {
                "name": plan.name,
                "labels": {LABEL_MANAGED: MANAGER},
                "annotations": {
                    ANNOTATION_REASON: clip(f"{plan.reason}; pods: {', '.join(plan.pods)}", limit=900)
                },
            },
            "spec": {"podTemplateRef": {"name": plan.name}, "replicas": plan.nodes},
        }
        self._apply_template(plan.name, template, existing)
        if current is None:
            log.info(
                "buffer %s: %d %s machine(s) of pool %s (%s)",
                plan.name,
                plan.nodes,
                plan.instance_type,
                plan.pool,
                plan.reason,
            )
            self._custom.create_namespaced_custom_object(*BUFFERS[:2], namespace, BUFFERS[2], buffer)
        elif (current.get("spec") or {}).get("replicas") != plan.nodes:
            patch = {
                "spec": {"replicas": plan.nodes},
                "metadata": {"annotations": buffer["metadata"]["annotations"]},
            }
            self._custom.patch_namespaced_custom_object(*BUFFERS[:2], namespace, BUFFERS[2], plan.name, patch)

    def _apply_template(self, name: str, template: Object, existing: Sequence[str]) -> None:
        """Create the buffer's PodTemplate, or replace it when ours changed (a digest of what we
        wrote is kept on it: the API server's defaults make a field by field comparison wrong)."""
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
        metadata = {
            "name": name,
            "labels": {LABEL_MANAGED: MANAGER},
            "annotations": {ANNOTATION_DIGEST: digest, ANNOTATION_EXISTING: json.dumps(list(existing))},
        }
        body: Object = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": metadata, "template": template}
        try:
            current = self._core.read_namespaced_pod_template(name, self.config.namespace)
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise
            self._core.create_namespaced_pod_template(self.config.namespace, body)
            return
        if (current.metadata.annotations or {}).get(ANNOTATION_DIGEST) != digest:
            metadata["resourceVersion"] = current.metadata.resource_version
            self._core.replace_namespaced_pod_template(name, self.config.namespace, body)

    def _withdraw(self, buffer: Object) -> None:
        """Scale the buffer to zero first, delete it once Karpenter saw that: Karpenter re-runs its
        provisioning simulation when a buffer changes, not when one is deleted, and until it runs
        again it still counts the buffer's last virtual pods on their machines (which keeps an
        empty machine from being consolidated)."""
        name = buffer["metadata"]["name"]
        if (buffer.get("spec") or {}).get("replicas") != 0:
            log.info("buffer %s withdrawn: its pods were placed or went", name)
            patch = {"spec": {"replicas": 0}}
            self._custom.patch_namespaced_custom_object(
                *BUFFERS[:2], self.config.namespace, BUFFERS[2], name, patch
            )
        elif (buffer.get("status") or {}).get("replicas") in (0, None):
            self._delete(name)

    def _delete(self, name: str) -> None:
        namespace = self.config.namespace
        try:
            self._custom.delete_namespaced_custom_object(*BUFFERS[:2], namespace, BUFFERS[2], name)
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise
        try:
            self._core.delete_namespaced_pod_template(name, namespace)
        except ApiException as exc:
            if status_of(exc) != NOT_FOUND:
                raise

    # --- protection -----------------------------------------------------------------------------

    def _protect(self, view: ClusterView) -> None:
        stuck = shares_stuck(view, pools=set(self.config.pools))
        for name, node in view.nodes.items():
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            ours = ANNOTATION_PROTECTED in annotations
            pods = stuck.get(name)
            text = clip(", ".join(sorted(pods or ())), limit=900)
            if pods and annotations.get(ANNOTATION_PROTECTED) != text:
                if not ours:
                    log.info(
                        "node %s protected from consolidation: its shares fit no other node (%s)", name, text
                    )
                self._annotate(name, {ANNOTATION_DO_NOT_DISRUPT: "true", ANNOTATION_PROTECTED: text})
            elif not pods and ours:
                log.info("node %s no longer protected: its shares could move", name)
                self._annotate(name, {ANNOTATION_DO_NOT_DISRUPT: None, ANNOTATION_PROTECTED: None})

    def _annotate(self, node: str, annotations: Mapping[str, str | None]) -> None:
        try:
            self._core.patch_node(node, {"metadata": {"annotations": dict(annotations)}})
        except ApiException as exc:
            if status_of(exc) not in (NOT_FOUND, CONFLICT):
                raise


def chunk_template(plan: BufferPlan, pool: Object, *, existing: Sequence[str] = ()) -> Object:
    """The pod template of one buffer chunk: one new machine of the plan's pool (module doc)."""
    spec = ((pool.get("spec") or {}).get("template") or {}).get("spec") or {}
    tolerations = [
        {"key": t.get("key"), "operator": "Exists", **({"effect": t["effect"]} if t.get("effect") else {})}
        for t in [*(spec.get("taints") or []), *(spec.get("startupTaints") or [])]
    ]
    mine = {"labelSelector": {"matchLabels": {LABEL_BUFFER: plan.name}}}
    affinity: Object = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": LABEL_NODEPOOL, "operator": "In", "values": [plan.pool]},
                            {"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": [plan.instance_type]},
                            *(
                                [{"key": LABEL_HOSTNAME, "operator": "NotIn", "values": list(existing)}]
                                if existing
                                else []
                            ),
                        ]
                    }
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{**mine, "topologyKey": LABEL_HOSTNAME}]
        },
    }
    if plan.tier_label and plan.tier_value:
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        terms[0]["matchExpressions"].append(
            {"key": plan.tier_label, "operator": "In", "values": [plan.tier_value]}
        )
    elif plan.tier_label:
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [{**mine, "topologyKey": plan.tier_label}]
        }
    cpu = plan_cpu(plan)
    return {
        "metadata": {"labels": {LABEL_BUFFER: plan.name, LABEL_MANAGED: MANAGER}},
        "spec": {
            "tolerations": tolerations,
            "affinity": affinity,
            "containers": [{"name": "chunk", "image": CHUNK_IMAGE, "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def plan_cpu(plan: BufferPlan) -> str:
    return f"{10 + plan.member_cpu_milli}m"


def _pool_labels(view: ClusterView, pool: str) -> list[Mapping[str, str]]:
    labels = (((n.get("metadata") or {}).get("labels")) or {} for n in view.nodes.values())
    return [label for label in labels if label.get(LABEL_NODEPOOL) == pool]


def _hostnames(view: ClusterView, pool: str) -> set[str]:
    return {str(label[LABEL_HOSTNAME]) for label in _pool_labels(view, pool) if label.get(LABEL_HOSTNAME)}


def _initialised(view: ClusterView, pool: str) -> set[str]:
    """Host names of the pool's machines Karpenter calls initialised."""
    return {
        str(label.get(LABEL_HOSTNAME))
        for label in _pool_labels(view, pool)
        if label.get(LABEL_INITIALIZED) == "true"
    }
