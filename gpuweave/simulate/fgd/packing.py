"""The FGD paper's packing experiment: place an inflated trace one pod at a time, no departures.

After each pod the GPU allocation ratio and the cluster fragmentation (for the target workload)
are recorded against the arrived load (GPU requests submitted so far, % of cluster capacity).
Records are binned by rounding the arrived load to whole percent and averaged per bin, which is
how the paper's artifact produces its discrete curves (0..130).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.policies import PlacementPolicy
from gpuweave.simulate.fgd.trace import TracePod
from topology.fragmentation import FragmentModel

ProgressHook = Callable[[int], None]


@dataclass(frozen=True)
class PackingCurves:
    """Per-percent curves of one run; index i is arrived load i% (NaN where no pod landed)."""

    allocation: list[float]  # % of all GPU milli allocated
    fragment_total: list[float]  # fragment, % of all GPU milli
    fragment_idle: list[float]  # fragment, % of idle GPU milli
    placed: int
    failed: int
    failed_gpu_milli: int
    # what is left at the end: pods that fit nowhere per request (``request_label``), the free
    # milli-GPU of every GPU partly used, and the GPUs entirely free
    failed_by_request: dict[str, int] = field(default_factory=dict)
    leftovers: tuple[int, ...] = ()
    idle_gpus: int = 0
    # of ``idle_gpus``, those on nodes whose free CPU (else memory) is below every GPU pod's that failed
    idle_gpus_short_of: dict[str, int] = field(default_factory=dict)
    smallest_failed_share_milli: int = MILLI_PER_GPU  # a whole GPU when no share failed


def request_label(request: Request) -> str:
    """A pod's GPU request in a word: ``810m`` (a share of 810 milli-GPU), ``2 GPU``, ``CPU only``."""
    if request.gpu_count == 0:
        return "CPU only"
    if request.is_share:
        return f"{request.gpu_milli}m"
    return f"{request.gpu_count} GPU"


@dataclass
class _Bins:
    size: int
    sums: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.sums = np.zeros((3, self.size))
        self.counts = np.zeros(self.size)

    def add(self, index: int, values: tuple[float, float, float]) -> None:
        if 0 <= index < self.size:
            self.sums[:, index] += values
            self.counts[index] += 1

    def means(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            means: np.ndarray = self.sums / self.counts[None, :]
        return means


def _snapshot(cluster: ClusterState) -> tuple[float, float, float]:
    total = cluster.total_gpu_milli
    idle = float(cluster.gpu_free.sum())
    fragment = float(cluster.node_fragment.sum())
    return (
        100.0 * (total - idle) / total,
        100.0 * fragment / total,
        100.0 * fragment / idle if idle > 0 else 100.0,
    )


def run_packing(
    *,
    nodes: Sequence[NodeSpec],
    pods: Sequence[TracePod],
    fragment_model: FragmentModel,
    policy: PlacementPolicy,
    seed: int,
    max_percent: int = 130,
    progress: ProgressHook | None = None,
) -> PackingCurves:
    """Place ``pods`` in order with ``policy``; a pod that fits nowhere fails and stays unplaced."""
    cluster = ClusterState(nodes, fragment_model)
    rng = np.random.default_rng(seed)
    bins = _Bins(max_percent + 1)
    arrived = 0
    placed = failed = failed_milli = 0
    failed_by: dict[str, int] = {}
    # the least CPU, memory and share a failed GPU pod asked for
    least_cpu = least_memory = np.inf
    least_share = MILLI_PER_GPU
    for step, pod in enumerate(pods):
        request = Request(pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli, pod.gpu_types)
        arrived += request.total_gpu_milli
        candidates = np.flatnonzero(cluster.feasible(request))
        if len(candidates):
            placement = policy.choose(cluster, request, candidates, rng)
            cluster.place(placement.node, placement.gpus, request)
            placed += 1
        else:
            failed += 1
            failed_milli += request.total_gpu_milli
            label = request_label(request)
            failed_by[label] = failed_by.get(label, 0) + 1
            if request.gpu_count:
                least_cpu, least_memory = min(least_cpu, pod.cpu_milli), min(least_memory, pod.memory_mib)
            if request.is_share:
                least_share = min(least_share, request.gpu_milli)
        bins.add(round(100.0 * arrived / cluster.total_gpu_milli), _snapshot(cluster))
        if progress is not None and step % 500 == 499:
            progress(500)
    means = bins.means()
    present = np.arange(cluster.gpu_free.shape[1])[None, :] < cluster.gpu_count[:, None]
    free = cluster.gpu_free[present]
    idle_per_node = ((cluster.gpu_free == MILLI_PER_GPU) & present).sum(axis=1)
    # no GPU pod failed: the minima are infinite and every node would count as short of both
    any_failed = bool(np.isfinite(least_cpu))
    cpu_short = (cluster.cpu_free < least_cpu) & any_failed
    memory_short = ~cpu_short & (cluster.memory_free < least_memory) & any_failed
    return PackingCurves(
        allocation=[float(v) for v in means[0]],
        fragment_total=[float(v) for v in means[1]],
        fragment_idle=[float(v) for v in means[2]],
        placed=placed,
        failed=failed,
        failed_gpu_milli=failed_milli,
        failed_by_request=failed_by,
        leftovers=tuple(int(v) for v in free[(free > 0) & (free < MILLI_PER_GPU)]),
        idle_gpus=int(idle_per_node.sum()),
        idle_gpus_short_of={
            "cpu": int(idle_per_node[cpu_short].sum()),
            "memory": int(idle_per_node[memory_short].sum()),
        },
        smallest_failed_share_milli=least_share,
    )
