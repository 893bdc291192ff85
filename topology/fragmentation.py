"""GPU fragmentation with respect to a target workload, as the FGD paper (USENIX ATC '23) defines it.

A node's idle GPU capacity is only useful if the tasks that will arrive can use it. Given the
expected task mix M (shapes with probabilities), the fragment of node n is

    F_n(M) = sum_m p_m * F_n(m)

where F_n(m) is, in milli-GPU: all of the node's idle GPU when task m cannot run there (it asks for
no GPU, its GPU-type constraint excludes the node, or the node lacks CPU or enough GPUs with room),
else the idle GPU on the GPUs too small for m. Memory does not enter the measure. Placing a task
where the fragment grows least (fragmentation gradient descent) packs shared GPUs well; the
extender scores fractional requests with the same code (``FragmentModel``).

``node_fragment`` is the scalar reference; ``FragmentModel.fragment`` evaluates many node states at
once with numpy and must agree with it (tests check both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, order=True)
class TaskShape:
    """The resource shape of one task: what the fragmentation measure looks at.

    ``gpu_milli`` is per GPU (1000 = a whole GPU; below 1000 only with ``gpu_count == 1``);
    ``gpu_types`` is a ``|``-separated list of allowed GPU models, empty for any.
    """

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    gpu_types: str = ""

    @property
    def is_cpu_only(self) -> bool:
        return self.gpu_milli == 0 or self.gpu_count == 0

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    def allows_model(self, model: str) -> bool:
        """Whether a node whose GPUs are ``model`` satisfies the task's GPU-type constraint."""
        if not self.gpu_types:
            return True
        return bool(model) and model in self.gpu_types.split("|")


@dataclass(frozen=True)
class TargetWorkload:
    """The expected task mix: shapes and their probabilities (summing to 1).

    ``memory_mib`` optionally gives each shape's typical host memory; when present, a task only
    fits a node that also has that memory free (FGD's measure ignores memory; gpuweave's uses it).
    """

    shapes: tuple[TaskShape, ...]
    probabilities: tuple[float, ...]
    memory_mib: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.probabilities) or not self.shapes:
            raise InvalidInputError(
                f"target workload needs one probability per shape, got {len(self.shapes)} shapes "
                f"and {len(self.probabilities)} probabilities; pass at least one shape"
            )
        if self.memory_mib and len(self.memory_mib) != len(self.shapes):
            raise InvalidInputError(
                f"target workload has {len(self.shapes)} shapes but {len(self.memory_mib)} memory sizes"
            )

    @property
    def memory_aware(self) -> bool:
        return bool(self.memory_mib)


def typical_workload(tasks: Iterable[TaskShape], *, coverage: float = 0.95, step: int = 1) -> TargetWorkload:
    """The most popular task shapes covering ``coverage`` of all tasks, renormalised.

    Shapes are added ``step`` at a time in decreasing popularity (ties: larger shape first) until the
    covered share reaches ``coverage``, as the FGD artifact builds its target workload.
    """
    counts = Counter(tasks)
    total = sum(counts.values())
    if total == 0:
        raise InvalidInputError("cannot build a target workload from zero tasks; give the trace's pods")
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    kept: list[tuple[TaskShape, int]] = []
    covered = 0
    while covered < coverage * total and len(kept) < len(ranked):
        for shape, count in ranked[len(kept) : len(kept) + step]:
            kept.append((shape, count))
            covered += count
    return TargetWorkload(
        shapes=tuple(shape for shape, _ in kept),
        probabilities=tuple(count / covered for _, count in kept),
    )


def with_memory(workload: TargetWorkload, tasks: Iterable[tuple[TaskShape, int]]) -> TargetWorkload:
    """The same workload, each shape annotated with the median memory of the tasks of that shape."""
    sizes: dict[TaskShape, list[int]] = {}
    for shape, memory in tasks:
        sizes.setdefault(shape, []).append(memory)
    medians = tuple(int(np.median(sizes.get(shape, [0]))) for shape in workload.shapes)
    return TargetWorkload(workload.shapes, workload.probabilities, medians)


