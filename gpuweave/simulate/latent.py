"""Latent faults: hardware that passive health does not see, and the active checks that find it.

A stuck memory cell (no ECC error reported) or an NVLink pair running at half its lanes (NVML
still says every link is up) raises no Xid, no counter and no event: the agent's rounds see
nothing. ``DEFAULT_LATENT`` injects such faults mid-run on GPUs drawn from the fleet with a seed
of their own (the same GPUs for every policy, and the workload's random stream untouched). A
fault **hits** a job when a pod of that job runs on it: a bad cell under any pod of its GPU, a
slow pair under a pod holding both of its GPUs. Until something finds it, every job placed there
is hit.

With node agents (the gpuweave run), the agents look for them as a deployment's do, through their
own runner, exerciser and health engine (``NodeAgentPool.active_check``), on the simulated clock:

- **between jobs**: each tick, per node, the GPUs ``health.active_schedule.due`` picks (idle for a
  tick, last checked ``interval_s`` ago or freed by a job: ``IdleSettings`` below), at most
  ``max_gpus`` at once;
- **gang preflight**: before a multi-node gang starts, the copies (host <-> device, NVLink) on
  every GPU planned for it; a node that fails (a GPU failed, or a slow pair found now among them)
  keeps the gang from starting there, the agent withholds the failed GPUs or publishes the pair
  degraded, and the gang is placed again (the next tick) knowing it.

A GPU a check fails (a bad cell) is withheld by its agent (the extender learns it from the published
inventory) and taken out of the simulated state. A slow pair fails neither GPU: the agent records
the pair as a degraded link and publishes it, and the extender's set choice avoids spanning it
(``health.links``); its GPUs keep serving.

A slow pair is physical truth from the moment it fires (``slow_pairs``): every job, under every
policy, whose pod holds both of its GPUs and starts after that runs with the pair at
``SLOW_NVLINK_SHARE`` of its bandwidth, through the step-time model (``jobtime``: the ring runs at
its slowest link). A bad cell changes no job's run time (the simulation models no corrupted result).

Each fault ends up **caught before a job** (a check found it before any job was hit), **found
after** a job hit it, or **not found** by the end of the run. The baselines run no agents and no
active checks: nothing finds a latent fault, and every job placed on one is hit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gpuweave.simulate.agents import SLOW_NVLINK_SHARE, NodeAgentPool
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.state import GpuMode, RunningPod, SimState
from hardware.exerciser.levels import peer_pairs
from health.active_schedule import GpuIdle, due, observe
from health.config import IdleSettings

LATENT_SEED_OFFSET = 7919  # the fault draws' own stream: the workload's stays as it was
# The simulation's checks between jobs: each GPU every 2 h, and after a job ends on it, 4 at a time
SIMULATED_IDLE = IdleSettings(interval_s=7200.0, after_job=True, settle_s=60.0, max_gpus=4)


class LatentKind(StrEnum):
    BAD_MEMORY = "bad-memory"
    SLOW_NVLINK = "slow-nvlink"


@dataclass(frozen=True)
class LatentSpec:
    kind: LatentKind
    at_fraction: float


DEFAULT_LATENT = (
    LatentSpec(LatentKind.BAD_MEMORY, 0.15),
    LatentSpec(LatentKind.SLOW_NVLINK, 0.25),
    LatentSpec(LatentKind.BAD_MEMORY, 0.4),
    LatentSpec(LatentKind.SLOW_NVLINK, 0.5),
    LatentSpec(LatentKind.BAD_MEMORY, 0.65),
    LatentSpec(LatentKind.SLOW_NVLINK, 0.8),
)


@dataclass
class LatentRecord:
    kind: str
    at_s: float
    node: str
    gpus: tuple[int, ...]  # one GPU (a bad cell) or the pair (a slow NVLink)
    caught_s: float | None = None
    caught_by: str = ""  # idle (between jobs), preflight
    first_hit_s: float | None = None
    jobs_hit: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """caught before a job, found after a job hit it, or not found (by the run's end)."""
        if self.caught_s is None:
            return "not found"
        if self.first_hit_s is None or self.caught_s <= self.first_hit_s:
            return "caught before a job"
        return "found after a job hit it"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at_s": self.at_s,
            "node": self.node,
            "gpus": list(self.gpus),
            "outcome": self.outcome,
            "caught_s": self.caught_s,
            "caught_by": self.caught_by,
            "first_hit_s": self.first_hit_s,
            "jobs_hit": len(self.jobs_hit),
        }


