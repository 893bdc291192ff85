"""One timeline sample of the simulated cluster: allocation, fragmentation and waiting work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.state import GpuMode, SimState
from gpuweave.simulate.workload import Job, JobKind


@dataclass
class Sample:
    t_s: float
    allocation: float  # % of healthy GPU capacity allocated
    fragmentation: float  # FGD fragment, % of healthy GPU capacity
    pending: int
    running: int
    # GPU capacity the waiting jobs ask for, % of healthy GPUs (MIG pods by compute slices): what
    # allocation would gain if they all fit. Big when multi-node gangs wait for whole EFA nodes.
    waiting_demand: float
    withheld_gpus: int
    mig_gpus: int


def take_sample(state: SimState, waiting: Sequence[Job], *, now: float) -> Sample:
    """The cluster at ``now``; ``waiting`` are the queued jobs."""
    healthy = max(state.healthy_gpus(), 1) * MILLI_PER_GPU
    modes = [m for node in state.modes for m in node]
    return Sample(
        t_s=now,
        allocation=100.0 * state.used_gpu_milli() / healthy,
        fragmentation=100.0 * float(state.cluster.node_fragment.sum()) / healthy,
        pending=len(waiting),
        running=len(state.pods),
        waiting_demand=100.0 * sum(demand_milli(job) for job in waiting) / healthy,
        withheld_gpus=sum(1 for m in modes if m is GpuMode.WITHHELD),
        mig_gpus=sum(1 for m in modes if m is GpuMode.MIG),
    )


def demand_milli(job: Job) -> float:
    """The milli-GPU a job asks for: all its pods, or a MIG slice's compute slices out of 7."""
    if job.kind is JobKind.MIG:
        slices = int(job.mig_profile.split("g.", 1)[0]) if "g." in job.mig_profile else 1
        return slices * MILLI_PER_GPU / 7
    return float(job.pods * job.gpus_per_pod * job.gpu_milli)
