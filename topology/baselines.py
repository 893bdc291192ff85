"""The go-gpuallocator baseline on a topology graph: its pair scores read off our link classes.

go-gpuallocator (``topology.go_gpuallocator`` ports its policies) scores a GPU pair by its PCIe
link, NVML's common ancestor of the two (SingleSwitch 50 for ``PIX``, MultiSwitch 40 for ``PXB``,
HostBridge 30 for ``PHB``, SameCPU 20 for ``NODE``, CrossCPU 10 for ``SYS``), plus 100 per NVLink
lane whose far end is the other GPU. GPUs that reach each other through NVSwitches get no NVLink
credit at all: on an NVSwitch node every pair scores as its PCIe path. We reproduce that on
purpose; it is the behaviour the benchmarks compare against (docs/topology.md, Baseline;
docs/benchmarks.md).

``go_gpuallocator_like`` hands the free GPUs to its best-effort policy in ascending index order,
as its ``Allocator`` does (``SortedSlice``), so ties break as they do there.
"""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType

from devicemodel.errors import TopologyError
from topology.go_gpuallocator import (
    ScoreMatrix,
    best_effort,
    clear_solver_caches,
    nvlink_link_name,
    pair_points,
)
from topology.graph import TopologyGraph
from topology.links import LinkClass

# NVML's common-ancestor level (our PCIe link class) -> go-gpuallocator's P2P link type.
GO_PCIE_LINKS = MappingProxyType({
    LinkClass.PIX: "P2PLinkSingleSwitch",
    LinkClass.PXB: "P2PLinkMultiSwitch",
    LinkClass.PHB: "P2PLinkHostBridge",
    LinkClass.NODE: "P2PLinkSameCPU",
    LinkClass.SYS: "P2PLinkCrossCPU",
})


def go_gpuallocator_links(graph: TopologyGraph, a: int, b: int) -> tuple[str, ...]:
    """The links go-gpuallocator lists between GPUs ``a`` and ``b`` (PCIe first, then NVLink)."""
    pcie = GO_PCIE_LINKS[graph.pcie_link(a, b).link_class]
    lanes = graph.direct_nvlinks(a, b)
    return (pcie, nvlink_link_name(lanes)) if lanes else (pcie,)


def go_gpuallocator_pair_score(graph: TopologyGraph, a: int, b: int) -> int:
    """The pair score as go-gpuallocator computes it, NVSwitch blind spot included."""
    return pair_points(go_gpuallocator_links(graph, a, b))


def go_gpuallocator_like(
    graph: TopologyGraph,
    *,
    available: frozenset[int],
    size: int,
    must_include: frozenset[int] = frozenset(),
) -> tuple[int, ...] | None:
    """The set go-gpuallocator's best-effort policy returns (ascending), or None where it returns
    none, or a set with padding in it (nil devices, which its callers cannot use)."""
    if size < 1:
        raise TopologyError(f"asked node {graph.name} for {size} GPUs; ask for 1 or more")
    indices = graph.gpu_indices
    position = {index: p for p, index in enumerate(indices)}
    unknown = sorted((available | must_include) - set(position))
    if unknown:
        raise TopologyError(f"node {graph.name} has no GPU {unknown[0]}; GPUs are {list(indices)}")
    chosen = best_effort(_scores(graph), available=sorted(position[i] for i in available),
                         required=[position[i] for i in must_include], size=size)
    if not chosen or None in chosen:
        return None
    return tuple(sorted(indices[p] for p in chosen if p is not None))


def clear_baseline_caches() -> None:
    """Forget memoized partitions and score matrices (benchmarks use it to time cold calls)."""
    clear_solver_caches()
    _scores.cache_clear()


@lru_cache(maxsize=256)
def _scores(graph: TopologyGraph) -> ScoreMatrix:
    indices = graph.gpu_indices
    return tuple(tuple(0 if a == b else go_gpuallocator_pair_score(graph, a, b) for b in indices)
                 for a in indices)
