"""The cluster as the extender sees it, built from listed objects by the extender's own code.

``gpuweave status`` must show what the scheduler decides on, not a second reading of the same
objects: the Nodes, GpuNodeInventory objects and Pods go through ``snapshot.apply_objects`` into
a ``ClusterCache`` (the code the extender's snapshot mode runs; its watches call the same
``upsert_*`` methods), and decisions come from a ``DecisionCore`` built by ``app.build_core``.
The raw objects stay beside the cache for what the cache does not keep: health reasons, Node
taints and labels, bound pods' specs, and the GpuBadHardware list.

The mix the fragmentation measure is taken against is learned as the extender learns it, from
the shapes of the GPU pods listed (the cold-start prior until enough pods are seen), or pinned
with ``--workload FILE``. Building a view does no I/O; the API adapter (``cluster_list``) or a
snapshot file supplies the objects.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from devicemodel.contracts import ANNOTATION_ASSIGNMENT, BAD_HARDWARE_KIND, NODE_INVENTORY_KIND
from scheduler_ext.api import (
    BadPodRequestError,
    ClusterCache,
    DecisionCore,
    apply_objects,
    build_core,
    pod_is_ours,
    pod_request,
    pod_shape,
)
from topology.fragmentation import TargetWorkload

Object = Mapping[str, Any]


@dataclass(frozen=True)
class BadHardware:
    """One GpuBadHardware entry: a GPU taken out of service for good, by UUID."""

    uuid: str
    node: str
    reason: str
    strikes: int
    since: str


@dataclass(frozen=True)
class ClusterView:
    cache: ClusterCache
    core: DecisionCore
    nodes: Mapping[str, Object]  # Node objects by name
    inventories: Mapping[str, Object]  # GpuNodeInventory objects by node name
    pods: Mapping[str, Object]  # Pods by namespace/name, as listed
    bad_hardware: tuple[BadHardware, ...]

    @classmethod
    def of(
        cls, objects: Iterable[Object], *, workload: TargetWorkload | None = None, pending: str = ""
    ) -> ClusterView:
        """The view of ``objects``; ``pending`` (namespace/name) is loaded as if not yet bound,
        so decisions count its devices as free (what ``--explain`` ranks a placed pod against)."""
        listed = list(objects)
        by_kind: dict[str, dict[str, Object]] = {"Node": {}, NODE_INVENTORY_KIND: {}, "Pod": {}}
        for obj in listed:
            kind = str(obj.get("kind") or "")
            if kind in by_kind:
                by_kind[kind][_key(obj, namespaced=kind == "Pod")] = obj
        if pending in by_kind["Pod"]:
            by_kind["Pod"][pending] = unbound(by_kind["Pod"][pending])
        cache, core = build_core(share_workload=workload)
        apply_objects(
            iter(
                [*by_kind["Node"].values(), *by_kind[NODE_INVENTORY_KIND].values(), *by_kind["Pod"].values()]
            ),
            cache,
        )
        cache.synced.set()
        _learn(core, by_kind["Pod"].values())
        return cls(
            cache=cache,
            core=core,
            nodes=by_kind["Node"],
            inventories=by_kind[NODE_INVENTORY_KIND],
            pods=by_kind["Pod"],
            bad_hardware=tuple(sorted(_bad_hardware(listed), key=lambda b: (b.node, b.uuid))),
        )


def unbound(pod: Object) -> dict[str, Any]:
    """The pod as it was before its bind: no node name, no assignment annotation, Pending."""
    copied: dict[str, Any] = copy.deepcopy(dict(pod))
    copied.setdefault("spec", {}).pop("nodeName", None)
    (copied.setdefault("metadata", {}).get("annotations") or {}).pop(ANNOTATION_ASSIGNMENT, None)
    copied["status"] = {"phase": "Pending"}
    return copied


def _key(obj: Object, *, namespaced: bool) -> str:
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name") or "")
    return f"{metadata.get('namespace') or 'default'}/{name}" if namespaced else name


def _learn(core: DecisionCore, pods: Iterable[Object]) -> None:
    """Count each GPU pod's shape once, as the extender's filter does for the pods it sees."""
    for pod in pods:
        if not pod_is_ours(pod):
            continue
        try:
            request = pod_request(pod)
        except BadPodRequestError:
            continue
        shaped = pod_shape(request, pod)
        if request.interested and shaped is not None:
            core.workload.observe(request.uid or request.key, *shaped)


def _bad_hardware(objects: Iterable[Object]) -> Iterable[BadHardware]:
    for obj in objects:
        if obj.get("kind") != BAD_HARDWARE_KIND:
            continue
        spec = obj.get("spec") or {}
        strikes = spec.get("strikes")
        yield BadHardware(
            uuid=str(spec.get("uuid") or (obj.get("metadata") or {}).get("name") or ""),
            node=str(spec.get("node") or ""),
            reason=str(spec.get("reason") or ""),
            strikes=strikes if isinstance(strikes, int) and not isinstance(strikes, bool) else 0,
            since=str(spec.get("since") or ""),
        )
