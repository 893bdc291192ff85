"""Offline mode: the cluster from a Kubernetes ``List`` file, binds applied in memory only.

A snapshot is what ``kubectl get nodes,gpunodeinventories,pods -A -o yaml`` prints (a ``List``), or
several YAML documents, each a List or one object, or the JSON form; nested Lists are flattened.
A file with no document, or a document that is neither (no ``kind``, a List without ``items``,
a bare list or string), is refused in one line instead of being read as an empty cluster. ResourceSlices and
ResourceClaims in it (``kubectl get resourceslices,resourceclaims -A``) feed the claim scores. It
lets the extender run with no cluster: for what-if runs, tests and benchmarks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import ANNOTATION_ASSIGNMENT, NODE_INVENTORY_KIND
from devicemodel.errors import InvalidInputError, echo
from scheduler_ext.cluster.cache import ClusterCache


def load_snapshot(path: Path, cache: ClusterCache) -> dict[str, int]:
    """Feed every Node, GpuNodeInventory, Pod, ResourceSlice and ResourceClaim in the file into
    the cache; returns counts by kind."""
    counts = apply_objects(iter(read_objects(path)), cache)
    cache.synced.set()
    return counts


def read_objects(path: Path) -> list[Mapping[str, Any]]:
    """Every object in the file, Lists flattened (``gpuweave status`` reads more kinds than the cache)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read snapshot {path}: {exc.strerror}; check --snapshot") from None
    objects = list(_documents(text, source=str(path)))
    kinds = sorted({str(obj.get("kind")) for obj in objects})
    if kinds and not CLUSTER_KINDS.intersection(kinds):  # an empty List is a cluster with nothing yet
        held = ", ".join(echo(kind, limit=40) for kind in kinds[:5])
        raise InvalidInputError(
            f"snapshot {path} holds no Node, {NODE_INVENTORY_KIND} or Pod (it holds {held}); {_GIVE}"
        )
    return objects


# A snapshot that holds objects holds at least one of these, else it is some other file
CLUSTER_KINDS = frozenset({"Node", NODE_INVENTORY_KIND, "Pod"})


def apply_objects(objects: Iterator[Mapping[str, Any]], cache: ClusterCache) -> dict[str, int]:
    counts: dict[str, int] = {}
    pods = []
    for obj in objects:
        kind = str(obj.get("kind") or "")
        if kind == "Node":
            cache.upsert_node(obj)
        elif kind == NODE_INVENTORY_KIND:
            cache.upsert_inventory(obj)
        elif kind == "ResourceSlice":
            cache.claims.upsert_slice(obj)
        elif kind == "ResourceClaim":
            cache.claims.upsert_claim(obj)
        elif kind == "Pod":
            pods.append(obj)  # after the nodes, so holdings land on known nodes
        else:
            continue
        counts[kind] = counts.get(kind, 0) + 1
    for pod in pods:
        cache.upsert_pod(pod)
        cache.remember_pod(pod)  # offline, the cache is the only record of bound pods too
    return counts


def _documents(text: str, *, source: str) -> Iterator[Mapping[str, Any]]:
    try:
        loaded = [json.loads(text)] if text.lstrip().startswith("{") else list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"snapshot {source} is neither JSON nor YAML: {exc}") from None
    documents = [d for d in loaded if d is not None]
    if not documents:
        raise InvalidInputError(f"snapshot {source} is empty; {_GIVE}")
    for number, document in enumerate(documents, start=1):
        where = f"snapshot {source}" + (f", document {number}," if len(documents) > 1 else "")
        yield from _flatten(document, where=where)


_GIVE = "give a Kubernetes List, as `kubectl get nodes,gpunodeinventories,pods -A -o yaml` prints"


def _flatten(document: object, *, where: str) -> Iterator[Mapping[str, Any]]:
    """The objects of one document: a Kubernetes List (``kind: List`` or ``*List``, whose
    ``items`` is a list, nested Lists flattened) or one Kubernetes object (a ``kind``). Anything
    else is refused (``InvalidInputError``, one line): read as an empty cluster, a wrong file
    would show as a cluster with nothing in it."""
    if not isinstance(document, Mapping):
        shown = f"{type(document).__name__} {echo(document, limit=40)}"
        raise InvalidInputError(f"{where} holds {shown}, not a Kubernetes List or object; {_GIVE}")
    kind = document.get("kind")
    if not isinstance(kind, str) or not kind:
        keys = ", ".join(sorted(map(str, document))[:5]) or "none"
        raise InvalidInputError(
            f"{where} is not a Kubernetes List or object: it has no kind (its keys: {echo(keys)}); {_GIVE}"
        )
    if not kind.endswith("List"):
        yield document
        return
    items = document.get("items")
    if not isinstance(items, list):
        raise InvalidInputError(f"{where} is a {echo(kind, limit=40)} without an items list; {_GIVE}")
    for item in items:
        yield from _flatten(item, where=f"{where}: an item of its {kind[:40]}")


class SnapshotBinder:
    """Bind in memory: the pod gets the annotation and node name, and the cache sees it as a watch would."""

    def __init__(self, cache: ClusterCache) -> None:
        self._cache = cache

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None:
        bound = copy.deepcopy(dict(pod))
        bound.setdefault("spec", {})["nodeName"] = node
        if assignment is not None:
            metadata = bound.setdefault("metadata", {})
            annotations = dict(metadata.get("annotations") or {})
            annotations[ANNOTATION_ASSIGNMENT] = assignment.to_annotation()
            metadata["annotations"] = annotations
        self._cache.upsert_pod(bound)
        self._cache.remember_pod(bound)  # no API server keeps it: the cache is the record
