"""Parse a node spec once per hardware model, not once per node.

A cluster of 15,000 nodes holds a handful of machine models: their published specs differ only
in the GPU and MIG UUIDs (and the node's name). Full validation and derivation of one spec takes
milliseconds, which adds up to a minute before the extender's first sync is done. Here the spec
with its UUIDs blanked is the key (its ``shape``); the first spec of each shape is parsed and
checked in full, and every later one reuses that inventory with its own UUIDs put in, after the
same UUID checks the full parse makes (pattern, no duplicates). Anything unusual (a UUID left
to be derived, a malformed one, a duplicate) takes the full parse, so its error is the same.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfileSpec

GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-fA-F-]{8,}$")
MAX_SHAPES = 256  # distinct hardware shapes remembered (least recently used dropped first)


def _entries(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]] | None:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        return None
    return value


def spec_shape(spec: Mapping[str, Any]) -> tuple[bytes, tuple[str, ...]] | None:
    """(the spec without its UUIDs as canonical JSON, the UUIDs: GPUs' then MIG devices'), or
    None when the spec cannot share a shape (not the expected lists, a UUID missing or malformed,
    duplicates)."""
    gpus, migs = _entries(spec, "gpus"), _entries(spec, "migDevices")
    if gpus is None or migs is None:
        return None
    uuids = tuple(e.get("uuid") for e in (*gpus, *migs))
    patterns = [GPU_UUID] * len(gpus) + [MIG_UUID] * len(migs)
    valid = all(isinstance(u, str) and p.match(u) for u, p in zip(uuids, patterns, strict=True))
    if not valid or len(set(uuids)) != len(uuids):
        return None
    blank = {
        **spec,
        "gpus": [{**g, "uuid": None} for g in gpus],
        "migDevices": [{**m, "uuid": None} for m in migs],
    }
    try:
        shape = orjson.dumps(blank, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON values: the full parse says what is wrong
        return None
    return shape, tuple(str(u) for u in uuids)


def _renamed(template: NodeInventory, *, old: Sequence[str], new: Sequence[str], name: str) -> NodeInventory:
    mapping = dict(zip(old, new, strict=True))
    gpus = tuple(replace(g, uuid=mapping[g.uuid]) for g in template.gpus)
    migs = tuple(
        replace(m, uuid=mapping[m.uuid], parent_uuid=mapping[m.parent_uuid]) for m in template.mig_devices
    )
    return replace(template, name=name, gpus=gpus, mig_devices=migs, labels=dict(template.labels))


class SpecTemplates:
    """Thread-safe memo of parsed specs by shape; ``inventory`` is the drop-in for
    ``NodeProfileSpec.parse(spec).to_inventory(node_name=name)``."""

    def __init__(self, *, limit: int = MAX_SHAPES) -> None:
        self._limit = limit
        self._shapes: OrderedDict[bytes, tuple[NodeInventory, tuple[str, ...]]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def inventory(self, spec: Mapping[str, Any], *, name: str, source: str) -> NodeInventory:
        """The node's inventory; raises what the parse raises."""
        found = spec_shape(spec)
        if found is None:
            return NodeProfileSpec.parse(spec, source=source).to_inventory(node_name=name)
        shape, uuids = found
        with self._lock:
            template = self._shapes.get(shape)
            if template is not None:
                self._shapes.move_to_end(shape)
                self.hits += 1
        if template is not None:
            return _renamed(template[0], old=template[1], new=uuids, name=name)
        inventory = NodeProfileSpec.parse(spec, source=source).to_inventory(node_name=name)
        with self._lock:
            self.misses += 1
            self._shapes[shape] = (inventory, uuids)
            while len(self._shapes) > self._limit:
                self._shapes.popitem(last=False)
        return inventory
