"""Adapter from the topology search (``topology.search.best_set``) to ``GpuSetChooser``.

The device plugin and the extender score GPU sets with the same code, so the kubelet-side
preference and the extender's recorded choice agree. The topology graph is built once per
inventory; a failure to build it degrades to the NUMA-ordered fallback in ``preferred``.
"""

from __future__ import annotations

import logging

from deviceplugin.preferred import GpuSetChooser
from topology.graph import TopologyGraph
from topology.inventory import NodeInventory
from topology.search import PlacementPolicy, best_set

log = logging.getLogger(__name__)


def gpu_chooser_for(
    inventory: NodeInventory, *, policy: PlacementPolicy = PlacementPolicy.BEST_EFFORT
) -> GpuSetChooser | None:
    """A chooser over ``inventory``'s topology graph, or None when the graph cannot be built."""
    try:
        graph = TopologyGraph.from_inventory(inventory)
    except Exception:
        log.exception("topology graph unavailable for node %s; using NUMA order", inventory.name)
        return None

    def choose(available: frozenset[int], size: int, must_include: frozenset[int]) -> tuple[int, ...] | None:
        try:
            selection = best_set(
                graph, available=available, size=size, must_include=must_include, policy=policy
            )
        except Exception:  # a search failure must not fail the pod: fall back to NUMA order
            log.exception("topology search failed for %d of %s; using NUMA order", size, sorted(available))
            return None
        return selection.gpus if selection is not None else None

    return choose
