"""Adapter from the topology search (``topology.search.best_set``) to ``GpuSetChooser``.

The device plugin and the extender score GPU sets with the same code, so the kubelet-side
preference and the extender's recorded choice agree. The topology graph is built once per
inventory; a failure to build it degrades to the NUMA-ordered fallback in ``preferred``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from deviceplugin.preferred import GpuSetChooser
from topology.inventory import NodeInventory

log = logging.getLogger(__name__)


def gpu_chooser_for(inventory: NodeInventory, *, policy: Any = None) -> GpuSetChooser | None:
    """A chooser over ``inventory``'s topology graph, or None when the graph cannot be built."""
    try:
        graph_module = importlib.import_module("topology.graph")
        search_module = importlib.import_module("topology.search")
        graph = graph_module.TopologyGraph.from_inventory(inventory)
    except Exception:
        log.exception("topology search unavailable for node %s; using NUMA order", inventory.name)
        return None
    best_set = search_module.best_set

    def choose(available: frozenset[int], size: int, must_include: frozenset[int]) -> tuple[int, ...] | None:
        kwargs: dict[str, Any] = {"available": available, "size": size, "must_include": must_include}
        if policy is not None:
            kwargs["policy"] = policy
        selection = best_set(graph, **kwargs)
        return tuple(selection.gpus) if selection is not None else None

    return choose
