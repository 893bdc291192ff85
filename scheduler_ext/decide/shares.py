"""Fractional and time-sliced GPU shares, placed FGD-style (fragmentation gradient descent).

A container's share units all come from one GPU. One rule picks the GPU for both share kinds and
for the node agent's local fallback: the GPU where the node's fragment for the expected workload
grows least, ties to the tightest fit (least room left), then the lowest index. Time-sliced
replicas have no fragment measure (a replica is a turn, not a size), so only the tightest fit
applies. The node's share quality is FGD's: how little the placement (all of the pod's share
containers together) fragments the node, increases within ``TOLERANCE_MILLI`` counted equal,
then packing (less idle GPU left) among equals. ``quality`` is what prioritize ranks nodes by.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from devicemodel.share_rule import tightest_gpu
from devicemodel.sharing import COMPUTE_UNITS_PER_GPU, MILLI_PER_GPU, SharingMode
from scheduler_ext.decide.layout import NodeLayout
from scheduler_ext.decide.state import FreeState, ShareUse, share_capacity
from scheduler_ext.decide.verdict import ContainerPlan, PlanStep, Verdict, fail, unresolvable
from scheduler_ext.pods.host import NO_HOST, HostRequest
from scheduler_ext.pods.requests import ContainerRequest, PodRequest
from topology.fragmentation import FragmentModel, TargetWorkload, TaskShape

# Fragment increases closer than this (milli-GPU) are ties: the measure's noise is not signal.
# Chosen on seeds 42..51 of the default trace for the simulator policy this scorer replaced.
TOLERANCE_MILLI = 40.0
UNLIMITED = 1 << 40  # host CPU or memory of a node that publishes no allocatable: never limits

# Expected mix of share requests (milli-GPU) for callers that give no workload.
DEFAULT_SHARE_WORKLOAD = TargetWorkload(
    shapes=tuple(TaskShape(cpu_milli=0, gpu_milli=m, gpu_count=1) for m in (100, 250, 500, 1000)),
    probabilities=(0.2, 0.3, 0.3, 0.2),
)


class FragmentModels:
    """The mix's fragment models per GPU product (type constraints are per product), built on use.

    Memory-aware: a shape fits a node only with its typical host memory free as well (FGD's
    measure ignores memory; GPUs stranded by spent host memory are fragment all the same).
    ``typed`` is the part of the mix whose shapes name GPU models, as (its own model, its mass):
    F over a subset of shapes of total probability q is q times F of that subset renormalised.
    That part of an increase is compared exactly, never rounded into a tie: spending a GPU model
    that type-bound tasks depend on is not noise.
    """

    def __init__(self, workload: TargetWorkload) -> None:
        memory = workload.memory_mib or (0,) * len(workload.shapes)
        self._aware = TargetWorkload(workload.shapes, workload.probabilities, memory)
        typed = [
            (s, p, m)
            for s, p, m in zip(workload.shapes, workload.probabilities, memory, strict=True)
            if s.gpu_types and not s.is_cpu_only
        ]
        self._mass = sum(p for _, p, _ in typed)
        self._typed = (
            TargetWorkload(
                tuple(s for s, _, _ in typed),
                tuple(p / self._mass for _, p, _ in typed),
                tuple(m for *_, m in typed),
            )
            if typed and self._mass > 0
            else None
        )
        self._full: dict[str, FragmentModel] = {}
        self._typed_models: dict[str, FragmentModel] = {}

    def __call__(self, product: str) -> FragmentModel:
        model = self._full.get(product)
        if model is None:
            model = self._full[product] = FragmentModel(self._aware, models=(product,), max_gpus=64)
        return model

    def typed(self, product: str) -> tuple[FragmentModel, float] | None:
        if self._typed is None:
            return None
        model = self._typed_models.get(product)
        if model is None:
            model = self._typed_models[product] = FragmentModel(self._typed, models=(product,), max_gpus=64)
        return model, self._mass


ModelFor = FragmentModels


def fragment_models(workload: TargetWorkload) -> FragmentModels:
    return FragmentModels(workload)


def plan_share_containers(
    *,
    request: PodRequest,
    layout: NodeLayout,
    free: FreeState,
    eligible: frozenset[int],
    models: ModelFor | None = None,
    host: HostRequest = NO_HOST,
    host_free: HostRequest | None = None,
) -> PlanStep | Verdict:
    wanting = [c for c in request.containers if c.wants_share]
    if not wanting:
        return PlanStep()
    use = dict(free.share_use)
    model_for = models or fragment_models(DEFAULT_SHARE_WORKLOAD)
    before = host_free or (UNLIMITED, UNLIMITED)
    hosts = (before, (before[0] - host[0], before[1] - host[1]))  # the node's host left, then after
    plans: dict[str, ContainerPlan] = {}
    qualities: list[float] = []  # time-sliced fill ratios
    fractional = False
    for container in sorted(wanting, key=lambda c: (-c.compute, -c.memory_gib, -c.shared, c.name)):
        mode = SharingMode.TIME_SLICED if container.shared else SharingMode.FRACTIONAL
        roomy = _roomy(container, mode, layout=layout, eligible=eligible, use=use)
        if isinstance(roomy, Verdict):
            return roomy
        if mode is SharingMode.TIME_SLICED:
            left = {i: share_capacity(layout, i).replicas - use[i].replicas for i in roomy}
            chosen = tightest_gpu(left, container.shared, index={i: i for i in roomy}) or roomy[0]
            capacity = share_capacity(layout, chosen).replicas
            qualities.append(1.0 - (left[chosen] - container.shared) / capacity)  # fill after
        else:
            chosen = _fgd_choice(container, roomy, use, layout=layout, model_for=model_for, host=hosts[1])
            fractional = True
        use[chosen] = ShareUse(
            use[chosen].compute + container.compute,
            use[chosen].memory + container.memory_gib,
            use[chosen].replicas + container.shared,
        )
        plans[container.name] = ContainerPlan(
            name=container.name,
            share_gpu=chosen,
            compute=container.compute,
            memory=container.memory_gib,
            replicas=container.shared,
        )
    if not fractional:
        return PlanStep(plans=plans, quality=sum(qualities) / len(qualities))
    level, idle = _fgd_level(layout, free, use, model_for=model_for, hosts=hosts)
    if qualities:  # time-sliced containers too: their fill ratio averages in, no level
        qualities.append(quality_of(level, idle))
        return PlanStep(plans=plans, quality=sum(qualities) / len(qualities))
    return PlanStep(plans=plans, quality=quality_of(level, idle), level=level, idle=idle)


def _roomy(
    container: ContainerRequest,
    mode: SharingMode,
    *,
    layout: NodeLayout,
    eligible: frozenset[int],
    use: dict[int, ShareUse],
) -> list[int] | Verdict:
    """The GPUs of the container's share mode with room for it, or why there are none."""
    capable = [g.index for g in layout.gpus if g.mode is mode and g.index in eligible and not g.mig_enabled]
    impossible = _impossible(container, mode, capable, layout, healthy=set(use))
    if impossible is not None:
        return unresolvable(impossible)
    roomy = [i for i in capable if i in use and _fits(container, layout, i, use[i])]
    if not roomy:
        return fail(f"container {container.name!r}: no {mode.value} GPU has {_describe(container)} free")
    return roomy


