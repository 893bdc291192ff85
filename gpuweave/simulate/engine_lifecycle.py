"""The node lifecycle's part of each tick of a ``Simulation`` (``lifecycle``: the decisions and
the provisioner's bookkeeping; here, what they do to the simulated cluster).

Before a tick's faults, drained nodes leave and machines whose boot is over join; after its
scheduling, empty added machines are consolidated, broken nodes are handed over and pending demand
is planned. A machine joins the way the first ones did: the state's row, the scheduler's view
(``placers.NodeWatcher``: its Node object, and its ``GpuNodeInventory`` from its own node agent,
or from the simulation where it runs none), the agent pool, the latent faults' checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuweave.simulate.faults import FaultKind, FaultRecord, FaultSpec
from gpuweave.simulate.lifecycle import Launch, NodeLifecycle, Replacement
from gpuweave.simulate.lifecycle_facts import ladder_verdict
from gpuweave.simulate.placers import NodeWatcher
from health.scope import node_verdict
from topology.network import LABEL_GPU_CLIQUE

if TYPE_CHECKING:
    from gpuweave.simulate.engine import Simulation


class LifecycleTick:
    """The lifecycle in a simulation's loop: broken nodes' faults (row -> the fault), the verdicts
    the simulation takes for nodes without an agent (row -> (from, verdict, detail)), and the
    removals due (at, row)."""

    def __init__(self, simulation: Simulation, lifecycle: NodeLifecycle) -> None:
        self._sim = simulation
        self.lifecycle = lifecycle
        self._broken_by: dict[int, FaultRecord] = {}
        self._verdicts: dict[int, tuple[float, str, str]] = {}
        self._removals: list[tuple[float, int]] = []

    def stays_broken(self, spec: FaultSpec, record: FaultRecord, now: float) -> None:
        """A GPU fault that does not heal (an Xid 79: the GPU fell off the bus and its reset
        fails). With an agent on the node, its reset fails in the simulated NVML and the agent's
        health rounds reach the verdict; without one, the simulation takes the verdict the Xid's
        remediation ladder gives once a reset failed, one health round later."""
        if record.gpu is None or not record.gpus_withheld:
            return
        node = self._sim._node_index(record.node)
        self._broken_by[node] = record
        if self._sim._agent_on(node):
            assert self._sim._agents is not None
            self._sim._agents.set_reset_fails(node, record.gpu)
            return
        xid = 79 if spec.kind is FaultKind.XID_79 else 48
        verdict, detail = ladder_verdict(self._sim.state.fleet[node], record.gpu, xid)
        self._verdicts[node] = (now + self._sim._tick, verdict, detail)

    def before(self, now: float) -> None:
        """Drained nodes leave, then machines whose boot is over join (before this tick's faults)."""
        for due in sorted(r for r in self._removals if r[0] <= now):
            self._removals.remove(due)
            self._remove(due[1], at_s=due[0])
        for launch in self.lifecycle.due(now):
            self._join(launch, now)

    def after(self, now: float) -> None:
        """After scheduling: empty added machines consolidated, broken nodes handed over (by
        ``replace.decide``), and what still fits nowhere planned (by ``capacity.plan_buffers``)."""
        present = [i for i in range(len(self._sim.state.fleet)) if self._sim.state.present(i)]
        empty = {i: not self._sim.state.pods_on(i) for i in present}
        for row in self.lifecycle.consolidate(empty, now=now):
            self._remove(row, at_s=now)
        broken = self._broken(now)
        pods = {row: [p.pod_id for p in self._sim.state.pods_on(row)] for row in broken}
        for row in self.lifecycle.decide_hand_over(
            broken, self._sim.state.fleet, pods=pods, nodes_total=len(present)
        ):
            self._hand_over(row, broken[row], now)
        queued = [(q.job, q.pending_since_s) for q in self._sim._queue]
        for plan in self.lifecycle.plan_scale_up(queued, now=now):
            jobs = {pod.rsplit("-", 1)[0] for pod in plan.pods}
            since = min(q.pending_since_s for q in self._sim._queue if q.job.job_id in jobs)
            self.lifecycle.scale_up(plan, since_s=since, now=now)

    def _broken(self, now: float) -> dict[int, tuple[str, str]]:
        """Nodes whose verdict asks for their engine: (verdict, detail) by row. An agent's node
        runs one health round per tick while its fault stays (the reset, then the verdict)."""
        broken: dict[int, tuple[str, str]] = {}
        handed = {row for _, row in self._removals}
        for row in sorted(self._broken_by):
            if row in handed:
                continue
            if self._sim._agent_on(row):
                assert self._sim._agents is not None
                self._sim._agents.health_round(row)
                snapshot = self._sim._agents.health_snapshot(row)
                condition = node_verdict(snapshot) if snapshot is not None else None
                if condition is not None and condition.status == "False":
                    broken[row] = (condition.reason, condition.message)
            elif row in self._verdicts and self._verdicts[row][0] <= now:
                broken[row] = self._verdicts[row][1:]
        return broken

    def _hand_over(self, row: int, verdict: tuple[str, str], now: float) -> None:
        """The node goes to the provisioner: its pods are evicted (their termination grace runs out
        before the next tick, when the node is removed) and their jobs queued again."""
        fault = self._broken_by.pop(row, None)
        self._verdicts.pop(row, None)
        jobs = [pod.rsplit("-", 1)[0] for pod in fault.evicted_pods] if fault is not None else []
        drained, pods = self._drain(row, now)
        record = Replacement(
            self._sim.state.fleet[row].name,
            verdict[0],
            verdict[1],
            fault.kind if fault is not None else "",
            fault.at_s if fault is not None else now,
            now,
            pods_drained=pods,
            jobs=list(dict.fromkeys(jobs + drained)),
        )
        shared = bool(self._sim._share_allowed[row])
        self.lifecycle.handed_over(row, self._sim.state.fleet[row], record, shared=shared, now=now)
        self._removals.append((now + self.lifecycle.settings.grace_s, row))

    def _drain(self, row: int, now: float) -> tuple[list[str], int]:
        """Evict every job with a pod on ``row``, queued again first (pending from now: its pods
        are re-created once the drained ones ended); (their IDs, pods evicted)."""
        jobs: list[str] = []
        evicted = 0
        for pod in self._sim.state.pods_on(row):
            if pod.pod_id in self._sim.state.pods:
                jobs.append(pod.job.job_id)
                evicted += self._sim._stop_job(pod, fault=None)
                self._sim.requeue_first(pod.job, queued_s=now)
        return jobs, evicted

    def _remove(self, row: int, *, at_s: float) -> None:
        """The machine of ``row`` is gone: from the state, the scheduler's view and its agent."""
        name = self._sim.state.fleet[row].name
        self._sim._restores = [r for r in self._sim._restores if r[1].node != name]
        self._broken_by.pop(row, None)
        self._verdicts.pop(row, None)
        self._sim.state.node_left(row)
        if isinstance(self._sim._placer, NodeWatcher):
            self._sim._placer.node_left(row)
        if self._sim._agents is not None:
            self._sim._agents.leave(row)
        self.lifecycle.left(row, now=at_s)

    def _join(self, launch: Launch, now: float) -> None:
        """A machine joins as the others did: the state, the scheduler's view (its Node object;
        its inventory from its agent, or from the simulation where it runs none), its agent."""
        row, machine = launch.row, launch.machine
        self._sim.state.node_joined(row, machine)
        self._sim._share_allowed[row] = launch.shared
        self._sim._gang_nodes[row] = machine.has_efa or LABEL_GPU_CLIQUE in machine.labels
        self._sim._mig_nodes = [
            i for i, n in enumerate(self._sim.state.fleet) if n.mig_managed and self._sim.state.present(i)
        ]
        runs_agent = self._sim._agents is not None and self._sim._agents.join(
            row, machine, shared=launch.shared
        )
        if isinstance(self._sim._placer, NodeWatcher):
            self._sim._placer.node_joined(
                row, machine, shared=launch.shared, inventory=self._sim._watcher is None
            )
        if self._sim._latent is not None:
            self._sim._latent.node_joined(row, machine)
        if runs_agent:
            self._sim._deliver_published(row)
        self.lifecycle.joined(launch, now=now)
