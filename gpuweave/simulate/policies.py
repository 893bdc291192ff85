"""Placement policies: which feasible node, and which GPUs on it, a request gets.

Baselines follow the FGD artifact's scoring plugins (random, best-fit, dot-product, FGD),
including kube-scheduler's integer scores and random choice among equal top scores. ``gpuweave``
is our scoring for shares: the exact fragmentation gradient (no integer rounding), ties broken by
packing, and a look-ahead that keeps whole GPUs for whole-GPU requests (see ``GpuweavePolicy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuweave.simulate.cluster import ClusterState, Request
from topology.fragmentation import MILLI_PER_GPU, FloatArray, FragmentModel, IntArray, TargetWorkload

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


class RandomPolicy:
    name = "random"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        node = int(candidates[rng.integers(len(candidates))])
        if request.is_share:
            roomy = np.flatnonzero(cluster.gpu_free[node] >= request.gpu_milli)
            return Placement(node, (int(roomy[rng.integers(len(roomy))]),))
        return Placement(node, default_gpus(cluster, node, request))


class BestFitPolicy:
    """Least weighted leftover (0.5 CPU + 0.5 GPU, normalised by the largest node spec)."""

    name = "best-fit"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        cpu_left = (cluster.cpu_free[candidates] - request.cpu_milli) / MAX_SPEC_CPU_MILLI
        gpu_left = (cluster.gpu_free[candidates].sum(axis=1) - request.total_gpu_milli) / MAX_SPEC_GPU_MILLI
        scores = np.floor((1.0 - 0.5 * cpu_left - 0.5 * gpu_left) * MAX_NODE_SCORE)
        node = int(candidates[pick_top(scores, rng)])
        return Placement(node, default_gpus(cluster, node, request))


class DotProductPolicy:
    """Tetris-style: the smallest dot product of free and requested (CPU, GPU), max-normalised."""

    name = "dot-product"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        cpu = cluster.cpu_free[candidates] / MAX_SPEC_CPU_MILLI * (request.cpu_milli / MAX_SPEC_CPU_MILLI)
        gpu_free = cluster.gpu_free[candidates].sum(axis=1)
        gpu = gpu_free / MAX_SPEC_GPU_MILLI * (request.total_gpu_milli / MAX_SPEC_GPU_MILLI)
        scores = np.floor((1.0 - (cpu + gpu) / 2.0) * MAX_NODE_SCORE)
        node = int(candidates[pick_top(scores, rng)])
        return Placement(node, default_gpus(cluster, node, request))


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


def _sigmoid(x: FloatArray) -> FloatArray:
    result: FloatArray = 1.0 / (1.0 + np.exp(-x))
    return result


def _placement(cluster: ClusterState, request: Request, node: int, share_gpu: int) -> Placement:
    if request.is_share:
        return Placement(node, (share_gpu,))
    return Placement(node, default_gpus(cluster, node, request))


class FgdPolicy:
    """FGD as evaluated in the paper: integer score floor(100 * sigmoid(-delta / 1000)), random
    choice among the top nodes; a share takes the first GPU with the node's best score."""

    name = "fgd"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        outcomes = fragment_outcomes(
            cluster,
            request,
            candidates,
            model=cluster.fragment_model,
            before=cluster.node_fragment[candidates],
        )
        finite = np.isfinite(outcomes.delta)
        scores = np.where(finite, np.floor(_sigmoid(-outcomes.delta / 1000.0) * MAX_NODE_SCORE), -1.0)
        row = pick_top(scores.max(axis=1), rng)
        return _placement(cluster, request, int(candidates[row]), int(np.argmax(scores[row])))


