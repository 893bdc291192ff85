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

A placement also costs the GPUs its host CPU strands (``HostCores``): charged per milli-GPU
alone, the reservation sends the tasks it presses off the reserved kinds onto the others, and on
a kind with fewer cores per GPU than the mix's GPU tasks ask, a task that spends cores faster
than GPU leaves that kind's GPUs without the CPU to use them. The cores are charged against the
demand for them as the milli-GPU are: what the placement removes from the GPU capacity the free
cores can still serve, in milli-GPU, added to the pressure's cost.
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
    cores: HostCores | None = None  # the mix's CPU per milli-GPU; None: no GPU task in the mix

    @classmethod
    def of(cls, workload: TargetWorkload, capacity: Mapping[NodeKind, int]) -> ReservedDemand:
        """``capacity``: GPUs per kind in the cluster."""
        kinds = [k for k, gpus in capacity.items() if gpus > 0]
        memory = workload.memory_mib or (0,) * len(workload.shapes)
        demand = dict.fromkeys(kinds, 0.0)
        total = gpu_cores = other_cores = 0.0
        for shape, p, mem in zip(workload.shapes, workload.probabilities, memory, strict=True):
            if shape.is_cpu_only:
                other_cores += p * shape.cpu_milli
                continue
            total += p * shape.total_gpu_milli
            gpu_cores += p * shape.cpu_milli
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
        return cls(
            {k: (d / total if total > 0 else 0.0) for k, d in demand.items() if d > 0},
            HostCores(gpu_cores / total, other_cores / total) if total > 0 else None,
        )

    def pressure(self, free: Mapping[NodeKind, float]) -> dict[NodeKind, float]:
        """Per kind with a reservation, the expected part of one free milli-GPU its tasks need."""
        everything = sum(free.values())
        result = {}
        for kind, share in self.share.items():
            held = free.get(kind, 0.0)
            result[kind] = 1.0 if held <= 0 else min(1.0, share * everything / held)
        return result

    def costs(self, gpu_milli: int, cpu_milli: int, kinds: KindTotals) -> dict[NodeKind, float]:
        """Per kind, what placing ``gpu_milli`` and ``cpu_milli`` there costs, in milli-GPU: its
        pressure times the milli-GPU taken, plus the GPU capacity the cores strand
        (``HostCores.stranded``). Kinds that cost nothing are left out."""
        free = dict(kinds.free)  # one copy of each while the cache may be updating them
        costs = {kind: p * gpu_milli for kind, p in self.pressure(free).items()}
        if self.cores is not None and cpu_milli > 0:
            stranded = self.cores.stranded(gpu_milli, cpu_milli, free, dict(kinds.cores), kinds.spare)
            for kind, cost in stranded.items():
                costs[kind] = costs.get(kind, 0.0) + cost
        return costs


@dataclass(frozen=True)
class HostCores:
    """GPU capacity is only usable with the host CPU beside it.

    The mix's GPU tasks ask, per milli-GPU, ``per_gpu_milli`` CPU milli of the node their GPU is
    on; its CPU-only tasks ask ``other_per_gpu_milli`` more for every milli-GPU that arrives, on
    any node. Future arrivals fill the free GPUs with the mix, so a kind with G milli-GPU free
    (on nodes that have some free) and F CPU milli free beside them can use min(G, F / rate) of
    its GPUs: with fewer cores than its GPUs' tasks need, each CPU milli spent there strands
    1 / rate milli-GPU. The cores beyond that (and those of nodes with no GPU free) are the
    surplus the CPU-only tasks draw on; what they ask beyond the whole surplus they take from
    cores the GPUs needed, stranding GPUs on some kind. Usable GPU capacity is therefore
    ``sum(min(G, F / rate)) - max(0, CPU-only demand - surplus) / rate``, and a placement costs
    what it removes from it beyond the ``gpu_milli`` it uses itself, never less than nothing.

    While the surplus covers the CPU-only demand, a placement that spends a kind's cores faster
    than its GPUs costs the GPUs those cores leave without CPU (on a kind with cores to spare it
    costs nothing), so a task the reservation sends away from the kinds it presses does not
    strand the GPUs of a CPU-poor kind instead. Once CPU is short cluster-wide, a core spent on
    any kind strands a GPU somewhere, every kind costs the same, and the ranking is unchanged.
    """

    per_gpu_milli: float
    other_per_gpu_milli: float

    def stranded(
        self,
        gpu_milli: int,
        cpu_milli: int,
        free: Mapping[NodeKind, float],
        cores: Mapping[NodeKind, float],
        spare: float,
    ) -> dict[NodeKind, float]:
        """Per kind, the usable GPU capacity (milli-GPU) a placement of ``gpu_milli`` with
        ``cpu_milli`` there removes beyond its own ``gpu_milli``; kinds where it is 0 left out.
        ``free``, ``cores``: milli-GPU and CPU milli free per kind (``KindTotals``); ``spare``:
        CPU milli free on nodes with no GPU free."""
        rate, other = self.per_gpu_milli, self.other_per_gpu_milli
        if rate <= 0 or len(free) < 2:  # one kind: the same charge on every node moves no choice
            return {}
        usable = {k: min(g, cores.get(k, 0.0) / rate) for k, g in free.items()}
        surplus = {k: max(cores.get(k, 0.0) - rate * g, 0.0) for k, g in free.items()}
        all_usable, all_surplus = sum(usable.values()), sum(surplus.values()) + spare
        demand = other * sum(free.values())
        before = all_usable - max(demand - all_surplus, 0.0) / rate
        demand_after = demand - other * gpu_milli
        result = {}
        for kind, g in free.items():
            g_after = max(g - gpu_milli, 0.0)
            f_after = max(cores.get(kind, 0.0) - cpu_milli, 0.0)
            used = all_usable - usable[kind] + min(g_after, f_after / rate)
            left = all_surplus - surplus[kind] + max(f_after - rate * g_after, 0.0)
            after = used - max(demand_after - left, 0.0) / rate
            cost = before - gpu_milli - after
            if cost > SAME_COST:
                result[kind] = cost
        return result


