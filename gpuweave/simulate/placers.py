"""Schedulers the simulation can drive: node choice plus the GPU set on the chosen node.

``gpuweave`` is the real extender (``extender_client.ExtenderPlacer``, built by the runner), not
a placer here; ``go-gpuallocator-like`` is what a cluster gets with kube-scheduler's default
spreading and NVIDIA's best-effort allocator; ``random`` and ``best-fit`` are the FGD artifact's
baselines (``baselines``; best-fit's ties go to the lowest rank of one random node order per seed)
and take the lowest-indexed free GPUs for a multi-GPU pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from gpuweave.simulate.cluster import ClusterState, Request
from gpuweave.simulate.fgd.baselines import ArtifactBestFit, ArtifactRandom, random_node_rank
from gpuweave.simulate.fgd.policies import Placement, PlacementPolicy, default_gpus, pick_top
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.state import SimState
from topology.baselines import go_gpuallocator_like
from topology.fragmentation import IntArray

SIMULATE_POLICIES = ("gpuweave", "random", "best-fit", "go-gpuallocator-like")
GpuChooser = Callable[[FleetNode, frozenset[int], int], tuple[int, ...]]


@dataclass(frozen=True)
class PodPlacement:
    node: int
    gpus: tuple[int, ...]
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # resource -> device IDs


@dataclass(frozen=True)
class Gang:
    """The job a pod belongs to, as its pod says it: a training job names its gang
    (``gpuweave.io/gang`` + size; a one-pod job is a gang of one), any other job of a priority
    above 0 only carries that priority (``named`` False: an ordinary pod)."""

    name: str
    size: int
    priority: int = 0  # the members' PriorityClass value
    tier: str = ""  # the tier label one domain of which must hold every member (gpuweave.io/gang-tier)
    named: bool = True  # the pods carry gpuweave.io/gang + gpuweave.io/gang-size
    duration_s: float = 0.0  # its drawn run time, on its pods as gpuweave.io/expected-duration (0: none)


@runtime_checkable
class Preemptor(Protocol):
    """A scheduler that preempts after a failed cycle, as kube-scheduler's DefaultPreemption."""

    def preempt(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        priority: int,
    ) -> list[str]:
        """The pods to evict so the pod whose cycle just failed can be placed ([]: none helps)."""
        ...


@runtime_checkable
class InventoryWatcher(Protocol):
    """A scheduler that reads the ``GpuNodeInventory`` objects node agents publish (its watch)."""

    def receive_inventory(self, node: int, obj: Mapping[str, Any]) -> None: ...


@runtime_checkable
class PodWatcher(Protocol):
    """A scheduler that watches pods as the API server's watch delivers them: a job's pods created
    (pending) before any of them is scheduled, and a pod's eviction (its ``DisruptionTarget``
    condition, whose reason says a preemption from any other eviction) before its delete
    (``Placer.forget``)."""

    def created(self, pod_ids: Sequence[str], request: Request, gang: Gang) -> None: ...

    def evicted(self, pod_id: str, *, preempted: bool = False) -> None: ...


@runtime_checkable
class TierDecider(Protocol):
    """A scheduler whose gangs may wait for their tightest network tier (the extender's
    ``gangs.tier_cost``): how many waited, and how many took a looser tier instead."""

    def tier_decisions(self) -> dict[str, int] | None: ...


@runtime_checkable
class NodeWatcher(Protocol):
    """A scheduler with a view of its own of the cluster's nodes (the extender's cache): told when
    a machine joins a row and when one leaves (the Node watch). Baselines read the shared state."""

    def node_joined(self, node: int, machine: FleetNode, *, shared: bool, inventory: bool) -> None: ...

    def node_left(self, node: int) -> None: ...


@runtime_checkable
class SimulatedTime(Protocol):
    """A scheduler with timers of its own (the extender's gang TTL), run on the simulated clock."""

    def set_time(self, now_s: float) -> None: ...


@runtime_checkable
class MigPlacer(Protocol):
    """A scheduler that also places MIG pods on the MIG devices node agents publish."""

    def place_mig(
        self, profile: str, *, allowed: np.ndarray, rng: np.random.Generator, pod_id: str
    ) -> PodPlacement | None: ...

    def publish_inventory(self, node: int, inventory: NodeInventory) -> None: ...