def draw_targets(
    fleet: Sequence[FleetNode], specs: Sequence[LatentSpec], *, seed: int
) -> list[tuple[int, tuple[int, ...]]]:
    """(node, GPUs) per spec, drawn once from the fleet: a pair an NVLink check measures for a slow
    link (a direct link, or neighbours on an NVSwitch), any GPU for a bad cell. MIG-managed nodes
    are left out where others exist: a GPU in MIG mode is not exercised (docs/health.md, Known
    gaps), so a fault there would say nothing about active checks. Rows without GPUs (reserved
    for machines a scale-up adds) are left out."""
    rng = np.random.default_rng(seed + LATENT_SEED_OFFSET)
    machines = [i for i, node in enumerate(fleet) if node.gpus]  # not the rows reserved for scale-up
    nodes = [i for i in machines if not fleet[i].mig_managed] or machines
    linked = [(i, pairs) for i in nodes if (pairs := _pairs(fleet[i]))]
    targets: list[tuple[int, tuple[int, ...]]] = []
    for spec in specs:
        if spec.kind is LatentKind.SLOW_NVLINK and linked:
            node, pairs = linked[int(rng.integers(len(linked)))]
            targets.append((node, pairs[int(rng.integers(len(pairs)))]))
        else:
            node = nodes[int(rng.integers(len(nodes)))]
            targets.append((node, (int(rng.integers(fleet[node].gpus)),)))
    return targets


def _pairs(node: FleetNode) -> list[tuple[int, int]]:
    index = {g.uuid: g.index for g in node.inventory.gpus}
    return [(index[p.src], index[p.dst]) for p in peer_pairs(node.inventory, all_pairs=False)]


