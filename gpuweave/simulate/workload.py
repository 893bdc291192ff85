"""The simulated workload: training gangs, single-GPU jobs, fractional inference and MIG pods.

Arrivals are a Poisson stream on the simulated clock, sized so the offered GPU load is about
``load`` of the cluster's capacity. Gang sizes follow the Microsoft ITP trace's multi-GPU mix
(2/4/8/16 GPUs; see the shared reference, section 3), fractional sizes the Alibaba 2023 trace's most
common shares. Halfway through, fractional inference shifts to MIG slices (the MIG demand shift).
With a trace file (Alibaba 2023 CSV format) the pods come from it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.fgd.trace import load_pods

GANG_SIZES = (2, 4, 8, 16)
# ITP: 2.14%, 3.42%, 10.11% of jobs; 16-64 GPUs 1.2% of jobs but 30% of GPU-hours, here all 16 GPUs
GANG_WEIGHTS = (0.13, 0.2, 0.57, 0.1)
SHARE_MILLI = (810, 470, 320, 650, 230, 460, 160, 220)
SHARE_WEIGHTS = (0.35, 0.24, 0.11, 0.08, 0.05, 0.04, 0.07, 0.06)
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
MIG_WEIGHTS = (0.6, 0.25, 0.15)
MIG_COMPUTE_SLICES = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}
GPUS_PER_GANG_POD = 8
# The PriorityClass value of multi-node training gangs (every other job: 0): the one thing it does
# in the simulation is let a gang recovering from a fault preempt other work in its network domain
TRAINING_GANG_PRIORITY = 1000


class JobKind(StrEnum):
    GANG = "training-gang"
    SINGLE = "single-gpu"
    SHARE = "fractional"
    MIG = "mig"


@dataclass(frozen=True)
class Job:
    """One unit of work; a gang of more than 8 GPUs runs as several 8-GPU pods, all or nothing."""

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


def _kind_mix(rng: np.random.Generator) -> JobKind:
    roll = rng.random()
    return JobKind.SHARE if roll < 0.45 else JobKind.SINGLE if roll < 0.8 else JobKind.GANG


def _make_job(rng: np.random.Generator, *, index: int, at: float, after_shift: bool, mig_share: float) -> Job:
    kind = _kind_mix(rng)
    if kind is JobKind.SHARE and after_shift and rng.random() < mig_share:
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
    size = int(rng.choice(GANG_SIZES, p=GANG_WEIGHTS))
    pods, per_pod = (size // GPUS_PER_GANG_POD, GPUS_PER_GANG_POD) if size > GPUS_PER_GANG_POD else (1, size)
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
        priority=TRAINING_GANG_PRIORITY if pods > 1 else 0,
    )


def _mean_gpu_seconds(rng_seed: int) -> float:
    """Mean GPU-seconds per job of the mix (estimated once by sampling, so load targets hold)."""
    rng = np.random.default_rng(rng_seed)
    sample = [_make_job(rng, index=i, at=0.0, after_shift=False, mig_share=0.0) for i in range(4000)]
    return float(np.mean([j.gpu_milli_total / MILLI_PER_GPU * j.duration_s for j in sample]))


def synthetic_jobs(settings: WorkloadSettings, *, seed: int) -> list[Job]:
    """Poisson arrivals over the run; the first arrivals come at once to warm the cluster up."""
    rng = np.random.default_rng(seed)
    rate = settings.load * settings.capacity_gpus / _mean_gpu_seconds(seed + 1)  # jobs per second
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
            _make_job(rng, index=len(jobs), at=at, after_shift=after_shift, mig_share=settings.mig_share)
        )


def trace_jobs(path: Path, settings: WorkloadSettings, *, seed: int) -> list[Job]:
    """Jobs drawn from an Alibaba-2023-format pod list: shapes from the file, arrivals Poisson.

    Lifetimes come from ``deletion_time - creation_time`` when present (clipped to 5 min .. 4 h),
    else 30 min. CPU-only pods are skipped (they use no GPU).
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
        jobs.append(
            Job(
                f"{pod.name}-{len(jobs)}",
                kind,
                clock,
                float(lifetimes[i]),
                1,
                pod.gpu_count,
                pod.gpu_milli,
                pod.cpu_milli,
                pod.memory_mib,
            )
        )
        clock += float(rng.exponential(1.0 / rate))
    return jobs
