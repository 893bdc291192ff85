"""The node lifecycle in simulated time: ``gpuweave lifecycle``'s decisions, a provisioner's acts.

The decisions are the deployed controller's own pure cores: ``lifecycle.replace.decide`` picks the
broken nodes handed to their engine (under its guards and disruption cap), and
``lifecycle.capacity.plan_buffers`` turns pending demand the autoscaler cannot read (shares, MIG
profiles, gangs bound to one network tier) into machines per pool, bounded by ``maxNodes``. What
Karpenter does with them is played here on the simulated clock, as a simple provisioner:

- a node handed over is drained (its pods get their termination grace, ``grace_s``, and their jobs
  are queued again), removed, and a fresh machine of its profile (new name, new GPU UUIDs) joins
  ``boot_s`` after the hand-over (the evicted pods are pending at once, so the launch starts then);
- a buffer asking for N machines of a pool makes N machines of that pool's profile join ``boot_s``
  later, in rows reserved for them (``max_new_nodes``: the most machines added at once), and a
  machine so added that stays empty for ``consolidate_after_s`` is removed again (Karpenter's
  ``consolidateAfter`` for an empty node), so the GPU-hours paid are what the fleet really held.

Every machine's life is recorded (``Lifetime``): GPU-hours paid are its GPUs times the time it
existed; the report sets them against the GPU-hours allocated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuweave.lifecycle.capacity import BufferPlan, plan_buffers
from gpuweave.lifecycle.replace import (
    Act,
    Engine,
    EngineHandle,
    NodeFacts,
    PodFacts,
    ReplacementPolicy,
    decide,
)
from gpuweave.simulate import DEFAULT_BOOT_S, DEFAULT_MAX_NEW_NODES
from gpuweave.simulate.fleet import FleetNode, new_machine
from gpuweave.simulate.lifecycle_facts import demand_of, pools_of
from gpuweave.simulate.workload import Job

CONSOLIDATE_AFTER_S = 600.0  # an added machine empty this long is consolidated away
PENDING_FOR_S = 120.0  # demand: a job still unplaced after this many seconds of scheduling tries
TERMINATION_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


@dataclass(frozen=True)
class LifecycleSettings:
    boot_s: float = DEFAULT_BOOT_S
    max_new_nodes: int = DEFAULT_MAX_NEW_NODES
    consolidate_after_s: float = CONSOLIDATE_AFTER_S
    pending_for_s: float = PENDING_FOR_S
    grace_s: float = TERMINATION_GRACE_S
    replacement: ReplacementPolicy = field(default_factory=ReplacementPolicy)


@dataclass
class Replacement:
    """One broken node handed to the provisioner: fault -> hand-over -> new node -> jobs back."""

    node: str
    verdict: str
    detail: str
    fault: str
    fault_at_s: float
    handed_over_s: float
    new_node: str = ""
    ready_s: float | None = None
    pods_drained: int = 0
    jobs: list[str] = field(default_factory=list)  # evicted by the fault or by the drain
    running_again_s: float | None = None  # when the last of ``jobs`` ran again
    _waiting: set[str] = field(default_factory=set, repr=False)
    _back_s: float | None = field(default=None, repr=False)  # the last of its jobs already back

    def to_json(self) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return None if t is None else t - self.fault_at_s

        return {
            "node": self.node,
            "verdict": self.verdict,
            "detail": self.detail,
            "fault": self.fault,
            "fault_at_s": self.fault_at_s,
            "handed_over_after_s": since(self.handed_over_s),
            "new_node": self.new_node,
            "new_node_ready_after_s": since(self.ready_s),
            "pods_drained": self.pods_drained,
            "jobs": list(self.jobs),
            "jobs_running_again_after_s": since(self.running_again_s),
        }


@dataclass
class ScaleUp:
    """One buffer's machines: pending demand -> launch -> nodes ready."""

    buffer: str
    kind: str
    pool: str
    machines: int
    reason: str
    pods: tuple[str, ...]
    demand_since_s: float
    launched_s: float
    nodes: list[str] = field(default_factory=list)
    ready_s: float | None = None  # the last of its machines

    def to_json(self) -> dict[str, Any]:
        ready = None if self.ready_s is None else self.ready_s - self.demand_since_s
        return {
            "buffer": self.buffer,
            "kind": self.kind,
            "pool": self.pool,
            "machines": self.machines,
            "reason": self.reason,
            "pods": len(self.pods),
            "demand_since_s": self.demand_since_s,
            "launched_s": self.launched_s,
            "nodes": list(self.nodes),
            "demand_to_ready_s": ready,
        }


@dataclass
class Lifetime:
    name: str
    profile: str
    gpus: int
    joined_s: float
    origin: str  # "fleet", "replacement" or "scale-up"
    left_s: float | None = None

    def gpu_hours(self, until_s: float) -> float:
        end = until_s if self.left_s is None else min(self.left_s, until_s)
        return self.gpus * max(0.0, end - min(self.joined_s, until_s)) / 3600


