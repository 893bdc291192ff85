"""The score of a GPU set: how fast its GPUs talk to each other and how well they sit.

One formula (documented in docs/topology.md) is evaluated by one vectorised routine,
``score_rows``, for a single set (``score_set``) and for thousands of candidate sets at once
(the search), so a set scores the same whichever path computes it.

    pair_term = (bottleneck + mean pair bandwidth) / 2         for 2+ GPUs
              = the GPU's PCIe host link                       for 1 GPU
    value     = pair_term * (1 + NIC_BONUS * nic_aligned)
                          * NUMA_FACTOR ** (numa_nodes - 1)
                          * SWITCH_FACTOR ** (pcie_switches - 1)

The bottleneck is the slowest pair in the set: every collective pattern (ring, tree,
all-to-all) on a set can be slowed by it, and it is a lower bound on a ring's bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from devicemodel.errors import TopologyError
from topology.graph import TopologyGraph, TopologyShape

NIC_BONUS = 0.05  # a NIC on every GPU's own PCIe switch lifts the value 5%
NUMA_FACTOR = 0.95  # each extra NUMA node spanned costs 5%
SWITCH_FACTOR = 0.98  # each extra PCIe switch spanned costs 2% (keeps sets compact, NICs shared)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class SetScore:
    """Quality of one GPU set; ``value`` ranks sets of equal size (higher is better)."""

    gpus: tuple[int, ...]
    bottleneck_gbps: float  # slowest pair (0 for one GPU)
    sum_pair_gbps: float  # total over all pairs
    mean_pair_gbps: float  # average pair (0 for one GPU)
    all_nvlink: bool  # every pair NVLink- or NVSwitch-connected (True for one GPU)
    nic_aligned: float  # fraction of GPUs with a NIC on their own PCIe switch
    numa_nodes: int  # NUMA nodes spanned
    pcie_switches: int  # PCIe switches (or root ports) spanned
    value: float


@dataclass(frozen=True)
class ShapeArrays:
    """A shape as numpy arrays, built once per shape and reused by every search on it."""

    bandwidth: FloatArray
    nvlinked: BoolArray
    host_gbps: FloatArray
    nic_local: FloatArray
    numa_bits: IntArray
    switch_bits: IntArray


@dataclass(frozen=True)
class RowScores:
    """Scores of many sets at once, one entry per row of the candidate array."""

    bottleneck: FloatArray
    total: FloatArray
    mean: FloatArray
    all_nvlink: BoolArray
    nic_aligned: FloatArray
    numa_nodes: IntArray
    pcie_switches: IntArray
    value: FloatArray


@lru_cache(maxsize=64)
def shape_arrays(shape: TopologyShape) -> ShapeArrays:
    """The shape's arrays, read-only because the cache shares them between callers."""
    arrays = ShapeArrays(
        bandwidth=np.array(shape.bandwidth_gbps, dtype=np.float64).reshape(shape.size, shape.size),
        nvlinked=np.array(shape.nvlinked, dtype=np.bool_).reshape(shape.size, shape.size),
        host_gbps=np.array(shape.host_gbps, dtype=np.float64),
        nic_local=np.array(shape.nic_local, dtype=np.float64),
        numa_bits=np.left_shift(1, np.array(shape.numa_rank, dtype=np.int64)),
        switch_bits=np.left_shift(1, np.array(shape.switch_rank, dtype=np.int64)),
    )
    for array in vars(arrays).values():
        array.setflags(write=False)
    return arrays


def score_rows(arrays: ShapeArrays, sets: IntArray) -> RowScores:
    """Score every row of ``sets`` (positions, sorted ascending within each row)."""
    rows, size = sets.shape
    bottleneck = np.zeros(rows, dtype=np.float64)
    total = np.zeros(rows, dtype=np.float64)
    all_nvlink = np.ones(rows, dtype=np.bool_)
    for i in range(size):
        for j in range(i + 1, size):
            pair = arrays.bandwidth[sets[:, i], sets[:, j]]
            bottleneck = pair if (i, j) == (0, 1) else np.minimum(bottleneck, pair)
            total = total + pair
            all_nvlink &= arrays.nvlinked[sets[:, i], sets[:, j]]
    pairs = size * (size - 1) // 2
    mean = total / pairs if pairs else np.zeros(rows, dtype=np.float64)
    pair_term = (bottleneck + mean) / 2 if pairs else arrays.host_gbps[sets[:, 0]]
    nic_aligned = arrays.nic_local[sets].mean(axis=1)
    numa_nodes = np.bitwise_count(np.bitwise_or.reduce(arrays.numa_bits[sets], axis=1)).astype(np.int64)
    switches = np.bitwise_count(np.bitwise_or.reduce(arrays.switch_bits[sets], axis=1)).astype(np.int64)
    value = (pair_term * (1 + NIC_BONUS * nic_aligned)
             * np.power(NUMA_FACTOR, numa_nodes - 1) * np.power(SWITCH_FACTOR, switches - 1))
    return RowScores(bottleneck=bottleneck, total=total, mean=mean, all_nvlink=all_nvlink,
                     nic_aligned=nic_aligned, numa_nodes=numa_nodes, pcie_switches=switches, value=value)


def row_score(scores: RowScores, row: int, gpus: tuple[int, ...]) -> SetScore:
    """One row of ``scores`` as a ``SetScore`` naming the GPUs by index."""
    return SetScore(
        gpus=gpus,
        bottleneck_gbps=float(scores.bottleneck[row]),
        sum_pair_gbps=float(scores.total[row]),
        mean_pair_gbps=float(scores.mean[row]),
        all_nvlink=bool(scores.all_nvlink[row]),
        nic_aligned=float(scores.nic_aligned[row]),
        numa_nodes=int(scores.numa_nodes[row]),
        pcie_switches=int(scores.pcie_switches[row]),
        value=float(scores.value[row]),
    )


def positions_of(graph: TopologyGraph, gpus: frozenset[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Shape positions of GPU indices, ascending; unknown indices are a ``TopologyError``."""
    order = {index: position for position, index in enumerate(graph.gpu_indices)}
    unknown = sorted(set(gpus) - set(order))
    if unknown:
        raise TopologyError(f"node {graph.name} has no GPUs {unknown}; GPUs are {list(order)}")
    return tuple(sorted(order[i] for i in gpus))


def score_set(graph: TopologyGraph, gpus: frozenset[int] | tuple[int, ...]) -> SetScore:
    """Score one set of GPUs (by index) on ``graph``."""
    if len(gpus) == 0 or len(set(gpus)) != len(gpus):
        raise TopologyError(f"cannot score GPU set {sorted(gpus)} on node {graph.name}: "
                            "give one or more distinct GPU indices")
    positions = positions_of(graph, tuple(gpus))
    scores = score_rows(shape_arrays(graph.shape_key), np.array([positions], dtype=np.int64))
    return row_score(scores, 0, tuple(graph.gpu_indices[p] for p in positions))
