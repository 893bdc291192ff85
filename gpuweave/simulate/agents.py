"""The real node agents of the simulated cluster, one per node, each with its own kubelet.

Every node runs ``nodeagent.agent.NodeAgent`` on simulated hardware
(``hardware.simulated.SimulatedBackend``: the production NVML/sysfs readers over a fake NVML),
built by the same ``gpuweave.node.builder.NodeAgentBuilder`` as ``gpuweave node-agent``: the
node's sharing plan, metrics in a registry of its own, one MPS daemon per fractional GPU (on
``InMemoryMpsDaemons``: records in this process, since a process per GPU across the fleet would
not fit a small machine), its health service (NVML events, kernel log, Xid policy) and, on a
MIG-managed node, the MIG manager, whose busy devices are the pods this pool admitted (the
kubelet's pod-resources view). It serves its resources over gRPC on unix sockets in a temporary
directory; a ``SimKubelet`` registers them and watches their device lists. When the extender binds
a pod, the node's kubelet admits it (GetPreferredAllocation + Allocate with the devices the
extender chose), so a device the agent refuses shows up as an admission failure; a share pod then
runs an MPS client process on its GPU (``share_processes``), which the simulated NVML lists. Faults are
injected into the simulated NVML (``inject_xid``), and the time until the kubelet sees the GPU
Unhealthy is measured: event, health policy, agent and ListAndWatch, end to end. An NVLink tray
fault sets the node's simulated fabric state (as ``gpuweave sim inject --fabric-state`` does) and
runs the agent's NVSwitch fabric gate (``gpuweave node-agent``'s, checked here at simulated times
rather than on its own timer), which withholds the tray's GPUs until the fabric completes.

The same seed gives the same report however loaded the machine is. The agents run real threads
(NVML event listener, the kubelets' ListAndWatch streams, a GPU reset, registrations), so nothing
the simulation decides may depend on how fast they are: health runs on the simulation's clock
(``SimClock``: fault windows, remediation, probation), its rounds are run by the simulation, a
round's checks wait for every read (``SETTLE_TIMEOUT_S``: the simulation injects no hang, so a
slow read is the machine's load, not a hung GPU), each step the simulation takes waits for the
agent's own state to follow (an injected Xid applied, its kernel-log line read as the next round
would, the burn-in over) rather than for a deadline, and the kubelet's view is only measured
(``agent_to_kubelet_s``, ``agent_back_s``: wall-clock figures, the report's only ones). A wait that
outlasts ``SETTLE_TIMEOUT_S`` stops the run (``SimulationStallError``) instead of letting it go on
with another outcome.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devicemodel.assignment import parent_gpu_of_share
from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NicType, NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from gpuweave.node.builder import NodeAgentBuilder
from gpuweave.node.fabric import fabric_gate
from gpuweave.node.health import SIM_KMSG_FILE
from gpuweave.node.mps import NodeMps
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.kubelet import KubeletCallError, SimKubelet
from gpuweave.simulate.share_processes import ShareProcess, ShareProcesses
from hardware.exerciser.protocol import BANDWIDTH_CHECKS, GPU_CHECKS
from hardware.mps import InMemoryMpsDaemons
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend, scratch_parent
from health.config import ActiveSettings, HealthSettings, IdleSettings
from health.errors import ActiveCheckBusyError
from health.policy import DeviceState
from health.scope import HealthSnapshot
from health.service import HealthService
from health.signals.fabric import DEFAULT_INTERVAL_S as FABRIC_INTERVAL_S
from health.signals.fabric import FabricGate
from mig.planner import TargetEntry
from mig.service import MigService
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.published import inventory_object


class AgentStartError(GpuweaveError):
    """A node agent did not register its resources with its kubelet in time."""


class SimulationStallError(GpuweaveError):
    """A node agent did not reach the state the simulation waits for within ``SETTLE_TIMEOUT_S``."""


# How long the simulation waits for an agent's thread to do what it will do (apply an event, end
# a burn-in, list new devices, answer a check) before it stops the run rather than go on with
# another outcome; a machine that busy makes the run slow, never different
SETTLE_TIMEOUT_S = 120.0
NEVER_STALLED_S = 10 * 365 * 86_400.0  # the round loop idles by design: the simulation runs the rounds


class SimClock:
    """The simulated time the agents' health runs on, set by the simulation at every tick."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def stalled(what: str) -> SimulationStallError:
    return SimulationStallError(
        f"{what} did not happen within {SETTLE_TIMEOUT_S:.0f} s of wall time; the machine is too busy "
        "for this run (it would not give the same report): run it with fewer nodes or agents"
    )