@dataclass
class Launch:
    """A machine on its way to row ``row``."""

    row: int
    machine: FleetNode
    ready_s: float
    origin: str
    shared: bool
    record: Replacement | ScaleUp


class NodeLifecycle:
    """The lifecycle controller and the provisioner of one run (see the module doc)."""

    def __init__(
        self,
        fleet: Sequence[FleetNode],
        *,
        reserve: Sequence[int],
        share_nodes: frozenset[int],
        settings: LifecycleSettings,
    ) -> None:
        self.settings = settings
        self.pools = pools_of([n for i, n in enumerate(fleet) if i not in reserve], share_nodes)
        self._reserve = tuple(reserve)
        self.lifetimes = {i: Lifetime(n.name, n.profile, n.gpus, 0.0, "fleet") for i, n in enumerate(fleet)}
        for row in reserve:
            del self.lifetimes[row]
        self.gone: list[Lifetime] = []
        self.replacements: list[Replacement] = []
        self.scale_ups: list[ScaleUp] = []
        self.launches: list[Launch] = []
        self.waits: dict[str, str] = {}  # node -> why its hand-over waits (the decision's reason)
        self._handed: set[str] = set()  # handed over, not yet removed (counts against the cap)
        self._empty_since: dict[int, float] = {}
        self._started: dict[str, float] = {}  # job -> its last start
        self._running_on: dict[str, tuple[str, ...]] = {}  # job -> the nodes of that start
        self._names = 0

    @property
    def reserve(self) -> tuple[int, ...]:
        """The rows kept for machines a scale-up adds (empty at the start)."""
        return self._reserve

    # ---- replacement --------------------------------------------------------------------------
    def decide_hand_over(
        self,
        broken: Mapping[int, tuple[str, str]],
        fleet: Sequence[FleetNode],
        *,
        pods: Mapping[int, Sequence[str]],
        nodes_total: int,
    ) -> list[int]:
        """The rows of ``broken`` (row -> (verdict, detail)) handed over now, by ``decide``."""
        facts = [
            NodeFacts(
                fleet[row].name,
                verdict,
                detail,
                EngineHandle(Engine.KARPENTER, f"nodeclaim-{fleet[row].name}"),
                tuple(PodFacts(key) for key in pods.get(row, ())),
                handed_over=fleet[row].name in self._handed,
            )
            for row, (verdict, detail) in sorted(broken.items())
        ]
        decisions = decide(facts, nodes_total=nodes_total, policy=self.settings.replacement)
        rows = {fleet[row].name: row for row in broken}
        self.waits = {d.node: d.reason for d in decisions if d.act is Act.WAIT}
        return [rows[d.node] for d in decisions if d.act is Act.HAND_OVER and d.node not in self._handed]

    def handed_over(
        self, row: int, old: FleetNode, record: Replacement, *, shared: bool, now: float
    ) -> Launch:
        """The node of ``row`` is the provisioner's: a machine of its profile (serving as it did:
        ``shared``) comes to the same row once the old one is gone."""
        self._handed.add(old.name)
        self.replacements.append(record)
        # a job the fault evicted may run again already (elsewhere, before the verdict)
        drained = {j for j in record.jobs if old.name in self._running_on.get(j, ())}
        back = [
            j for j in record.jobs if j not in drained and self._started.get(j, -1.0) >= record.fault_at_s
        ]
        record._waiting = set(record.jobs) - set(back)
        record._back_s = max((self._started[j] for j in back), default=None)
        if not record._waiting:
            record.running_again_s = record._back_s
        machine = new_machine(old, self._new_name(old.profile))
        record.new_node = machine.name
        launch = Launch(row, machine, now + self.settings.boot_s, "replacement", shared, record)
        self.launches.append(launch)
        return launch

    def job_started(self, job_id: str, *, at_s: float, nodes: Sequence[str] = ()) -> None:
        """A job's pods run from ``at_s`` (on ``nodes``): a replacement's jobs are back once all
        of them ran again."""
        self._started[job_id] = at_s
        self._running_on[job_id] = tuple(nodes)
        for record in self.replacements:
            if job_id in record._waiting:
                record._waiting.discard(job_id)
                if not record._waiting:
                    record.running_again_s = max(at_s, record._back_s or at_s)

    # ---- scale-up -----------------------------------------------------------------------------
    def plan_scale_up(self, queued: Sequence[tuple[Job, float]], *, now: float) -> list[BufferPlan]:
        """Buffers for the jobs pending ``pending_for_s`` or longer that the autoscaler cannot
        read, less the machines already on their way per pool, within the free reserve rows."""
        due = [(job, since) for job, since in queued if now - since >= self.settings.pending_for_s]
        shares, migs, gangs = demand_of([job for job, _ in due], self.pools)
        booting = self._booting_scale_ups()
        free = len(self._free_rows())
        plans = plan_buffers(
            shares=shares,
            migs=migs,
            gangs=gangs,
            pools={k: p.offer for k, p in self.pools.items()},
            max_nodes=free + sum(booting.values()),
        )
        wanted: list[BufferPlan] = []
        for plan in plans:
            more = min(plan.nodes - booting.get(plan.pool, 0), free)
            booting[plan.pool] = max(0, booting.get(plan.pool, 0) - plan.nodes)
            if more > 0:
                free -= more
                wanted.append(replace(plan, nodes=more))
        return wanted

    def scale_up(self, plan: BufferPlan, *, since_s: float, now: float) -> list[Launch]:
        """Launch the plan's machines into free reserve rows; they join ``boot_s`` later."""
        pool = self.pools[plan.pool]
        record = ScaleUp(plan.name, plan.kind, plan.pool, plan.nodes, plan.reason, plan.pods, since_s, now)
        self.scale_ups.append(record)
        launches = []
        for row in self._free_rows()[: plan.nodes]:
            machine = new_machine(pool.template, self._new_name(pool.template.profile))
            record.nodes.append(machine.name)
            launches.append(Launch(row, machine, now + self.settings.boot_s, "scale-up", pool.shared, record))
        self.launches.extend(launches)
        return launches

    def _booting_scale_ups(self) -> dict[str, int]:
        booting: dict[str, int] = {}
        for launch in self.launches:
            if isinstance(launch.record, ScaleUp):
                booting[launch.record.pool] = booting.get(launch.record.pool, 0) + 1
        return booting

    def _free_rows(self) -> list[int]:
        taken = set(self.lifetimes) | {launch.row for launch in self.launches}
        return [row for row in self._reserve if row not in taken]

    def consolidate(self, empty: Mapping[int, bool], *, now: float) -> list[int]:
        """Reserve rows whose machine has stayed empty ``consolidate_after_s``: to be removed."""
        out = []
        for row in self._reserve:
            if row not in self.lifetimes or not empty.get(row, False):
                self._empty_since.pop(row, None)
                continue
            since = self._empty_since.setdefault(row, now)
            if now - since >= self.settings.consolidate_after_s:
                out.append(row)
                self._empty_since.pop(row, None)
        return out

    # ---- machines joining and leaving ---------------------------------------------------------
    def due(self, now: float) -> list[Launch]:
        """Launches whose machine is ready by ``now`` and whose row is free, in launch order."""
        ready = [x for x in self.launches if x.ready_s <= now and x.row not in self.lifetimes]
        for launch in ready:
            self.launches.remove(launch)
        return ready

    def joined(self, launch: Launch, *, now: float) -> None:
        machine = launch.machine
        launched = launch.ready_s - self.settings.boot_s  # paid from its launch on
        self.lifetimes[launch.row] = Lifetime(
            machine.name, machine.profile, machine.gpus, launched, launch.origin
        )
        record = launch.record
        if isinstance(record, Replacement) or set(record.nodes) <= self._present_names():
            record.ready_s = now  # a scale-up's: its last machine

    def left(self, row: int, *, now: float) -> None:
        lifetime = self.lifetimes.pop(row)
        lifetime.left_s = now
        self.gone.append(lifetime)
        self._handed.discard(lifetime.name)

    def _present_names(self) -> set[str]:
        return {life.name for life in self.lifetimes.values()}

    def _new_name(self, profile: str) -> str:
        name = f"{profile}-n{self._names:02d}"
        self._names += 1
        return name

    # ---- report -------------------------------------------------------------------------------
    def gpu_hours_paid(self, until_s: float) -> float:
        return sum(life.gpu_hours(until_s) for life in [*self.gone, *self.lifetimes.values()])

    def summary(self, *, until_s: float) -> dict[str, Any]:
        done = [r for r in self.replacements if r.running_again_s is not None]
        ready = [s for s in self.scale_ups if s.ready_s is not None]
        return {
            "gpu_hours_paid": self.gpu_hours_paid(until_s),
            "node_boot_s": self.settings.boot_s,
            "max_new_nodes": self.settings.max_new_nodes,
            "replacements": len(self.replacements),
            "replacement_fault_to_running_mean_s": _mean(
                [r.running_again_s - r.fault_at_s for r in done if r.running_again_s is not None]
            ),
            "scale_ups": len(self.scale_ups),
            "machines_added": sum(s.machines for s in self.scale_ups),
            "scale_up_demand_to_ready_mean_s": _mean(
                [s.ready_s - s.demand_since_s for s in ready if s.ready_s is not None]
            ),
            "machines_consolidated": sum(1 for life in self.gone if life.origin == "scale-up"),
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
