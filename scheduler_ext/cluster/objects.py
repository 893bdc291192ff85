"""Reading the Kubernetes objects the extender watches into small values.

Tolerant on purpose: the extender must keep serving when one object is odd. A GpuNodeInventory
whose spec does not parse is logged and treated as "no inventory" for that node; a pod whose
assignment annotation does not parse holds nothing (and is logged), never crashes the cache.

A pod's ``gpuweave.io/assignment`` annotation is trusted only as far as the pod could really hold
those devices (anyone who may create a pod can write the annotation): it counts only once the pod
is bound (``spec.nodeName``) to the node the annotation names, and per container and resource only
IDs of that resource's form (a ``GPU-`` UUID for ``nvidia.com/gpu``, a compute unit for
``gpuweave.io/gpu-compute``, ...: its resource kind's ``fits_id``), up to the count the container
requests (the first IDs in the annotation's order; the requests as ``requests.pod_request`` reads
them, so a pod whose containers it refuses counts nothing); a Pending pod's annotation holds
nothing. The extender's own bind is counted before the watch shows it (the
cache's *assumed* holdings).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from devicekinds.registry import KINDS
from devicemodel.assignment import PodAssignment, fits_resource
from devicemodel.contracts import ANNOTATION_ASSIGNMENT
from devicemodel.degraded import STATUS_FIELD, links_from_wire
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import (
    ANNOTATION_EXPECTED_DURATION,
    BadGangError,
    active_deadline_s,
    gang_key,
    parse_expected_duration,
)
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import DEFAULT_REPLICAS, GpuSharing, SharingMode
from devicemodel.spec import NodeProfileSpec
from devicemodel.spec_templates import SpecTemplates
from scheduler_ext.pods.host import host_requests
from scheduler_ext.pods.requests import PodRequest, pod_request, request_counts

LOG = logging.getLogger(__name__)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DISRUPTION_CONDITION = "DisruptionTarget"  # set by evictions, preemption, taint and node-shutdown deletions
EVICTED_REASON = "Evicted"  # status.reason of a pod the kubelet evicted (also before the condition existed)
PREEMPTED_REASON = "PreemptionByScheduler"  # the DisruptionTarget reason kube-scheduler's preemption writes


@dataclass(frozen=True)
class InventoryRecord:
    """What one GpuNodeInventory says: the hardware, withheld devices and per-GPU sharing modes."""

    node: str
    inventory: NodeInventory
    unhealthy: frozenset[str]
    sharing: Mapping[str, GpuSharing]


@dataclass(frozen=True)
class PodRecord:
    """A pod as the cache tracks it: who it is and which devices it holds where."""

    uid: str
    namespace: str
    name: str
    node: str | None
    devices: frozenset[str]
    priority: int
    terminated: bool
    cpu_milli: int = 0  # host requests, as NodeResourcesFit counts them (``host``)
    memory_mib: int = 0
    gang: str = ""  # the gang key it names (``gangs.gang_key``), "" for none
    disrupted: bool = False  # ended, or being ended, by an eviction or a preemption (``pod_disrupted``)
    preempted: bool = False  # ... by kube-scheduler's preemption, for a higher priority (``pod_preempted``)
    # How long it is expected to hold its devices (a gang's wait for its tightest tier counts on
    # it, ``gangs.tier_wait``); not compared: a kubelet status update that adds the start time
    # changes no decision, so it rebuilds no node state (``ClusterCache._confirm`` keeps it).
    started_s: float | None = field(default=None, compare=False)  # status.startTime, Unix seconds
    expected_s: float | None = field(default=None, compare=False)  # gpuweave.io/expected-duration
    deadline_s: float | None = field(default=None, compare=False)  # spec.activeDeadlineSeconds

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def inventory_record(obj: Mapping[str, Any], *, templates: SpecTemplates | None = None) -> InventoryRecord:
    """Parse a GpuNodeInventory object; raises ``InvalidInputError`` with the field at fault.
    ``templates``: parse each hardware shape once (the cache's first sync of a large cluster)."""
    name = str(_mapping(obj.get("metadata")).get("name") or "")
    if not name:
        raise InvalidInputError("GpuNodeInventory without metadata.name; the name must be the node's name")
    raw_spec = _mapping(obj.get("spec"))
    source = f"GpuNodeInventory {name} spec"
    if templates is not None:
        inventory = templates.inventory(raw_spec, name=name, source=source)
    else:
        inventory = NodeProfileSpec.parse(raw_spec, source=source).to_inventory(node_name=name)
    status = _mapping(obj.get("status"))
    return InventoryRecord(
        node=name,
        inventory=_with_degraded_links(inventory, status),
        unhealthy=_unhealthy(status),
        sharing=_sharing(
            _mapping(status.get("sharing")) or _mapping(_mapping(obj.get("spec")).get("sharing"))
        ),
    )


def _with_degraded_links(inventory: NodeInventory, status: Mapping[str, Any]) -> NodeInventory:
    """The NVLink pairs the node agent found slow (``status.degradedLinks``, absent in inventories
    written before it existed), on the inventory the topology search reads; an entry naming no GPU
    of the node, or not parsing, is logged and left out."""
    links, problems = links_from_wire(status.get(STATUS_FIELD))
    known = {g.index for g in inventory.gpus}
    kept = tuple(link for link in links if {link.gpu_a, link.gpu_b} <= known)
    if len(kept) < len(links):
        problems.append(f"{len(links) - len(kept)} degraded link(s) name GPUs the node does not have")
    for problem in problems:
        LOG.warning("GpuNodeInventory %s: ignoring %s", inventory.name, problem)
    return replace(inventory, degraded_links=kept) if kept else inventory


def _unhealthy(status: Mapping[str, Any]) -> frozenset[str]:
    """Device IDs kept from new work: ``status.unhealthyDevices``, ``status.withheld``, or any
    ``status.devices`` entry whose health is not Healthy (the node agent publishes all three)."""
    listed = [*(status.get("unhealthyDevices") or []), *(status.get("withheld") or [])]
    ids = {str(d) for d in listed if isinstance(d, str | int)}
    for device in status.get("devices") or []:
        entry = _mapping(device)
        health = str(entry.get("health") or entry.get("state") or "Healthy").lower()
        if entry.get("id") and health not in ("healthy", "probation"):
            ids.add(str(entry["id"]))
    return frozenset(ids)


def _sharing(raw: Mapping[str, Any]) -> Mapping[str, GpuSharing]:
    result: dict[str, GpuSharing] = {}
    for key, value in raw.items():
        entry = _mapping(value) if not isinstance(value, str) else {"mode": value}
        try:
            mode = SharingMode(str(entry.get("mode") or "exclusive"))
        except ValueError:
            LOG.warning("ignoring sharing entry %s: unknown mode %r", key, entry.get("mode"))
            continue
        replicas = entry.get("replicas")
        result[str(key)] = GpuSharing(mode, replicas if isinstance(replicas, int) else DEFAULT_REPLICAS)
    return result


def pod_identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(uid, "namespace/name") as ``pod_record`` has them, without parsing the rest."""
    metadata = _mapping(obj.get("metadata"))
    return _pod_uid(metadata), f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def _pod_uid(metadata: Mapping[str, Any]) -> str:
    """The pod's UID; "namespace/name" as given for an object without one (a snapshot file's pod)."""
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


def pod_disrupted(obj: Mapping[str, Any]) -> bool:
    """Whether the pod is ended by a disruption, not by its own end or its owner's delete: the
    ``DisruptionTarget`` condition True (the API server's Eviction, kube-scheduler's preemption,
    the taint manager, the kubelet and the pod garbage collector set it before the delete), or a
    kubelet eviction's ``Evicted`` reason. How a gang's loss of a member to a fault or a
    preemption is told from a job that finished or was deleted (``gangs.book``)."""
    status = _mapping(obj.get("status"))
    if status.get("reason") == EVICTED_REASON:
        return True
    conditions = status.get("conditions")
    return any(
        _mapping(c).get("type") == DISRUPTION_CONDITION and _mapping(c).get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else [])
    )


def pod_preempted(obj: Mapping[str, Any]) -> bool:
    """Whether the disruption is kube-scheduler's preemption: the ``DisruptionTarget`` condition
    True with reason ``PreemptionByScheduler`` (what its preemption writes on each victim before
    the delete). Such a pod made room for more important work on purpose; a fault, a drain or a
    node's loss end a pod with another reason."""
    conditions = _mapping(obj.get("status")).get("conditions")
    return any(
        _mapping(c).get("type") == DISRUPTION_CONDITION
        and _mapping(c).get("status") == "True"
        and _mapping(c).get("reason") == PREEMPTED_REASON
        for c in (conditions if isinstance(conditions, list) else [])
    )


