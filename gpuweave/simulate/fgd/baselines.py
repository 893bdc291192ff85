"""The FGD artifact's baseline schedulers, as its run scripts run them.

Each is one score plugin (weight 1000, every default kube-scheduler score plugin disabled) behind
the default filters (NodeResourcesFit: CPU and memory) and its GPU-share filter (GPU model, enough
GPUs with room). Scores are kube-scheduler's integers, truncated as Go's ``int64()`` does, and a tie
goes to the node of lowest rank in the run's random node order (``artifact.ArtifactRun``), not to a
random one. The GPU a share takes: the tightest GPU that fits (``best``) for best-fit and
dot-product, a uniformly random one that fits for random, FGD's own best-scoring one for FGD. Whole
GPUs are the lowest-indexed idle ones. Sources: ``pkg/simulator/plugin/*_score.go`` and
``open_gpu_share.go`` of hkust-adsl/kubernetes-scheduler-simulator, read, not copied.
"""

from __future__ import annotations

import numpy as np

from devicemodel.errors import InvalidInputError
from gpuweave.simulate.cluster import ClusterState, Request
from gpuweave.simulate.fgd.policies import (
    MAX_NODE_SCORE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    Placement,
    PlacementPolicy,
    default_gpus,
    fragment_outcomes,
)
from topology.fragmentation import FloatArray, FragmentModel, IntArray

BASELINE_NAMES = ("random", "best-fit", "dot-product", "fgd")


def pick_by_rank(scores: FloatArray, candidates: IntArray, rank: IntArray) -> int:
    """The candidate node with the top score; among equals the one of lowest rank."""
    top = candidates[scores == scores.max()]
    return int(top[np.argmin(rank[top])])


def random_node_rank(node_count: int, *, seed: int) -> IntArray:
    """A tie order for a run outside the artifact's stream (``gpuweave simulate``): one random
    permutation per seed, as the artifact's prefixed node names give (``artifact.artifact_run``)."""
    rank: IntArray = np.random.default_rng(seed).permutation(node_count).astype(np.int64)
    return rank


class ArtifactRandom:
    """Random-fit: one uniformly random feasible node (the plugin's PreScore draw); a share takes a
    uniformly random GPU with room, whole GPUs the lowest-indexed idle ones."""

    name = "random"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        node = int(candidates[rng.integers(len(candidates))])
        if request.is_share:
            roomy = np.flatnonzero(cluster.gpu_free[node] >= request.gpu_milli)
            return Placement(node, (int(roomy[rng.integers(len(roomy))]),))
        return Placement(node, default_gpus(cluster, node, request))


class ArtifactBestFit:
    """Best-fit: 100 x (1 - leftover), leftover = 0.5 CPU + 0.5 GPU left after placing, each over the
    largest node spec (128 cores, 8 GPUs). The plugin's min-max normalisation keeps the top set."""

    name = "best-fit"

    def __init__(self, rank: IntArray) -> None:
        self._rank = rank

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        cpu = (cluster.cpu_free[candidates] - request.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
        gpu_free = cluster.gpu_free[candidates].sum(axis=1)
        gpu = (gpu_free - request.total_gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5
        scores = np.trunc((1.0 - (cpu + gpu)) * MAX_NODE_SCORE)
        node = pick_by_rank(scores, candidates, self._rank)
        return Placement(node, default_gpus(cluster, node, request))


class ArtifactDotProduct:
    """Tetris-style dot product (``dimext=merge``, ``norm=max``): 100 x (1 - (free . request) / 2),
    both vectors (CPU, total milli-GPU) over the largest node spec; the smallest product wins."""

    name = "dot-product"

    def __init__(self, rank: IntArray) -> None:
        self._rank = rank

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        cpu = (cluster.cpu_free[candidates] / MAX_SPEC_CPU_MILLI) * (request.cpu_milli / MAX_SPEC_CPU_MILLI)
        gpu_free = cluster.gpu_free[candidates].sum(axis=1)
        gpu = (gpu_free / MAX_SPEC_GPU_MILLI) * (request.total_gpu_milli / MAX_SPEC_GPU_MILLI)
        scores = np.trunc(MAX_NODE_SCORE * (1.0 - (cpu + gpu) / 2.0))
        node = pick_by_rank(scores, candidates, self._rank)
        return Placement(node, default_gpus(cluster, node, request))


class ArtifactFgd:
    """FGD: score ``trunc(100 x sigmoid(-delta / 1000))`` of the fragment increase for the artifact's
    95% target workload; a share takes the first GPU with the node's best score."""

    name = "fgd"

    def __init__(self, rank: IntArray, model: FragmentModel) -> None:
        self._rank = rank
        self._model = model
        self._values: FloatArray = np.zeros(0)
        self._versions: IntArray = np.zeros(0, dtype=np.int64)

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        before = self._fragments(cluster, candidates)
        outcomes = fragment_outcomes(cluster, request, candidates, model=self._model, before=before)
        finite = np.isfinite(outcomes.delta)
        sigmoid = 1.0 / (1.0 + np.exp(np.where(finite, outcomes.delta, 0.0) / 1000.0))
        scores = np.where(finite, np.trunc(sigmoid * MAX_NODE_SCORE), -1.0)
        node = pick_by_rank(scores.max(axis=1), candidates, self._rank)
        row = int(np.flatnonzero(candidates == node)[0])
        if request.is_share:
            return Placement(node, (int(np.argmax(scores[row])),))
        return Placement(node, default_gpus(cluster, node, request))

    def _fragments(self, cluster: ClusterState, nodes: IntArray) -> FloatArray:
        """F_n(M) of ``nodes`` for this model, recomputed only where the node changed."""
        if len(self._values) != cluster.size:
            self._values = np.zeros(cluster.size)
            self._versions = np.full(cluster.size, -1, dtype=np.int64)
        stale = nodes[self._versions[nodes] != cluster.version[nodes]]
        if len(stale):
            self._values[stale] = self._model.fragment(
                cluster.cpu_free[stale],
                cluster.gpu_free[stale],
                cluster.model_index[stale],
                cluster.memory_free[stale],
            )
            self._versions[stale] = cluster.version[stale]
        result: FloatArray = self._values[nodes]
        return result


def make_baseline(name: str, *, rank: IntArray, fgd_model: FragmentModel) -> PlacementPolicy:
    """A fresh artifact baseline for one run (FGD keeps per-run state)."""
    if name == "random":
        return ArtifactRandom()
    if name == "best-fit":
        return ArtifactBestFit(rank)
    if name == "dot-product":
        return ArtifactDotProduct(rank)
    if name == "fgd":
        return ArtifactFgd(rank, fgd_model)
    raise InvalidInputError(f"unknown baseline {name!r}; choose from {', '.join(BASELINE_NAMES)}")
