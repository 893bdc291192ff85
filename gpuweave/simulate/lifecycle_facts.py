"""The simulation's facts in the terms of ``gpuweave lifecycle``'s decision cores: node pools, pending
demand, and the verdict of a node that runs no agent (``lifecycle`` decides with them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devicemodel.contracts import VERDICT_REBOOT, VERDICT_REPLACE
from devicemodel.sharing import memory_units
from gpuweave.lifecycle.capacity import GangDemand, MigDemand, PoolOffer, ShareDemand
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.workload import Job, JobKind
from hardware.mig_catalog import default_catalog
from health.xid import Action, table_for


@dataclass(frozen=True)
class Pool:
    offer: PoolOffer
    template: FleetNode
    shared: bool


def pools_of(fleet: Sequence[FleetNode], share_nodes: frozenset[int]) -> dict[str, Pool]:
    """One node pool per profile of the fleet, offering what its nodes serve (shares on the share
    pool's nodes, MIG on MIG-managed ones, else whole GPUs); its first node is the template."""
    pools: dict[str, Pool] = {}
    catalog = default_catalog()
    for index, node in enumerate(fleet):
        if node.profile in pools or not node.gpus:
            continue
        shared = index in share_nodes
        offers = "fractional" if shared else "mig" if node.mig_managed else "exclusive"
        model = catalog.for_product(node.product) if node.mig_managed else None
        mig_max = {p.name: p.max_count for p in model.profiles} if model is not None else {}
        memory_gib = memory_units(node.inventory.gpus[0].memory_mib)
        offer = PoolOffer(node.profile, node.profile, node.gpus, memory_gib, offers, mig_max=mig_max)
        pools[node.profile] = Pool(offer, node, shared)
    return pools


def demand_of(
    jobs: Sequence[Job], pools: Mapping[str, Pool]
) -> tuple[list[ShareDemand], list[MigDemand], list[GangDemand]]:
    """The pending jobs as ``capacity.py`` demand, each under the pools that would hold it:
    shares (compute units of one GPU), MIG profiles, and multi-node gangs bound to one tier (a
    gang free to span tiers asks for whole GPUs, which the autoscaler reads by itself)."""
    fractional = tuple(k for k, p in pools.items() if p.offer.offers == "fractional")
    shares, migs, gangs = [], [], []
    for job in jobs:
        if job.kind is JobKind.SHARE and fractional:
            shares.append(ShareDemand(f"{job.job_id}-0", max(1, job.gpu_milli // 10), 0, 0, fractional))
        elif job.kind is JobKind.MIG:
            mig = tuple(k for k, p in pools.items() if job.mig_profile in p.offer.mig_max)
            if mig:
                migs.append(MigDemand(f"{job.job_id}-0", {job.mig_profile: 1}, mig))
        elif job.pods > 1 and job.gang_tier:
            whole = tuple(
                k
                for k, p in pools.items()
                if p.offer.offers == "exclusive"
                and p.offer.gpus >= job.gpus_per_pod
                and job.gang_tier in p.template.labels
            )
            members = tuple(f"{job.job_id}-{i}" for i in range(job.pods))
            gangs.append(GangDemand(job.job_id, members, job.pods, job.gpus_per_pod, job.gang_tier, whole))
    return shares, migs, gangs


def ladder_verdict(node: FleetNode, gpu: int, xid: int) -> tuple[str, str]:
    """The node verdict a GPU's Xid leads to once its reset failed, by the health policy's Xid
    table (``health.xid``): the ladder's next rung (reboot the node, or replace it); what the
    simulation decides for a node that runs no agent. (verdict, detail)"""
    rule = table_for(node.architecture).rule(xid)
    after_reset = rule.ladder[1] if len(rule.ladder) > 1 else Action.REPLACE
    verdict = VERDICT_REBOOT if after_reset is Action.REBOOT_NODE else VERDICT_REPLACE
    uuid = node.inventory.gpus[gpu].uuid
    return verdict, f"{uuid}: Xid {xid} ({rule.name}); reset failed"
