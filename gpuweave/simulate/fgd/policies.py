"""What a placement policy is, and the pieces the baselines share.

A policy chooses a feasible node, and the GPUs on it, for one request. The only baselines are the
FGD artifact's (``baselines``: random, best-fit, dot-product, FGD) and, in ``gpuweave simulate``,
kube-scheduler's default spreading (``placers.LeastAllocatedPolicy``); gpuweave has no policy here:
trace experiments and the simulation run the extender itself (``product_policy.ProductPolicy``,
``extender_client.ExtenderPlacer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.cluster import ClusterState, Request
from topology.fragmentation import FloatArray, FragmentModel, IntArray

MAX_NODE_SCORE = 100
MAX_SPEC_CPU_MILLI = 128_000  # best-fit / dot-product normalisation, as in the FGD artifact
MAX_SPEC_GPU_MILLI = 8_000


@dataclass(frozen=True)
class Placement:
    node: int
    gpus: tuple[int, ...]


class PlacementPolicy(Protocol):
    name: str

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement: ...


def pick_top(scores: FloatArray, rng: np.random.Generator) -> int:
    """Index of a maximum score, uniformly among ties (kube-scheduler's selectHost)."""
    top = np.flatnonzero(scores == scores.max())
    return int(top[0]) if len(top) == 1 else int(top[rng.integers(len(top))])


def share_gpu_best_fit(cluster: ClusterState, node: int, request: Request) -> int:
    """The GPU with the least room that still fits the share (first such index)."""
    free = cluster.gpu_free[node]
    room = np.where(free >= request.gpu_milli, free, MILLI_PER_GPU + 1)
    return int(np.argmin(room))


def default_gpus(cluster: ClusterState, node: int, request: Request) -> tuple[int, ...]:
    if request.gpu_count == 0:
        return ()
    if request.is_share:
        return (share_gpu_best_fit(cluster, node, request),)
    return tuple(cluster.exclusive_gpus(node, request.gpu_count))


@dataclass(frozen=True)
class Outcomes:
    """Every way to place a request on the candidate nodes, and the fragment increase of each.

    ``delta`` has shape (candidates, slots): for a share, one column per GPU it could take
    (``inf`` where it does not fit); for other requests only column 0 is used. ``idle_after`` is
    the node's idle milli-GPU after that placement.
    """

    delta: FloatArray
    idle_after: IntArray


def fragment_outcomes(
    cluster: ClusterState, request: Request, candidates: IntArray, *, model: FragmentModel, before: FloatArray
) -> Outcomes:
    """Fragment increase (for ``model``'s target workload) of each way to place ``request``."""
    gpu_free = cluster.gpu_free[candidates]
    cpu_after = cluster.cpu_free[candidates] - request.cpu_milli
    memory_after = cluster.memory_free[candidates] - request.memory_mib
    kinds = cluster.model_index[candidates]
    slots = gpu_free.shape[1]
    if request.is_share:
        hypothetical = np.repeat(gpu_free[:, None, :], slots, axis=1)
        diagonal = np.arange(slots)
        hypothetical[:, diagonal, diagonal] -= request.gpu_milli
        after = model.fragment(
            np.repeat(cpu_after, slots),
            hypothetical.reshape(-1, slots),
            np.repeat(kinds, slots),
            np.repeat(memory_after, slots),
        )
        delta = np.where(gpu_free >= request.gpu_milli, after.reshape(-1, slots) - before[:, None], np.inf)
        return Outcomes(delta, hypothetical.sum(axis=2))
    taken = _exclusive_mask(gpu_free, request.gpu_count)
    rows = gpu_free - MILLI_PER_GPU * taken
    delta = np.full(gpu_free.shape, np.inf)
    delta[:, 0] = model.fragment(cpu_after, rows, kinds, memory_after) - before
    idle = np.zeros(gpu_free.shape, dtype=np.int64)
    idle[:, 0] = rows.sum(axis=1)
    return Outcomes(delta, idle)


def _exclusive_mask(gpu_free: IntArray, count: int) -> IntArray:
    full = gpu_free == MILLI_PER_GPU
    mask: IntArray = (full & (np.cumsum(full, axis=1) <= count)).astype(np.int64)
    return mask
