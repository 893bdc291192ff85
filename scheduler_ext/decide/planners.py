"""Per-resource planners: whole GPUs, MIG devices, GPU shares and EFA adapters for one pod on one
node, and one planner for every other resource kind of the registry (``plan_kinds``).

Each stage returns either a ``PlanStep`` (what each container gets, plus a 0..1 quality) or a
failing ``Verdict`` with a specific reason. Init containers run one at a time before the app
containers, so (as the kubelet does) they reuse devices picked for the pod rather than add to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from devicekinds.kind import KindSlot
from devicekinds.registry import KINDS
from devicemodel.sharing import SharingMode
from scheduler_ext.decide.layout import NodeLayout
from scheduler_ext.decide.nics import plan_nic_containers
from scheduler_ext.decide.search import LayoutSearch, SetChoice
from scheduler_ext.decide.shares import ModelFor, plan_share_containers
from scheduler_ext.decide.state import FreeState
from scheduler_ext.decide.verdict import MAX_SCORE, ContainerPlan, PlanStep, Verdict, fail, unresolvable
from scheduler_ext.pods.host import NO_HOST, HostRequest
from scheduler_ext.pods.requests import ContainerRequest, Placement, PodRequest

# Whole-GPU node score weights (docs/extender.md, "Decisions"), 5:5:3 summing to 1. Multi-GPU
# requests mix in the set's absolute quality so that hardware classes compare. Packing's share was
# chosen by mean job completion on `gpuweave simulate` seeds 42..51 (docs/extender.md).
RELATIVE_WEIGHT, PACKING_WEIGHT, LOOKAHEAD_WEIGHT = 5 / 13, 5 / 13, 3 / 13
ABSOLUTE_WEIGHT = 0.4  # share of the multi-GPU score taken by ``SetChoice.absolute``
# One score step off for a single GPU that still has a free NVLink peer: keeps NVLink-rich nodes
# free for gangs when a PCIe-only node fits as well, without outweighing packing by much.
SINGLE_GPU_NVLINK_PENALTY = 0.1


@dataclass
class Planner:
    request: PodRequest
    layout: NodeLayout
    free: FreeState
    eligible: frozenset[int]
    search: LayoutSearch
    share_models: ModelFor | None = None
    host: HostRequest = NO_HOST  # the pod's CPU and memory request
    host_free: HostRequest | None = None  # the node's CPU and memory left; None: not known
    _gpus_chosen: dict[str, tuple[int, ...]] = field(default_factory=dict)

    # ---- whole GPUs -------------------------------------------------------------------------
    def plan_gpus(self) -> PlanStep | Verdict:
        need = self.request.pod_gpus()
        if need == 0:
            return PlanStep()
        what = "GPUs matching the gpu-selector" if self.request.selector else "GPUs"
        exclusive = frozenset(
            g.index for g in self.layout.gpus if g.index in self.eligible and g.index in self._exclusive()
        )
        if len(exclusive) < need:
            return unresolvable(f"pod needs {need} whole {what}; node offers {len(exclusive)}")
        healthy = exclusive & self.free.healthy_gpus
        if len(healthy) < need:
            return unresolvable(
                f"pod needs {need} whole {what}; node has {len(healthy)} healthy "
                f"({len(exclusive) - len(healthy)} withheld as unhealthy)"
            )
        impossible = self._policy_check(healthy, need, free=False)
        if impossible is not None:
            return unresolvable(impossible)
        available = healthy & self.free.free_gpus
        if len(available) < need:
            return fail(f"pod needs {need} free {what}; node has {len(available)} free of {len(healthy)}")
        blocked = self._policy_check(available, need, free=True)
        if blocked is not None:
            return fail(blocked)
        chosen = self._choose(available, need)
        if chosen is None:
            return fail(f"no set of {need} free {what} satisfies placement {self.request.placement.value}")
        return PlanStep(
            plans=self._split_gpus(chosen.gpus),
            quality=self._gpu_quality(chosen),
            gpus_used=chosen.gpus,
        )

    def _exclusive(self) -> frozenset[int]:
        return frozenset(
            g.index for g in self.layout.gpus if g.mode is SharingMode.EXCLUSIVE and not g.mig_enabled
        )

    def _policy_check(self, gpus: frozenset[int], need: int, *, free: bool) -> str | None:
        adjective = "free " if free else ""
        placement = self.request.placement
        if placement is Placement.NVLINK_REQUIRED and need > 1:
            largest = len(self.search.graph.largest_nvlink_clique(gpus))
            if largest < need:
                return f"needs {need} NVLink-connected GPUs; largest {adjective}NVLink group is {largest}"
        if placement is Placement.SINGLE_NUMA:
            per_numa: dict[int, int] = {}
            for index in gpus:
                numa = self.layout.gpu_by_index[index].numa_node
                per_numa[numa] = per_numa.get(numa, 0) + 1
            most = max(per_numa.values(), default=0)
            if most < need:
                return f"needs {need} GPUs on one NUMA node; most {adjective}GPUs on one NUMA node is {most}"
        if placement is Placement.NIC_ALIGNED:
            aligned = sum(1 for index in gpus if self.layout.nic_aligned(index))
            if aligned < need:
                return (
                    f"needs {need} GPUs with an EFA adapter on their PCIe switch; "
                    f"node has {aligned} such {adjective}GPUs"
                )
        return None

    def _choose(self, available: frozenset[int], need: int) -> SetChoice | None:
        return self.search.best(available, need, policy=self.request.placement.value)

    def _split_gpus(self, pool: tuple[int, ...]) -> dict[str, ContainerPlan]:
        """Give app containers disjoint best subsets of the pool; init containers reuse it."""
        plans: dict[str, ContainerPlan] = {}
        remaining = frozenset(pool)
        app = sorted((c for c in self.request.containers if not c.init and c.gpus), key=lambda c: -c.gpus)
        for container in app:
            subset = self._subset(remaining, container.gpus)
            remaining -= frozenset(subset)
            plans[container.name] = ContainerPlan(name=container.name, gpus=subset)
        for container in self.request.containers:
            if container.init and container.gpus:
                plans[container.name] = ContainerPlan(
                    name=container.name, gpus=self._subset(frozenset(pool), container.gpus)
                )
        self._gpus_chosen = {name: plan.gpus for name, plan in plans.items()}
        return plans

    def _subset(self, pool: frozenset[int], size: int) -> tuple[int, ...]:
        if size == len(pool):
            return tuple(sorted(pool))
        found = self.search.best(pool, size)
        return found.gpus if found is not None else tuple(sorted(pool)[:size])

    def _gpu_quality(self, chosen: SetChoice) -> float:
        """Topology quality of the set, packing, and what stays possible for later requests.

        The first three are relative to this node (how well the set uses it); for 2+ GPUs the
        set's absolute quality is mixed in, so an NVLink quad beats a PCIe-only node's best four.
        Packing counts the GPUs left against all the node was built with: a GPU in MIG mode or
        withheld as unhealthy does not make its node look emptier than an intact node with as
        many free (that node can still take a node-sized pod; this one cannot either way).
        """
        remaining = self.free.free_gpus - frozenset(chosen.gpus)
        total = max(1, len(self.layout.gpus))
        packing = 1.0 - len(remaining) / total
        lookahead = 1.0 if not remaining else chosen.lookahead  # a node filled exactly: no fragments
        fit = RELATIVE_WEIGHT * chosen.quality + PACKING_WEIGHT * packing + LOOKAHEAD_WEIGHT * lookahead
        if len(chosen.gpus) > 1:
            return (1.0 - ABSOLUTE_WEIGHT) * fit + ABSOLUTE_WEIGHT * chosen.absolute
        (gpu,) = chosen.gpus
        if any(self.layout.nvlinked(gpu, other) for other in remaining):
            fit -= SINGLE_GPU_NVLINK_PENALTY
        return max(0.0, fit)

    # ---- MIG devices ------------------------------------------------------------------------
    def plan_migs(self) -> PlanStep | Verdict:
        profiles = sorted({p for c in self.request.containers for p, _ in c.mig})
        plans: dict[str, ContainerPlan] = {}
        left = set(self.free.free_migs)
        for profile in profiles:
            step = self._plan_profile(profile, left, plans)
            if isinstance(step, Verdict):
                return step
        if not profiles:
            return PlanStep()
        healthy = max(1, len(self.free.healthy_migs))
        return PlanStep(plans=plans, quality=1.0 - len(left) / healthy)

    def _plan_profile(self, profile: str, left: set[int], plans: dict[str, ContainerPlan]) -> Verdict | None:
        def count(c: ContainerRequest) -> int:
            return dict(c.mig).get(profile, 0)

        need = max(
            sum(count(c) for c in self.request.containers if not c.init),
            max((count(c) for c in self.request.containers if c.init), default=0),
        )
        ofprofile = [m for m in self.layout.migs if m.profile == profile and m.parent_index in self.eligible]
        healthy = [m for m in ofprofile if m.position in self.free.healthy_migs]
        if len(healthy) < need:
            return unresolvable(
                f"pod needs {need} MIG devices of profile {profile}; node has {len(healthy)} healthy "
                f"of {len(ofprofile)} (change the node's MIG layout to offer more)"
            )
        free = [m for m in healthy if m.position in left]
        if len(free) < need:
            return fail(f"pod needs {need} free MIG devices of profile {profile}; node has {len(free)} free")
        per_parent: dict[int, int] = {}
        for m in self.layout.migs:
            if m.position in left:
                per_parent[m.parent_index] = per_parent.get(m.parent_index, 0) + 1
        # Pack: take slices from the GPU with the fewest free devices, keeping emptier GPUs whole.
        ordered = sorted(free, key=lambda m: (per_parent[m.parent_index], m.parent_index, m.position))
        pool = [m.position for m in ordered[:need]]
        left.difference_update(pool)
        containers = self.request.containers
        _deal(containers, pool, count, plans, lambda base, got: replace(base, migs=base.migs + got))
        return None

    # ---- shares and EFA ---------------------------------------------------------------------
    def plan_shares(self) -> PlanStep | Verdict:
        return plan_share_containers(
            request=self.request,
            layout=self.layout,
            free=self.free,
            eligible=self.eligible,
            models=self.share_models,
            host=self.host,
            host_free=self.host_free,
        )

    def plan_nics(self) -> PlanStep | Verdict:
        return plan_nic_containers(
            request=self.request, layout=self.layout, free=self.free, gpus_chosen=self._gpus_chosen
        )

    # ---- kinds without a planner of their own (``devicekinds``) -----------------------------
    def plan_kinds(self) -> PlanStep | Verdict:
        """Each requested resource of a generically planned kind: counted against the node's
        healthy and free devices of it, the set chosen by its kind (``ResourceKind.choose``)."""
        wanted = sorted({resource for c in self.request.containers for resource, _ in c.extra})
        plans: dict[str, ContainerPlan] = {}
        for resource in wanted:
            failed = self._plan_kind(resource, plans)
            if failed is not None:
                return failed
        return PlanStep(plans=plans) if wanted else PlanStep()

    def _plan_kind(self, resource: str, plans: dict[str, ContainerPlan]) -> Verdict | None:
        def count(c: ContainerRequest) -> int:
            return dict(c.extra).get(resource, 0)

        app = sum(count(c) for c in self.request.containers if not c.init)
        need = max(app, max((count(c) for c in self.request.containers if c.init), default=0))
        slots = self.layout.extra_slots.get(resource, ())
        healthy = dict(self.free.extra_healthy).get(resource, frozenset())
        free = dict(self.free.extra_free).get(resource, frozenset())
        kind = KINDS.kind_for(resource)
        if kind is None or len(healthy) < need:
            return unresolvable(
                f"pod needs {need} {resource}; node has {len(healthy)} healthy of {len(slots)}"
            )
        if len(free) < need:
            return fail(f"pod needs {need} free {resource}; node has {len(free)} free")
        near = [
            KindSlot(g, self.layout.gpu_by_index[g].numa_node, self.layout.gpu_by_index[g].pcie_switch, g)
            for g in sorted({g for chosen in self._gpus_chosen.values() for g in chosen})
        ]
        pool = list(kind.choose([slots[p] for p in sorted(free)], need, near=near))
        if len(pool) != need or len(set(pool)) != need or not set(pool) <= free:
            return fail(f"the {resource} kind chose no set of {need} of the node's {len(free)} free devices")
        _deal(
            self.request.containers,
            pool,
            count,
            plans,
            lambda base, taken: replace(base, extra=(*base.extra, (resource, taken))),
        )
        return None

    def combine(self, steps: list[PlanStep]) -> Verdict:
        plans: dict[str, ContainerPlan] = {}
        for step in steps:
            for name, part in step.plans.items():
                base = plans.get(name, ContainerPlan(name=name))
                plans[name] = _merge(base, part)
        qualities = [s.quality for s in steps if s.quality is not None]
        quality = sum(qualities) / len(qualities) if qualities else 0.5
        score = max(0, min(MAX_SCORE, round(quality * MAX_SCORE)))
        ordered = tuple(plans[c.name] for c in self.request.containers if c.name in plans)
        scored = [s for s in steps if s.level is not None]
        level, idle = (
            (scored[0].level, scored[0].idle) if len(scored) == 1 and len(qualities) == 1 else (None, 0.0)
        )
        return Verdict(
            fits=True, score=score, plan=ordered, quality=max(0.0, min(1.0, quality)), level=level, idle=idle
        )


def _deal(
    containers: Sequence[ContainerRequest],
    pool: Sequence[int],
    count: Callable[[ContainerRequest], int],
    plans: dict[str, ContainerPlan],
    add: Callable[[ContainerPlan, tuple[int, ...]], ContainerPlan],
) -> None:
    """Hand the chosen ``pool`` to the containers in order: app containers take successive
    devices, an init container (which ends before the app containers start) reuses the first."""
    remaining = list(pool)
    for container in containers:
        want = count(container)
        if not want:
            continue
        taken = tuple(pool[:want]) if container.init else tuple(remaining[:want])
        if not container.init:
            remaining = remaining[want:]
        plans[container.name] = add(plans.get(container.name, ContainerPlan(name=container.name)), taken)


def _merge(base: ContainerPlan, part: ContainerPlan) -> ContainerPlan:
    return replace(
        base,
        gpus=base.gpus + part.gpus,
        migs=base.migs + part.migs,
        nics=base.nics + part.nics,
        share_gpu=part.share_gpu if part.share_gpu is not None else base.share_gpu,
        compute=base.compute + part.compute,
        memory=base.memory + part.memory,
        replicas=base.replicas + part.replicas,
        extra=base.extra + part.extra,
    )
