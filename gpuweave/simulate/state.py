"""What the simulated cluster holds at one moment: allocations, GPU modes, MIG instances, pods.

``ClusterState`` (numpy) carries what schedulers look at; this adds what the node agents know:
which GPUs are withheld (health) or in MIG mode, the MIG instances on each GPU, and which pods
run where. Withheld and MIG-mode GPUs show 0 free milli-GPU to whole-GPU and share requests.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.workload import Job
from topology.fragmentation import FragmentModel


class GpuMode(IntEnum):
    NORMAL = 0
    MIG = 1
    WITHHELD = 2


@dataclass
class MigSlot:
    """One MIG instance on a GPU; ``pod`` is the pod using it, if any."""

    profile: str
    start: int
    size: int
    compute_slices: int
    pod: str | None = None


@dataclass
class RunningPod:
    pod_id: str
    job: Job
    node: int
    gpus: tuple[int, ...]
    request: Request | None  # None for a MIG pod
    started_s: float
    mig_gpu: int = -1


@dataclass
class SimState:
    fleet: tuple[FleetNode, ...]
    cluster: ClusterState
    modes: list[list[GpuMode]]
    mig_slots: dict[tuple[int, int], list[MigSlot]] = field(default_factory=dict)
    pods: dict[str, RunningPod] = field(default_factory=dict)
    efa_down: set[int] = field(default_factory=set)  # nodes whose EFA link is down
    fabric_down: set[int] = field(default_factory=set)  # trays whose NVLink fabric failed (no new pods)
    # rows with no machine now (``node_left``): a reserve row no scale-up filled, or a machine gone
    absent: set[int] = field(default_factory=set)
    # pod IDs by job and by node, in start order (as ``pods`` holds them): lookups without a scan
    _by_job: dict[str, dict[str, None]] = field(default_factory=dict, repr=False)
    _by_node: dict[int, dict[str, None]] = field(default_factory=dict, repr=False)
    # per node, a count of changes to its pods and GPU modes (what a cached dry run depends on)
    _node_changes: dict[int, int] = field(default_factory=dict, repr=False)

    @classmethod
    def create(
        cls, fleet: Sequence[FleetNode], metric_model: FragmentModel, *, absent: Collection[int] = ()
    ) -> SimState:
        """The cluster of ``fleet``; the rows ``absent`` names hold no machine yet (``node_joined``)."""
        specs = [_spec(n) for n in fleet]
        modes = [[GpuMode.NORMAL] * n.gpus for n in fleet]
        state = cls(tuple(fleet), ClusterState(specs, metric_model), modes)
        for row in sorted(absent):
            state.node_left(row)
        return state

    def present(self, node: int) -> bool:
        return node not in self.absent

    def node_left(self, node: int) -> None:
        """The machine of row ``node`` is gone (its pods stopped before): no capacity, no GPUs."""
        if self.pods_on(node):
            raise InvalidInputError(f"node {self.fleet[node].name} still runs pods; drain it first")
        self.absent.add(node)
        self.modes[node] = []
        self.efa_down.discard(node)
        self.fabric_down.discard(node)
        for key in [k for k in self.mig_slots if k[0] == node]:
            del self.mig_slots[key]
        self.cluster.set_node(node, None)
        self._changed(node)

    def node_joined(self, node: int, machine: FleetNode) -> None:
        """A new machine takes the empty row ``node``: its GPUs normal and free."""
        if node not in self.absent:
            raise InvalidInputError(f"row {node} still holds {self.fleet[node].name}")
        self.absent.discard(node)
        self.fleet = (*self.fleet[:node], machine, *self.fleet[node + 1 :])
        self.modes[node] = [GpuMode.NORMAL] * machine.gpus
        self.cluster.set_node(node, _spec(machine))
        self._changed(node)

    def full_free_gpus(self, node: int) -> frozenset[int]:
        """GPUs of ``node`` (by index) that are normal, healthy and entirely free."""
        free = self.cluster.gpu_free[node]
        return frozenset(
            g
            for g, mode in enumerate(self.modes[node])
            if mode is GpuMode.NORMAL and free[g] == MILLI_PER_GPU
        )

    @property
    def node_versions(self) -> Mapping[int, int]:
        """Per node, the changes so far to its pods and GPU modes (absent: 0): equal numbers, the
        same node state."""
        return self._node_changes

    def _changed(self, node: int) -> None:
        self._node_changes[node] = self._node_changes.get(node, 0) + 1

    def pods_on(self, node: int) -> list[RunningPod]:
        """The pods running on ``node``, in start order."""
        return [self.pods[i] for i in self._by_node.get(node, ())]

    def pods_on_gpu(self, node: int, gpu: int) -> list[RunningPod]:
        on_node = (self.pods[i] for i in self._by_node.get(node, ()))
        return [p for p in on_node if gpu in p.gpus or p.mig_gpu == gpu]

    def pods_of_job(self, job_id: str) -> list[RunningPod]:
        return [self.pods[i] for i in self._by_job.get(job_id, ())]

    def start_pod(self, pod: RunningPod) -> None:
        """Every pod starts here (whole-GPU, share and MIG pods alike) and ends in ``stop_pod``."""
        if pod.request is not None:
            self.cluster.place(pod.node, pod.gpus, pod.request)
        self.pods[pod.pod_id] = pod
        self._changed(pod.node)
        self._by_job.setdefault(pod.job.job_id, {})[pod.pod_id] = None
        self._by_node.setdefault(pod.node, {})[pod.pod_id] = None

    def stop_pod(self, pod_id: str) -> RunningPod:
        pod = self.pods.pop(pod_id)
        self._changed(pod.node)
        _forget(self._by_job, pod.job.job_id, pod_id)
        _forget(self._by_node, pod.node, pod_id)
        if pod.request is not None:
            self.cluster.release(pod.node, pod.gpus, pod.request)
        else:
            for slot in self.mig_slots.get((pod.node, pod.mig_gpu), []):
                if slot.pod == pod_id:
                    slot.pod = None
        return pod

    def set_mode(self, node: int, gpu: int, mode: GpuMode) -> None:
        """Switch a GPU's mode; the GPU must hold no whole-GPU or share pods."""
        self.modes[node][gpu] = mode
        self._changed(node)
        visible = MILLI_PER_GPU if mode is GpuMode.NORMAL else 0
        self.cluster.set_gpu_free(node, gpu, visible)

    def healthy_gpus(self) -> int:
        return sum(1 for modes in self.modes for m in modes if m is not GpuMode.WITHHELD)

    def used_gpu_milli(self) -> float:
        """Allocated milli-GPU: whole and share allocations plus MIG compute slices in use."""
        used = 0.0
        for node, modes in enumerate(self.modes):
            for gpu, mode in enumerate(modes):
                if mode is GpuMode.NORMAL:
                    used += MILLI_PER_GPU - int(self.cluster.gpu_free[node, gpu])
                elif mode is GpuMode.MIG:
                    slots = self.mig_slots.get((node, gpu), [])
                    used += sum(s.compute_slices for s in slots if s.pod) * MILLI_PER_GPU / 7
        return used


def _spec(node: FleetNode) -> NodeSpec:
    return NodeSpec(node.name, node.cpu_milli, node.memory_mib, node.gpus, node.profile)


def _forget(index: dict[Any, dict[str, None]], key: object, pod_id: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.pop(pod_id, None)
        if not ids:
            del index[key]
