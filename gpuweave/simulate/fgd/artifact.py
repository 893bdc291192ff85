"""The FGD artifact's experiment setup: its target workload, its task stream and its node order.

The published curves (``fgd-atc23-results``) come from ``hkust-adsl/kubernetes-scheduler-simulator``
run as its scripts run it. Three setup rules change what a baseline measures, so a faithful
baseline needs all three (docs/benchmarks.md, "Faithful baselines"):

- Target workload: the most popular task shapes (CPU, milli-GPU per GPU, GPU count, GPU type) until
  they cover 95% of the trace's own pods, CPU-only pods included, renormalised.
- Stream: the trace's pods are shuffled; then clones of random trace pods are *appended* (not
  shuffled in) until the next clone's per-GPU request would pass 130% of GPU capacity (the
  artifact compares the per-GPU milli, not the pod's total, so the last multi-GPU clone may
  overshoot); a variant above the target instead loses random pods until it fits.
- Node order: every node's name gets a random 4-digit prefix from a permutation drawn after the
  stream, and its patched kube-scheduler gives a tie to the lexicographically smallest name, so
  ties go to the node with the lowest rank of one random permutation, fixed for the whole run.

The artifact draws from Go's ``math/rand``; we draw the same kinds of choices from numpy, so a seed
here names a different sample of the same distribution, not the artifact's run of that seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.fgd.trace import TracePod
from topology.fragmentation import FragmentModel, IntArray, typical_workload

ARTIFACT_COVERAGE = 0.95  # podPopularityThreshold in the artifact's run scripts
ARTIFACT_RATIO = 1.3  # -tune 1.3


@dataclass(frozen=True)
class ArtifactRun:
    """One seed's task stream and node tie order (``node_rank[i]``: lower wins a tie)."""

    pods: tuple[TracePod, ...]
    node_rank: IntArray


def artifact_model(pods: Sequence[TracePod], *, models: Sequence[str], max_gpus: int) -> FragmentModel:
    """FGD's fragment model for the artifact's target workload of ``pods`` (the trace, not the stream)."""
    workload = typical_workload([p.shape for p in pods], coverage=ARTIFACT_COVERAGE)
    return FragmentModel(workload, models=models, max_gpus=max_gpus)


def artifact_run(
    pods: Sequence[TracePod], *, capacity_gpus: int, node_count: int, seed: int, ratio: float = ARTIFACT_RATIO
) -> ArtifactRun:
    """The stream and node order the artifact builds for one seed (see the module docstring)."""
    if not pods:
        raise InvalidInputError("the artifact stream needs the trace's pods; the pod list is empty")
    rng = np.random.default_rng(seed)
    by_name = sorted(pods, key=lambda p: p.name)
    shuffled = [by_name[int(i)] for i in rng.permutation(len(by_name))]
    target = ratio * capacity_gpus * MILLI_PER_GPU
    requested = sum(p.total_gpu_milli for p in shuffled)
    if requested > target:
        stream = _tune_down(shuffled, requested=requested, target=target, rng=rng)
    else:
        stream = shuffled + _clones(by_name, requested=requested, target=target, rng=rng)
    rank: IntArray = rng.permutation(node_count).astype(np.int64)
    return ArtifactRun(tuple(stream), rank)


def _clones(
    source: list[TracePod], *, requested: int, target: float, rng: np.random.Generator
) -> list[TracePod]:
    """Random clones until the next one's per-GPU milli would pass ``target`` (the artifact's test)."""
    clones: list[TracePod] = []
    while True:
        pod = source[int(rng.integers(len(source)))]
        if requested + pod.gpu_milli > target:
            return clones
        requested += pod.total_gpu_milli
        clones.append(
            TracePod(
                f"{pod.name}-tuned-{len(clones)}",
                pod.cpu_milli,
                pod.memory_mib,
                pod.gpu_count,
                pod.gpu_milli,
                pod.gpu_types,
            )
        )


def _tune_down(
    pods: list[TracePod], *, requested: int, target: float, rng: np.random.Generator
) -> list[TracePod]:
    """Random pods removed (order kept) until the GPU requests fit ``target``."""
    kept = list(pods)
    while requested > target and kept:
        requested -= kept.pop(int(rng.integers(len(kept)))).total_gpu_milli
    return kept
