"""What users pay for, per job: how long it took, how long its links stretched it, what faults cost.

The scheduling loop reports starts, evictions and ends here; the report reads the records:
- a job's **completion time** runs from its arrival to the end of its last pod (waiting, every
  restart after an eviction, and its run time as its placement stretched it, ``jobtime``);
- **GPU-hours lost to faults** are the GPU time evicted pods had run: the simulated job restarts
  from its beginning (no checkpoint), so that work is done again;
- a **gang recovery** runs from a fault to the moment every pod of an evicted training job runs
  again, on the simulated clock (60 s ticks; the fault's nominal detection latency is added, as the
  loop evicts at the fault's own tick), checkpoint load and container start excluded. Its parts
  (``GangRecovery.parts``): **detection** (the fault's nominal detection latency), **waiting**
  (the ticks until every member had a place: 0 when spare room took the gang at the fault's own
  tick) and **preemption grace** (``PREEMPTION_GRACE_S`` when the gang got its room by evicting
  lower-priority pods, which it waits out).

On a fleet of NVLink cliques each training start and each recovery also names the cliques its
nodes are in (``clique_name``; "" for a node outside any), so the report can count gangs inside one
clique and across cliques, and say where an evicted gang ran before and after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.jobtime import JobTiming
from gpuweave.simulate.state import RunningPod
from gpuweave.simulate.workload import Job, JobKind


@dataclass
class JobCompletion:
    job_id: str
    kind: str
    arrival_s: float
    end_s: float
    restarts: int

    @property
    def completion_s(self) -> float:
        return self.end_s - self.arrival_s


@dataclass
class GangRecovery:
    job_id: str
    pods: int
    fault: str
    fault_at_s: float
    detection_s: float
    running_again_s: float | None = None  # None: not all members running again by the end
    grace_s: float = 0.0  # preemption grace waited before running again (0: no preemption)
    cliques_before: tuple[str, ...] = ()  # the NVLink cliques of its nodes when the fault hit
    cliques: tuple[str, ...] = ()  # ... and once running again (one: re-placed inside one clique)

    @property
    def seconds(self) -> float | None:
        if self.running_again_s is None:
            return None
        return self.running_again_s - self.fault_at_s + self.detection_s

    @property
    def parts(self) -> dict[str, float] | None:
        """Where the recovery's seconds went: detection + waiting + preemption grace."""
        if self.running_again_s is None:
            return None
        waiting = self.running_again_s - self.grace_s - self.fault_at_s
        return {"detection": self.detection_s, "waiting": waiting, "preemption_grace": self.grace_s}


@dataclass
class PlacedTraining:
    """A training job's start: the placement's slowest link and the resulting run time."""

    job_id: str
    pods: int
    gpus: int
    at_s: float
    slowest: str
    gbps: float
    stretch: float
    run_s: float
    waited_s: float = 0.0  # from the job's arrival to this start (a restart: again from its arrival)
    cliques: tuple[str, ...] = ()  # the NVLink cliques of its nodes, sorted ("": a node outside any)


@dataclass
class FaultContext:
    kind: str
    at_s: float
    detection_s: float


@dataclass
class JobLedger:
    completions: list[JobCompletion] = field(default_factory=list)
    recoveries: list[GangRecovery] = field(default_factory=list)
    training: list[PlacedTraining] = field(default_factory=list)
    gpu_seconds_lost: float = 0.0
    _restarts: dict[str, int] = field(default_factory=dict)
    _open: dict[str, GangRecovery] = field(default_factory=dict)

    def started(
        self,
        job: Job,
        *,
        now: float,
        timing: JobTiming,
        run_s: float,
        grace_s: float = 0.0,
        cliques: tuple[str, ...] = (),
    ) -> None:
        """``now``: when the job runs; ``grace_s`` of it was waiting for preempted pods to leave;
        ``cliques``: the NVLink cliques of its nodes (empty on a fleet without cliques)."""
        recovery = self._open.pop(job.job_id, None)
        if recovery is not None:
            recovery.running_again_s = now
            recovery.grace_s = grace_s
            recovery.cliques = cliques
        if job.kind is JobKind.GANG:
            self.training.append(
                PlacedTraining(
                    job.job_id,
                    job.pods,
                    job.pods * job.gpus_per_pod,
                    now,
                    timing.slowest.value,
                    timing.gbps,
                    timing.stretch,
                    run_s,
                    now - job.arrival_s,
                    cliques,
                )
            )

    def pod_evicted(self, pod: RunningPod, *, now: float) -> None:
        """One pod evicted: the GPU time it had run is lost (its job restarts from the beginning)."""
        gpus = len(pod.gpus) * (pod.job.gpu_milli / MILLI_PER_GPU) if pod.request is not None else 0.0
        self.gpu_seconds_lost += gpus * max(0.0, now - pod.started_s)

    def job_evicted(self, job: Job, *, fault: FaultContext | None) -> None:
        """A job's pods were evicted (once per eviction); a training job's recovery clock starts."""
        self._restarts[job.job_id] = self._restarts.get(job.job_id, 0) + 1
        if fault is None or job.kind is not JobKind.GANG:
            return
        recovery = GangRecovery(job.job_id, job.pods, fault.kind, fault.at_s, fault.detection_s)
        last = next((p for p in reversed(self.training) if p.job_id == job.job_id), None)
        recovery.cliques_before = last.cliques if last is not None else ()
        self._open[job.job_id] = recovery
        self.recoveries.append(recovery)

    def finished(self, job: Job, *, end_s: float) -> None:
        self.completions.append(
            JobCompletion(job.job_id, job.kind.value, job.arrival_s, end_s, self._restarts.get(job.job_id, 0))
        )