class NodeFragmentCache:
    """Per-node F_n(M) for a policy's own target workload, refreshed for nodes that changed."""

    def __init__(self, model: FragmentModel) -> None:
        self.model = model
        self._values: FloatArray = np.zeros(0)
        self._versions: IntArray = np.zeros(0, dtype=np.int64)

    def values(self, cluster: ClusterState, nodes: IntArray) -> FloatArray:
        if len(self._values) != cluster.size:
            self._values = np.zeros(cluster.size)
            self._versions = np.full(cluster.size, -1, dtype=np.int64)
        stale = nodes[self._versions[nodes] != cluster.version[nodes]]
        if len(stale):
            self._values[stale] = self.model.fragment(
                cluster.cpu_free[stale],
                cluster.gpu_free[stale],
                cluster.model_index[stale],
                cluster.memory_free[stale],
            )
            self._versions[stale] = cluster.version[stale]
        result: FloatArray = self._values[nodes]
        return result


class GpuweavePolicy:
    """gpuweave's scoring for shares and whole GPUs on a node pool.

    1. Fragmentation gradient on a memory-aware target workload (a task needs its typical host
       memory too, so GPUs stranded by full host memory count as fragment; FGD ignores memory).
    2. Increases within ``tolerance_milli`` count as equal (noise in the measure is not signal),
       except the part owed to GPU-type-constrained tasks, which is compared exactly: spending a
       GPU model that type-bound tasks depend on is never a tie.
    3. Reservation: a placement also costs, per milli-GPU it takes, its node kind's pressure
       (``ReservedDemand``): the expected part of that capacity that tasks fitting only a few
       kinds (a GPU-type constraint, or 8 GPUs with 120 cores) will need, times
       ``reserve_weight`` (1 = the expected loss itself). Zero on a cluster of one kind or a
       workload every shape of which fits every kind.
    4. Among equals, pack: a share goes to the fullest GPU that fits, a pod to the node left
       with the least idle GPU, then the least free CPU; only then a random choice.
    """

    name = "gpuweave"

    def __init__(
        self,
        model: FragmentModel,
        *,
        tolerance_milli: float = 40.0,
        reserve_weight: float = 1.0,
    ) -> None:
        self._cache = NodeFragmentCache(model)
        self._tolerance = tolerance_milli
        self._typed = _typed_part(model)
        self._reserve_weight = reserve_weight
        self._reserve: ReservedDemand | None = None

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        level, idle_after = self._levels(cluster, request, candidates)
        finite = np.isfinite(level)
        gpu_room = np.where(finite, cluster.gpu_free[candidates], MILLI_PER_GPU + 1)
        gpu = np.lexsort((gpu_room, level), axis=1)[:, 0]
        rows = np.arange(len(candidates))
        cpu_left = cluster.cpu_free[candidates] - request.cpu_milli
        key = (-cpu_left, -idle_after[rows, gpu], -level[rows, gpu])
        order = np.lexsort(key)
        best = order[-1]
        ties = order[np.all([k[order] == k[best] for k in key], axis=0)]
        row = int(ties[rng.integers(len(ties))]) if len(ties) > 1 else int(best)
        return _placement(cluster, request, int(candidates[row]), int(gpu[row]))

    def _levels(
        self, cluster: ClusterState, request: Request, candidates: IntArray
    ) -> tuple[FloatArray, IntArray]:
        """Fragment increase per (node, GPU choice), untyped part rounded, typed part exact
        (``inf`` where the choice does not fit); and the node's idle milli-GPU after each choice."""
        before = self._cache.values(cluster, candidates)
        outcomes = fragment_outcomes(cluster, request, candidates, model=self._cache.model, before=before)
        finite = np.isfinite(outcomes.delta)
        delta = np.where(finite, outcomes.delta, 0.0)
        typed_delta = np.zeros_like(delta)
        if self._typed is not None:
            cache, mass = self._typed
            typed = fragment_outcomes(
                cluster, request, candidates, model=cache.model, before=cache.values(cluster, candidates)
            )
            typed_delta = mass * np.where(finite, typed.delta, 0.0)
        rounded = np.round((delta - typed_delta) / self._tolerance) * self._tolerance
        if self._reserve is None or len(self._reserve.kind_of_node) != cluster.size:
            self._reserve = ReservedDemand.of(self._cache.model.workload, cluster)
        pressure = self._reserve_weight * self._reserve.pressure(cluster)
        reserve = pressure[self._reserve.kind_of_node[candidates]] * request.total_gpu_milli
        levels: FloatArray = np.where(finite, np.round(rounded + typed_delta + reserve[:, None], 6), np.inf)
        return levels, outcomes.idle_after


