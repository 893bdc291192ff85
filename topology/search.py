"""The best set of k GPUs from the free ones: exact search with a fragmentation look-ahead.

Every candidate set (all combinations of the free GPUs that contain the must-include ones) is
scored at once with ``topology.scoring.score_rows``; C(16, 8) = 12,870 sets is the worst case.
Among the sets whose value is within ``LOOKAHEAD_TOLERANCE`` of the best, the search prefers
the one whose leftover GPUs still hold the best sets for later requests of 2, 4 and 8 GPUs.

Results are memoized by (topology shape, free mask, must mask, size, policy) in bounded LRU
caches of pure functions, so identical nodes share them (docs/topology.md, Memoization).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np

from devicemodel.errors import InvalidInputError, TopologyError
from topology.graph import TopologyGraph, TopologyShape
from topology.scoring import (
    BoolArray,
    FloatArray,
    IntArray,
    RowScores,
    SetScore,
    positions_of,
    score_rows,
    score_set,
    shape_arrays,
)

# Later request sizes the look-ahead protects, with weights. The 8-GPU share is largest because
# 8-GPU jobs hold about half of all GPU-hours in the Microsoft ITP trace (see
# shared reference traces-and-papers.md section 3); 2 and 4 keep NVLink pairs and quads whole.
LOOKAHEAD_SIZES: tuple[tuple[int, float], ...] = ((2, 0.25), (4, 0.35), (8, 0.40))
LOOKAHEAD_TOLERANCE = 0.025  # within 2.5% of the best value: one PCIe-switch step, not a NUMA or NIC step
LOOKAHEAD_CANDIDATES = 32  # at most this many near-best sets get a look-ahead evaluation
# C(16, 8): every request on a node of up to 16 GPUs is searched exactly. Larger searches (nodes
# beyond 16 GPUs) grow the set greedily instead, and the look-ahead is off there.
EXACT_SEARCH_LIMIT = 12_870
LOOKAHEAD_MAX_GPUS = 16


class PlacementPolicy(StrEnum):
    """What a request demands of its set; the values are the ``gpuweave.io/placement`` words."""

    BEST_EFFORT = "best-effort"  # the best set there is
    NVLINK_REQUIRED = "nvlink-required"  # every pair NVLink- or NVSwitch-connected, or nothing
    NIC_ALIGNED = "nic-aligned"  # every GPU has a NIC on its own PCIe switch, or nothing
    SINGLE_NUMA = "single-numa"  # all GPUs in one NUMA node, or nothing

    @classmethod
    def parse(cls, text: str) -> PlacementPolicy:
        try:
            return cls(text.strip().lower())
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise InvalidInputError(f"unknown placement policy {text!r}; use one of: {allowed}") from None


@dataclass(frozen=True)
class Selection:
    """The chosen GPUs (ascending indices), their score and what they leave for later requests."""

    gpus: tuple[int, ...]
    score: SetScore
    lookahead: float  # 0..1: quality of the best sets left free (0 when the look-ahead is off)
    candidates: int  # qualifying sets compared (exact search) or extensions scored (greedy)


@dataclass(frozen=True)
class _Request:
    """A search request by position masks: with the shape, the memoization key."""

    free_mask: int
    must_mask: int
    size: int
    policy: PlacementPolicy
    lookahead: bool


@dataclass(frozen=True)
class _Choice:
    positions: tuple[int, ...]
    lookahead: float
    candidates: int


def best_set(
    graph: TopologyGraph,
    *,
    available: frozenset[int],
    size: int,
    must_include: frozenset[int] = frozenset(),
    policy: PlacementPolicy = PlacementPolicy.BEST_EFFORT,
    lookahead: bool = True,
) -> Selection | None:
    """The best ``size``-GPU subset of ``available`` containing ``must_include``, or None.

    None means no set satisfies the request; ``explain_unsatisfiable`` says why.
    """
    if size < 1:
        raise TopologyError(f"asked node {graph.name} for {size} GPUs; ask for 1 or more")
    free = positions_of(graph, available)
    must = positions_of(graph, must_include)
    if not set(must) <= set(free) or len(must) > size or size > len(free):
        return None
    request = _Request(_mask(free), _mask(must), size, policy, lookahead)
    choice = _search(graph.shape_key, request)
    if choice is None:
        return None
    gpus = tuple(graph.gpu_indices[p] for p in choice.positions)
    return Selection(gpus=gpus, score=score_set(graph, gpus), lookahead=choice.lookahead,
                     candidates=choice.candidates)


def remaining_quality(graph: TopologyGraph, free: frozenset[int]) -> float:
    """How good the best later sets on ``free`` are, relative to an empty node (see module doc)."""
    return _leftover_quality(graph.shape_key, _mask(positions_of(graph, free)), 0)


def clear_search_caches() -> None:
    """Forget every memoized result (benchmarks use it to time cold searches)."""
    for cached in (_search, _k_sets, _combinations, shape_arrays):
        cached.cache_clear()


def _mask(positions: tuple[int, ...] | list[int]) -> int:
    mask = 0
    for position in positions:
        mask |= 1 << int(position)
    return mask


def _positions(mask: int) -> list[int]:
    return [p for p in range(mask.bit_length()) if mask >> p & 1]


@lru_cache(maxsize=256)
def _combinations(n: int, r: int) -> IntArray:
    """All r-combinations of range(n) in lexicographic order, one per row (read-only)."""
    combos = list(itertools.combinations(range(n), r))
    table = np.array(combos, dtype=np.int64).reshape(len(combos), r)
    table.setflags(write=False)
    return table


def _candidate_sets(free_mask: int, must_mask: int, size: int) -> IntArray:
    """Every ``size``-set of free positions holding the must positions, rows sorted ascending."""
    must = _positions(must_mask)
    rest = np.array([p for p in _positions(free_mask) if not must_mask >> p & 1], dtype=np.int64)
    chosen = rest[_combinations(len(rest), size - len(must))]
    fixed = np.broadcast_to(np.array(must, dtype=np.int64), (chosen.shape[0], len(must)))
    sets = np.concatenate([fixed, chosen], axis=1)
    sets.sort(axis=1)
    return sets


def _policy_mask(scores: RowScores, policy: PlacementPolicy) -> BoolArray:
    if policy is PlacementPolicy.NVLINK_REQUIRED:
        return scores.all_nvlink
    if policy is PlacementPolicy.NIC_ALIGNED:
        return np.asarray(scores.nic_aligned >= 1.0, dtype=np.bool_)
    if policy is PlacementPolicy.SINGLE_NUMA:
        return np.asarray(scores.numa_nodes == 1, dtype=np.bool_)
    return np.ones(scores.value.shape, dtype=np.bool_)


@lru_cache(maxsize=4096)
def _search(shape: TopologyShape, request: _Request) -> _Choice | None:
    open_slots = request.size - request.must_mask.bit_count()
    if math.comb((request.free_mask & ~request.must_mask).bit_count(), open_slots) > EXACT_SEARCH_LIMIT:
        return _greedy_search(shape, request)
    sets = _candidate_sets(request.free_mask, request.must_mask, request.size)
    scores = score_rows(shape_arrays(shape), sets)
    valid = _policy_mask(scores, request.policy)
    count = int(valid.sum())
    if count == 0:
        return None
    values = np.where(valid, scores.value, -np.inf)
    if not request.lookahead or shape.size > LOOKAHEAD_MAX_GPUS:
        row = int(np.argmax(values))  # first maximum: the lexicographically smallest best set
        return _Choice(tuple(int(p) for p in sets[row]), 0.0, count)
    best = float(values.max())
    near = np.flatnonzero(values >= best - LOOKAHEAD_TOLERANCE * abs(best))
    near = near[np.argsort(-values[near], kind="stable")][:LOOKAHEAD_CANDIDATES]
    ranked = []
    for row in (int(r) for r in near):
        positions = tuple(int(p) for p in sets[row])
        leftover = _leftover_quality(shape, request.free_mask, _mask(positions))
        ranked.append((round(leftover, 9), float(values[row]), -row, positions, leftover))
    _, _, _, positions, leftover = max(ranked)
    return _Choice(positions, leftover, count)


def _greedy_search(shape: TopologyShape, request: _Request) -> _Choice | None:
    """Grow the set from the must GPUs (or the best pair) one GPU at a time, best value first.

    Every policy is hereditary (each subset of a qualifying set qualifies), so each step can drop
    the non-qualifying extensions; the result always qualifies but, unlike the exact search, may
    be worse than the best set or miss one that exists.
    """
    arrays = shape_arrays(shape)
    chosen = _positions(request.must_mask)
    free = [p for p in _positions(request.free_mask) if not request.must_mask >> p & 1]
    compared = 0
    while len(chosen) < request.size:
        if not chosen and request.size >= 2:
            options = _candidate_sets(request.free_mask, 0, 2)
        else:
            options = np.array([sorted([*chosen, p]) for p in free if p not in chosen], dtype=np.int64)
        scores = score_rows(arrays, options)
        values = np.where(_policy_mask(scores, request.policy), scores.value, -np.inf)
        compared += len(options)
        row = int(np.argmax(values))
        if values[row] == -np.inf:
            return None
        chosen = [int(p) for p in options[row]]
    return _Choice(tuple(chosen), 0.0, compared)


@dataclass(frozen=True)
class _KSets:
    """Every ``size``-set of some free GPUs: its position mask and best-effort value, per row."""

    masks: IntArray
    values: FloatArray


@lru_cache(maxsize=128)
def _k_sets(shape: TopologyShape, free_mask: int, size: int) -> _KSets:
    sets = _candidate_sets(free_mask, 0, size)
    values = score_rows(shape_arrays(shape), sets).value
    masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), sets), axis=1)
    values.setflags(write=False)
    masks.setflags(write=False)
    return _KSets(masks=masks, values=values)


def _leftover_quality(shape: TopologyShape, free_mask: int, taken_mask: int) -> float:
    """Weighted best-set value per later request size on ``free - taken``, each relative to the
    empty node's best; a size that no longer fits adds 0.

    One table of all k-sets of the free GPUs serves every candidate: the best set left after
    taking a candidate is the best row disjoint from it.
    """
    full_mask = (1 << shape.size) - 1
    left = (free_mask & ~taken_mask).bit_count()
    total = 0.0
    for size, weight in LOOKAHEAD_SIZES:
        if size > left:
            continue
        table = _k_sets(shape, free_mask, size)
        best = float(table.values[(table.masks & taken_mask) == 0].max())
        total += weight * best / float(_k_sets(shape, full_mask, size).values.max())
    return total

def explain_unsatisfiable(
    graph: TopologyGraph,
    *,
    available: frozenset[int],
    size: int,
    must_include: frozenset[int] = frozenset(),
    policy: PlacementPolicy = PlacementPolicy.BEST_EFFORT,
) -> str:
    """Why ``best_set`` finds nothing for this request, in one line naming GPUs and numbers."""
    where = f"node {graph.name}"
    missing = sorted(must_include - available)
    if size < 1:
        return f"{where}: asked for {size} GPUs; ask for 1 or more"
    if missing:
        return f"{where}: must-include GPUs {_fmt(missing)} are not free"
    if len(must_include) > size:
        return f"{where}: {len(must_include)} must-include GPUs do not fit in a request for {size}"
    if size > len(available):
        return (f"{where}: needs {size} GPUs; only {len(available)} are free ({_fmt(available)}); "
                "wait for GPUs to free up or ask for fewer")
    reason = _policy_reason(graph, available=available, size=size, must_include=must_include,
                            policy=policy)
    if reason:
        return f"{where}: {reason}"
    found = best_set(graph, available=available, size=size, must_include=must_include, policy=policy)
    if found is None:
        return f"{where}: no {size}-GPU set among free GPUs {_fmt(available)} satisfies {policy}"
    return f"{where}: satisfiable under {policy}; best set is GPUs {_fmt(found.gpus)}"


def _policy_reason(graph: TopologyGraph, *, available: frozenset[int], size: int,
                   must_include: frozenset[int], policy: PlacementPolicy) -> str:
    if policy is PlacementPolicy.NVLINK_REQUIRED:
        group = graph.largest_nvlink_clique(available)
        if len(group) < size:
            return (f"needs {size} NVLink-connected GPUs; largest free NVLink group is {len(group)} "
                    f"(GPUs {_fmt(group)}); use placement best-effort or wait for GPUs")
        if best_set(graph, available=available, size=size, must_include=must_include, policy=policy) is None:
            return (f"needs {size} NVLink-connected GPUs including GPUs {_fmt(must_include)}; "
                    f"no such group among free GPUs {_fmt(available)}")
    if policy is PlacementPolicy.NIC_ALIGNED:
        aligned = frozenset(g for g in available if _nic_on_switch(graph, g))
        lacking = sorted(must_include - aligned)
        if lacking:
            return f"must-include GPUs {_fmt(lacking)} have no NIC on their PCIe switch"
        if len(aligned) < size:
            return (f"needs {size} GPUs with a NIC on their own PCIe switch; {len(aligned)} free GPUs "
                    f"have one ({_fmt(aligned)}); use placement best-effort or ask for fewer")
    if policy is PlacementPolicy.SINGLE_NUMA:
        return _numa_reason(graph, available=available, size=size, must_include=must_include)
    return ""


def _numa_reason(graph: TopologyGraph, *, available: frozenset[int], size: int,
                 must_include: frozenset[int]) -> str:
    by_numa: dict[int, list[int]] = {}
    for index in sorted(available):
        by_numa.setdefault(graph.gpu(index).numa_node, []).append(index)
    must_numa = sorted({graph.gpu(i).numa_node for i in must_include})
    if len(must_numa) > 1:
        return f"must-include GPUs {_fmt(must_include)} span NUMA nodes {_fmt(must_numa)}"
    eligible = {n: g for n, g in by_numa.items() if not must_numa or n == must_numa[0]}
    numa, gpus = max(eligible.items(), key=lambda item: (len(item[1]), -item[0]))
    if len(gpus) < size:
        return (f"needs {size} GPUs in one NUMA node; the most free in one NUMA node is {len(gpus)} "
                f"(NUMA {numa}: GPUs {_fmt(gpus)}); use placement best-effort or ask for fewer")
    return ""


def _nic_on_switch(graph: TopologyGraph, gpu: int) -> bool:
    return graph.shape_key.nic_local[graph.gpu_indices.index(gpu)]


def _fmt(gpus: frozenset[int] | tuple[int, ...] | list[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus)) or "none"
