"""A rack of nodes sharing one multi-node NVLink domain: the ``RackProfile`` document.

On a GB200/GB300 NVL72 rack, 18 compute trays reach each other over the rack's NVLink switch
trays; NVML reports the domain per GPU as a cluster UUID and a clique ID (the NVLink partition).
A rack profile names the node profile of its trays and how its nodes divide into cliques; each
node it yields is that node profile with its rack's domain in ``nvswitch`` (``clusterUuid``,
``cliqueId``), so one node of a rack goes through exactly the parser and checks of any node.

```yaml
apiVersion: gpuweave.io/v1alpha1
kind: RackProfile
metadata: {name: gb200-nvl72}
spec:
  node: gb200-compute-tray          # a node profile with an NVSwitch fabric
  cliques:                          # in node order; one clique of every node when omitted
    - {id: 32766, nodes: 18}
  clusterUuid: 6a2b...              # optional: derived from the rack's name
```

Pure: the caller loads the node profile (``hardware.profiles``) and passes it in.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from devicemodel.spec import UUID_PATTERN, NodeProfile, ProfileError, ProfileMetadata

RACK_KIND = "RackProfile"
MAX_RACK_NODES = 576  # NVLink 5 domains reach 576 GPUs; no rack holds more nodes than that
DEFAULT_CLIQUE_ID = 32766  # the ID NVIDIA's Fabric Manager gives the default partition (0x7ffe)
_RACK_NAMESPACE = uuid.UUID("5f0c4d1e-9a3b-4c2d-8e7f-112233445566")  # gpuweave's, for derived domains


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class CliqueSpec(_Model):
    id: int = Field(ge=0, le=0xFFFFFFFF)
    nodes: int = Field(ge=1, le=MAX_RACK_NODES)


class RackProfileSpec(_Model):
    node: str = Field(min_length=1, max_length=4096)
    nodes: int | None = Field(default=None, ge=1, le=MAX_RACK_NODES)
    cliques: tuple[CliqueSpec, ...] = Field(default=(), max_length=MAX_RACK_NODES)
    cluster_uuid: str | None = Field(default=None, pattern=UUID_PATTERN)

    @model_validator(mode="after")
    def _cliques_cover_the_rack(self) -> RackProfileSpec:
        if not self.cliques and self.nodes is None:
            raise ValueError("give nodes (one clique of them all) or cliques")
        counted = sum(c.nodes for c in self.cliques)
        if self.cliques and self.nodes is not None and counted != self.nodes:
            raise ValueError(f"cliques hold {counted} nodes but the rack has nodes: {self.nodes}")
        if counted > MAX_RACK_NODES:
            raise ValueError(f"cliques hold {counted} nodes, more than {MAX_RACK_NODES}")
        ids = [c.id for c in self.cliques]
        if len(set(ids)) != len(ids):
            raise ValueError(f"cliques: clique IDs repeat ({ids})")
        return self

    @property
    def clique_of_each_node(self) -> tuple[int, ...]:
        if not self.cliques:
            return (DEFAULT_CLIQUE_ID,) * (self.nodes or 0)
        return tuple(c.id for c in self.cliques for _ in range(c.nodes))


class RackProfile(_Model):
    api_version: Literal["gpuweave.io/v1alpha1"]
    kind: Literal["RackProfile"]
    metadata: ProfileMetadata
    spec: RackProfileSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @classmethod
    def parse(cls, data: object, *, source: str = "rack profile") -> RackProfile:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise ProfileError(f"{source}: {where + ': ' if where else ''}{message}") from None

    def cluster_uuid(self, instance: int = 0) -> str:
        """The domain of the ``instance``-th rack built from this profile (racks differ by instance)."""
        base = self.spec.cluster_uuid or str(uuid.uuid5(_RACK_NAMESPACE, self.name))
        return base if instance == 0 else str(uuid.uuid5(uuid.UUID(base), str(instance)))

    def nodes(self, node: NodeProfile, *, instance: int = 0) -> tuple[NodeProfile, ...]:
        """The rack's nodes: ``node`` with this rack's domain, one per tray in order.

        ``node`` must have an NVSwitch fabric (the rack's NVLink reaches its GPUs through it).
        """
        if node.spec.nvswitch is None:
            raise ProfileError(
                f"rack profile {self.name}: node profile {node.name} has no nvswitch; a rack's NVLink "
                "domain reaches its GPUs through NVSwitches"
            )
        cluster = self.cluster_uuid(instance)
        built = []
        for clique in self.spec.clique_of_each_node:
            wire: dict[str, Any] = node.to_wire()
            wire["spec"]["nvswitch"] |= {"clusterUuid": cluster, "cliqueId": clique}
            built.append(NodeProfile.parse(wire, source=f"rack profile {self.name}"))
        return tuple(built)
