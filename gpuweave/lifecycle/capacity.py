"""How many new machines pending GPU demand needs, in terms the autoscaler reads (pure).

An autoscaler sizes machines for what pods ask of instance types: cpu, memory, ``nvidia.com/gpu``.
It cannot read a fractional or time-sliced share (``gpuweave.io/gpu-*``: which GPUs offer shares is
the node agent's configuration), a MIG profile (the MIG manager makes instances on demand), or that
a gang must sit in one network tier (``gpuweave.io/gang-tier``). For such pending pods, which
gpuweave's own decision core says fit no node now, this plans CapacityBuffers: per node pool that
offers what they ask, the machines that hold them, packed by gpuweave's per-GPU rules:

- shares onto whole GPUs (first fit, largest first: a share's compute and memory come from one GPU,
  100 compute units and the model's memory in GiB per GPU; time-sliced replicas per GPU);
- MIG profiles onto whole GPUs the MIG manager will reshape (a profile's ``max_count`` per GPU);
- a gang onto whole machines in one tier (as many members per machine as its GPUs hold).

A buffer asks for whole machines of the pool's instance type, one buffer chunk per machine. Every
plan is bounded: all buffers together ask for at most ``max_nodes`` machines.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from devicemodel.sharing import COMPUTE_UNITS_PER_GPU

KIND_SHARES = "shares"
KIND_MIG = "mig"
KIND_GANG = "gang"
OFFERS = ("fractional", "time-sliced", "mig", "exclusive")


@dataclass(frozen=True)
class PoolOffer:
    """What one new machine of a node pool offers, as its node agent will serve it."""

    name: str  # the NodePool
    instance_type: str
    gpus: int
    memory_gib: int  # per GPU
    offers: str  # one of OFFERS
    replicas: int = 4  # time-sliced replicas per GPU
    mig_max: Mapping[str, int] = field(default_factory=dict)  # MIG profile -> instances per GPU


@dataclass(frozen=True)
class ShareDemand:
    pod: str  # namespace/name
    compute: int  # gpuweave.io/gpu-compute units (of one GPU)
    memory_gib: int
    shared: int  # gpuweave.io/gpu-shared replicas
    pools: tuple[str, ...]  # pools whose machines would hold it, best first


@dataclass(frozen=True)
class MigDemand:
    pod: str
    profiles: Mapping[str, int]  # MIG profile -> instances
    pools: tuple[str, ...]


@dataclass(frozen=True)
class GangDemand:
    gang: str  # the gang's key
    members: tuple[str, ...]  # its pending pods
    missing: int  # members its best domain cannot hold yet
    gpus_per_member: int
    tier_label: str
    pools: tuple[str, ...]
    cpu_milli: int = 0  # a member's CPU request
    domain: str = ""  # the tier domain to grow ("" for any one domain)


@dataclass(frozen=True)
class BufferPlan:
    name: str
    kind: str
    pool: str
    instance_type: str
    nodes: int
    pods: tuple[str, ...]
    tier_label: str = ""  # a gang's: every machine in one domain of this label
    reason: str = ""
    member_cpu_milli: int = 0  # a gang's chunks ask for more CPU than a member: placed first
    tier_value: str = ""  # a gang's: that domain of ``tier_label`` ("" for any one)


def buffer_name(kind: str, key: str) -> str:
    """``gpuweave-<kind>-<pool>`` or, for a gang, a digest of its key (names are bounded)."""
    if kind == KIND_GANG:
        return f"gpuweave-gang-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    safe = "".join(c if c.isalnum() or c == "-" else "-" for c in key.lower())[:40].strip("-")
    return f"gpuweave-{kind}-{safe}"


def share_gpus(demands: Sequence[ShareDemand], pool: PoolOffer) -> int:
    """GPUs of ``pool`` the shares need, packed first fit, largest first, one GPU per share."""
    if pool.offers == "time-sliced":
        return math.ceil(sum(d.shared for d in demands) / max(1, pool.replicas))
    free: list[list[int]] = []  # per GPU: [compute, memory]
    for demand in sorted(demands, key=lambda d: (-d.compute, -d.memory_gib, d.pod)):
        need = (demand.compute, demand.memory_gib)
        slot = next((g for g in free if g[0] >= need[0] and g[1] >= need[1]), None)
        if slot is None:
            slot = [COMPUTE_UNITS_PER_GPU, pool.memory_gib]
            free.append(slot)
        slot[0] -= need[0]
        slot[1] -= need[1]
    return len(free)


def mig_gpus(demands: Sequence[MigDemand], pool: PoolOffer) -> int:
    """GPUs of ``pool`` the MIG instances need: each profile's share of a GPU is 1/max_count."""
    fraction = 0.0
    for demand in demands:
        for profile, count in demand.profiles.items():
            fraction += count / max(1, pool.mig_max.get(profile, 1))
    return math.ceil(round(fraction, 9))