def task_fragment(
    *, cpu_free: int, gpu_free: Sequence[int], gpu_model: str, task: TaskShape, memory_fits: bool = True
) -> int:
    """F_n(m): the milli-GPU on one node that task ``task`` could not use."""
    idle = sum(gpu_free)
    if task.is_cpu_only or not task.allows_model(gpu_model) or cpu_free < task.cpu_milli or not memory_fits:
        return idle
    roomy = [free for free in gpu_free if free >= task.gpu_milli]
    if len(roomy) < task.gpu_count:
        return idle
    return idle - sum(roomy)


def node_fragment(
    *, cpu_free: int, gpu_free: Sequence[int], gpu_model: str, workload: TargetWorkload, memory_free: int = 0
) -> float:
    """F_n(M): the expected fragment of one node for the target workload (scalar reference).

    ``memory_free`` only matters for a memory-aware workload.
    """
    memory = workload.memory_mib or (0,) * len(workload.shapes)
    return sum(
        p
        * task_fragment(
            cpu_free=cpu_free,
            gpu_free=gpu_free,
            gpu_model=gpu_model,
            task=shape,
            memory_fits=not workload.memory_aware or memory_free >= needed,
        )
        for shape, p, needed in zip(workload.shapes, workload.probabilities, memory, strict=True)
    )


