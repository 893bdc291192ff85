"""The simulated workload: training gangs, single-GPU jobs, fractional inference and MIG pods.

Arrivals are a Poisson stream on the simulated clock, sized so the offered GPU load is about
``load`` of the cluster's capacity. Gang sizes follow the Microsoft ITP trace's multi-GPU mix
(2/4/8/16 GPUs; see the shared reference, section 3), fractional sizes the Alibaba 2023 trace's most
common shares. Halfway through, fractional inference shifts to MIG slices (the MIG demand shift).
With a trace file (Alibaba 2023 CSV format) the pods come from it instead.

The workload is shaped to the fleet (``WorkloadSettings.node_gpus``, ``mig``, ``clique_gpus``): a
gang's pods are as large as the fleet's largest node (8 GPUs on the default fleet, 4 on GB200
compute trays), so a training job larger than a node is reshaped into a multi-node gang rather than
a pod no node can hold; MIG requests are not generated when no node is MIG-managed (those arrivals
stay fractional); and on an NVLink pool (every whole-GPU node in a clique) gangs of 32 and 64 GPUs
are drawn too, as far as the largest clique holds them, each asking to stay inside one clique
(``gpuweave.io/gang-tier: nvidia.com/gpu.clique``), as a user on an NVL72 rack would.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.fgd.trace import load_pods
from topology.network import LABEL_GPU_CLIQUE

GANG_SIZES = (2, 4, 8, 16)
# ITP: 2.14%, 3.42%, 10.11% of jobs; 16-64 GPUs 1.2% of jobs but 30% of GPU-hours, here all 16 GPUs
GANG_WEIGHTS = (0.13, 0.2, 0.57, 0.1)
# On an NVLink pool (NVL72 racks) the ITP's 16-64 GPU class is spread over 16, 32 and 64 GPUs (its
# 0.1 split 5:3:2): these are the jobs a 72-GPU NVLink domain is built for (4, 8 and 16 trays of one
# clique), which a fleet of 8-GPU nodes runs over the network. Sizes the largest clique cannot hold
# are left out and the other weights scaled up (``_gang_mix``).
CLIQUE_GANG_SIZES = (2, 4, 8, 16, 32, 64)
CLIQUE_GANG_WEIGHTS = (0.13, 0.2, 0.57, 0.05, 0.03, 0.02)
SHARE_MILLI = (810, 470, 320, 650, 230, 460, 160, 220)
SHARE_WEIGHTS = (0.35, 0.24, 0.11, 0.08, 0.05, 0.04, 0.07, 0.06)
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
MIG_WEIGHTS = (0.6, 0.25, 0.15)
MIG_COMPUTE_SLICES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}
GPUS_PER_GANG_POD = 8  # the default fleet's node size; a fleet of smaller nodes: ``node_gpus``
# What an NVLink-pool gang asks for (docs/pod-api.md): every member inside one clique, or it waits
GANG_TIER_CLIQUE = LABEL_GPU_CLIQUE
# The PriorityClass values of training jobs (every other job: 0): the one thing they do in the
# simulation is let a training job recovering from a fault preempt lower-priority work in its
# network domain (the extender lets no gang preempt before its attempt ran). A one-pod job (a gang
# of one) is below a multi-node gang, which may so displace it, as it displaces other work.
TRAINING_GANG_PRIORITY = 1000
TRAINING_POD_PRIORITY = 500


class JobKind(StrEnum):
    GANG = "training-gang"
    SINGLE = "single-gpu"
    SHARE = "fractional"
    MIG = "mig"


@dataclass(frozen=True)
class Job:
    """One unit of work; a gang larger than a node runs as several node-sized pods, all or nothing."""

    job_id: str
    kind: JobKind
    arrival_s: float
    duration_s: float
    pods: int
    gpus_per_pod: int
    gpu_milli: int  # per GPU
    cpu_milli: int
    memory_mib: int
    mig_profile: str = ""
    priority: int = 0  # the pods' PriorityClass value
    gang_tier: str = ""  # the tier label one domain of which must hold every pod ("": none required)

    @property
    def gpu_milli_total(self) -> int:
        if self.kind is JobKind.MIG:
            return MIG_COMPUTE_SLICES.get(self.mig_profile, 1) * MILLI_PER_GPU // 7
        return self.pods * self.gpus_per_pod * self.gpu_milli


@dataclass(frozen=True)
class WorkloadSettings:
    duration_s: float
    capacity_gpus: int
    load: float = 0.95
    mig_shift_at: float = 0.5  # fraction of the run after which shares move to MIG
    mig_share: float = 0.6  # fraction of fractional arrivals that become MIG requests after the shift
    node_gpus: int = GPUS_PER_GANG_POD  # the fleet's largest node: a gang's pods are this size
    mig: bool = True  # some node is MIG-managed (else no MIG requests are drawn)
    # An NVLink pool (every whole-GPU node in a clique): the GPUs of the whole-GPU nodes of its
    # largest clique, the most one gang can get; 0: not such a pool (no clique sizes, no tier)
    clique_gpus: int = 0

    def gang_mix(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Training job sizes and their weights for this fleet (module doc)."""
        if self.clique_gpus <= 0:
            return GANG_SIZES, GANG_WEIGHTS
        kept = [
            (s, w)
            for s, w in zip(CLIQUE_GANG_SIZES, CLIQUE_GANG_WEIGHTS, strict=True)
            if s <= self.clique_gpus
        ]
        if not kept:
            return GANG_SIZES, GANG_WEIGHTS
        total = sum(w for _, w in kept)
        return tuple(s for s, _ in kept), tuple(w / total for _, w in kept)


