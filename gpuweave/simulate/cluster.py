"""A cluster's allocatable state as numpy arrays, for fast placement experiments.

One row per node: free CPU (milli), free memory (MiB), free milli-GPU per GPU slot (padded with 0
past the node's GPU count), GPU model index. The per-node fragment F_n(M) for the target workload
is kept up to date on every placement, so cluster fragmentation is a running sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from topology.fragmentation import BoolArray, FloatArray, FragmentModel, IntArray, TaskShape


@dataclass(frozen=True)
class NodeSpec:
    """What a node offers to the scheduler (a trace row or a built-in profile)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Request:
    """What a pod asks for: CPU, memory, and GPUs (``gpu_milli`` per GPU)."""

    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_types: str = ""

    @property
    def shape(self) -> TaskShape:
        return TaskShape(self.cpu_milli, self.gpu_milli, self.gpu_count, self.gpu_types)

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI_PER_GPU


class ClusterState:
    """Mutable allocatable state of every node; ``place`` and ``release`` keep it consistent."""

    def __init__(self, nodes: Sequence[NodeSpec], fragment_model: FragmentModel) -> None:
        if not nodes:
            raise InvalidInputError("a cluster needs at least one node")
        slots = max(n.gpus for n in nodes)
        self.names = [n.name for n in nodes]
        self.models = fragment_model.models
        self.fragment_model = fragment_model
        self.model_index: IntArray = np.asarray(
            [fragment_model.model_index(n.model) for n in nodes], dtype=np.int64
        )
        self.gpu_count: IntArray = np.asarray([n.gpus for n in nodes], dtype=np.int64)
        self.cpu_capacity: IntArray = np.asarray([n.cpu_milli for n in nodes], dtype=np.int64)
        self.memory_capacity: IntArray = np.asarray([n.memory_mib for n in nodes], dtype=np.int64)
        self.cpu_free = self.cpu_capacity.copy()
        self.memory_free = self.memory_capacity.copy()
        present = np.arange(slots)[None, :] < self.gpu_count[:, None]
        self.gpu_free: IntArray = np.where(present, MILLI_PER_GPU, 0).astype(np.int64)
        self.total_gpu_milli = int(self.gpu_count.sum()) * MILLI_PER_GPU
        self.node_fragment: FloatArray = fragment_model.fragment(
            self.cpu_free, self.gpu_free, self.model_index, self.memory_free
        )
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)  # bumped on every change
        self._access_cache: dict[str, BoolArray] = {}

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def used_gpu_milli(self) -> int:
        return self.total_gpu_milli - int(self.gpu_free.sum())

    def model_allows(self, gpu_types: str) -> BoolArray:
        """Nodes whose GPU model satisfies a ``|``-separated constraint (all nodes when empty)."""
        if gpu_types not in self._access_cache:
            allowed = TaskShape(0, 1, 1, gpu_types)
            per_model = np.asarray([allowed.allows_model(m) for m in self.models], dtype=np.bool_)
            self._access_cache[gpu_types] = per_model[self.model_index]
        return self._access_cache[gpu_types]

    def feasible(self, request: Request) -> BoolArray:
        """Nodes where the request fits now (CPU, memory, GPU type, enough GPUs with room)."""
        fits = (self.cpu_free >= request.cpu_milli) & (self.memory_free >= request.memory_mib)
        if request.gpu_count > 0:
            roomy = (self.gpu_free >= request.gpu_milli).sum(axis=1)
            fits &= (roomy >= request.gpu_count) & self.model_allows(request.gpu_types)
        return fits

    def exclusive_gpus(self, node: int, count: int) -> list[int]:
        """The lowest-indexed fully free GPUs (the default whole-GPU choice)."""
        free = np.flatnonzero(self.gpu_free[node] == MILLI_PER_GPU)
        if len(free) < count:
            raise InvalidInputError(f"node {self.names[node]} has {len(free)} free GPUs, {count} asked")
        return [int(g) for g in free[:count]]

    def set_node(self, node: int, spec: NodeSpec | None) -> None:
        """A machine joins row ``node`` (``spec``) or leaves it (None: a row of no capacity, which
        no request fits). The row must be free of pods; the GPU slots padded as at creation."""
        gpus, cpu, memory = (spec.gpus, spec.cpu_milli, spec.memory_mib) if spec else (0, 0, 0)
        if gpus > self.gpu_free.shape[1]:
            name = spec.name if spec else ""
            raise InvalidInputError(f"node {name} has more GPUs than the cluster's GPU slots")
        self.total_gpu_milli += (gpus - int(self.gpu_count[node])) * MILLI_PER_GPU
        if spec is not None:
            self.names[node] = spec.name
            self.model_index[node] = self.fragment_model.model_index(spec.model)
        self.gpu_count[node] = gpus
        self.cpu_capacity[node] = self.cpu_free[node] = cpu
        self.memory_capacity[node] = self.memory_free[node] = memory
        self.gpu_free[node] = np.where(np.arange(self.gpu_free.shape[1]) < gpus, MILLI_PER_GPU, 0)
        self._access_cache.clear()
        self._refresh(node)

    def set_gpu_free(self, node: int, gpu: int, free_milli: int) -> None:
        """Show a GPU as having ``free_milli`` free (0 withholds it from every request)."""
        self.gpu_free[node, gpu] = free_milli
        self._refresh(node)

    def place(self, node: int, gpus: Sequence[int], request: Request) -> None:
        self._apply(node, gpus, request, sign=-1)

    def release(self, node: int, gpus: Sequence[int], request: Request) -> None:
        self._apply(node, gpus, request, sign=+1)

    def _apply(self, node: int, gpus: Sequence[int], request: Request, *, sign: int) -> None:
        """Add (release) or subtract (place) a request; refused whole if it would over-commit."""
        if len(gpus) != request.gpu_count or len(set(gpus)) != len(gpus):
            raise InvalidInputError(f"request for {request.gpu_count} GPUs given GPU slots {list(gpus)}")
        cpu = self.cpu_free[node] + sign * request.cpu_milli
        memory = self.memory_free[node] + sign * request.memory_mib
        gpu_free = self.gpu_free[node].copy()
        gpu_free[list(gpus)] += sign * request.gpu_milli
        if cpu < 0 or memory < 0 or (gpu_free < 0).any() or (gpu_free > MILLI_PER_GPU).any():
            raise InvalidInputError(
                f"placing {request} on node {self.names[node]} GPUs {list(gpus)} would over-commit it; "
                "the scheduler's view and the node's disagree"
            )
        self.cpu_free[node], self.memory_free[node], self.gpu_free[node] = cpu, memory, gpu_free
        self._refresh(node)

    def _refresh(self, node: int) -> None:
        self.version[node] += 1
        rows = slice(node, node + 1)
        self.node_fragment[node] = self.fragment_model.fragment(
            self.cpu_free[rows], self.gpu_free[rows], self.model_index[rows], self.memory_free[rows]
        )[0]
