"""Decision values: a node verdict for a pod and the index-based device plan behind it.

Plans name layout positions (GPU index, MIG/NIC position, share GPU and unit counts, a
generically planned kind's positions), never
device IDs, so one memoized plan serves every node of the same layout and free state. IDs are
filled in only at bind (``materialize``), against the node's own identifiers and holders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devicemodel.assignment import ContainerAssignment, PodAssignment, device_id_share
from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    mig_resource_name,
)
from scheduler_ext.decide.state import NodeState

MAX_SCORE = 10


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    gpus: tuple[int, ...] = ()
    migs: tuple[int, ...] = ()
    nics: tuple[int, ...] = ()
    share_gpu: int | None = None
    compute: int = 0
    memory: int = 0
    replicas: int = 0
    extra: tuple[tuple[str, tuple[int, ...]], ...] = ()  # generically planned kinds: (resource, positions)


@dataclass(frozen=True)
class Verdict:
    """Whether a pod fits a node, why not, how well, and with which devices."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False
    score: int = 0
    plan: tuple[ContainerPlan, ...] = ()
    quality: float = -1.0  # 0..1, what prioritize ranks fitting nodes by (``ranking``); -1: from score
    level: float | None = None  # fragment increase (milli-GPU, rounded) behind ``quality``, if FGD-scored
    idle: float = 0.0  # idle milli-GPU left on the node's share GPUs (packing among equals)
    held: int = 0  # devices held on the node when it was decided (filter's shortlist: fuller first)
    priority: int = field(init=False)  # the node's own 0..10 score when it fits, else 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", self.score if self.fits else 0)
        if self.quality < 0:
            object.__setattr__(self, "quality", self.score / MAX_SCORE if self.fits else -1.0)


@dataclass(frozen=True)
class PlanStep:
    """One stage's result: per-container device positions and a quality in 0..1 (None: no opinion)."""

    plans: dict[str, ContainerPlan] = field(default_factory=dict)
    quality: float | None = None
    gpus_used: tuple[int, ...] = ()
    level: float | None = None  # FGD-scored steps: the fragment increase and idle GPU behind quality
    idle: float = 0.0


def fail(reason: str) -> Verdict:
    return Verdict(fits=False, reason=reason)


def unresolvable(reason: str) -> Verdict:
    return Verdict(fits=False, reason=reason, unresolvable=True)


PASS_THROUGH = Verdict(fits=True, score=0)


def materialize(plan: tuple[ContainerPlan, ...], node: NodeState) -> PodAssignment:
    """Turn an index-based plan into the device IDs of this node (share units not yet held)."""
    assert node.layout is not None and node.index is not None
    index = node.index
    taken: set[str] = set(node.holders)
    containers: dict[str, ContainerAssignment] = {}
    for item in plan:
        devices: dict[str, list[str]] = {}
        if item.gpus:
            devices[RESOURCE_GPU] = [index.gpu_uuids[i] for i in item.gpus]
        for position in item.migs:
            profile = node.layout.migs[position].profile
            devices.setdefault(mig_resource_name(profile), []).append(index.mig_uuids[position])
        if item.nics:
            devices[RESOURCE_EFA] = [index.nic_names[p] for p in item.nics]
        if item.share_gpu is not None:
            uuid = index.gpu_uuids[item.share_gpu]
            for resource, kind, count in (
                (RESOURCE_GPU_COMPUTE, "compute", item.compute),
                (RESOURCE_GPU_MEMORY, "memory", item.memory),
                (RESOURCE_GPU_SHARED, "replica", item.replicas),
            ):
                if count:
                    devices[resource] = _free_units(uuid, kind, count, taken)
        for resource, positions in item.extra:
            ids = index.extra_ids[resource]
            devices.setdefault(resource, []).extend(ids[p] for p in positions)
        containers[item.name] = ContainerAssignment(devices=devices)
    return PodAssignment(node=node.name, containers=containers)


def _free_units(uuid: str, kind: str, count: int, taken: set[str]) -> list[str]:
    chosen: list[str] = []
    unit = 0
    while len(chosen) < count:
        device_id = device_id_share(uuid, kind, unit)
        if device_id not in taken:
            chosen.append(device_id)
            taken.add(device_id)
        unit += 1
    return chosen