def pods_of(size: int, node_gpus: int) -> tuple[int, int]:
    """(pods, GPUs per pod) of a training job of ``size`` GPUs on nodes of ``node_gpus``: one pod
    when it fits a node, else pods of the largest divisor of ``size`` a node holds."""
    if size <= node_gpus:
        return 1, size
    per_pod = max(d for d in range(1, max(node_gpus, 1) + 1) if size % d == 0)
    return size // per_pod, per_pod


def _kind_mix(rng: np.random.Generator) -> JobKind:
    roll = rng.random()
    return JobKind.SHARE if roll < 0.45 else JobKind.SINGLE if roll < 0.8 else JobKind.GANG


def _make_job(
    rng: np.random.Generator,
    *,
    index: int,
    at: float,
    after_shift: bool,
    mig_share: float,
    settings: WorkloadSettings,
) -> Job:
    kind = _kind_mix(rng)
    if kind is JobKind.SHARE and settings.mig and after_shift and rng.random() < mig_share:
        profile = str(rng.choice(MIG_PROFILES, p=MIG_WEIGHTS))
        duration = float(rng.lognormal(np.log(1500), 0.6))
        return Job(f"mig-{index}", JobKind.MIG, at, duration, 1, 1, 0, 4000, 16_384, profile)
    if kind is JobKind.SHARE:
        milli = int(rng.choice(SHARE_MILLI, p=SHARE_WEIGHTS))
        duration = float(rng.lognormal(np.log(1500), 0.6))
        return Job(f"infer-{index}", kind, at, duration, 1, 1, milli, 4000, 16_384)
    if kind is JobKind.SINGLE:
        duration = float(rng.lognormal(np.log(2400), 0.7))
        return Job(f"single-{index}", kind, at, duration, 1, 1, MILLI_PER_GPU, 12_000, 65_536)
    sizes, weights = settings.gang_mix()
    size = int(rng.choice(sizes, p=weights))
    pods, per_pod = pods_of(size, settings.node_gpus)
    duration = float(rng.lognormal(np.log(3600), 0.6))
    return Job(
        f"train-{index}",
        kind,
        at,
        duration,
        pods,
        per_pod,
        MILLI_PER_GPU,
        11_000 * per_pod,
        98_304 * per_pod,
        priority=TRAINING_GANG_PRIORITY if pods > 1 else TRAINING_POD_PRIORITY,
        gang_tier=GANG_TIER_CLIQUE if pods > 1 and settings.clique_gpus > 0 else "",
    )


