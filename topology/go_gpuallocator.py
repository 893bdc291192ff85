"""NVIDIA go-gpuallocator's allocation policies, re-implemented as baselines (docs/topology.md).

Written from the algorithm of NVIDIA/go-gpuallocator (Apache-2.0), package ``gpuallocator`` as of
commit 876e7b7609bb839919e4eb06ce00607db76e907e, and held to that package's own test cases
(``tests/fixtures/go_gpuallocator/cases.yaml``). Devices are plain integers here; a score matrix
``scores[a][b]`` holds its pair score (``pair_points``) for every pair of devices.

Best effort, as go-gpuallocator runs it:

- The available devices, in the order given, are padded with empty slots up to a multiple of the
  request size; the padding lies after every device.
- Partitions are listed depth first: the first remaining slot joined by every combination of the
  later ones in lexicographic order; a set holds either all the padding or none of it.
- A partition counts only if one padding-free set holds every required device. Its score is the
  sum of its sets' scores, and a set's score sums its device pairs, so the devices that share the
  padded set score with each other too (they are not left out).
- The first partition listed with the highest score wins; within it, the first set with the
  highest score among those holding every required device (with none required: every set, the
  padded one included). If that is the padded set, go-gpuallocator returns it with nil devices;
  ``best_effort`` returns ``None`` in those places.

``best_effort`` finds that same partition without listing all of them: the best total of each
remaining slot set is memoized, and the first partition with the best total is rebuilt by walking
the candidates in the listing order (``partitions`` lists them one by one, for checking).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import TypeVar

from devicemodel.errors import TopologyError

ScoreMatrix = tuple[tuple[int, ...], ...]
_T = TypeVar("_T")
Slot = int | None  # a device, or None for a padding slot

# Points per link between two GPUs (go-gpuallocator's P2PLinkType names). A pair has one PCIe link
# (NVML's common ancestor of the two) and at most one NVLink entry, worth 100 per lane.
PCIE_LINK_POINTS = MappingProxyType({
    "P2PLinkCrossCPU": 10,
    "P2PLinkSameCPU": 20,
    "P2PLinkHostBridge": 30,
    "P2PLinkMultiSwitch": 40,
    "P2PLinkSingleSwitch": 50,
    "P2PLinkSameBoard": 60,
})
NVLINK_POINTS_PER_LANE = 100
MAX_NVLINK_LANES = 18  # its link types stop at EighteenNVLINKLinks (NVML_NVLINK_MAX_LINKS)
_LANE_WORDS = ("Single", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
               "Eleven", "Twelve", "Thirteen", "Fourteen", "Fifteen", "Sixteen", "Seventeen", "Eighteen")
NVLINK_LINK_NAMES = tuple(f"{word}NVLINKLink{'s' if n > 1 else ''}"
                          for n, word in enumerate(_LANE_WORDS, start=1))


def nvlink_link_name(lanes: int) -> str:
    """The link type of ``lanes`` NVLink lanes between two GPUs (capped at 18, as go-gpuallocator's)."""
    if lanes < 1:
        raise TopologyError(f"an NVLink link has 1 or more lanes, not {lanes}")
    return NVLINK_LINK_NAMES[min(lanes, MAX_NVLINK_LANES) - 1]


def pair_points(links: Sequence[str]) -> int:
    """A GPU pair's score: the sum of its links' points."""
    total = 0
    for link in links:
        if link in PCIE_LINK_POINTS:
            total += PCIE_LINK_POINTS[link]
        elif link in NVLINK_LINK_NAMES:
            total += NVLINK_POINTS_PER_LANE * (NVLINK_LINK_NAMES.index(link) + 1)
        else:
            raise TopologyError(f"unknown go-gpuallocator link type {link!r}")
    return total


def best_effort(scores: ScoreMatrix, *, available: Sequence[int], required: Collection[int] = (),
                size: int) -> tuple[Slot, ...]:
    """go-gpuallocator's best-effort choice of ``size`` devices; () when it allocates none."""
    order = _checked_order(scores, available)
    must = frozenset(required)
    if size <= 0 or len(order) < size or len(must) > size or len(must) > len(order):
        return ()
    if size == 1:  # one partition per device, each scoring 0: the first that holds the required
        return next(((d,) for d in order if must <= {d}), ())
    if not must <= set(order):
        return ()
    solver = _solver(scores, _listing_order(order, len(scores)))
    return solver.choose(order, must=must, size=size)


def gpu_sets(devices: Sequence[_T], size: int) -> Iterator[tuple[_T, ...]]:
    """Every set of ``size`` of ``devices``, lexicographic by position (none for ``size`` < 1)."""
    if 0 < size <= len(devices):
        yield from itertools.combinations(devices, size)


def partitions(devices: Sequence[int], size: int) -> Iterator[tuple[tuple[Slot, ...], ...]]:
    """Every partition go-gpuallocator lists for ``devices`` and ``size``, in its order."""
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        yield from (((d,),) for d in devices)
        return
    padding = -len(devices) % size
    yield from _partitions_of(list(devices) + [None] * padding, size, padding)


def _partitions_of(slots: list[Slot], size: int, padding: int) -> Iterator[tuple[tuple[Slot, ...], ...]]:
    if len(slots) == size:
        yield (tuple(slots),)
        return
    for combo in gpu_sets(range(1, len(slots)), size - 1):
        group = (slots[0], *(slots[i] for i in combo))
        if group.count(None) not in (0, padding):
            continue
        rest = [s for i, s in enumerate(slots) if i != 0 and i not in combo]
        for tail in _partitions_of(rest, size, padding):
            yield (group, *tail)


def _checked_order(scores: ScoreMatrix, available: Sequence[int]) -> tuple[int, ...]:
    order = tuple(available)
    if len(set(order)) != len(order):
        raise TopologyError(f"available devices {list(order)} list a device twice")
    if any(not 0 <= d < len(scores) for d in order):
        raise TopologyError(f"available devices {list(order)} name a device outside 0..{len(scores) - 1}")
    return order


def _listing_order(order: tuple[int, ...], device_count: int) -> tuple[int, ...]:
    """Device at each bit position: ascending when the devices are (so memos are shared between
    requests), else the given order first."""
    if list(order) == sorted(order):
        return tuple(range(device_count))
    return order + tuple(d for d in range(device_count) if d not in order)


@lru_cache(maxsize=64)
def _solver(scores: ScoreMatrix, positions: tuple[int, ...]) -> _PartitionSolver:
    return _PartitionSolver(tuple(tuple(scores[a][b] for b in positions) for a in positions), positions)


def clear_solver_caches() -> None:
    """Forget memoized partitions (benchmarks use it to time cold calls)."""
    _solver.cache_clear()


_Part = tuple[int, int]  # (mask of device positions, padding slots in the set)
_MEMO_LIMIT = 1 << 18


class _PartitionSolver:
    """Best partition totals over device positions (bits of a mask) for one score matrix.

    ``required`` is a mask; a set is acceptable when it holds all of it or none of it, and the one
    holding it has no padding (that is go-gpuallocator's partition filter, set by set).
    """

    def __init__(self, scores: ScoreMatrix, positions: tuple[int, ...]) -> None:
        self._scores = scores
        self._positions = positions
        self._totals: dict[tuple[int, int, int, int], int] = {}

    def choose(self, order: tuple[int, ...], *, must: frozenset[int], size: int) -> tuple[Slot, ...]:
        bit = {d: p for p, d in enumerate(self._positions)}
        mask = sum(1 << bit[d] for d in order)
        required = sum(1 << bit[d] for d in must)
        parts = self._first_best_partition(mask, -len(order) % size, required, size)
        holding = [part for part in parts if part[0] & required == required]
        if not holding:
            return ()
        chosen = holding[0]
        for part in holding[1:]:
            if self._set_score(part[0]) > self._set_score(chosen[0]):
                chosen = part
        devices = [self._positions[p] for p in range(chosen[0].bit_length()) if chosen[0] >> p & 1]
        return (*devices, *([None] * chosen[1]))

    def _first_best_partition(self, mask: int, pads: int, required: int, size: int) -> list[_Part]:
        target = self._best_total(mask, pads, required, size)
        parts: list[_Part] = []
        while target >= 0 and mask:
            if mask.bit_count() + pads == size:
                parts.append((mask, pads))
                break
            for group, group_pads in self._candidates(mask, pads, required, size):
                rest = self._best_total(mask & ~group, pads - group_pads, required, size)
                if rest >= 0 and rest + self._set_score(group) == target:
                    parts.append((group, group_pads))
                    mask, pads, target = mask & ~group, pads - group_pads, rest
                    break
        return parts

    def _best_total(self, mask: int, pads: int, required: int, size: int) -> int:
        """Highest partition score of these slots; -1 when no acceptable partition exists."""
        key = (mask, pads, required, size)
        if key in self._totals:
            return self._totals[key]
        if mask.bit_count() + pads == size:
            best = self._set_score(mask) if _acceptable(mask, pads, required) else -1
        else:
            best = -1
            for group, group_pads in self._candidates(mask, pads, required, size):
                rest = self._best_total(mask & ~group, pads - group_pads, required, size)
                if rest >= 0:
                    best = max(best, rest + self._set_score(group))
        if len(self._totals) >= _MEMO_LIMIT:
            self._totals.clear()
        self._totals[key] = best
        return best

    def _candidates(self, mask: int, pads: int, required: int, size: int) -> Iterator[_Part]:
        """Sets holding the lowest remaining position, in go-gpuallocator's listing order."""
        first = mask & -mask
        later = [p for p in range(first.bit_length(), mask.bit_length()) if mask >> p & 1]
        padding_slots = [-1] * pads  # listed after every device, as the padding is
        for combo in gpu_sets(later + padding_slots, size - 1):
            group_pads = combo.count(-1)
            if group_pads not in (0, pads):
                continue
            group = first | sum(1 << p for p in combo if p >= 0)
            if _acceptable(group, group_pads, required):
                yield group, group_pads

    def _set_score(self, group: int) -> int:
        members = [p for p in range(group.bit_length()) if group >> p & 1]
        return sum(self._scores[a][b] for a, b in itertools.combinations(members, 2))


def _acceptable(group: int, pads: int, required: int) -> bool:
    held = group & required
    return held == 0 or (held == required and pads == 0)


def simple(*, available: Sequence[int], required: Collection[int] = (), size: int) -> tuple[int, ...]:
    """go-gpuallocator's simple policy: the required devices, then the lowest-numbered others."""
    must = tuple(dict.fromkeys(required))
    if size <= 0 or len(available) < size or len(must) > size or not set(must) <= set(available):
        return ()
    others = sorted(set(available) - set(must))
    return must + tuple(others[:size - len(must)])


# Its static policies' valid sets per request size (staticdgx_policies.go), tried in this order.
StaticSets = MappingProxyType[int, tuple[tuple[int, ...], ...]]
DGX1_PASCAL_SETS: StaticSets = MappingProxyType({
    1: tuple((i,) for i in range(8)),
    2: ((0, 2), (1, 3), (4, 6), (5, 7)),
    4: ((0, 1, 2, 3), (4, 5, 6, 7)),
    8: (tuple(range(8)),),
})
DGX1_VOLTA_SETS: StaticSets = MappingProxyType({
    1: tuple((i,) for i in range(8)),
    2: ((0, 3), (1, 2), (4, 7), (5, 6)),
    4: ((0, 1, 2, 3), (4, 5, 6, 7)),
    8: (tuple(range(8)),),
})
DGX2_VOLTA_SETS: StaticSets = MappingProxyType({
    n: tuple(tuple(range(start, start + n)) for start in range(0, 16, n)) for n in (1, 2, 4, 8, 16)
})


def static_sets(table: StaticSets, *, available: Sequence[int], required: Collection[int] = (),
                size: int) -> tuple[int, ...]:
    """A static policy: the first valid set of ``size`` that holds the required devices and whose
    every device is available; () when none does (or ``size`` has no valid sets)."""
    must = frozenset(required)
    free = frozenset(available)
    if size <= 0 or len(available) < size or len(must) > size or not must <= free:
        return ()
    for valid in table.get(size, ()):
        if must <= set(valid) and set(valid) <= free:
            return tuple(d for d in valid if d in must) + tuple(d for d in valid if d not in must)
    return ()