def _typed_part(model: FragmentModel) -> tuple[NodeFragmentCache, float] | None:
    """The fragment owed to type-constrained GPU tasks, as (a model of those tasks, their mass).

    F over a subset of tasks of total probability q equals q times F of that subset renormalised.
    """
    workload = model.workload
    memory = workload.memory_mib or (0,) * len(workload.shapes)
    typed = [
        (shape, p, mem)
        for shape, p, mem in zip(workload.shapes, workload.probabilities, memory, strict=True)
        if shape.gpu_types and not shape.is_cpu_only
    ]
    mass = sum(p for _, p, _ in typed)
    if not typed or mass <= 0:
        return None
    subset = TargetWorkload(
        tuple(s for s, _, _ in typed),
        tuple(p / mass for _, p, _ in typed),
        tuple(m for _, _, m in typed) if workload.memory_aware else (),
    )
    return NodeFragmentCache(FragmentModel(subset, models=model.models, max_gpus=model.max_gpus)), mass


@dataclass(frozen=True)
class ReservedDemand:
    """Expected GPU demand that only some node kinds can serve, per kind.

    A node kind is (GPU model, GPU count, CPU, memory) as built. A task shape that fits only some
    kinds even on an empty node (a GPU-type constraint, 8 GPUs, 120 cores, 700 GiB) brings its
    expected demand (probability x milli-GPU) to those kinds, spread in proportion to their GPUs;
    ``share`` is that per kind, as a share of all expected GPU demand. Shapes that fit every kind
    reserve nothing, so a uniform cluster has no reservation.
    """

    kind_of_node: IntArray
    share: FloatArray

    @classmethod
    def of(cls, workload: TargetWorkload, cluster: ClusterState) -> ReservedDemand:
        spec = np.column_stack(
            (cluster.model_index, cluster.gpu_count, cluster.cpu_capacity, cluster.memory_capacity)
        )
        kinds, kind_of_node = np.unique(spec, axis=0, return_inverse=True)
        capacity = np.bincount(kind_of_node.ravel(), weights=cluster.gpu_count, minlength=len(kinds))
        memory = workload.memory_mib or (0,) * len(workload.shapes)
        demand = np.zeros(len(kinds))
        total = 0.0
        for shape, p, mem in zip(workload.shapes, workload.probabilities, memory, strict=True):
            if shape.is_cpu_only:
                continue
            total += p * shape.total_gpu_milli
            fits = np.asarray([shape.allows_model(cluster.models[m]) for m in kinds[:, 0]]) & np.all(
                kinds[:, 1:] >= (shape.gpu_count, shape.cpu_milli, mem), axis=1
            )
            if fits.any() and not np.all(fits | (capacity == 0)):
                demand += np.where(fits, capacity, 0.0) / capacity[fits].sum() * p * shape.total_gpu_milli
        return cls(kind_of_node.ravel().astype(np.int64), demand / total if total > 0 else demand)

    def pressure(self, cluster: ClusterState) -> FloatArray:
        """Per kind, the expected part of one free milli-GPU that only its reserved tasks can use.

        Future arrivals fill the free GPUs with the workload's mix, so the reserved tasks will ask
        kind k for about ``share[k]`` of all free capacity: if k holds a smaller share of the free
        GPUs than that, all of its free capacity is theirs (pressure 1), else the ratio. FGD's
        per-node measure cannot see this (a scarce kind's idle GPU counts like any other), so
        spending a scarce kind on a task that fits anywhere looked free until the tasks that need
        it failed.
        """
        free = np.bincount(self.kind_of_node, weights=cluster.gpu_free.sum(axis=1), minlength=len(self.share))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.share * free.sum() / free
        result: FloatArray = np.minimum(np.nan_to_num(ratio, nan=0.0, posinf=1.0), 1.0)
        return result