class LatentFaults:
    """The latent faults of one run and, given agents, the active checks that look for them."""

    def __init__(
        self,
        fleet: Sequence[FleetNode],
        *,
        duration_s: float,
        seed: int,
        specs: Sequence[LatentSpec] = DEFAULT_LATENT,
        agents: NodeAgentPool | None = None,
        idle: IdleSettings = SIMULATED_IDLE,
    ) -> None:
        self._fleet = tuple(fleet)
        self._plan = sorted(
            zip(specs, draw_targets(fleet, specs, seed=seed), strict=True), key=lambda s: s[0].at_fraction
        )
        self._duration = duration_s
        self._agents = agents
        self._idle = idle
        self.records: list[LatentRecord] = []
        self._seen: dict[int, dict[str, GpuIdle]] = {}  # per node: the rounds' look at its GPUs
        self._checked: dict[int, dict[str, float]] = {}  # per node: GPU UUID -> last check (simulated)
        self.check_runs = 0

    @property
    def checking(self) -> bool:
        return self._agents is not None

    # ---- faults -------------------------------------------------------------------------------
    def fire(self, state: SimState, now: float) -> None:
        """Inject the faults due by ``now``; pods already on them are hit at once."""
        while self._plan and self._plan[0][0].at_fraction * self._duration <= now:
            spec, (node, gpus) = self._plan.pop(0)
            record = LatentRecord(spec.kind.value, now, self._fleet[node].name, gpus)
            self.records.append(record)
            if self._agents is not None and self._agents.has(node):
                self._agents.inject_latent(node, gpus, slow_nvlink=spec.kind is LatentKind.SLOW_NVLINK)
            self.pods_started([p for p in state.pods.values() if p.node == node], now)

    def slow_pairs(self) -> dict[str, dict[frozenset[int], float]]:
        """Per node name, the NVLink pairs a fired slow-NVLink fault slowed, and the share of their
        bandwidth they keep: the hardware as it is, found or not (``jobtime.job_timing``)."""
        slow: dict[str, dict[frozenset[int], float]] = {}
        for record in self.records:
            if record.kind == LatentKind.SLOW_NVLINK.value:
                slow.setdefault(record.node, {})[frozenset(record.gpus)] = SLOW_NVLINK_SHARE
        return slow

    def node_joined(self, node: int, machine: FleetNode) -> None:
        """A new machine took row ``node`` (the lifecycle): its checks start afresh."""
        self._fleet = (*self._fleet[:node], machine, *self._fleet[node + 1 :])
        self._seen.pop(node, None)
        self._checked.pop(node, None)

    def pods_started(self, pods: Iterable[RunningPod], now: float) -> None:
        """Pods that run from ``now``: each one on a fault not yet found hits it."""
        for pod in pods:
            used = set(pod.gpus) | ({pod.mig_gpu} if pod.mig_gpu >= 0 else set())
            for record in self._open_on(self._fleet[pod.node].name):
                if set(record.gpus) <= used and pod.job.job_id not in record.jobs_hit:
                    record.jobs_hit.append(pod.job.job_id)
                    if record.first_hit_s is None:
                        record.first_hit_s = now

    def _open_on(self, node: str) -> list[LatentRecord]:
        return [r for r in self.records if r.node == node and r.caught_s is None]

    # ---- active checks ------------------------------------------------------------------------
    def check_idle(self, state: SimState, now: float) -> list[int]:
        """Checks between jobs on every agent's node, on the simulated clock; the nodes whose
        agent found something (their published inventory changed)."""
        if self._agents is None:
            return []
        changed = []
        for node, fleet_node in enumerate(self._fleet):
            if not self._agents.has(node):
                continue
            gpus = [g.uuid for g in fleet_node.inventory.gpus]
            held = {gpus[g] for p in state.pods.values() if p.node == node for g in p.gpus}
            held |= {gpus[i] for i, mode in enumerate(state.modes[node]) if mode is not GpuMode.NORMAL}
            self._seen[node] = observe(self._seen.get(node, {}), gpus, held=held, now=now)
            checked = self._checked.setdefault(node, {})
            free, seen, settings = set(gpus) - held, self._seen[node], self._idle
            chosen = due(seen, gpus, healthy=free, last_checked=checked, now=now, settings=settings)
            if chosen and any(self._check(state, node, [gpus.index(u) for u in chosen], now, trigger="idle")):
                changed.append(node)
        return changed

    def preflight(self, state: SimState, placed: Sequence[tuple[int, Sequence[int]]], now: float) -> bool:
        """A multi-node gang's preflight on the GPUs planned for it (node, GPUs); False when a node
        failed (its agent now withholds what it found)."""
        if self._agents is None or len({node for node, _ in placed}) < 2:
            return True
        passed = True
        for node, gpus in placed:
            if self._agents.has(node) and any(self._check(state, node, list(gpus), now, trigger="preflight")):
                passed = False  # a GPU failed, or a slow pair the plan did not know of (``health.preflight``)
        return passed

    def _check(
        self, state: SimState, node: int, gpus: list[int], now: float, *, trigger: str
    ) -> tuple[bool, bool]:
        """One run on the node's agent; the GPUs it failed leave the simulated state. (whether a
        GPU failed, whether a slow NVLink pair became a degraded link: its GPUs stay)."""
        assert self._agents is not None
        self.check_runs += 1
        failed = self._agents.active_check(
            node,
            gpus,
            trigger=trigger,
            max_gpus=self._idle.max_gpus if trigger == "idle" else len(gpus),
            bandwidth=trigger == "preflight",
        )
        uuids = [g.uuid for g in self._fleet[node].inventory.gpus]
        self._checked.setdefault(node, {}).update(dict.fromkeys((uuids[g] for g in gpus), now))
        degraded = self._agents.degraded_pairs(node)
        newly = False
        for record in self._open_on(self._fleet[node].name):
            slow = record.kind == LatentKind.SLOW_NVLINK.value
            if (slow and frozenset(record.gpus) in degraded) or (not slow and set(record.gpus) & failed):
                record.caught_s, record.caught_by = now, trigger
                newly = newly or slow
        for gpu in failed:
            if state.modes[node][gpu] is GpuMode.NORMAL and not state.pods_on_gpu(node, gpu):
                state.set_mode(node, gpu, GpuMode.WITHHELD)
        return bool(failed), newly

    # ---- report -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        outcomes = [r.outcome for r in self.records]
        return {
            "latent_faults": len(self.records),
            "latent_caught_before_job": outcomes.count("caught before a job"),
            "latent_found_after_job": outcomes.count("found after a job hit it"),
            "latent_not_found": outcomes.count("not found"),
            "latent_jobs_hit": sum(len(r.jobs_hit) for r in self.records),
            "latent_check_runs": self.check_runs,
        }
