"""GPU set search per node layout: the extender's view of the topology score.

Wraps ``topology.search.best_set`` (the same code the node agent uses in
``GetPreferredAllocation``; it memoizes by topology shape and free mask, so identical nodes share
work) and normalises a set's value by the best set of the same size on an idle node, which puts
every layout on one 0..1 scale for the node score. That relative quality says how well a set uses
its own node; ``absolute_quality`` says how good the set is against fixed references, so that
different hardware classes compare (a PCIe-only node's best 4 GPUs are not an NVLink quad).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from devicemodel.inventory import NodeInventory
from scheduler_ext.decide.layout import NodeLayout
from topology.graph import TopologyGraph
from topology.scoring import SetScore
from topology.search import PlacementPolicy, best_set

# Absolute scale of a multi-GPU set's value (topology.scoring, in GB/s): logarithmic between a
# PCIe path across sockets (FLOOR) and an NVSwitch-connected H100 set (REFERENCE), because each
# hardware generation multiplies bandwidth rather than adding to it.
ABSOLUTE_FLOOR_GBPS = 10.0
ABSOLUTE_REFERENCE_GBPS = 450.0
NVLINK_SHARE = 0.5  # half of the absolute quality: every pair talks over NVLink/NVSwitch, not PCIe


def absolute_quality(score: SetScore) -> float:
    """0..1 quality of a set of 2+ GPUs on a fixed scale shared by every layout.

    Half is the set's value on the log scale above, half whether every pair is NVLink- or
    NVSwitch-connected (collectives then never cross PCIe or the host bridge).
    """
    span = math.log(ABSOLUTE_REFERENCE_GBPS / ABSOLUTE_FLOOR_GBPS)
    bandwidth = math.log(max(score.value, ABSOLUTE_FLOOR_GBPS) / ABSOLUTE_FLOOR_GBPS) / span
    nvlink = 1.0 if score.all_nvlink else 0.0
    return (1.0 - NVLINK_SHARE) * min(1.0, bandwidth) + NVLINK_SHARE * nvlink


@dataclass(frozen=True)
class SetChoice:
    """A chosen GPU set with its relative, look-ahead and absolute qualities (each 0..1)."""

    gpus: tuple[int, ...]
    quality: float  # value over the best same-size set on an idle node of this layout
    lookahead: float  # how good the best sets left free are (topology.search)
    absolute: float  # ``absolute_quality``; 0 for a single GPU


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
    ) -> SetChoice | None:
        """The best ``size``-set of ``available`` under ``policy``, or None."""
        if size <= 0 or len(available) < size:
            return None
        selection = best_set(self.graph, available=available, size=size, policy=PlacementPolicy(policy))
        if selection is None:
            return None
        gpus = tuple(sorted(selection.gpus))
        ideal = self._ideal_value(size)
        quality = min(1.0, selection.score.value / ideal) if ideal > 0 else 1.0
        absolute = absolute_quality(selection.score) if size > 1 else 0.0
        return SetChoice(gpus=gpus, quality=quality, lookahead=selection.lookahead, absolute=absolute)

    def _ideal_value(self, size: int) -> float:
        ideal = self._ideal.get(size)
        if ideal is None:
            selection = best_set(self.graph, available=self._all, size=size, lookahead=False)
            ideal = float(selection.score.value) if selection is not None else 0.0
            with self._lock:
                self._ideal[size] = ideal
        return ideal