def _mean_gpu_seconds(rng_seed: int, settings: WorkloadSettings) -> float:
    """Mean GPU-seconds per job of the mix (estimated once by sampling, so load targets hold)."""
    rng = np.random.default_rng(rng_seed)
    sample = [
        _make_job(rng, index=i, at=0.0, after_shift=False, mig_share=0.0, settings=settings)
        for i in range(4000)
    ]
    return float(np.mean([j.gpu_milli_total / MILLI_PER_GPU * j.duration_s for j in sample]))


def synthetic_jobs(settings: WorkloadSettings, *, seed: int) -> list[Job]:
    """Poisson arrivals over the run; the first arrivals come at once to warm the cluster up."""
    rng = np.random.default_rng(seed)
    rate = settings.load * settings.capacity_gpus / _mean_gpu_seconds(seed + 1, settings)  # jobs per second
    jobs: list[Job] = []
    clock = 0.0
    warm = int(rate * 1800)  # half an hour of arrivals at t=0: start near steady state
    while True:
        at = 0.0 if len(jobs) < warm else clock
        if len(jobs) >= warm:
            clock += float(rng.exponential(1.0 / rate))
            at = clock
        if at >= settings.duration_s:
            return jobs
        after_shift = at >= settings.mig_shift_at * settings.duration_s
        jobs.append(
            _make_job(
                rng,
                index=len(jobs),
                at=at,
                after_shift=after_shift,
                mig_share=settings.mig_share,
                settings=settings,
            )
        )


def trace_jobs(path: Path, settings: WorkloadSettings, *, seed: int) -> list[Job]:
    """Jobs drawn from an Alibaba-2023-format pod list: shapes from the file, arrivals Poisson.

    Lifetimes come from ``deletion_time - creation_time`` when present (clipped to 5 min .. 4 h),
    else 30 min. CPU-only pods are skipped (they use no GPU). A pod of more GPUs than the fleet's
    largest node holds is reshaped into a gang of node-sized pods (its CPU and memory split among
    them), as the synthetic training jobs are.
    """
    pods = [p for p in load_pods(path) if p.gpu_count > 0]
    if not pods:
        raise InvalidInputError(f"{path} has no GPU pods to simulate")
    rng = np.random.default_rng(seed)
    lifetimes = [
        min(max(p.deletion_time - p.creation_time, 300), 14_400) if p.deletion_time else 1800 for p in pods
    ]
    mean_gpu_s = float(
        np.mean([p.total_gpu_milli / MILLI_PER_GPU * t for p, t in zip(pods, lifetimes, strict=True)])
    )
    rate = settings.load * settings.capacity_gpus / mean_gpu_s
    jobs: list[Job] = []
    clock = 0.0
    while clock < settings.duration_s:
        i = int(rng.integers(len(pods)))
        pod = pods[i]
        kind = (
            JobKind.SHARE
            if pod.gpu_milli < MILLI_PER_GPU
            else JobKind.SINGLE
            if pod.gpu_count == 1
            else JobKind.GANG
        )
        whole = kind is JobKind.GANG
        members, per_pod = pods_of(pod.gpu_count, settings.node_gpus) if whole else (1, pod.gpu_count)
        jobs.append(
            Job(
                f"{pod.name}-{len(jobs)}",
                kind,
                clock,
                float(lifetimes[i]),
                members,
                per_pod,
                pod.gpu_milli,
                pod.cpu_milli // members,
                pod.memory_mib // members,
                priority=(TRAINING_GANG_PRIORITY if members > 1 else TRAINING_POD_PRIORITY) if whole else 0,
                gang_tier=GANG_TIER_CLIQUE if members > 1 and settings.clique_gpus > 0 else "",
            )
        )
        clock += float(rng.exponential(1.0 / rate))
    return jobs
