"""EFA adapters, aligned to the pod's GPUs: same PCIe switch first, then same NUMA node, then any.

GPUDirect RDMA traffic between a GPU and an EFA adapter on one PCIe switch never crosses the host
bridge, so a container's adapters are taken from its own GPUs' switches when they are free.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_ext.decide.layout import NodeLayout
from scheduler_ext.decide.state import FreeState
from scheduler_ext.decide.verdict import ContainerPlan, PlanStep, Verdict, fail, unresolvable
from scheduler_ext.pods.requests import PodRequest


def plan_nic_containers(
    *, request: PodRequest, layout: NodeLayout, free: FreeState, gpus_chosen: Mapping[str, tuple[int, ...]]
) -> PlanStep | Verdict:
    app = sum(c.efa for c in request.containers if not c.init)
    need = max(app, max((c.efa for c in request.containers if c.init), default=0))
    if need == 0:
        return PlanStep()
    if len(free.healthy_nics) < need:
        return unresolvable(
            f"pod needs {need} EFA adapters; node has {len(free.healthy_nics)} healthy of {len(layout.nics)}"
        )
    if len(free.free_nics) < need:
        return fail(f"pod needs {need} free EFA adapters; node has {len(free.free_nics)} free")
    left = set(free.free_nics)
    plans: dict[str, ContainerPlan] = {}
    aligned = 0
    pod_gpus = tuple(sorted({g for gpus in gpus_chosen.values() for g in gpus}))
    for container in sorted((c for c in request.containers if c.efa and not c.init), key=lambda c: -c.efa):
        gpus = gpus_chosen.get(container.name) or pod_gpus
        picked = _pick(layout, left, gpus, container.efa)
        left.difference_update(picked)
        aligned += sum(1 for p in picked if _on_switch_of(layout, p, gpus))
        plans[container.name] = ContainerPlan(name=container.name, nics=picked)
    pool = tuple(sorted(p for plan in plans.values() for p in plan.nics))
    for container in request.containers:
        if container.init and container.efa:
            reuse = pool[: container.efa]
            extra = _pick(layout, left, pod_gpus, container.efa - len(reuse))
            left.difference_update(extra)
            plans[container.name] = ContainerPlan(name=container.name, nics=reuse + extra)
    quality = aligned / app if pod_gpus and app else None
    return PlanStep(plans=plans, quality=quality)


def _on_switch_of(layout: NodeLayout, position: int, gpus: tuple[int, ...]) -> bool:
    switch = layout.nics[position].pcie_switch
    return switch is not None and any(layout.gpu_by_index[g].pcie_switch == switch for g in gpus)


def _pick(layout: NodeLayout, left: set[int], gpus: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``count`` adapters: on the GPUs' switches first (spread across them), then same NUMA, then any."""
    switches = {layout.gpu_by_index[g].pcie_switch for g in gpus} - {None}
    numas = {layout.gpu_by_index[g].numa_node for g in gpus}
    per_switch: dict[str | None, int] = {}
    pool = set(left)
    picked: list[int] = []

    def rank(position: int) -> tuple[int, int, int]:
        nic = layout.nics[position]
        tier = 0 if nic.pcie_switch in switches else 1 if nic.numa_node in numas else 2
        return (tier, per_switch.get(nic.pcie_switch, 0), position)

    while len(picked) < count and pool:
        best = min(pool, key=rank)
        pool.discard(best)
        picked.append(best)
        switch = layout.nics[best].pcie_switch
        per_switch[switch] = per_switch.get(switch, 0) + 1
    return tuple(sorted(picked))