class FragmentModel:
    """Vectorised F_n(M) for many node states at once.

    Built once per (target workload, GPU model vocabulary); ``fragment`` then takes arrays:
    free CPU (K,), free milli-GPU per GPU slot (K, G) with empty slots as 0, model index (K,) and,
    for a memory-aware workload, free memory (K,).

    Tasks are grouped by their per-GPU request d. For one d, the idle GPU a node can offer is the
    sum of its GPUs with at least d free, and the probability that a task of that group fits
    depends only on (GPU model, how many GPUs have d free, which CPU levels fit). Without memory
    that probability is a precomputed table, so K states cost O(K x G x D), D distinct requests;
    with memory it is summed over the task shapes, O(K x M).
    """

    def __init__(self, workload: TargetWorkload, *, models: Sequence[str], max_gpus: int = 16) -> None:
        self.workload = workload
        self.models = tuple(models)
        self.max_gpus = max_gpus
        memory = workload.memory_mib or (0,) * len(workload.shapes)
        tasks = [
            (shape, p, mem)
            for shape, p, mem in zip(workload.shapes, workload.probabilities, memory, strict=True)
            if not shape.is_cpu_only
        ]
        thresholds = sorted({s.gpu_milli for s, _, _ in tasks}) or [MILLI_PER_GPU]
        self._thresholds = np.asarray(thresholds, dtype=np.int64)
        self._cpu_levels = np.asarray(sorted({s.cpu_milli for s, _, _ in tasks}), dtype=np.int64)
        self._group_of = np.asarray([thresholds.index(s.gpu_milli) for s, _, _ in tasks], dtype=np.int64)
        self._task_count = np.asarray([s.gpu_count for s, _, _ in tasks], dtype=np.int64)
        self._task_cpu = np.asarray([s.cpu_milli for s, _, _ in tasks], dtype=np.int64)
        self._task_memory = np.asarray([mem for _, _, mem in tasks], dtype=np.int64)
        self._task_weight = np.asarray([p for _, p, _ in tasks], dtype=np.float64)
        self._task_access = np.asarray(
            [[s.allows_model(model) for s, _, _ in tasks] for model in self.models], dtype=np.bool_
        ).reshape(len(self.models), len(tasks))
        self._group_matrix = (self._group_of[:, None] == np.arange(len(thresholds))[None, :]).astype(
            np.float64
        )
        self._table = self._fit_probability_table([(s, p) for s, p, _ in tasks])

    def _fit_probability_table(self, gpu_tasks: list[tuple[TaskShape, float]]) -> FloatArray:
        """P(task of request-group j fits | model, #GPUs with room, CPU level), times its share."""
        thresholds = [int(t) for t in self._thresholds]
        levels = [int(c) for c in self._cpu_levels]
        table = np.zeros((len(thresholds), len(self.models), self.max_gpus + 1, len(levels) + 1))
        for shape, p in gpu_tasks:
            j = thresholds.index(shape.gpu_milli)
            cpu_rank = levels.index(shape.cpu_milli) + 1
            for a, model in enumerate(self.models):
                if shape.allows_model(model) and shape.gpu_count <= self.max_gpus:
                    table[j, a, shape.gpu_count :, cpu_rank:] += p
        return table

    def model_index(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError as exc:
            raise InvalidInputError(
                f"GPU model {model!r} is not in the fragment model's vocabulary {list(self.models)}; "
                "build the FragmentModel with every model in the cluster"
            ) from exc

    def fragment(
        self,
        cpu_free: IntArray,
        gpu_free: IntArray,
        model_index: IntArray,
        memory_free: IntArray | None = None,
    ) -> FloatArray:
        """F_n(M) in milli-GPU for each of K node states.

        F depends on the GPUs' free amounts as a multiset, so rows are sorted and identical
        states (common: idle nodes of one type, equal GPUs of one node) are evaluated once.
        """
        if gpu_free.shape[1] > self.max_gpus:
            raise InvalidInputError(
                f"node states have {gpu_free.shape[1]} GPU slots; the fragment model was built for at "
                f"most {self.max_gpus}; pass a larger max_gpus"
            )
        if not self.workload.memory_aware:
            memory_free = np.zeros_like(cpu_free)
        elif memory_free is None:
            raise InvalidInputError("this target workload is memory-aware; pass the nodes' free memory")
        ordered = -np.sort(-gpu_free, axis=1)
        if len(ordered) < 64:
            return self._fragment_sorted(cpu_free, ordered, model_index, memory_free)
        keys = np.ascontiguousarray(
            np.column_stack((model_index, cpu_free, memory_free, ordered)).astype(np.int64)
        )
        row_bytes = np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))
        _, first, inverse = np.unique(keys.view(row_bytes).ravel(), return_index=True, return_inverse=True)
        unique = self._fragment_sorted(
            cpu_free[first], ordered[first], model_index[first], memory_free[first]
        )
        result: FloatArray = unique[inverse.ravel()]
        return result

    def _fragment_sorted(
        self, cpu_free: IntArray, ordered: IntArray, model_index: IntArray, memory_free: IntArray
    ) -> FloatArray:
        """F for states whose GPU columns are sorted in decreasing free amount."""
        prefix = np.zeros((ordered.shape[0], ordered.shape[1] + 1), dtype=np.int64)
        np.cumsum(ordered, axis=1, out=prefix[:, 1:])
        roomy_count = (ordered[:, :, None] >= self._thresholds[None, None, :]).sum(axis=1)  # (K, D)
        roomy_milli = np.take_along_axis(prefix, roomy_count, axis=1)  # (K, D)
        if self.workload.memory_aware:
            fit = self._fit_by_task(roomy_count, cpu_free, memory_free, model_index)
        else:
            cpu_rank = np.searchsorted(self._cpu_levels, cpu_free, side="right")
            groups = np.arange(len(self._thresholds))[None, :]
            fit = self._table[groups, model_index[:, None], roomy_count, cpu_rank[:, None]]  # (K, D)
        usable = (roomy_milli * fit).sum(axis=1)
        result: FloatArray = prefix[:, -1] - usable
        return result

    def _fit_by_task(
        self, roomy_count: IntArray, cpu_free: IntArray, memory_free: IntArray, model_index: IntArray
    ) -> FloatArray:
        fits = (
            (roomy_count[:, self._group_of] >= self._task_count[None, :])
            & (cpu_free[:, None] >= self._task_cpu[None, :])
            & (memory_free[:, None] >= self._task_memory[None, :])
            & self._task_access[model_index]
        )
        result: FloatArray = (fits * self._task_weight[None, :]) @ self._group_matrix
        return result