def settle(what: str, done: Callable[[], bool]) -> None:
    """Wait until ``done()``; past ``SETTLE_TIMEOUT_S`` of wall time, ``SimulationStallError``."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise stalled(what)
        time.sleep(0.002)


def _started(health: HealthService, *, node: str) -> None:
    """Wait out the round the monitor runs as it starts and the burn-in, so rounds the simulation
    drives never overlap them (an overlapping round finds its checks pending and is not clean), and
    the active checks the simulation runs never find the burn-in still going."""

    def done() -> bool:
        burning = health.active is not None and bool(health.active.status()["burnInPending"])
        running = health.active is not None and health.active.running
        return health.monitor.rounds_completed >= 1 and not burning and not running

    settle(f"the first health round and burn-in of {node}'s agent", done)


def _stop_node(node: _Node) -> None:
    if node.health is not None:
        node.health.stop()
    if node.mps is not None:
        node.mps.stop()
    node.agent.stop()
    node.kubelet.stop()
    node.backend.close()


@dataclass
class _Node:
    agent: NodeAgent
    kubelet: SimKubelet
    backend: SimulatedBackend
    health: HealthService | None
    mig: MigService | None = None
    fabric: FabricGate | None = None  # built at the node's first fabric change (NVLink tray fault)
    mps: NodeMps | None = None  # its MPS supervisor (a restarter thread), stopped with the node
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod -> devices (pod-resources)
    shares: ShareProcesses | None = None  # its share pods' processes on their GPUs
    faults: int = 0  # faults its health engine applied (an injected Xid is waited for by this)

    def fault_applied(self, _device: str, _fault: object) -> None:
        self.faults += 1  # under the monitor's lock: one writer at a time

    def held_devices(self) -> frozenset[str]:
        """What the kubelet's pod-resources API would list: devices of pods still running."""
        return _devices_of(self.held)


