"""The capacity controller's configuration: which node pools offer what (read at the edge).

gpuweave cannot learn from the autoscaler which pool's machines will offer shares or MIG: that is
the node agents' configuration there (``--sharing-config``, ``--mig-mode demand``). The operator
says it once per pool::

    apiVersion: gpuweave.io/v1alpha1
    kind: CapacityConfig
    namespace: gpuweave-system   # where the buffers and their pod templates live
    maxNodes: 8                  # all buffers together ask for at most this many machines
    pools:
      - nodePool: gpu-shares     # a Karpenter NodePool
        instanceType: p5.48xlarge
        profile: p5.48xlarge     # the node profile of that machine (default: the instance type)
        offers: fractional       # fractional | time-sliced | mig | exclusive
        replicas: 4              # time-sliced replicas per GPU

A pool's GPUs (count, model, memory, MIG profiles) come from the profile; a bad file stops the
start with one line naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import memory_units
from devicemodel.validation import first_problem
from gpuweave.lifecycle.capacity import PoolOffer
from hardware.mig_catalog import default_catalog
from hardware.profiles import load_profile


class PoolModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    node_pool: str = Field(alias="nodePool", min_length=1, max_length=253)
    instance_type: str = Field(alias="instanceType", min_length=1, max_length=253)
    profile: str | None = Field(default=None, max_length=4096)
    offers: Literal["fractional", "time-sliced", "mig", "exclusive"]
    replicas: int = Field(default=4, ge=1, le=64)


class CapacityConfigModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    api_version: Literal["gpuweave.io/v1alpha1"] = Field(default="gpuweave.io/v1alpha1", alias="apiVersion")
    kind: Literal["CapacityConfig"] = "CapacityConfig"
    namespace: str = Field(default="gpuweave-system", min_length=1, max_length=63)
    max_nodes: int = Field(default=8, ge=1, le=10000, alias="maxNodes")
    pools: list[PoolModel] = Field(default_factory=list, max_length=256)


@dataclass(frozen=True)
class CapacityConfig:
    namespace: str
    max_nodes: int
    pools: dict[str, PoolOffer]
    inventories: dict[str, NodeInventory]  # pool -> one new machine's inventory (for the decision core)


def offer_of(pool: PoolModel) -> tuple[PoolOffer, NodeInventory]:
    """What one machine of the pool offers, from its node profile."""
    inventory = load_profile(pool.profile or pool.instance_type).to_inventory(
        node_name=f"new-{pool.node_pool}"
    )
    if not inventory.gpus:
        raise InvalidInputError(
            f"pool {pool.node_pool}: profile {pool.profile or pool.instance_type} has no GPU"
        )
    first = inventory.gpus[0]
    mig_max: dict[str, int] = {}
    catalog = default_catalog()
    if pool.offers == "mig" and catalog.supports(first.product):
        mig_max = {p.name: p.max_count for p in catalog.for_product(first.product).profiles}
    offer = PoolOffer(
        name=pool.node_pool,
        instance_type=pool.instance_type,
        gpus=len(inventory.gpus),
        memory_gib=memory_units(first.memory_mib),
        offers=pool.offers,
        replicas=pool.replicas,
        mig_max=mig_max,
    )
    return offer, inventory


def load_capacity_config(path: Path) -> CapacityConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read capacity config {path}: {exc}") from exc
    try:
        model = CapacityConfigModel.model_validate(raw or {})
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="config")
        raise InvalidInputError(f"capacity config {path}: {where}: {problem}") from exc
    pools, inventories = {}, {}
    for pool in model.pools:
        if pool.node_pool in pools:
            raise InvalidInputError(f"capacity config {path}: pool {pool.node_pool} is listed twice")
        pools[pool.node_pool], inventories[pool.node_pool] = offer_of(pool)
    return CapacityConfig(model.namespace, model.max_nodes, pools, inventories)
