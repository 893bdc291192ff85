"""The scheduling loop on a simulated clock: arrivals, departures, faults, MIG demand, metrics.

Each tick: finished pods leave, due faults fire (and faulted resources come back), new jobs
queue, the MIG manager follows pending MIG demand, then the queue is scheduled in arrival order
(a job that does not fit waits; later ones may pass it). A job of several pods (a multi-node
training gang) is placed all or nothing. A job of priority above 0 that does not fit gets the
scheduler's preemption, where it has one (``Preemptor``: kube-scheduler's, with the extender's
``/preempt``): the victims' jobs are evicted and queued again, and the job starts
``PREEMPTION_GRACE_S`` later, once they are gone. Metrics are sampled after every tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.cluster import Request
from gpuweave.simulate.engine_lifecycle import LifecycleTick
from gpuweave.simulate.faults import (
    DEFAULT_FAULTS,
    FaultKind,
    FaultRecord,
    FaultSpec,
    detection_s,
    inject_efa_loss,
    inject_gpu_fault,
    inject_tray_fault,
    restore,
)
from gpuweave.simulate.fleet import FleetNode, clique_name, share_pool
from gpuweave.simulate.jobtime import TrainingStep, job_timing
from gpuweave.simulate.latent import LatentFaults
from gpuweave.simulate.lifecycle import NodeLifecycle
from gpuweave.simulate.mig_manager import MigManager, Reshape
from gpuweave.simulate.outcomes import FaultContext, JobLedger
from gpuweave.simulate.placers import (
    Gang,
    InventoryWatcher,
    MigPlacer,
    Placer,
    PodPlacement,
    PodWatcher,
    Preemptor,
    SimulatedTime,
    TierDecider,
)
from gpuweave.simulate.state import GpuMode, RunningPod, SimState
from gpuweave.simulate.timeline import Sample, take_sample
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel
from topology.network import LABEL_GPU_CLIQUE
from topology.scoring import score_set
from topology.search import best_set

TickHook = Callable[[int], None]
DrainHook = Callable[[int], None]  # jobs still queued or running: at the drain's start and after each tick
# A preemptor's pods start once its victims are gone: their terminationGracePeriodSeconds
# (Kubernetes' default, 30 s), as the victims' containers are asked to stop and given that long
PREEMPTION_GRACE_S = 30.0
DRAIN_LIMIT_S = 24 * 3600.0  # the longest the loop runs on after the arrival window


@dataclass
class TopologyOutcome:
    job_id: str
    node: str
    size: int
    chosen_value: float
    best_value: float

    @property
    def got_best(self) -> bool:
        return self.chosen_value >= self.best_value - 1e-9


@dataclass
class RunResult:
    policy: str
    samples: list[Sample] = field(default_factory=list)
    pending_times_s: list[float] = field(default_factory=list)
    topology: list[TopologyOutcome] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    reshapes: list[Reshape] = field(default_factory=list)
    jobs_started: int = 0
    mig_pods_started: int = 0  # after the demand shift; through the extender when agents run
    jobs_pending_at_end: int = 0
    transport: str = "in-process"
    placement_mismatches: int = 0  # scheduler chose devices the node state could not give
    admission_failures: int = 0  # the node agent refused the devices at the kubelet's Allocate
    admissions: int = 0  # pods admitted by a node agent (GetPreferredAllocation + Allocate)
    agents: str = ""  # what ran on the nodes (empty: no node agents)
    ledger: JobLedger = field(default_factory=JobLedger)  # per-job completion, recovery, faults' cost
    inventories_received: int = 0  # GpuNodeInventory objects the agents published to the extender
    pods_preempted: int = 0  # pods evicted by the scheduler's preemption (their jobs queued again)
    drained_s: float = 0.0  # simulated time run on after the arrival window until every job ended
    jobs_unfinished: int = 0  # jobs still queued or running when the drain stopped (its limit)
    cliques: tuple[str, ...] = ()  # the fleet's NVLink cliques (``clique_name``); () without any
    latent: LatentFaults | None = None  # latent faults: caught by active checks, or hit by jobs
    lifecycle: NodeLifecycle | None = None  # replacements and scale-ups (None: a fixed fleet)
    window_s: float = 0.0  # the arrival window
    gpu_hours_used: float = 0.0  # allocated over the arrival window
    gpu_hours_paid: float = 0.0  # every machine's GPUs x its time within the window
    gang_tier_decisions: dict[str, int] | None = None  # waited / looser (None: no such scheduler)


@dataclass
class _Queued:
    job: Job
    queued_s: float  # what its pending time counts from (a job a fault evicted: its first start)
    entered_s: float = -1.0  # when it entered the queue this time (-1: at ``queued_s``)

    @property
    def pending_since_s(self) -> float:
        return self.queued_s if self.entered_s < 0 else self.entered_s


class Simulation:
    def __init__(
        self,
        *,
        fleet: Sequence[FleetNode],
        jobs: Sequence[Job],
        placer: Placer,
        metric_model: FragmentModel,
        duration_s: float,
        tick_s: float = 60.0,
        seed: int = 0,
        faults: Sequence[FaultSpec] = DEFAULT_FAULTS,
        share_nodes: frozenset[int] | None = None,
        agents: NodeAgentPool | None = None,
        step: TrainingStep | None = None,
        latent: LatentFaults | None = None,
        lifecycle: NodeLifecycle | None = None,
    ) -> None:
        """``lifecycle``: replacement and scale-up (``lifecycle`` module); its reserve rows, the
        last of ``fleet``, hold no machine until a scale-up fills one. None: a fixed fleet."""
        self._lifecycle = lifecycle
        reserve = lifecycle.reserve if lifecycle is not None else ()
        self.state = SimState.create(fleet, metric_model, absent=reserve)
        self._latent = latent  # faults only active checks find, and (with agents) those checks
        self._step = step or TrainingStep()
        self._now = 0.0
        self._fault: FaultContext | None = None  # the fault whose evictions are being made
        self._jobs = sorted(jobs, key=lambda j: j.arrival_s)
        self._next_job = 0  # the first job not yet arrived
        self._placer = placer
        self._duration = duration_s
        self._tick = tick_s
        self._rng = np.random.default_rng(seed)
        self._fault_plan = sorted(faults, key=lambda f: f.at_fraction)
        self._agents = agents
        # With an agent on every node the extender places MIG pods on the MIG devices the agents
        # publish, and learns faults, recoveries and MIG devices only from the GpuNodeInventory
        # objects they publish, as its watch would deliver them. With agents on a sample of the
        # nodes (a large cluster), the agents admit what lands on their nodes and take the faults
        # that hit them, while MIG layouts and fault notices go through the simulation for all.
        every = agents is not None and not agents.sampled
        self._mig_placer = placer if every and isinstance(placer, MigPlacer) else None
        self._watcher = placer if every and isinstance(placer, InventoryWatcher) else None
        self._mig = MigManager(applier=self._apply_layout if self._mig_placer is not None else None)
        self._mig_nodes = [i for i, n in enumerate(self.state.fleet) if n.mig_managed]
        self._queue: list[_Queued] = []
        self._preempted: list[_Queued] = []  # victims' jobs of this tick's preemptions, queued again
        # job -> (its priority, nodes it preempted on): kube-scheduler's nominated nodes, kept from
        # lower-priority pods until the job starts
        self._nominated: dict[str, tuple[int, set[int]]] = {}
        self._ends: dict[str, float] = {}
        # jobs whose last attempt a fault or a drain ended (not a preemption), until they start again
        self._disrupted: set[str] = set()
        self._preflight_failed = False  # the last try placed every pod and failed only its preflight
        self._restores: list[tuple[float, FaultRecord]] = []
        self._fault_nodes: set[int] = set()
        self._life = LifecycleTick(self, lifecycle) if lifecycle is not None else None
        self.used_gpu_hours = 0.0  # allocated GPU time over the arrival window
        self.result = RunResult(policy=placer.name, transport=placer.transport, latent=latent)
        nodes = len(self.state.fleet)
        base = self.state.fleet[: nodes - len(reserve)]
        if agents is not None and agents.sampled:
            self.result.agents = f"{len(agents)} of {len(base)} nodes' agents (gRPC, sampled)"
        elif agents is not None:
            self.result.agents = f"{len(base)} agents (gRPC)"
        pool = share_pool(base) if share_nodes is None else share_nodes
        self._share_allowed = np.asarray([i in pool for i in range(nodes)], dtype=bool)
        # Nodes a multi-node gang may use: EFA nodes, and nodes of an NVLink clique (their members
        # talk over NVLink inside it, and over the trays' InfiniBand NICs across cliques)
        self._gang_nodes = np.asarray(
            [n.has_efa or LABEL_GPU_CLIQUE in n.labels for n in self.state.fleet], dtype=bool
        )
        self.result.cliques = tuple(sorted({c for n in self.state.fleet if (c := clique_name(n))}))

    def run(self, *, on_tick: TickHook | None = None, on_drain: DrainHook | None = None) -> RunResult:
        """The arrival window (sampled every tick, ``on_tick``), then the drain: the loop runs on
        without arrivals until every job has finished (at most ``DRAIN_LIMIT_S`` more), so every
        policy's job completion times cover the same jobs; the cluster metrics stay the window's.
        ``on_drain`` hears how many jobs are left as the drain starts and after each of its ticks."""
        ticks = int(np.ceil(self._duration / self._tick))
        for tick in range(ticks + 1):
            self._advance(tick * self._tick)
            self.result.samples.append(self._sample(tick * self._tick))
            if tick < ticks:
                self.used_gpu_hours += self.state.used_gpu_milli() / MILLI_PER_GPU * self._tick / 3600
            if on_tick is not None:
                on_tick(1)
        self.result.jobs_pending_at_end = len(self._queue)
        self._account(ticks * self._tick)
        if on_drain is not None and self._jobs_left():
            on_drain(self._jobs_left())
        for tick in range(ticks + 1, ticks + 1 + int(np.ceil(DRAIN_LIMIT_S / self._tick))):
            if not self._queue and not self._ends:
                break
            self._advance(tick * self._tick)
            if on_drain is not None:
                on_drain(self._jobs_left())
        self.result.drained_s = self._now - ticks * self._tick
        if isinstance(self._placer, TierDecider):
            self.result.gang_tier_decisions = self._placer.tier_decisions()
        self.result.jobs_unfinished = self._jobs_left()
        self.result.reshapes = list(self._mig.reshapes)
        return self.result

    def _account(self, window_s: float) -> None:
        """GPU-hours used and paid over the arrival window (``lifecycle_report``)."""
        self.result.window_s = window_s
        self.result.gpu_hours_used = self.used_gpu_hours
        if self._lifecycle is not None:
            self.result.lifecycle = self._lifecycle
            self.result.gpu_hours_paid = self._lifecycle.gpu_hours_paid(window_s)
        else:
            self.result.gpu_hours_paid = sum(n.gpus for n in self.state.fleet) * window_s / 3600

    def requeue_first(self, job: Job, *, queued_s: float) -> None:
        """A job evicted now is queued again at the head (pending from ``queued_s``)."""
        self._queue.insert(0, _Queued(job, queued_s, self._now))

    def _jobs_left(self) -> int:
        """Jobs queued or with a pod running."""
        return len(self._queue) + len({p.job.job_id for p in self.state.pods.values()})

    def _advance(self, now: float) -> None:
        """One tick: the extender's clock and watch, departures, faults, arrivals, MIG, scheduling."""
        self._now = now
        if isinstance(self._placer, SimulatedTime):
            self._placer.set_time(now)
        if self._agents is not None:  # their health's clock: fault windows, remediation, probation
            self._agents.set_time(now)
        self._deliver_published()
        self._depart(now)
        if self._life is not None:
            self._life.before(now)
        self._fire_faults(now)
        if self._latent is not None:
            self._latent.fire(self.state, now)
            self._deliver_published(*self._latent.check_idle(self.state, now))
        while self._next_job < len(self._jobs) and self._jobs[self._next_job].arrival_s <= now:
            self._queue.append(_Queued(self._jobs[self._next_job], self._jobs[self._next_job].arrival_s))
            self._next_job += 1
        demand = Counter(q.job.mig_profile for q in self._queue if q.job.kind is JobKind.MIG)
        self._reconcile_mig(demand, now)
        self._schedule(now)
        if self._life is not None:
            self._life.after(now)

    def _deliver_published(self, *nodes: int) -> None:
        """The agents' changed GpuNodeInventory objects reach the extender (its watch); ``nodes``
        are delivered too (a node whose kubelet already saw the change its listener may not yet
        have announced: the published object is built from the agent's health maps either way)."""
        if self._agents is None or self._watcher is None:
            return
        for node in sorted(set(self._agents.take_changed()) | set(nodes)):
            self._watcher.receive_inventory(node, self._agents.published(node))
            self.result.inventories_received += 1

    def _apply_layout(self, node: int, gpu: int, layout: Sequence[tuple[str, int]] | None) -> bool:
        """A reshape goes through the node agent's MIG reconciler; the extender gets its new devices."""
        assert self._agents is not None and self._mig_placer is not None
        if not self._agents.reshape(node, gpu, layout):
            return False
        if self._watcher is not None:
            self._deliver_published()
        else:
            self._mig_placer.publish_inventory(node, self._agents.inventory(node))
        return True

    def _reconcile_mig(self, demand: Counter[str], now: float) -> None:
        if self._mig_placer is not None:  # the agents publish the MIG devices themselves
            self._mig.reconcile(self.state, demand, now=now)
            return
        # only MIG-managed nodes are reshaped
        before = {node: [m is GpuMode.MIG for m in self.state.modes[node]] for node in self._mig_nodes}
        self._mig.reconcile(self.state, demand, now=now)
        for node, was in before.items():
            for gpu, mode in enumerate(self.state.modes[node]):
                if (mode is GpuMode.MIG) != was[gpu]:
                    self._placer.gpu_mode_changed(node, gpu, mig=mode is GpuMode.MIG)

    def _depart(self, now: float) -> None:
        for pod_id in [p for p, end in self._ends.items() if end <= now]:
            end = self._ends.pop(pod_id)
            if pod_id in self.state.pods:
                job = self._stop(pod_id).job
                if not self.state.pods_of_job(job.job_id):
                    self.result.ledger.finished(job, end_s=end)

    def _fire_faults(self, now: float) -> None:
        for due in [r for r in self._restores if r[0] <= now]:
            self._restores.remove(due)
            healed = due[1]
            if self._agent_on(self._node_index(healed.node)) and not self._back_on_node(healed):
                self._restores.append((now + self._tick, healed))  # next simulated health round
                continue
            restore(self.state, healed, now=now)
            if healed.gpu is not None and self._watcher is None:
                self._placer.gpu_restored(self._node_index(healed.node), healed.gpu)
            if healed.kind == FaultKind.NVLINK_TRAY.value and self._watcher is None:
                for gpu in range(self.state.fleet[self._node_index(healed.node)].gpus):
                    self._placer.gpu_restored(self._node_index(healed.node), gpu)
            self._deliver_published(self._node_index(healed.node))
        while self._fault_plan and self._fault_plan[0].at_fraction * self._duration <= now:
            spec = self._fault_plan.pop(0)
            self._fault = FaultContext(spec.kind.value, now, detection_s(spec.kind))
            record = self._inject(spec, now)
            self._fault = None
            if record is None:
                continue
            self.result.faults.append(record)
            self._deliver_published(self._node_index(record.node))
            if spec.restore_after_s <= 0:
                if self._life is not None:
                    self._life.stays_broken(spec, record, now)
                continue
            # with agents a failed GPU comes back when the agent's rounds (reset, probation) say so
            gpu_by_agent = self._agent_on(self._node_index(record.node)) and record.gpu is not None
            self._restores.append((now + (self._tick if gpu_by_agent else spec.restore_after_s), record))

    def _inject(self, spec: FaultSpec, now: float) -> FaultRecord | None:
        """The fault in the simulated state and, with agents, in the node's simulated hardware."""
        if spec.kind is FaultKind.EFA_LINK:
            record = inject_efa_loss(self.state, now=now, evict=self._evict_job)
            if record is not None and self._agent_on(node := self._node_index(record.node)):
                assert self._agents is not None
                record.efa_adapter = self._agents.efa_adapter(node)
                if record.efa_adapter is not None:
                    record.agent_to_kubelet_s = self._agents.set_efa_present(
                        node, record.efa_adapter, present=False
                    )
            return record
        if spec.kind is FaultKind.NVLINK_TRAY:
            return self._inject_tray_fault(now)
        record = inject_gpu_fault(self.state, spec, now=now, evict=self._evict_job, used=self._fault_nodes)
        if record is not None and record.gpu is not None and record.gpus_withheld:
            node = self._node_index(record.node)
            if self._watcher is None:  # no agent to publish it: the simulation tells the scheduler
                self._placer.gpu_failed(node, record.gpu, record.kind)
            if self._agents is not None and self._agents.has(node):
                xid = 79 if spec.kind is FaultKind.XID_79 else 48
                record.agent_to_kubelet_s = self._agents.inject_xid(node, record.gpu, xid)
        return record

    def _inject_tray_fault(self, now: float) -> FaultRecord | None:
        """The tray's fabric fails in its simulated NVML and the agent's fabric gate withholds its
        GPUs (the extender learns it from the published inventory); without agents the loop tells
        the scheduler itself, as for a failed GPU."""
        record = inject_tray_fault(self.state, now=now, evict=self._evict_job)
        if record is None:
            return None
        node = self._node_index(record.node)
        if self._agents is not None and self._agents.has(node):
            record.agent_to_kubelet_s = self._agents.set_fabric_state(node, "failed")
        if self._watcher is None:
            for gpu in range(self.state.fleet[node].gpus):
                self._placer.gpu_failed(node, gpu, record.kind)
        return record

    def _agent_on(self, node: int) -> bool:
        """Whether an agent runs on the node (all nodes, or the sampled ones)."""
        return self._agents is not None and self._agents.has(node)

    def _back_on_node(self, record: FaultRecord) -> bool:
        """One simulated health round on the node: whether the agent serves the device again."""
        assert self._agents is not None
        node = self._node_index(record.node)
        if record.kind == FaultKind.NVLINK_TRAY.value:  # the fabric completes; the gate releases
            record.agent_back_s = self._agents.set_fabric_state(node, "completed")
            record.health_rounds += 1
            return True
        if record.gpu is None:
            if record.efa_adapter is not None:  # the link returns: the adapter is back in sysfs
                record.agent_back_s = self._agents.set_efa_present(node, record.efa_adapter, present=True)
                record.health_rounds += 1
            return True
        self._agents.health_round(node)
        record.health_rounds += 1
        if not self._agents.gpu_served(node, record.gpu):  # the agent's verdict, not the kubelet's timing
            return False
        record.agent_back_s = self._agents.gpu_back(node, record.gpu)
        return True

    def _evict_job(self, pod: RunningPod) -> int:
        """Evict every pod of ``pod``'s job (a fault) and queue the job again first; returns pods evicted."""
        evicted = self._stop_job(pod, fault=self._fault)
        self._queue.insert(0, _Queued(pod.job, pod.started_s, self._now))
        return evicted

    def _stop_job(self, pod: RunningPod, *, fault: FaultContext | None, preempted: bool = False) -> int:
        """Stop every pod of ``pod``'s job, their run so far lost (ledger); returns pods stopped.
        ``preempted``: kube-scheduler's preemption stops them (their eviction says so)."""
        self.result.ledger.job_evicted(pod.job, fault=fault)
        if not preempted:
            self._disrupted.add(pod.job.job_id)
        members = self.state.pods_of_job(pod.job.job_id)
        for member in members:
            self.result.ledger.pod_evicted(member, now=self._now)
            if isinstance(self._placer, PodWatcher):  # an eviction, not the job's own end
                self._placer.evicted(member.pod_id, preempted=preempted)
            self._stop(member.pod_id)
            self._ends.pop(member.pod_id, None)
        return len(members)

    def _schedule(self, now: float) -> None:
        waiting: list[_Queued] = []
        self._preempted = []
        for queued in self._queue:
            if self._start(queued.job, now) or self._start_by_preemption(queued.job, now):
                self.result.pending_times_s.append(now - queued.queued_s)
                self.result.jobs_started += 1
            else:
                waiting.append(queued)
        self._queue = waiting + self._preempted

    def _start_by_preemption(self, job: Job, now: float) -> bool:
        """The scheduler's preemption for a job of priority above 0 that did not fit: one round
        per pod at most (each frees one node), the job tried again after each. A try that placed
        every pod and failed only its preflight is made once more at once, without the GPUs the
        preflight withheld: as the extender plans again after a failed preflight, and so that
        the next round has the filter's answer to preempt on."""
        if job.priority <= 0 or job.kind is JobKind.MIG or not isinstance(self._placer, Preemptor):
            return False
        request = Request(job.cpu_milli, job.memory_mib, job.gpus_per_pod, job.gpu_milli)
        for _ in range(job.pods):
            victims = self._placer.preempt(
                self.state, request, allowed=self._allowed(job), priority=job.priority
            )
            if not victims:
                return False
            for pod_id in victims:
                if pod_id in self.state.pods:
                    self._nominated.setdefault(job.job_id, (job.priority, set()))[1].add(
                        self.state.pods[pod_id].node
                    )
                    self._preempt_job(self.state.pods[pod_id], now)
            self._preflight_failed = False
            if self._start(job, now, delay_s=PREEMPTION_GRACE_S):
                return True
            if self._preflight_failed and self._start(job, now, delay_s=PREEMPTION_GRACE_S):
                return True
        return False

    def _preempt_job(self, pod: RunningPod, now: float) -> None:
        """Evict every pod of a preemption victim's job; the job is queued again as a new one."""
        self.result.pods_preempted += self._stop_job(pod, fault=None, preempted=True)
        self._preempted.append(_Queued(pod.job, now))

    def _stop(self, pod_id: str) -> RunningPod:
        pod = self.state.stop_pod(pod_id)
        self._placer.forget(pod_id)
        if self._agents is not None and self._agents.has(pod.node):
            self._agents.release(pod.node, pod_id)
        return pod

    def _node_index(self, name: str) -> int:
        return next(i for i, n in enumerate(self.state.fleet) if n.name == name)

    def _allowed(self, job: Job) -> np.ndarray:
        """Share pods go to the shared pool, whole GPUs elsewhere; multi-node gangs need EFA up;
        nodes a higher-priority job preempted on are kept for it (kube-scheduler's nomination)."""
        allowed = self._share_allowed.copy() if job.kind is JobKind.SHARE else ~self._share_allowed
        for owner, (priority, nodes) in self._nominated.items():
            if owner != job.job_id and priority > job.priority:
                allowed[sorted(nodes)] = False
        if job.pods > 1:
            down = np.asarray([i in self.state.efa_down for i in range(len(allowed))], dtype=bool)
            allowed &= self._gang_nodes & ~down
        if self.state.fabric_down:  # a tray whose NVLink fabric failed takes no new pods
            allowed[sorted(self.state.fabric_down)] = False
        if self.state.absent:  # rows with no machine now
            allowed[sorted(self.state.absent)] = False
        return allowed

    def _start(self, job: Job, now: float, *, delay_s: float = 0.0) -> bool:
        """Place every pod of ``job`` (or none); they run from ``now + delay_s``."""
        if job.kind is JobKind.MIG:
            return self._start_mig(job, now)
        request = Request(job.cpu_milli, job.memory_mib, job.gpus_per_pod, job.gpu_milli)
        allowed = self._allowed(job)
        outcomes: list[TopologyOutcome] = []
        # a training job names its gang, a one-pod job too (a gang of one, ``gpuweave.io/gang-size:
        # 1``: placed as any pod, preempting only when re-created after its attempt ran); any other
        # job of a priority above 0 is an ordinary pod carrying the job's PriorityClass
        training = job.kind is JobKind.GANG or job.pods > 1
        gang = (
            Gang(job.job_id, job.pods, job.priority, job.gang_tier, named=training, duration_s=job.duration_s)
            if training or job.priority > 0
            else None
        )
        if gang is not None and gang.named and job.pods > 1 and isinstance(self._placer, PodWatcher):
            # a gang's pods all exist before the first is scheduled (its plan waits for them)
            self._placer.created([f"{job.job_id}-{i}" for i in range(job.pods)], request, gang)
        placed = self._place_all(job, request, allowed, gang)
        if placed is None or not self._preflight(job, placed, now):
            return False
        started: list[RunningPod] = []
        for index, (pod_id, placement) in enumerate(placed):
            pod = RunningPod(pod_id, job, placement.node, placement.gpus, request, now)
            if not self._try_start(pod, placement, outcomes):
                for done in started:
                    self._stop(done.pod_id)
                for later_id, _ in placed[index + 1 :]:
                    self._placer.forget(later_id)
                return False
            started.append(pod)
        if self._latent is not None:
            self._latent.pods_started(started, now + delay_s)
        timing = job_timing(
            [(self.state.fleet[p.node], p.gpus) for p in started],
            step=self._step,
            slow_pairs=self._latent.slow_pairs() if self._latent is not None else None,
        )
        run_s = job.duration_s * timing.stretch
        for pod in started:
            self._ends[pod.pod_id] = now + delay_s + run_s
        cliques = (
            tuple(sorted({clique_name(self.state.fleet[p.node]) for p in started}))
            if self.result.cliques
            else ()
        )
        self.result.ledger.started(
            job, now=now + delay_s, timing=timing, run_s=run_s, grace_s=delay_s, cliques=cliques
        )
        self._nominated.pop(job.job_id, None)
        self._disrupted.discard(job.job_id)
        self.result.topology.extend(outcomes)
        if self._lifecycle is not None:
            names = [self.state.fleet[p.node].name for p in started]
            self._lifecycle.job_started(job.job_id, at_s=now + delay_s, nodes=names)
        return True

    def _place_all(
        self, job: Job, request: Request, allowed: np.ndarray, gang: Gang | None
    ) -> list[tuple[str, PodPlacement]] | None:
        """Where the scheduler puts every pod of the job, one pod per node (None: one did not fit,
        and the ones placed are forgotten)."""
        placed: list[tuple[str, PodPlacement]] = []
        for index in range(job.pods):
            pod_id = f"{job.job_id}-{index}"
            placement = self._placer.place(
                self.state, request, allowed=allowed, rng=self._rng, pod_id=pod_id, gang=gang
            )
            if placement is None:
                for earlier, _ in placed:
                    self._placer.forget(earlier)
                return None
            placed.append((pod_id, placement))
            allowed[placement.node] = False  # one pod of a gang per node
        return placed

    def _preflight(self, job: Job, placed: list[tuple[str, PodPlacement]], now: float) -> bool:
        """A multi-node gang starts only when its nodes' agents pass the GPUs planned for it
        (``latent``); a failed node's GPUs are withheld and the gang is placed again next tick.

        The deployed extender runs a gang's preflight before it binds the members, so a failed
        one leaves the gang as it was; here the members were bound first, so a gang re-created
        after a fault or a drain has its members' deletes delivered as evictions: still
        recovering (it may preempt), as with the extender's own preflight."""
        if self._latent is None or self._latent.preflight(
            self.state, [(p.node, p.gpus) for _, p in placed], now
        ):
            return True
        self._preflight_failed = True
        for pod_id, _ in placed:
            if job.job_id in self._disrupted and isinstance(self._placer, PodWatcher):
                self._placer.evicted(pod_id)
            self._placer.forget(pod_id)
        self._deliver_published(*{p.node for _, p in placed})
        return False

    def _try_start(self, pod: RunningPod, placement: PodPlacement, outcomes: list[TopologyOutcome]) -> bool:
        """Record the pod where the scheduler put it; a choice the node cannot honour is counted."""
        if len(placement.gpus) != pod.job.gpus_per_pod:
            self.result.placement_mismatches += 1
            self._placer.forget(pod.pod_id)
            return False
        outcome = self._topology_outcome(pod.job, placement)
        try:
            self.state.start_pod(pod)
        except InvalidInputError:
            self.result.placement_mismatches += 1
            self._placer.forget(pod.pod_id)
            return False
        agents = self._agents if self._agent_on(placement.node) and placement.devices else None
        if agents is not None and not agents.admit(placement.node, placement.devices, pod_id=pod.pod_id):
            self.result.admission_failures += 1
            self._stop(pod.pod_id)
            return False
        if agents is not None:
            self.result.admissions += 1
        if outcome is not None:
            outcomes.append(outcome)
        return True

    def _start_mig(self, job: Job, now: float) -> bool:
        pod_id = f"{job.job_id}-0"
        where = (
            MigManager.take_instance(self.state, job.mig_profile, pod_id)
            if self._mig_placer is None
            else self._place_mig(job, pod_id)
        )
        if where is None:
            return False
        node, gpu = where
        self.result.mig_pods_started += 1
        pod = RunningPod(pod_id, job, node, (), None, now, mig_gpu=gpu)
        self.state.start_pod(pod)
        if self._latent is not None:
            self._latent.pods_started([pod], now)
        self._ends[pod_id] = now + job.duration_s
        if self._lifecycle is not None:
            self._lifecycle.job_started(job.job_id, at_s=now, nodes=[self.state.fleet[node].name])
        return True

    def _place_mig(self, job: Job, pod_id: str) -> tuple[int, int] | None:
        """Through the extender (filter/prioritize/bind) and the node's kubelet; the device the
        extender chose must be an idle instance of the simulated layout, or it is a disagreement."""
        assert self._mig_placer is not None and self._agents is not None
        allowed = np.asarray(
            [n.mig_managed and self.state.present(i) for i, n in enumerate(self.state.fleet)], dtype=bool
        )
        placement = self._mig_placer.place_mig(job.mig_profile, allowed=allowed, rng=self._rng, pod_id=pod_id)
        if placement is None:
            return None
        ids = {d for ids in placement.devices.values() for d in ids}
        devices = [m for m in self._agents.inventory(placement.node).mig_devices if m.uuid in ids]
        slots = self.state.mig_slots.get((placement.node, devices[0].parent_index), []) if devices else []
        slot = next((s for s in slots if devices and s.start == devices[0].placement_start), None)
        if slot is None or slot.pod is not None or slot.profile != job.mig_profile:
            self.result.placement_mismatches += 1
            self._placer.forget(pod_id)
            return None
        if not self._agents.admit(placement.node, placement.devices, pod_id=pod_id):
            self.result.admission_failures += 1
            self._placer.forget(pod_id)
            return None
        self.result.admissions += 1
        slot.pod = pod_id
        return placement.node, devices[0].parent_index

    def _topology_outcome(self, job: Job, placement: PodPlacement) -> TopologyOutcome | None:
        """The chosen set against the best set free on the node now (multi-GPU pods only)."""
        if job.gpus_per_pod < 2:
            return None
        node = self.state.fleet[placement.node]
        available = self.state.full_free_gpus(placement.node)
        if not set(placement.gpus) <= available:
            return None
        best = best_set(node.graph, available=available, size=job.gpus_per_pod, lookahead=False)
        chosen = score_set(node.graph, placement.gpus).value
        best_value = best.score.value if best is not None else chosen
        return TopologyOutcome(job.job_id, node.name, job.gpus_per_pod, chosen, best_value)

    def _sample(self, now: float) -> Sample:
        return take_sample(self.state, [q.job for q in self._queue], now=now)