def _devices_of(held: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    devices = {d for ids in list(held.values()) for d in ids}
    return frozenset(devices | {p for p in (parent_gpu_of_share(d) for d in devices) if p is not None})


# Agents stopped at once at the end of a run: each stop mostly waits for its threads' loops
STOP_WORKERS = 16
# How often each agent's kubelet watcher looks for a restarted kubelet and for resources to
# register: the agent's default (0.1 s) where agents reshape MIG (new resources are registered at
# its next look), once a second on a sample, whose agents never reshape and whose kubelets never
# restart (64 watchers looking ten times a second cost the run's main thread time for nothing)
DEFAULT_POLL_INTERVAL_S = AgentConfig.poll_interval
SAMPLED_POLL_INTERVAL_S = 1.0


# The agents' own round timer is set past any run: the simulation runs each health round itself
# (``health_round``) at simulated times, so remediation and probation follow the simulated clock.
DRIVEN_ROUND_INTERVAL_S = 86_400.0
LATENT_CELL = 1 << 20  # a latent memory fault's byte offset: inside the 2 % a level-1 pattern covers
SLOW_NVLINK_SHARE = 0.5  # a latent slow NVLink pair runs at half its rate (half its lanes trained)
# The simulation schedules checks between jobs itself, on the simulated clock (``latent``)
DRIVEN_ACTIVE = ActiveSettings(idle=IdleSettings(interval_s=0))


def driven_health_settings() -> HealthSettings:
    """Health as the simulation drives it: rounds run by the simulation, checks that wait for every
    read (a read slowed by machine load is no hung GPU: the simulation injects no hang), no stall."""
    return HealthSettings(
        round_interval_s=DRIVEN_ROUND_INTERVAL_S,
        active=DRIVEN_ACTIVE,
        check_timeout_s=SETTLE_TIMEOUT_S,
        stall_after_s=NEVER_STALLED_S,
    )


class NodeAgentPool:
    def __init__(
        self,
        fleet: Sequence[FleetNode],
        *,
        share_nodes: frozenset[int],
        health: HealthSettings | None = None,
        only: Collection[int] | None = None,
        absent: Collection[int] = (),
    ) -> None:
        """An agent per node of ``fleet``, or only on the nodes ``only`` names (a sample); none
        on the rows ``absent`` names, which hold no machine yet (``join``)."""
        self._fleet = tuple(fleet)
        self._joins = 0  # machines joined since the start: each gets its own directory
        self._health = health or driven_health_settings()
        self.clock = SimClock()  # the simulation sets it (``set_time``); the agents' health reads it
        # memory-backed where the machine has it, as the simulated sysfs trees are: a sampled
        # 1,000-node run writes and removes ~45,000 files (state, sockets, sysfs) here; the path
        # stays short, as unix socket paths must be
        self._root = Path(tempfile.mkdtemp(prefix="gws", dir=scratch_parent() or "/tmp"))
        self._nodes: dict[int, _Node] = {}
        rows = [i for i in range(len(self._fleet)) if i not in set(absent)]
        wanted = rows if only is None else sorted(set(only) - set(absent))
        self.sampled = len(wanted) < len(rows)
        self.admitted = 0
        self.admission_failures: list[str] = []
        self.reshape_refusals: list[str] = []
        self._changed_lock = threading.Lock()
        self._changed: set[int] = set()  # nodes whose agent changed what it publishes
        try:
            for index in wanted:
                self._nodes[index] = self._start(index, self._fleet[index], shared=index in share_nodes)
        except BaseException:
            self.close()
            raise

    def join(self, index: int, node: FleetNode, *, shared: bool) -> bool:
        """A new machine joined row ``index``: it runs an agent as every node does (True), unless
        the pool is a sample, whose unsampled nodes run none (False)."""
        self._fleet = (*self._fleet[:index], node, *self._fleet[index + 1 :])
        if self.sampled:
            return False
        self._joins += 1
        self._nodes[index] = self._start(index, node, shared=shared, folder=f"j{self._joins}")
        return True

    def leave(self, index: int) -> None:
        """The machine of row ``index`` is gone: its agent, kubelet and hardware stop."""
        held = self._nodes.pop(index, None)
        if held is not None:
            _stop_node(held)
        with self._changed_lock:
            self._changed.discard(index)

    def set_reset_fails(self, node: int, gpu: int) -> None:
        """From now on a reset of the GPU fails in the node's simulated NVML (it stays off the bus)."""
        self._nodes[node].backend.node.health.set_reset_fails(gpu)

    def _start(self, index: int, node: FleetNode, *, shared: bool, folder: str = "") -> _Node:
        kubelet_dir = self._root / (folder or f"n{index}") / "k"
        state_dir = self._root / (folder or f"n{index}") / "s"
        state_dir.mkdir(parents=True, exist_ok=True)
        kubelet = SimKubelet(kubelet_dir, call_timeout_s=SETTLE_TIMEOUT_S)
        kubelet.start()
        backend = SimulatedBackend(
            node.node_profile or load_profile(node.profile),
            self._root / (folder or f"n{index}") / "hw",
            node_name=node.name,
            kmsg_path=state_dir / SIM_KMSG_FILE,
        )
        mode = SharingMode.FRACTIONAL if shared else SharingMode.EXCLUSIVE
        config = AgentConfig(
            kubelet_dir=kubelet_dir,
            state_dir=state_dir,
            sharing=SharingPlan(default=GpuSharing(mode)),
            poll_interval=SAMPLED_POLL_INTERVAL_S if self.sampled else DEFAULT_POLL_INTERVAL_S,
        )
        # the builder's own metrics registry: the agent's, MIG's and health's counters, as a process has
        builder = NodeAgentBuilder(backend, state_dir=state_dir, node_name=node.name)
        agent = builder.agent(config)
        agent.add_listener(lambda: self._mark_changed(index))  # what wakes its publisher
        self._mark_changed(index)
        # One MPS daemon per fractional GPU, as records in this process (no process per GPU)
        mps = builder.mps(agent, daemons=InMemoryMpsDaemons(), inventory=backend.discover())
        agent.start()
        if not kubelet.wait_for(set(agent.resource_names()[:1])):
            mps.stop()
            agent.stop()
            kubelet.stop()
            backend.close()
            raise AgentStartError(f"node agent of {node.name} did not register with its kubelet within 20 s")
        held: dict[str, tuple[str, ...]] = {}  # pod -> devices: what the kubelet's pod-resources lists
        health = builder.health(
            agent,
            settings=self._health,
            mps=mps,
            clock=self.clock,
            held_by_pods=lambda: _devices_of(held),
        )
        _started(health, node=node.name)
        shares = ShareProcesses(backend.node.processes)
        started = _Node(agent, kubelet, backend, health, mps=mps, held=held, shares=shares)
        health.engine.fault_observers.append(started.fault_applied)
        if node.mig_managed:  # busy devices: what this pool admitted and has not released
            started.mig = builder.mig(agent, inventory=agent.inventory, held_by_pods=started.held_devices)
            started.mig.start()
        return started

    def set_time(self, now_s: float) -> None:
        """The simulated time of the tick about to run (``placers.SimulatedTime``)."""
        self.clock.now_s = now_s

    def _mark_changed(self, node: int) -> None:
        with self._changed_lock:
            self._changed.add(node)

    def take_changed(self) -> list[int]:
        """Nodes whose agent changed its health, withheld devices or inventory since the last call
        (the agent's change listener, which in a deployment wakes its publisher)."""
        with self._changed_lock:
            changed, self._changed = sorted(self._changed), set()
        return changed

    def published(self, node: int) -> dict[str, Any]:
        """The ``GpuNodeInventory`` the node's agent publishes now: its inventory and its own fault
        and withheld maps, built as ``deviceplugin.kube.Publisher.publish_once`` builds it."""
        agent = self._nodes[node].agent
        faults, withheld = agent.health_maps()
        return inventory_object(
            agent.inventory,
            sharing=agent.config.sharing,
            faults=faults,
            withheld=withheld,
            degraded=agent.degraded_links(),
        )

    def resources(self, node: int) -> dict[str, int]:
        return self._nodes[node].kubelet.resources()

    def kubelet_follows(self, node: int, resources: Collection[str] | None = None) -> bool:
        """Whether the node's kubelet lists every device the agent serves now under ``resources``
        (None: all of its resources) with the health the agent gives it: its ListAndWatch streams
        have carried the agent's last change (a reshape's new devices, released after being
        withheld as their GPU changed mode; a GPU or an adapter back). Devices the agent no longer
        serves may still be listed: the kubelet keeps them, and they decide nothing here."""
        started = self._nodes[node]
        served = started.agent.resource_names()
        for name in served if resources is None else [r for r in resources if r in served]:
            listed = started.kubelet.devices(name)
            if any(listed.get(s.device.id) != s.health for s in started.agent.state_of(name).snapshot()):
                return False
        return True

    def _settle_kubelet(self, node: int, what: str, resources: Collection[str] | None = None) -> None:
        """Wait until the node's kubelet lists the devices as its agent serves them now
        (``kubelet_follows``), so that what it admits never depends on how fast its streams ran."""
        name = self._fleet[node].name
        settle(f"the kubelet of {name} {what}", lambda: self.kubelet_follows(node, resources))

    def admit(self, node: int, devices: Mapping[str, Sequence[str]], *, pod_id: str = "") -> bool:
        """The kubelet admits a pod's container with the devices the scheduler chose, once it
        lists those resources' devices as the agent serves them (the kubelet's
        GetPreferredAllocation offers the devices it sees Healthy: a list behind the agent's
        would refuse a device the agent serves)."""
        self._settle_kubelet(node, f"listing {sorted(devices)} as its agent serves them", devices.keys())
        for resource, ids in devices.items():
            try:
                self._nodes[node].kubelet.admit(resource, list(ids))
            except KubeletCallError as exc:
                self.admission_failures.append(f"{self._fleet[node].name}: {exc}")
                return False
        self.admitted += 1
        started = self._nodes[node]
        if pod_id:
            started.held[pod_id] = tuple(d for ids in devices.values() for d in ids)
            if started.shares is not None:  # a share pod runs an MPS client on its GPU
                gpus = {g.uuid: g.index for g in started.agent.inventory.gpus}
                started.shares.start(pod_id, devices, gpu_index=gpus)
        return True

    def release(self, node: int, pod_id: str) -> None:
        """The pod ended: its devices leave the kubelet's pod-resources list, its processes end."""
        started = self._nodes[node]
        started.held.pop(pod_id, None)
        if started.shares is not None:
            started.shares.end(pod_id)

    def share_processes(self, node: int) -> list[ShareProcess]:
        """The processes the node's share pods run now (what NVML lists on its GPUs)."""
        shares = self._nodes[node].shares
        return shares.running() if shares is not None else []

    def inventory(self, node: int) -> NodeInventory:
        """What the node agent discovered last (MIG devices included): what it publishes."""
        return self._nodes[node].agent.inventory

    def reshape(self, node: int, gpu: int, target: Sequence[tuple[str, int]] | None) -> bool:
        """Apply a MIG layout (profile, start) to one GPU through the node agent's MIG reconciler
        (None: back to a whole GPU); the agent withholds and republishes its devices. False when
        the agent refuses (busy instance, bad plan): the layout stays as it was."""
        mig = self._nodes[node].mig
        if mig is None:
            return False
        entries = None if target is None else [TargetEntry(profile, start) for profile, start in target]
        try:
            mig.reconciler.apply(gpu, entries)
        except GpuweaveError as exc:
            self.reshape_refusals.append(f"{self._fleet[node].name} GPU {gpu}: {exc}")
            return False
        # a kubelet only admits pods to devices its ListAndWatch streams announced Healthy: the
        # new MIG devices are listed first withheld (their GPU changing mode), then released
        self._settle_kubelet(node, f"listing the MIG devices of GPU {gpu} as its agent serves them")
        return True

    def inject_xid(self, node: int, gpu: int, xid: int) -> float | None:
        """Raise an Xid in the node's simulated NVML and wait until the agent's health applied it
        (its event listener, at the simulated time), read its kernel-log line (a round reads it
        within seconds: the same Xid, dropped as such) and pushed the result to the agent; then the
        seconds until the kubelet sees the GPU Unhealthy, measured (None: not within 20 s, e.g. a
        non-fatal Xid)."""
        held = self._nodes[node]
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        before = held.faults
        started = time.monotonic()
        held.backend.node.health.inject_xid(gpu, xid)
        if held.health is not None:
            settle(f"Xid {xid} on {self._fleet[node].name} GPU {gpu} applied", lambda: held.faults > before)
            held.health.monitor.read_kernel_log()
            held.health.monitor.publish()
        return held.kubelet.wait_unhealthy(uuid, since=started)

    def health_round(self, node: int) -> None:
        """One health round of the node's agent: checks, remediation (a GPU reset), probation."""
        health = self._nodes[node].health
        if health is not None:
            health.monitor.run_round()

    def health_snapshot(self, node: int) -> HealthSnapshot | None:
        """The node's device health as its agent's engine holds it (None: no health service)."""
        health = self._nodes[node].health
        return health.snapshot() if health is not None else None

    def gpu_served(self, node: int, gpu: int) -> bool:
        """After a round: whether the agent's health has the GPU Healthy again (what it publishes,
        and so what the extender sees)."""
        health = self._nodes[node].health
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        return health is not None and health.snapshot().state_of(uuid) is DeviceState.HEALTHY

    def gpu_back(self, node: int, gpu: int) -> float | None:
        """Seconds until the kubelet lists the GPU Healthy again, measured (None: not within 20 s,
        or the agent still withholds it)."""
        if not self.gpu_served(node, gpu):
            return None
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        return self._nodes[node].kubelet.wait_healthy(uuid, since=time.monotonic(), timeout=20.0)

    def efa_adapter(self, node: int) -> str | None:
        """The node's first EFA adapter (what an EFA link loss takes away), None without EFA."""
        return next((n.name for n in self._fleet[node].inventory.nics if n.type is NicType.EFA), None)

    def set_efa_present(self, node: int, adapter: str, *, present: bool) -> float | None:
        """The adapter disappears (or comes back) in the node's simulated sysfs; one health round
        runs; seconds until the kubelet sees it Unhealthy (or Healthy again), None if not in 5 s."""
        started = time.monotonic()
        self._nodes[node].backend.node.health.set_efa(adapter, present=present)
        self.health_round(node)
        kubelet = self._nodes[node].kubelet
        if present:
            return kubelet.wait_healthy(adapter, since=started)
        return kubelet.wait_unhealthy(adapter, since=started, timeout=5.0)

    def set_fabric_state(self, node: int, state: str) -> float | None:
        """The node's NVSwitch fabric goes to ``state`` in its simulated NVML (``failed``: a tray
        fault; ``completed``: back); the agent's fabric gate checks it once. Seconds until the
        kubelet sees every GPU of the node Unhealthy (``failed``) or Healthy again, None if not in 5 s."""
        started = time.monotonic()
        held = self._nodes[node]
        held.backend.node.health.set_fabric_state(state)
        if held.fabric is None:
            held.fabric = fabric_gate(held.agent, held.backend, interval_s=FABRIC_INTERVAL_S)
        held.fabric.check(held.agent.inventory)
        seen: list[float | None] = []
        for gpu in self._fleet[node].inventory.gpus:
            if state == "completed":
                seen.append(held.kubelet.wait_healthy(gpu.uuid, since=started))
            else:
                seen.append(held.kubelet.wait_unhealthy(gpu.uuid, since=started, timeout=5.0))
        return None if any(s is None for s in seen) else max(s for s in seen if s is not None)

    def inject_latent(
        self, node: int, gpus: Sequence[int], *, slow_nvlink: bool, share: float = SLOW_NVLINK_SHARE
    ) -> None:
        """A fault only an active check finds, in the node's simulated hardware (``gpuweave sim
        inject --bad-memory`` / ``--slow-nvlink``): a stuck memory cell 1 MiB into the GPU, or the
        NVLink pair of two GPUs at ``share`` of its rate (half its lanes)."""
        faults = self._nodes[node].backend.node.exerciser
        if slow_nvlink:
            faults.slow_pair(gpus[0], gpus[1], share=share)
        else:
            faults.add_bad_cell(gpus[0], LATENT_CELL)

    def active_check(
        self, node: int, gpus: Sequence[int], *, trigger: str, max_gpus: int, bandwidth: bool = False
    ) -> set[int]:
        """One active-check run of the node's agent (its runner, exerciser and health engine, as a
        check between jobs or a gang's preflight runs it), now; the GPUs it failed. The agent's
        health withholds them, as after any run; an NVLink pair it measured slow fails neither GPU
        but becomes one of the agent's degraded links (``degraded_pairs``)."""
        health = self._nodes[node].health
        if health is None or health.active is None or not gpus:
            return set()
        checks = BANDWIDTH_CHECKS if bandwidth else GPU_CHECKS
        run = health.active.run
        try:
            outcome = run(sorted(gpus), level=1, trigger=trigger, checks=checks, max_gpus=max_gpus)
        except ActiveCheckBusyError:  # the burn-in still runs: the next tick checks
            return set()
        failed = {g.index for g in outcome.gpus.values() if g.verdict == "failed"}
        # the agent tells its kubelet over ListAndWatch, a stream of its own: the run goes on once
        # the kubelet sees them withheld, whatever the machine's load
        settle(
            f"the kubelet of node {node} seeing GPUs {sorted(failed)} withheld",
            lambda: not any(self.gpu_healthy(node, gpu) for gpu in failed),
        )
        return failed

    def degraded_pairs(self, node: int) -> set[frozenset[int]]:
        """The NVLink pairs (GPU indices) the node's agent holds as degraded now (what it publishes)."""
        return {link.pair for link in self._nodes[node].agent.degraded_links()}

    def gpu_healthy(self, node: int, gpu: int) -> bool:
        """Whether the node's kubelet currently sees the GPU as Healthy (the agent's verdict)."""
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        return self._nodes[node].kubelet.healthy(uuid)

    def __len__(self) -> int:
        return len(self._nodes)

    def has(self, node: int) -> bool:
        """Whether the node runs an agent (every node, unless the pool is a sample)."""
        return node in self._nodes

    def close(self) -> None:
        """Stop every agent (several at once: a stop mostly waits for loops to notice), then
        remove the pool's files."""
        nodes, self._nodes = list(self._nodes.values()), {}
        if nodes:
            with ThreadPoolExecutor(max_workers=min(STOP_WORKERS, len(nodes))) as pool:
                for done in [pool.submit(_stop_node, node) for node in nodes]:
                    done.result()
        shutil.rmtree(self._root, ignore_errors=True)