class Placer(Protocol):
    """A scheduler: where a pod goes; told when pods leave and GPUs fail or come back.

    ``gpu_failed``/``gpu_restored`` are the simulation's own knowledge of a fault; with node agents
    the gpuweave extender is never told through them: it reads the agents' published inventories
    (``InventoryWatcher``). Baselines that are not the product read the shared state directly.
    """

    name: str
    transport: str

    def place(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        rng: np.random.Generator,
        pod_id: str = "",
        gang: Gang | None = None,
    ) -> PodPlacement | None: ...

    def forget(self, pod_id: str) -> None: ...

    def gpu_failed(self, node: int, gpu: int, reason: str) -> None: ...

    def gpu_restored(self, node: int, gpu: int) -> None: ...

    def gpu_mode_changed(self, node: int, gpu: int, *, mig: bool) -> None: ...

    def close(self) -> None: ...


class LeastAllocatedPolicy:
    """kube-scheduler's default NodeResourcesFit scoring: prefer the emptiest node (spreading)."""

    name = "least-allocated"

    def choose(
        self, cluster: ClusterState, request: Request, candidates: IntArray, rng: np.random.Generator
    ) -> Placement:
        gpu_capacity = np.maximum(cluster.gpu_count[candidates], 1) * 1000
        free = (
            cluster.cpu_free[candidates] / cluster.cpu_capacity[candidates]
            + cluster.memory_free[candidates] / cluster.memory_capacity[candidates]
            + cluster.gpu_free[candidates].sum(axis=1) / gpu_capacity
        )
        node = int(candidates[pick_top(np.floor(free / 3 * 100), rng)])
        return Placement(node, default_gpus(cluster, node, request))


def lowest_index(_: FleetNode, available: frozenset[int], size: int) -> tuple[int, ...]:
    return tuple(sorted(available)[:size])


def go_allocator(node: FleetNode, available: frozenset[int], size: int) -> tuple[int, ...]:
    """go-gpuallocator's best-effort set; where it would return padding (nil devices, which its
    callers cannot use), the lowest free GPUs."""
    chosen = go_gpuallocator_like(node.graph, available=available, size=size)
    return chosen if chosen is not None else lowest_index(node, available, size)


class InProcessPlacer:
    """A node policy and a GPU-set chooser, called directly (no HTTP). It reads the shared state,
    so pod departures and GPU faults need no notification."""

    transport = "in-process"

    def __init__(self, name: str, node_policy: PlacementPolicy, gpu_chooser: GpuChooser) -> None:
        self.name = name
        self._node_policy = node_policy
        self._gpu_chooser = gpu_chooser

    def forget(self, pod_id: str) -> None:
        return None

    def gpu_failed(self, node: int, gpu: int, reason: str) -> None:
        return None

    def gpu_restored(self, node: int, gpu: int) -> None:
        return None

    def gpu_mode_changed(self, node: int, gpu: int, *, mig: bool) -> None:
        return None

    def close(self) -> None:
        return None

    def place(
        self,
        state: SimState,
        request: Request,
        *,
        allowed: np.ndarray,
        rng: np.random.Generator,
        pod_id: str = "",
        gang: Gang | None = None,
    ) -> PodPlacement | None:
        candidates = np.flatnonzero(state.cluster.feasible(request) & allowed)
        if len(candidates) == 0:
            return None
        choice = self._node_policy.choose(state.cluster, request, candidates, rng)
        gpus = choice.gpus
        if request.gpu_count >= 2:
            available = state.full_free_gpus(choice.node)
            gpus = self._gpu_chooser(state.fleet[choice.node], available, request.gpu_count)
        return PodPlacement(choice.node, gpus)


def make_placer(name: str, *, node_count: int, seed: int) -> InProcessPlacer:
    """A baseline scheduler for a run of ``node_count`` nodes (gpuweave itself runs through the
    extender: ``ExtenderPlacer``); ``seed`` draws best-fit's node tie order."""
    if name == "random":
        return InProcessPlacer(name, ArtifactRandom(), lowest_index)
    if name == "best-fit":
        return InProcessPlacer(name, ArtifactBestFit(random_node_rank(node_count, seed=seed)), lowest_index)
    if name == "go-gpuallocator-like":
        return InProcessPlacer(name, LeastAllocatedPolicy(), go_allocator)
    baselines = ", ".join(p for p in SIMULATE_POLICIES if p != "gpuweave")
    raise InvalidInputError(f"no in-process placer {name!r}; choose from {baselines}")
