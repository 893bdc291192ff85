"""Reading the Kubernetes objects the extender watches into small values.

Tolerant on purpose: the extender must keep serving when one object is odd. A GpuNodeInventory
whose spec does not parse is logged and treated as "no inventory" for that node; a pod whose
assignment annotation does not parse holds nothing (and is logged), never crashes the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_ext.host import host_requests
from scheduler_ext.layout import DEFAULT_REPLICAS, GpuSharingEntry, ShareMode
from topology.assignment import PodAssignment
from topology.contracts import ANNOTATION_ASSIGNMENT
from topology.errors import InvalidInputError
from topology.gangs import gang_key
from topology.inventory import NodeInventory
from topology.spec import NodeProfileSpec
from topology.spec_templates import SpecTemplates

LOG = logging.getLogger(__name__)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class InventoryRecord:
    """What one GpuNodeInventory says: the hardware, withheld devices and per-GPU sharing modes."""

    node: str
    inventory: NodeInventory
    unhealthy: frozenset[str]
    sharing: Mapping[str, GpuSharingEntry]


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
        inventory=inventory,
        unhealthy=_unhealthy(status),
        sharing=_sharing(
            _mapping(status.get("sharing")) or _mapping(_mapping(obj.get("spec")).get("sharing"))
        ),
    )


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


def _sharing(raw: Mapping[str, Any]) -> Mapping[str, GpuSharingEntry]:
    result: dict[str, GpuSharingEntry] = {}
    for key, value in raw.items():
        entry = _mapping(value) if not isinstance(value, str) else {"mode": value}
        try:
            mode = ShareMode(str(entry.get("mode") or "exclusive"))
        except ValueError:
            LOG.warning("ignoring sharing entry %s: unknown mode %r", key, entry.get("mode"))
            continue
        replicas = entry.get("replicas")
        result[str(key)] = GpuSharingEntry(mode, replicas if isinstance(replicas, int) else DEFAULT_REPLICAS)
    return result


def pod_identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(uid, "namespace/name") as ``pod_record`` has them, without parsing the rest."""
    metadata = _mapping(obj.get("metadata"))
    return _pod_uid(metadata), f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def _pod_uid(metadata: Mapping[str, Any]) -> str:
    """The pod's UID; "namespace/name" as given for an object without one (a snapshot file's pod)."""
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")


def pod_record(obj: Mapping[str, Any]) -> PodRecord:
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    annotations = _mapping(metadata.get("annotations"))
    devices: frozenset[str] = frozenset()
    node = spec.get("nodeName") or None
    raw = annotations.get(ANNOTATION_ASSIGNMENT)
    if isinstance(raw, str) and raw:
        try:
            assignment = PodAssignment.from_annotation(raw)
            devices = frozenset(assignment.all_device_ids())
            node = node or assignment.node
        except InvalidInputError as exc:
            LOG.warning("pod %s/%s: %s", metadata.get("namespace"), metadata.get("name"), exc)
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
    )