def plan_buffers(
    *,
    shares: Sequence[ShareDemand],
    migs: Sequence[MigDemand],
    gangs: Sequence[GangDemand],
    pools: Mapping[str, PoolOffer],
    max_nodes: int,
) -> tuple[BufferPlan, ...]:
    """The buffers, gangs first (whole machines or nothing), then shares and MIG per pool, until
    ``max_nodes`` machines are asked for; what is left waits (its plan says how many it got)."""
    plans: list[BufferPlan] = []
    left = max_nodes
    for gang in sorted(gangs, key=lambda g: g.gang):
        pool = pools.get(gang.pools[0]) if gang.pools else None
        if pool is None or pool.gpus < gang.gpus_per_member:
            continue
        per_node = max(1, pool.gpus // max(1, gang.gpus_per_member))
        nodes = math.ceil(gang.missing / per_node)
        if nodes > left:
            continue  # a gang gets what its domain lacks, or waits
        left -= nodes
        where = f"{gang.tier_label}={gang.domain}" if gang.domain else f"one {gang.tier_label}"
        reason = f"gang {gang.gang}: {gang.missing} more x {gang.gpus_per_member} GPUs in {where}"
        name = buffer_name(KIND_GANG, gang.gang)
        plans.append(
            BufferPlan(
                name,
                KIND_GANG,
                pool.name,
                pool.instance_type,
                nodes,
                gang.members,
                gang.tier_label,
                reason,
                member_cpu_milli=gang.cpu_milli,
                tier_value=gang.domain,
            )
        )
    by_pool: list[tuple[str, str, int, tuple[str, ...]]] = []  # (kind, pool, GPUs, pods)
    for pool_name, share_group in sorted(_by_pool(shares).items()):
        by_pool.append(
            (KIND_SHARES, pool_name, share_gpus(share_group, pools[pool_name]), _pods(share_group))
        )
    for pool_name, mig_group in sorted(_by_pool(migs).items()):
        by_pool.append((KIND_MIG, pool_name, mig_gpus(mig_group, pools[pool_name]), _pods(mig_group)))
    for kind, pool_name, gpus, pods in by_pool:
        pool = pools[pool_name]
        wanted = math.ceil(gpus / max(1, pool.gpus))
        nodes = min(wanted, left)
        if nodes <= 0:
            continue
        left -= nodes
        capped = f"; capped at {nodes} of {wanted} machines" if nodes < wanted else ""
        reason = f"{len(pods)} pending pod(s) need {gpus} {pool.offers} GPU(s){capped}"
        plans.append(
            BufferPlan(
                buffer_name(kind, pool_name), kind, pool_name, pool.instance_type, nodes, pods, "", reason
            )
        )
    return tuple(plans)


D = TypeVar("D", "ShareDemand", "MigDemand")


def _by_pool(demands: Sequence[D]) -> dict[str, list[D]]:
    """Each demand under the first pool that would hold it."""
    grouped: dict[str, list[D]] = {}
    for demand in demands:
        if demand.pools:
            grouped.setdefault(demand.pools[0], []).append(demand)
    return grouped


def _pods(demands: Sequence[ShareDemand] | Sequence[MigDemand]) -> tuple[str, ...]:
    return tuple(sorted({d.pod for d in demands}))
