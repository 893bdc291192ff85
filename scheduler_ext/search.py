"""GPU set search per node layout: the extender's view of the topology score.

Wraps ``topology.search.best_set`` (the same code the node agent uses in
``GetPreferredAllocation``; it memoizes by topology shape and free mask, so identical nodes share
work) and normalises a set's value by the best set of the same size on an idle node, which puts
every layout on one 0..1 scale for the node score.
"""

from __future__ import annotations

import threading

from scheduler_ext.layout import NodeLayout
from topology.graph import TopologyGraph
from topology.inventory import NodeInventory
from topology.search import PlacementPolicy, best_set


class LayoutSearch:
    """Best GPU sets and their normalised quality for one node layout (thread-safe)."""

    def __init__(self, layout: NodeLayout, inventory: NodeInventory) -> None:
        self.layout = layout
        self.graph = TopologyGraph.from_inventory(inventory)
        self._all = frozenset(g.index for g in layout.gpus)
        self._ideal: dict[int, float] = {}
        self._lock = threading.Lock()

    def best(
        self, available: frozenset[int], size: int, *, policy: str = PlacementPolicy.BEST_EFFORT.value
    ) -> tuple[tuple[int, ...], float, float] | None:
        """(GPUs, set quality 0..1, look-ahead quality 0..1) of the best ``size``-set, or None."""
        if size <= 0 or len(available) < size:
            return None
        selection = best_set(self.graph, available=available, size=size, policy=PlacementPolicy(policy))
        if selection is None:
            return None
        gpus = tuple(sorted(selection.gpus))
        ideal = self._ideal_value(size)
        quality = min(1.0, selection.score.value / ideal) if ideal > 0 else 1.0
        return gpus, quality, selection.lookahead

    def _ideal_value(self, size: int) -> float:
        ideal = self._ideal.get(size)
        if ideal is None:
            selection = best_set(self.graph, available=self._all, size=size, lookahead=False)
            ideal = float(selection.score.value) if selection is not None else 0.0
            with self._lock:
                self._ideal[size] = ideal
        return ideal
