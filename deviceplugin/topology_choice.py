"""Adapter from the topology search (``topology.search.best_set``) to ``GpuSetChooser``.

The device plugin and the extender score GPU sets with the same code, so the kubelet-side
preference and the extender's recorded choice agree. The topology graph is built once per
inventory; a failure to build it degrades to the NUMA-ordered fallback in ``preferred``.

The search (numpy) and the graph are prepared on first use or by ``prepare()``, which the agent
calls on a background thread once its resources are registered: registration is not delayed by
~0.3 s of imports, and the first GetPreferredAllocation does not pay for them either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from devicemodel.inventory import NodeInventory

if TYPE_CHECKING:
    from topology.search import PlacementPolicy, Selection

log = logging.getLogger(__name__)


class TopologyChooser:
    """A ``GpuSetChooser`` over one inventory's topology graph (callable like one)."""

    def __init__(self, inventory: NodeInventory, *, policy: PlacementPolicy | None = None) -> None:
        self._inventory = inventory
        self._policy = policy
        self._lock = threading.Lock()
        self._prepared = False
        self._search: Callable[..., Selection | None] | None = None

    def prepare(self) -> bool:
        """Import the search and build the graph (once); False when the graph cannot be built."""
        with self._lock:
            if not self._prepared:
                self._search = self._build_search()
                self._prepared = True
            return self._search is not None

    def _build_search(self) -> Callable[..., Selection | None] | None:
        # Deferred imports (see the module doc): numpy comes with the search.
        from topology.graph import TopologyGraph  # noqa: PLC0415
        from topology.search import PlacementPolicy, best_set  # noqa: PLC0415

        try:
            graph = TopologyGraph.from_inventory(self._inventory)
            _ = graph.shape_key  # computed once here rather than by the first request
        except Exception:
            log.exception("topology graph unavailable for node %s; using NUMA order", self._inventory.name)
            return None
        return partial(best_set, graph, policy=self._policy or PlacementPolicy.BEST_EFFORT)

    def __call__(
        self, available: frozenset[int], size: int, must_include: frozenset[int]
    ) -> tuple[int, ...] | None:
        if not self.prepare() or self._search is None:
            return None
        try:
            selection = self._search(available=available, size=size, must_include=must_include)
        except Exception:  # a search failure must not fail the pod: fall back to NUMA order
            log.exception("topology search failed for %d of %s; using NUMA order", size, sorted(available))
            return None
        return selection.gpus if selection is not None else None


def gpu_chooser_for(inventory: NodeInventory, *, policy: PlacementPolicy | None = None) -> TopologyChooser:
    """A chooser over ``inventory``'s topology graph (best-effort policy unless ``policy``)."""
    return TopologyChooser(inventory, policy=policy)
