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

import math
from collections.abc import Callable

import numpy as np

from scheduler_ext.layout import COMPUTE_UNITS_PER_GPU, NodeLayout, ShareMode
from scheduler_ext.requests import ContainerRequest, PodRequest
from scheduler_ext.state import FreeState, ShareUse, share_capacity
from scheduler_ext.verdict import ContainerPlan, PlanStep, Verdict, fail, unresolvable
from topology.fragmentation import MILLI_PER_GPU, FragmentModel, TargetWorkload, TaskShape

# Fragment increases closer than this (milli-GPU) are ties: the measure's noise is not signal.
# Chosen on seeds 42..51 of the default trace for the simulator policy this scorer replaced.
TOLERANCE_MILLI = 40.0
UNLIMITED_CPU = 1 << 40  # the extender does not track host CPU; CPU never limits a shape here
ModelFor = Callable[[str], FragmentModel]

# Expected mix of share requests (milli-GPU) for callers that give no workload.
DEFAULT_SHARE_WORKLOAD = TargetWorkload(
    shapes=tuple(TaskShape(cpu_milli=0, gpu_milli=m, gpu_count=1) for m in (100, 250, 500, 1000)),
    probabilities=(0.2, 0.3, 0.3, 0.2),
)


def fragment_models(workload: TargetWorkload) -> ModelFor:
    """A memo of the workload's fragment model per GPU product (type constraints are per product)."""
    blind = TargetWorkload(workload.shapes, workload.probabilities)  # host memory is not tracked here
    models: dict[str, FragmentModel] = {}

    def model_for(product: str) -> FragmentModel:
        model = models.get(product)
        if model is None:
            model = models[product] = FragmentModel(blind, models=(product,), max_gpus=64)
        return model

    return model_for


def plan_share_containers(
    *,
    request: PodRequest,
    layout: NodeLayout,
    free: FreeState,
    eligible: frozenset[int],
    models: ModelFor | None = None,
) -> PlanStep | Verdict:
    wanting = [c for c in request.containers if c.wants_share]
    if not wanting:
        return PlanStep()
    use = dict(free.share_use)
    model_for = models or fragment_models(DEFAULT_SHARE_WORKLOAD)
    plans: dict[str, ContainerPlan] = {}
    qualities: list[float] = []
    fractional = False
    for container in sorted(wanting, key=lambda c: (-c.compute, -c.memory_gib, -c.shared, c.name)):
        mode = ShareMode.TIME_SLICED if container.shared else ShareMode.FRACTIONAL
        capable = [
            g.index for g in layout.gpus if g.mode is mode and g.index in eligible and not g.mig_enabled
        ]
        impossible = _impossible(container, mode, capable, layout, healthy=set(use))
        if impossible is not None:
            return unresolvable(impossible)
        roomy = [i for i in capable if i in use and _fits(container, layout, i, use[i])]
        if not roomy:
            return fail(f"container {container.name!r}: no {mode.value} GPU has {_describe(container)} free")
        if mode is ShareMode.TIME_SLICED:
            chosen = min(roomy, key=lambda i: (share_capacity(layout, i).replicas - use[i].replicas, i))
            qualities.append(
                (use[chosen].replicas + container.shared) / share_capacity(layout, chosen).replicas
            )
        else:
            chosen = _fgd_choice(container, roomy, use, layout=layout, model_for=model_for)
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
    if fractional:
        qualities.append(_fgd_quality(layout, free, use, model_for=model_for))
    return PlanStep(plans=plans, quality=sum(qualities) / len(qualities))


def _impossible(
    container: ContainerRequest, mode: ShareMode, capable: list[int], layout: NodeLayout, *, healthy: set[int]
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
        if layout.gpu_by_index[i].mode is ShareMode.FRACTIONAL
    }


def _product(layout: NodeLayout) -> str:
    return layout.gpus[0].attributes.product_name if layout.gpus else ""


def _fragments(model: FragmentModel, rows: list[list[int]]) -> np.ndarray:
    gpu_free = np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)
    count = len(rows)
    return model.fragment(
        np.full(count, UNLIMITED_CPU, dtype=np.int64), gpu_free, np.zeros(count, dtype=np.int64)
    )


def _fgd_choice(
    container: ContainerRequest,
    roomy: list[int],
    use: dict[int, ShareUse],
    *,
    layout: NodeLayout,
    model_for: ModelFor,
) -> int:
    """The GPU where the node's fragment grows least; ties: tightest fit, then lowest index."""
    frees = _frees(layout, use)
    order = sorted(frees)
    rows = []
    for index in roomy:
        after = dict(frees)
        after[index] -= _milli(container.compute)
        rows.append([after[i] for i in order])
    fragments = _fragments(model_for(_product(layout)), rows)
    best = min(
        range(len(roomy)),
        key=lambda k: (round(float(fragments[k]), 6), frees[roomy[k]], roomy[k]),
    )
    return roomy[best]


def _fgd_quality(
    layout: NodeLayout, free: FreeState, use: dict[int, ShareUse], *, model_for: ModelFor
) -> float:
    """0..1, higher for a smaller fragment increase (FGD's sigmoid), then for less idle GPU left
    (packing among equals: a tiny term, below the gap between two fragment levels)."""
    before = _frees(layout, dict(free.share_use))
    after = _frees(layout, use)
    order = sorted(before)
    values = _fragments(model_for(_product(layout)), [[before[i] for i in order], [after[i] for i in order]])
    level = round(float(values[1] - values[0]) / TOLERANCE_MILLI) * TOLERANCE_MILLI
    idle = sum(after.values()) / (MILLI_PER_GPU * 64)  # below 1: never outweighs one level step
    return 1.0 / (1.0 + math.exp(level / MILLI_PER_GPU)) - 1e-6 * idle