def _impossible(
    container: ContainerRequest,
    mode: SharingMode,
    capable: list[int],
    layout: NodeLayout,
    *,
    healthy: set[int],
) -> str | None:
    if not capable:
        return f"container {container.name!r} asks for GPU shares; node offers no {mode.value} GPU"
    if not any(i in healthy for i in capable):
        return f"container {container.name!r}: every {mode.value} GPU on the node is withheld as unhealthy"
    if not any(_fits(container, layout, i, ShareUse()) for i in capable):
        return f"container {container.name!r} asks for {_describe(container)}; more than one GPU offers"
    return None


def _fits(container: ContainerRequest, layout: NodeLayout, gpu: int, used: ShareUse) -> bool:
    total = share_capacity(layout, gpu)
    return (
        used.compute + container.compute <= total.compute
        and used.memory + container.memory_gib <= total.memory
        and used.replicas + container.shared <= total.replicas
    )


def _describe(container: ContainerRequest) -> str:
    if container.shared:
        return f"{container.shared} time-sliced replicas"
    return f"{container.compute}% compute and {container.memory_gib} GiB memory"


def _milli(compute_units: int) -> int:
    return compute_units * MILLI_PER_GPU // COMPUTE_UNITS_PER_GPU


def _frees(layout: NodeLayout, use: dict[int, ShareUse]) -> dict[int, int]:
    """Free milli-GPU of the node's fractional GPUs (healthy ones: ``use`` holds only those)."""
    return {
        i: _milli(COMPUTE_UNITS_PER_GPU - u.compute)
        for i, u in use.items()
        if layout.gpu_by_index[i].mode is SharingMode.FRACTIONAL
    }


def _product(layout: NodeLayout) -> str:
    return layout.gpus[0].attributes.product_name if layout.gpus else ""


