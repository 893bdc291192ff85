"""Reservation by node kind: capacity that only some tasks can use is not spent on tasks that fit anywhere.

A node kind is (GPU product, GPU count, host CPU, host memory) as built. A task shape of the mix
that fits only some kinds even on an empty node (a GPU-type constraint, 8 GPUs, 120 cores, 700
GiB) brings its expected demand (probability x milli-GPU) to those kinds, spread in proportion
to their GPUs; ``share`` is that per kind, as a part of all expected GPU demand. Future arrivals
fill the free GPUs with the mix, so those tasks will ask kind k for about ``share[k]`` of all
free capacity: if k holds less of the free GPUs than that, all of its free capacity is theirs
(pressure 1), else the ratio. A placement then costs, per milli-GPU it takes, its kind's
pressure, added to the fragment increase (weight 1: the expected loss itself, no tuned factor).
FGD's per-node measure cannot see this: a scarce kind's idle GPU counts like any other until
the tasks that need it fail. Shapes that fit every kind reserve nothing, so a uniform cluster
has no reservation.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from devicemodel.sharing import MILLI_PER_COMPUTE_UNIT, MILLI_PER_GPU
from scheduler_ext.decide.state import NodeState
from topology.fragmentation import TargetWorkload

NodeKind = tuple[str, int, int, int]  # (GPU product, GPU count, CPU milli, memory MiB) as built


@dataclass(frozen=True)
class ReservedDemand:
    """Per node kind, the part of all expected GPU demand only it (and kinds like it) can serve."""

    share: Mapping[NodeKind, float]

    @classmethod
    def of(cls, workload: TargetWorkload, capacity: Mapping[NodeKind, int]) -> ReservedDemand:
        """``capacity``: GPUs per kind in the cluster."""
        kinds = [k for k, gpus in capacity.items() if gpus > 0]
        memory = workload.memory_mib or (0,) * len(workload.shapes)
        demand = dict.fromkeys(kinds, 0.0)
        total = 0.0
        for shape, p, mem in zip(workload.shapes, workload.probabilities, memory, strict=True):
            if shape.is_cpu_only:
                continue
            total += p * shape.total_gpu_milli
            fits = [
                k
                for k in kinds
                if shape.allows_model(k[0])
                and k[1] >= shape.gpu_count
                and k[2] >= shape.cpu_milli
                and k[3] >= mem
            ]
            if fits and len(fits) < len(kinds):
                room = sum(capacity[k] for k in fits)
                for kind in fits:
                    demand[kind] += capacity[kind] / room * p * shape.total_gpu_milli
        return cls({k: (d / total if total > 0 else 0.0) for k, d in demand.items() if d > 0})

    def pressure(self, free: Mapping[NodeKind, float]) -> dict[NodeKind, float]:
        """Per kind with a reservation, the expected part of one free milli-GPU its tasks need."""
        everything = sum(free.values())
        result = {}
        for kind, share in self.share.items():
            held = free.get(kind, 0.0)
            result[kind] = 1.0 if held <= 0 else min(1.0, share * everything / held)
        return result


class KindTotals:
    """Per node kind: GPUs built and milli-GPU free now, kept up to date on every node rebuild.

    ``number_of`` maps a node to its kind's small integer (``kinds[number]`` is the kind): the
    per-request pass over every node name looks kinds up by int, whose hash is itself, where a
    ``NodeKind`` tuple would be hashed again, element by element, for every node of every call."""

    def __init__(self) -> None:
        self.number_of: dict[str, int] = {}
        self.kinds: list[NodeKind] = []
        self._numbers: dict[NodeKind, int] = {}
        self.capacity: dict[NodeKind, int] = {}
        self.free: dict[NodeKind, float] = {}
        self._node: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self.version = 0  # bumped when ``capacity`` changes

    def put(self, name: str, kind: NodeKind | None, gpus: int, free: float) -> None:
        with self._lock:
            old_number = self.number_of.pop(name, None)
            old_kind = self.kinds[old_number] if old_number is not None else None
            old_gpus, old_free = self._node.pop(name, (0, 0.0))
            if old_kind is not None:
                self.capacity[old_kind] -= old_gpus
                self.free[old_kind] -= old_free
            if kind is not None:
                self.number_of[name] = self._number(kind)
                self._node[name] = (gpus, free)
                self.capacity[kind] = self.capacity.get(kind, 0) + gpus
                self.free[kind] = self.free.get(kind, 0.0) + free
            if old_kind != kind or old_gpus != gpus:
                self.version += 1

    def _number(self, kind: NodeKind) -> int:
        number = self._numbers.get(kind)
        if number is None:
            number = self._numbers[kind] = len(self.kinds)
            self.kinds.append(kind)
        return number


def kind_and_free(
    state: NodeState, allocatable: tuple[int, int] | None
) -> tuple[NodeKind | None, int, float]:
    """The node's kind (GPU product, GPU count, CPU, memory as built) and its free milli-GPU."""
    layout = state.layout
    if layout is None or not layout.gpus or allocatable is None:
        return None, 0, 0.0
    free = state.free
    shares = sum(
        MILLI_PER_GPU - u.compute * MILLI_PER_COMPUTE_UNIT for _, u in free.share_use if not u.replicas
    )
    kind = (layout.gpus[0].attributes.product_name, len(layout.gpus), allocatable[0], allocatable[1])
    return kind, len(layout.gpus), float(shares + MILLI_PER_GPU * len(free.free_gpus))
