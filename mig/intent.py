"""Where MIG targets come from: a declared per-node layout, or the demand of pending pods.

Declared: the node annotation ``gpuweave.io/mig-layout`` holds JSON keyed by GPU UUID, PCI bus id
or index (``devicemodel.gpu_keys``; an index moves when a GPU is missing at boot, the others do not)::

    {"gpus": {"GPU-5e1c...": ["3g.40gb", "3g.40gb"],  # profiles; the planner places them
              "0000:53:00.0": ["4g.40gb@0", "1g.10gb@6"],  # profile@start pins a placement
              "5": [],                              # MIG on, no instances
              "6": null}}                           # whole GPU, MIG off

GPUs not listed are left as they are. Demand: pending pods' ``nvidia.com/mig-<profile>`` requests
are turned into per-GPU plans by ``derive_demand_plans`` (pure), which keeps busy instances, counts
idle instances of a requested profile as serving it, and adds instances where they fit, GPU by
GPU in index order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION, mig_profile_of_resource
from devicemodel.errors import InvalidInputError
from devicemodel.gpu_keys import canonical_keys, is_index_key
from devicemodel.validation import first_problem
from hardware.mig_catalog import GpuModel
from mig.planner import Instance, MigPlanError, Plan, TargetEntry, plan_demand

WHOLE_GPU = None  # the declared layout value that means "MIG off"


class _LayoutWire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: dict[str, list[str] | None]

    @field_validator("gpus")
    @classmethod
    def _keys_name_gpus(cls, gpus: dict[str, list[str] | None]) -> dict[str, list[str] | None]:
        return canonical_keys(gpus)


def parse_entry(text: str) -> TargetEntry:
    """``3g.40gb`` or ``3g.40gb@4`` (pinned start slot)."""
    profile, sep, start = text.strip().partition("@")
    if not profile or (sep and not start.isdigit()):
        raise InvalidInputError(
            f"bad MIG layout entry {text!r}: expected PROFILE or PROFILE@START, e.g. 3g.40gb@4"
        )
    return TargetEntry(profile, int(start) if sep else None)


def parse_profile_list(text: str) -> tuple[TargetEntry, ...]:
    """A comma-separated CLI list: ``3g.40gb,3g.40gb`` or ``1g.10gb@6``; empty means no instances."""
    return tuple(parse_entry(part) for part in text.split(",") if part.strip())


def parse_layout_annotation(
    value: str, *, resolve: Callable[[str], int] | None = None
) -> dict[int, tuple[TargetEntry, ...] | None]:
    """The declared layout per GPU index; ``None`` means whole GPU (MIG off). ``resolve`` turns a
    UUID or bus-id key into the GPU's index (and raises ``InvalidInputError`` for one naming no GPU);
    without it only index keys are accepted."""
    try:
        wire = _LayoutWire.model_validate_json(value)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="value")
        raise InvalidInputError(
            f"bad {MIG_LAYOUT_ANNOTATION} annotation at {where}: {problem}; "
            'expected {"gpus": {"3": ["3g.40gb", "3g.40gb"]}}'
        ) from exc
    layout = {
        _index_of(key, resolve): None if entries is None else tuple(parse_entry(e) for e in entries)
        for key, entries in wire.gpus.items()
    }
    return dict(sorted(layout.items()))


def _index_of(key: str, resolve: Callable[[str], int] | None) -> int:
    if is_index_key(key):
        return int(key)
    if resolve is None:
        raise InvalidInputError(f"{MIG_LAYOUT_ANNOTATION}: GPU key {key!r} needs the node's GPUs to resolve")
    return resolve(key)


def mig_requests(resources: Mapping[str, int]) -> dict[str, int]:
    """``{"nvidia.com/mig-1g.10gb": 2, "cpu": 4}`` -> ``{"1g.10gb": 2}``."""
    found = {name: mig_profile_of_resource(name) for name in resources}
    return {profile: resources[name] for name, profile in found.items() if profile and resources[name] > 0}


@dataclass(frozen=True)
class GpuMigState:
    """One MIG-enabled GPU as the demand planner sees it."""

    index: int
    model: GpuModel
    instances: tuple[Instance, ...]


def derive_demand_plans(
    pending: Sequence[Mapping[str, int]],
    gpus: Sequence[GpuMigState],
) -> dict[int, Plan]:
    """Per-GPU plans serving as much of the pending MIG requests as fits; unchanged GPUs omitted.

    ``pending`` holds each pending pod's MIG requests (profile -> count). Idle instances of a
    requested profile anywhere on the node serve it first; the rest is placed GPU by GPU, first on
    GPUs with free room, then on GPUs where idle instances nobody asked for can be destroyed.
    """
    total = node_demand(pending, gpus)
    idle = Counter(i.profile for gpu in gpus for i in gpu.instances if not i.busy)
    missing = Counter({p: c - idle[p] for p, c in total.items() if c > idle[p]})
    plans: dict[int, Plan] = {}
    for may_destroy in (False, True):  # first where room is free, then by destroying idle instances
        for gpu in sorted(gpus, key=lambda g: g.index):
            if gpu.index in plans:
                continue
            plan = _demand_plan(gpu, missing)
            if plan is None or plan.is_noop or (plan.destroy and not may_destroy):
                continue
            plans[gpu.index] = plan
            missing.subtract(Counter(p.profile for p in plan.create))
            missing.update(Counter(i.profile for i in plan.destroy if i.profile in total))
    return plans


def node_demand(pending: Sequence[Mapping[str, int]], gpus: Sequence[GpuMigState]) -> Counter[str]:
    """The pending requests per profile, each capped at what the node's GPUs can hold of it
    (``max_count`` per GPU that offers the profile): any pending pod's ``nvidia.com/mig-*``
    request counts here, so the planning cost is bounded by the hardware, not by the request."""
    room: Counter[str] = Counter()
    for gpu in gpus:
        room.update({p.name: p.max_count for p in gpu.model.profiles})
    total: Counter[str] = Counter()
    for requests in pending:
        total.update({p: c for p, c in requests.items() if c > 0})
    return Counter({p: min(c, room[p]) for p, c in total.items() if room[p]})


def _demand_plan(gpu: GpuMigState, missing: Counter[str]) -> Plan | None:
    offered = {p.name for p in gpu.model.profiles}
    wanted = {p: c for p, c in missing.items() if p in offered and c > 0}
    if not wanted:
        return None
    local_idle = Counter(i.profile for i in gpu.instances if not i.busy)
    try:
        return plan_demand(gpu.model, gpu.instances, {p: c + local_idle[p] for p, c in wanted.items()})
    except MigPlanError:
        return None