def pod_record(obj: Mapping[str, Any]) -> PodRecord:
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    annotations = _mapping(metadata.get("annotations"))
    node = spec.get("nodeName") or None
    where = f"pod {metadata.get('namespace')}/{metadata.get('name')}"
    devices = _counted_devices(obj, annotations.get(ANNOTATION_ASSIGNMENT), node=node, where=where)
    priority = spec.get("priority")
    cpu, memory = host_requests(obj)
    return PodRecord(
        uid=_pod_uid(metadata),
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        node=str(node) if node else None,
        devices=devices,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        terminated=str(status.get("phase") or "") in TERMINAL_PHASES,  # terminating pods still hold
        cpu_milli=cpu,
        memory_mib=memory,
        gang=gang_key(obj),
        disrupted=pod_disrupted(obj),
        preempted=pod_preempted(obj),
        started_s=_timestamp(status.get("startTime")),
        expected_s=_declared_duration(annotations.get(ANNOTATION_EXPECTED_DURATION)),
        deadline_s=active_deadline_s(obj),
    )


def _timestamp(value: object) -> float | None:
    """An RFC 3339 time the API server wrote (``2026-01-02T03:04:05Z``) as Unix seconds."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _declared_duration(value: object) -> float | None:
    """A running pod's run-time estimate, None when it gives none (a bad one is the filter's to
    report, on the pending pod; here it only falls back to the default)."""
    if value is None:
        return None
    try:
        return parse_expected_duration(value)
    except BadGangError:
        return None


def _counted_devices(obj: Mapping[str, Any], raw: object, *, node: object, where: str) -> frozenset[str]:
    """The devices a pod's assignment annotation may count (see the module docstring)."""
    if not isinstance(raw, str) or not raw or not node:
        return frozenset()  # no annotation, or not bound: a Pending pod holds nothing
    try:
        assignment = PodAssignment.from_annotation(raw)
        allowed = requested_units(pod_request({"spec": obj.get("spec")}))  # its containers only
    except InvalidInputError as exc:
        LOG.warning("%s: %s; counting none of its devices", where, exc)
        return frozenset()
    if assignment.node != node:
        LOG.warning(
            "%s: its gpuweave.io/assignment names node %.200r but the pod is bound to %.200r; "
            "counting none of its devices",
            where,
            assignment.node,
            node,
        )
        return frozenset()
    counted: set[str] = set()
    for container, chosen in assignment.containers.items():
        for resource, ids in chosen.devices.items():
            limit = allowed.get((container, resource), 0)
            counted.update(_within(ids, resource, limit, where=f"{where} container {container:.200}"))
    return frozenset(counted)


def _within(ids: list[str], resource: str, limit: int, *, where: str) -> list[str]:
    """Of the IDs named for one container and resource, those of that resource's form
    (``fits_resource``), the first ``limit`` of them in the annotation's order."""
    named = list(dict.fromkeys(ids))
    kind = KINDS.kind_for(resource)
    fitting = [d for d in named if (kind.fits_id(resource, d) if kind else fits_resource(resource, d))]
    if len(fitting) < len(named) or len(fitting) > limit:
        LOG.warning(
            "%s: its gpuweave.io/assignment names %d devices of %.200s (%d not of that resource's "
            "kind) and it requests %d; counting %d",
            where,
            len(named),
            resource,
            len(named) - len(fitting),
            limit,
            min(limit, len(fitting)),
        )
    return fitting[:limit]


def requested_units(request: PodRequest) -> dict[tuple[str, str], int]:
    """(container name, resource name) -> the units that container requests, init containers
    included, as ``requests.pod_request`` parsed them."""
    return {(c.name, resource): n for c in request.containers for resource, n in request_counts(c).items()}
