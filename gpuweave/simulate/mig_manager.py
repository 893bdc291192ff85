"""The simulation's MIG manager: reshape GPUs on MIG nodes to follow pending MIG demand.

One GPU at a time, as the node agent's MIG manager does (docs/mig.md): a GPU already in MIG
mode gets new instances where they fit (``mig.planner.plan_demand`` keeps busy instances); else a
fully idle GPU on a MIG node is switched to MIG mode. A MIG GPU left without demand and without
busy instances for ``idle_revert_s`` goes back to a whole GPU. Every non-empty plan is a reshape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.state import GpuMode, MigSlot, SimState
from hardware.mig_catalog import default_catalog
from mig.planner import Instance, MigPlanError, plan_demand


@dataclass(frozen=True)
class Reshape:
    at_s: float
    node: str
    gpu: int
    created: tuple[str, ...]
    destroyed: tuple[str, ...]


# Applies a GPU's new layout on its node ((profile, start) per instance; None: whole GPU again);
# False when the node refused, so the simulated state keeps the old layout.
LayoutApplier = Callable[[int, int, Sequence[tuple[str, int]] | None], bool]


class MigManager:
    def __init__(self, *, idle_revert_s: float = 1800.0, applier: LayoutApplier | None = None) -> None:
        self._applier = applier
        self._catalog = default_catalog()
        self._idle_revert_s = idle_revert_s
        self._idle_since: dict[tuple[int, int], float] = {}
        self.reshapes: list[Reshape] = []

    def reconcile(self, state: SimState, demand: Counter[str], *, now: float) -> None:
        """At most one reshape per MIG node per call."""
        unmet = demand - self._idle_instances(state)
        for node, fleet_node in enumerate(state.fleet):
            if not fleet_node.mig_managed:
                continue
            if +unmet and self._grow(state, node, unmet, now=now):
                unmet = demand - self._idle_instances(state)
                continue
            self._revert_idle(state, node, wanted=bool(+demand), now=now)

    def _idle_instances(self, state: SimState) -> Counter[str]:
        return Counter(s.profile for slots in state.mig_slots.values() for s in slots if s.pod is None)

    def _grow(self, state: SimState, node: int, unmet: Counter[str], *, now: float) -> bool:
        modes = state.modes[node]
        candidates = [g for g, m in enumerate(modes) if m is GpuMode.MIG]
        candidates += [g for g in sorted(state.full_free_gpus(node)) if modes[g] is GpuMode.NORMAL]
        return any(self._apply_plan(state, node, gpu, unmet, now=now) for gpu in candidates)

    def _apply_plan(self, state: SimState, node: int, gpu: int, unmet: Counter[str], *, now: float) -> bool:
        model = self._catalog.for_product(state.fleet[node].product)
        slots = state.mig_slots.get((node, gpu), [])
        current = [
            Instance(s.profile, s.start, s.size, busy=s.pod is not None, key=str(i))
            for i, s in enumerate(slots)
        ]
        try:
            plan = plan_demand(model, current, dict(unmet))
        except MigPlanError:
            return False
        if not plan.create:
            return False
        kept = [slots[int(i.key)] for i in plan.keep]
        created = [
            MigSlot(c.profile, c.start, c.size, model.profile(c.profile).compute_slices) for c in plan.create
        ]
        layout = [(s.profile, s.start) for s in kept + created]
        if self._applier is not None and not self._applier(node, gpu, layout):
            return False
        if state.modes[node][gpu] is GpuMode.NORMAL:
            state.set_mode(node, gpu, GpuMode.MIG)
        state.mig_slots[(node, gpu)] = kept + created
        self.reshapes.append(
            Reshape(
                now,
                state.fleet[node].name,
                gpu,
                tuple(c.profile for c in plan.create),
                tuple(d.profile for d in plan.destroy),
            )
        )
        self._idle_since.pop((node, gpu), None)
        return True

    def _revert_idle(self, state: SimState, node: int, *, wanted: bool, now: float) -> None:
        for gpu, mode in enumerate(state.modes[node]):
            key = (node, gpu)
            if mode is not GpuMode.MIG or any(s.pod for s in state.mig_slots.get(key, [])) or wanted:
                self._idle_since.pop(key, None)
                continue
            since = self._idle_since.setdefault(key, now)
            if now - since >= self._idle_revert_s:
                if self._applier is not None and not self._applier(node, gpu, None):
                    continue
                destroyed = tuple(s.profile for s in state.mig_slots.pop(key, []))
                state.set_mode(node, gpu, GpuMode.NORMAL)
                self.reshapes.append(Reshape(now, state.fleet[node].name, gpu, (), destroyed))
                self._idle_since.pop(key, None)
                return

    @staticmethod
    def take_instance(state: SimState, profile: str, pod_id: str) -> tuple[int, int] | None:
        """Bind a MIG pod to an idle instance of ``profile``: (node, gpu), or None."""
        for (node, gpu), slots in sorted(state.mig_slots.items()):
            for slot in slots:
                if slot.profile == profile and slot.pod is None and state.modes[node][gpu] is GpuMode.MIG:
                    slot.pod = pod_id
                    return node, gpu
        return None


def mig_used_milli(slots: list[MigSlot]) -> float:
    return sum(s.compute_slices for s in slots if s.pod) * MILLI_PER_GPU / 7