def _fragments(model: FragmentModel, rows: list[list[int]], hosts: list[HostRequest]) -> np.ndarray:
    """F per node state: GPU frees in ``rows``, host (CPU, memory) left in ``hosts``."""
    gpu_free = np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)
    host = np.asarray(hosts, dtype=np.int64).reshape(len(rows), 2)
    return model.fragment(host[:, 0], gpu_free, np.zeros(len(rows), dtype=np.int64), host[:, 1])


def _fgd_choice(
    container: ContainerRequest,
    roomy: list[int],
    use: dict[int, ShareUse],
    *,
    layout: NodeLayout,
    model_for: ModelFor,
    host: HostRequest,
) -> int:
    """The GPU where the node's fragment grows least; ties: tightest fit, then lowest index."""
    frees = _frees(layout, use)
    order = sorted(frees)
    rows = []
    for index in roomy:
        after = dict(frees)
        after[index] -= _milli(container.compute)
        rows.append([after[i] for i in order])
    fragments = _fragments(model_for(_product(layout)), rows, [host] * len(rows))
    best = min(
        range(len(roomy)),
        key=lambda k: (round(float(fragments[k]), 6), frees[roomy[k]], roomy[k]),
    )
    return roomy[best]


def _fgd_level(
    layout: NodeLayout,
    free: FreeState,
    use: dict[int, ShareUse],
    *,
    model_for: ModelFor,
    hosts: tuple[HostRequest, HostRequest],
) -> tuple[float, float]:
    """A share placement's fragment level and the idle milli-GPU it leaves (``quality_of``)."""
    before = _frees(layout, dict(free.share_use))
    return _level(model_for, _product(layout), before, _frees(layout, use), hosts)


def host_only_level(
    layout: NodeLayout | None, free: FreeState, *, model_for: ModelFor, hosts: tuple[HostRequest, HostRequest]
) -> tuple[float, float]:
    """Placing a pod that asks for no device: what its CPU and memory take from the tasks the
    node's idle GPUs (shares and whole) could still serve. A node without GPUs loses nothing, so
    it ranks best: CPU pods stay off GPU nodes when they can."""
    if layout is None or not layout.gpus:
        return _level(None, "", {}, {}, hosts)
    frees = _frees(layout, dict(free.share_use)) | dict.fromkeys(free.free_gpus, MILLI_PER_GPU)
    return _level(model_for, _product(layout), frees, frees, hosts)


def node_fragment(
    layout: NodeLayout | None, free: FreeState, *, model_for: ModelFor, host_free: HostRequest | None
) -> tuple[float, float]:
    """(F_n(M), idle milli-GPU) of a node as it stands: the fragment the scorer weighs, over the
    same GPUs it counts for host-only pods (free whole GPUs and fractional GPUs' free compute;
    MIG and time-sliced GPUs have no fragment measure). ``gpuweave status`` reports it."""
    if layout is None or not layout.gpus:
        return 0.0, 0.0
    frees = _frees(layout, dict(free.share_use)) | dict.fromkeys(free.free_gpus, MILLI_PER_GPU)
    if not frees:
        return 0.0, 0.0
    order = sorted(frees)
    host = host_free or (UNLIMITED, UNLIMITED)
    values = _fragments(model_for(_product(layout)), [[frees[i] for i in order]], [host])
    return float(values[0]), float(sum(frees.values()))


def _level(
    models: FragmentModels | None,
    product: str,
    before: dict[int, int],
    after: dict[int, int],
    hosts: tuple[HostRequest, HostRequest],
) -> tuple[float, float]:
    """The fragment increase, its untyped part within ``TOLERANCE_MILLI`` counted equal and its
    typed part exact (``FragmentModels``), and the idle GPU left."""
    if models is None or not before:
        return 0.0, float(sum(after.values()))
    order = sorted(before)
    rows = [[before[i] for i in order], [after[i] for i in order]]
    values = _fragments(models(product), rows, list(hosts))
    delta = float(values[1] - values[0])
    typed_delta = 0.0
    typed = models.typed(product)
    if typed is not None:
        typed_values = _fragments(typed[0], rows, list(hosts))
        typed_delta = typed[1] * float(typed_values[1] - typed_values[0])
    rounded = round((delta - typed_delta) / TOLERANCE_MILLI) * TOLERANCE_MILLI
    return round(rounded + typed_delta, 6), float(sum(after.values()))


def quality_of(level: Any, idle: Any) -> Any:
    """0..1, higher for a smaller fragment increase (FGD's sigmoid), then for less idle GPU left
    (packing among equals: a tiny term, below the gap between two fragment levels). Floats or
    numpy arrays (prioritize re-ranks a whole node list at once)."""
    return 1.0 / (1.0 + np.exp(np.asarray(level) / MILLI_PER_GPU)) - 1e-7 * np.asarray(idle) / (
        MILLI_PER_GPU * 64
    )