SAME_COST = 1e-6  # milli-GPU: float noise of equal sums


class KindTotals:
    """Per node kind: GPUs built, milli-GPU free and the CPU free beside it now (with the CPU free
    on nodes with no GPU free, ``spare``), kept up to date on every node rebuild.

    ``number_of`` maps a node to its kind's small integer (``kinds[number]`` is the kind): the
    per-request pass over every node name looks kinds up by int, whose hash is itself, where a
    ``NodeKind`` tuple would be hashed again, element by element, for every node of every call."""

    def __init__(self) -> None:
        self.number_of: dict[str, int] = {}
        self.kinds: list[NodeKind] = []
        self._numbers: dict[NodeKind, int] = {}
        self.capacity: dict[NodeKind, int] = {}
        self.free: dict[NodeKind, float] = {}
        self.cores: dict[NodeKind, float] = {}  # CPU milli free on the kind's nodes with GPU free
        self.spare = 0.0  # CPU milli free on nodes with no GPU free (or none built)
        self._node: dict[str, tuple[int, float, float]] = {}
        self._spare: dict[str, float] = {}
        self._lock = threading.Lock()
        self.version = 0  # bumped when ``capacity`` changes

    def put(self, name: str, kind: NodeKind | None, gpus: int, free: float, cores: float = 0.0) -> None:
        """``cores``: the node's free CPU milli (counted with its kind's GPUs while it has GPU
        free, else as ``spare``)."""
        with self._lock:
            old_number = self.number_of.pop(name, None)
            old_kind = self.kinds[old_number] if old_number is not None else None
            old_gpus, old_free, old_cores = self._node.pop(name, (0, 0.0, 0.0))
            self.spare -= self._spare.pop(name, 0.0)
            if old_kind is not None:
                self.capacity[old_kind] -= old_gpus
                self.free[old_kind] -= old_free
                self.cores[old_kind] -= old_cores
            beside = cores if kind is not None and free > 0 else 0.0
            if cores - beside > 0:
                self._spare[name] = cores - beside
                self.spare += cores - beside
            if kind is not None:
                self.number_of[name] = self._number(kind)
                self._node[name] = (gpus, free, beside)
                self.capacity[kind] = self.capacity.get(kind, 0) + gpus
                self.free[kind] = self.free.get(kind, 0.0) + free
                self.cores[kind] = self.cores.get(kind, 0.0) + beside
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
) -> tuple[NodeKind | None, int, float, float]:
    """The node's kind (GPU product, GPU count, CPU, memory as built), its GPUs, its free
    milli-GPU and its free CPU milli (0 where not known)."""
    host = state.host_free
    cores = float(max(host[0], 0)) if host is not None and allocatable is not None else 0.0
    layout = state.layout
    if layout is None or not layout.gpus or allocatable is None:
        return None, 0, 0.0, cores
    free = state.free
    shares = sum(
        MILLI_PER_GPU - u.compute * MILLI_PER_COMPUTE_UNIT for _, u in free.share_use if not u.replicas
    )
    kind = (layout.gpus[0].attributes.product_name, len(layout.gpus), allocatable[0], allocatable[1])
    return kind, len(layout.gpus), float(shares + MILLI_PER_GPU * len(free.free_gpus)), cores
