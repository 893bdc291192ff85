"""Fractional and time-sliced GPU shares, placed FGD-style (fragmentation gradient descent).

A container's share units all come from one GPU. Among the GPUs with room, a fractional request
goes where the node's fragment for the expected workload grows least (``topology.fragmentation``,
the FGD paper's measure); time-sliced replicas go best-fit. The node's share quality is how little
the placement fragments the node, so prioritize steers shares to where they waste least.
"""

from __future__ import annotations

from scheduler_ext.layout import COMPUTE_UNITS_PER_GPU, NodeLayout, ShareMode
from scheduler_ext.requests import ContainerRequest, PodRequest
from scheduler_ext.state import FreeState, ShareUse, share_capacity
from scheduler_ext.verdict import ContainerPlan, PlanStep, Verdict, fail, unresolvable
from topology.fragmentation import MILLI_PER_GPU, TargetWorkload, TaskShape, node_fragment

# Expected mix of share requests (milli-GPU) when no trace-derived workload is configured.
DEFAULT_SHARE_WORKLOAD = TargetWorkload(
    shapes=tuple(TaskShape(cpu_milli=0, gpu_milli=m, gpu_count=1) for m in (100, 250, 500, 1000)),
    probabilities=(0.2, 0.3, 0.3, 0.2),
)


def plan_share_containers(
    *,
    request: PodRequest,
    layout: NodeLayout,
    free: FreeState,
    eligible: frozenset[int],
    workload: TargetWorkload = DEFAULT_SHARE_WORKLOAD,
) -> PlanStep | Verdict:
    wanting = [c for c in request.containers if c.wants_share]
    if not wanting:
        return PlanStep()
    use = dict(free.share_use)
    plans: dict[str, ContainerPlan] = {}
    qualities: list[float] = []
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
            quality = (use[chosen].replicas + container.shared) / share_capacity(layout, chosen).replicas
        else:
            chosen, quality = _fgd_choice(container, roomy, use, workload=workload)
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
        qualities.append(quality)
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


def _fgd_choice(
    container: ContainerRequest, roomy: list[int], use: dict[int, ShareUse], *, workload: TargetWorkload
) -> tuple[int, float]:
    """The GPU where the node's fragment grows least, and a 0..1 quality of that choice."""
    frees = {i: _milli(COMPUTE_UNITS_PER_GPU - use[i].compute) for i in use}
    before = _fragment(frees, workload)
    task = _milli(container.compute) if container.compute else _milli(1)
    best: tuple[float, int, int] | None = None
    for index in roomy:
        after = dict(frees)
        after[index] -= _milli(container.compute)
        delta = _fragment(after, workload) - before
        candidate = (delta, frees[index], index)  # ties: best fit, then lowest index
        if best is None or candidate < best:
            best = candidate
    assert best is not None
    delta, _, chosen = best
    quality = 1.0 - min(1.0, max(0.0, (delta + task) / (MILLI_PER_GPU + task)))
    return chosen, quality


def _fragment(frees: dict[int, int], workload: TargetWorkload) -> float:
    values = [frees[i] for i in sorted(frees)]
    return node_fragment(cpu_free=1 << 30, gpu_free=values, gpu_model="", workload=workload)
