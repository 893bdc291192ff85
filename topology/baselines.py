"""A go-gpuallocator-like placement policy, re-implemented from its description as a baseline.

NVIDIA's go-gpuallocator (``besteffort_policy.go``) scores a GPU pair by summing a score per
link between them: CrossCPU 10, SameCPU 20, HostBridge 30, MultiSwitch 40, SingleSwitch 50, and
100 per NVLink. Its NVLink count comes from links whose remote end is the other GPU, so GPUs that
reach each other through NVSwitches get no NVLink credit at all: on an NVSwitch node every pair
scores as its PCIe path. We reproduce that on purpose; it is the behaviour the benchmarks compare
against (docs/topology.md, Baseline; docs/benchmarks.md).

Its best-effort policy enumerates partitions of the available GPUs into sets of the requested
size, keeps the partition with the highest total set score (so later requests also get good
sets) and returns the best set in it; required GPUs must sit together in one set. We find the
same optimum by dynamic programming over bitmasks instead of listing partitions one by one (same
result, tractable for 16 GPUs); ties go to the lowest GPU indices.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from types import MappingProxyType

from devicemodel.errors import TopologyError
from topology.graph import TopologyGraph
from topology.links import LinkClass

GO_PCIE_SCORES = MappingProxyType({
    LinkClass.PIX: 50,  # SingleSwitch
    LinkClass.PXB: 40,  # MultiSwitch
    LinkClass.PHB: 30,  # HostBridge
    LinkClass.NODE: 20,  # SameCPU
    LinkClass.SYS: 10,  # CrossCPU
})
GO_NVLINK_SCORE = 100  # per direct NVLink lane

ScoreMatrix = tuple[tuple[int, ...], ...]


def go_gpuallocator_pair_score(graph: TopologyGraph, a: int, b: int) -> int:
    """The pair score as go-gpuallocator computes it, NVSwitch blind spot included."""
    pcie = GO_PCIE_SCORES[graph.pcie_link(a, b).link_class]
    link = graph.pair_link(a, b)
    direct_lanes = link.nvlinks if link.link_class is LinkClass.NVLINK else 0
    return pcie + GO_NVLINK_SCORE * direct_lanes


def go_gpuallocator_like(
    graph: TopologyGraph,
    *,
    available: frozenset[int],
    size: int,
    must_include: frozenset[int] = frozenset(),
) -> tuple[int, ...] | None:
    """The set go-gpuallocator's best-effort policy would return, or None if none fits."""
    if size < 1:
        raise TopologyError(f"asked node {graph.name} for {size} GPUs; ask for 1 or more")
    if not must_include <= available or len(must_include) > size or size > len(available):
        return None
    indices = graph.gpu_indices
    scores = tuple(tuple(0 if a == b else go_gpuallocator_pair_score(graph, a, b) for b in indices)
                   for a in indices)
    position = {index: p for p, index in enumerate(indices)}
    free = sorted(position[i] for i in available)
    must = sorted(position[i] for i in must_include)
    chosen = _choose(scores, free=free, must=must, size=size)
    return tuple(indices[p] for p in range(len(indices)) if chosen >> p & 1)


def clear_baseline_caches() -> None:
    """Forget memoized partitions (benchmarks use it to time cold calls)."""
    _best_partition.cache_clear()
    _set_score.cache_clear()


def _choose(scores: ScoreMatrix, *, free: list[int], must: list[int], size: int) -> int:
    """The returned set's mask: best partition's best set, or with required GPUs the best holder."""
    free_mask = _mask(free)
    if not must:
        _, groups = _best_partition(scores, free_mask, size, len(free) % size)
        return max(groups, key=lambda g: (_set_score(scores, g), _lowest_first(g)))
    must_mask = _mask(must)
    rest = [p for p in free if not must_mask >> p & 1]
    best: tuple[int, int] | None = None
    for combo in itertools.combinations(rest, size - len(must)):
        group = must_mask | _mask(list(combo))
        remaining = free_mask & ~group
        partition_score, _ = _best_partition(scores, remaining, size, remaining.bit_count() % size)
        total = _set_score(scores, group) + partition_score
        if best is None or (total, _lowest_first(group)) > (best[0], _lowest_first(best[1])):
            best = (total, group)
    assert best is not None  # at least one combination exists: size - len(must) <= len(rest)
    return best[1]


@lru_cache(maxsize=65536)
def _best_partition(scores: ScoreMatrix, mask: int, size: int, spare: int) -> tuple[int, tuple[int, ...]]:
    """Best total over partitions of ``mask`` into ``size``-sets, leaving ``spare`` GPUs out.

    The lowest GPU either stays out (while spares remain) or joins a set; -1 marks no partition.
    """
    if mask == 0:
        return 0, ()
    low = (mask & -mask).bit_length() - 1
    rest = mask & ~(1 << low)
    best: tuple[int, tuple[int, ...]] = (-1, ())
    if spare > 0:
        best = _best_partition(scores, rest, size, spare - 1)
    if mask.bit_count() >= size:
        others = [p for p in range(rest.bit_length()) if rest >> p & 1]
        for combo in itertools.combinations(others, size - 1):
            group = (1 << low) | _mask(list(combo))
            score, groups = _best_partition(scores, mask & ~group, size, spare)
            total = score + _set_score(scores, group)
            if score >= 0 and total > best[0]:
                best = (total, (group, *groups))
    return best


@lru_cache(maxsize=65536)
def _set_score(scores: ScoreMatrix, group: int) -> int:
    members = [p for p in range(group.bit_length()) if group >> p & 1]
    return sum(scores[a][b] for a, b in itertools.combinations(members, 2))


def _lowest_first(group: int) -> list[int]:
    """Sort key that ranks the set with the lowest GPU positions highest (for ties)."""
    return [-p for p in range(group.bit_length()) if group >> p & 1]


def _mask(positions: list[int]) -> int:
    mask = 0
    for position in positions:
        mask |= 1 << position
    return mask
