"""The extender protocol's messages (kube-scheduler ``extender/v1``), as pydantic models.

The Go structs carry no json tags, so the keys on the wire are the Go field names (``Pod``,
``NodeNames``, ``FailedAndUnresolvableNodes`` ...). Go decodes keys case-insensitively; so do we,
for the top-level keys (``canonical_keys``). Pods and nodes stay plain dicts past a shape check:
the decision core reads only a few fields and must not choke on fields a newer Kubernetes adds.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from devicemodel.errors import ECHO_CHARS, InvalidInputError, clip

M = TypeVar("M", bound=BaseModel)


class WireError(InvalidInputError):
    """A request body that is not the message its verb expects."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ObjectMeta(_Message):
    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = ""
    namespace: str = ""
    uid: str = ""
    annotations: dict[str, str] | None = None


class KubeObject(_Message):
    """A v1.Pod or v1.Node: metadata checked, the rest kept as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class NodeList(_Message):
    items: list[KubeObject] | None = None


class ExtenderArgs(_Message):
    Pod: KubeObject
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Message):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""

    @field_serializer("FailedNodes", "FailedAndUnresolvableNodes")
    def _as_dict(self, rejected: Mapping[str, str]) -> dict[str, str]:
        """Filter builds these as ``by_state.RejectedNames`` (a mapping written per state by the
        HTTP adapter); any other dump sees the plain dict."""
        return dict(rejected)


class HostPriority(_Message):
    Host: str
    Score: int


class ExtenderBindingArgs(_Message):
    PodName: str
    PodNamespace: str
    PodUID: str = ""
    Node: str


class ExtenderBindingResult(_Message):
    Error: str = ""


class MetaPod(_Message):
    UID: str


class MetaVictims(_Message):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: int = 0


class Victims(_Message):
    Pods: list[KubeObject] | None = None
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Message):
    """preempt's message. Each node's victims stay as sent until ``victims`` reads them, validated
    then: the extender reads only the nodes it may answer, so a pod it refuses (a gang that is not
    recovering) or a node outside a gang's room costs no validation of its victim list (hundreds
    of entries per call from kube-scheduler's dry runs). ``MetaVictims`` keeps no field as sent, so
    its entries need no depth check; ``Victims`` keeps whole pods, which the HTTP adapter checks."""

    Pod: KubeObject
    NodeNameToVictims: dict[str, Any] | None = None
    NodeNameToMetaVictims: dict[str, Any] | None = None

    def proposed(self) -> list[str]:
        """The candidate nodes, in the order sent (the meta form when both are sent)."""
        if self.NodeNameToMetaVictims is not None:
            return list(self.NodeNameToMetaVictims)
        return list(self.NodeNameToVictims or {})

    def victims(self, node: str) -> tuple[list[str], int]:
        """The UIDs of ``node``'s victims and its NumPDBViolations; ``WireError`` naming the bad field."""
        if self.NodeNameToMetaVictims is not None:
            raw = self.NodeNameToMetaVictims.get(node)
            meta = _validated(MetaVictims, raw, f"NodeNameToMetaVictims.{node}")
            return [p.UID for p in meta.Pods or []], meta.NumPDBViolations
        full = _validated(Victims, (self.NodeNameToVictims or {}).get(node), f"NodeNameToVictims.{node}")
        return [p.metadata.uid for p in full.Pods or []], full.NumPDBViolations


class ExtenderPreemptionResult(_Message):
    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


def canonical_keys(body: object, model: type[BaseModel]) -> object:
    """Map top-level keys to the model's field names case-insensitively, as Go's decoder does.
    A body whose keys are all field names already (kube-scheduler's, every call) is returned as is."""
    if not isinstance(body, Mapping):
        return body
    if model.model_fields.keys() >= body.keys():
        return body
    names = _lowered(model)
    return {names.get(str(key).lower(), key): value for key, value in body.items()}


@functools.cache
def _lowered(model: type[BaseModel]) -> dict[str, str]:
    return {name.lower(): name for name in model.model_fields}


def parse(model: type[M], body: object) -> M:
    """Validate a decoded JSON body; raises ``WireError`` naming the first bad field."""
    if not isinstance(body, Mapping):
        raise WireError(f"{model.__name__} must be a JSON object, got {type(body).__name__}")
    return _validated(model, canonical_keys(body, model), "")


def _validated(model: type[M], value: object, field: str) -> M:
    """``value`` validated as ``model``, the part of a message at ``field`` ("": the whole body)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join([*([field] if field else []), *map(str, first["loc"])])
        where = clip(path or "body", limit=ECHO_CHARS)
        raise WireError(f"bad {model.__name__}: {where}: {clip(first['msg'], limit=ECHO_CHARS)}") from None
