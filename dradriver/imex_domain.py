"""The IMEX domain of DRA claims: a ``GpuImexDomain`` object, and what a claim's config says of it. Pure.

In DRA mode a job's IMEX domain is a namespaced ``GpuImexDomain`` (``gpuweave.io/v1alpha1``;
``manifests/crds/gpuimexdomains.yaml``): the job's owner creates it with ``spec.numNodes`` (how many
nodes the job runs on) and names it in the opaque config of the claim's IMEX channel request::

    config:
    - requests: [imex]
      opaque:
        driver: gpuweave.io
        parameters: {apiVersion: gpuweave.io/v1alpha1, kind: ImexChannelConfig, domain: train}

At prepare each node agent adds its own entry (``name``, ``address``: the Node's InternalIP,
``clique``) to the domain's ``status.nodes``, and removes it at unprepare
(``dradriver.imex_domains``, ``dradriver.kube.KubeImexDomains``); each node's IMEX daemon is
configured with the entries of its own clique (``domain_decision``). This module holds the pure
parts: the config's validation (``channel_domain``), the status entries (``joined``, ``left``,
``only_own_entry_changed``, ``status_patch``) and the decision the IMEX reconciler writes.

Trust: the claim's author names the domain; the domain must be in the claim's namespace (a
claim cannot join another namespace's job). Agents write only their own node's entry
(``only_own_entry_changed`` is checked before every write); what other entries say is trusted only
as far as the Node objects agree (the reconciler takes the peers' addresses from the Nodes that
carry this node's clique label, as in device-plugin mode).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from devicemodel.assignment import MAX_IMEX_NODES, ImexDomain, imex_domain_name
from devicemodel.errors import InvalidInputError, clip, echo
from devicemodel.validation import first_problem
from dradriver.devices import DRIVER
from nodeagent.imex import ImexDecision

GROUP = "gpuweave.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "gpuimexdomains"
KIND = "GpuImexDomain"
CONFIG_KIND = "ImexChannelConfig"
MAX_ADDRESS = 64  # an IPv6 address with a zone fits
MAX_CLIQUE = 128  # "<cluster UUID>.<clique ID>"

_DnsName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]


class ImexDomainError(InvalidInputError):
    """A claim's IMEX config, or a GpuImexDomain, that the node cannot act on (one line)."""


class ImexChannelConfig(BaseModel):
    """The opaque parameters of driver ``gpuweave.io`` for an IMEX channel request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_version: Literal["gpuweave.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ImexChannelConfig"]
    domain: _DnsName  # a GpuImexDomain in the claim's namespace


class DomainNode(BaseModel):
    """One entry of ``status.nodes``: a node of the job, written by that node's agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: _DnsName
    address: Annotated[str, StringConstraints(min_length=1, max_length=MAX_ADDRESS)]
    clique: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CLIQUE)]

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "address": self.address, "clique": self.clique}


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    num_nodes: int = Field(alias="numNodes", ge=1, le=MAX_IMEX_NODES)


class _Status(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    nodes: tuple[DomainNode, ...] = Field(default=(), max_length=MAX_IMEX_NODES)


@dataclass(frozen=True)
class DomainRef:
    """A GpuImexDomain by namespace and name."""

    namespace: str
    name: str

    def describe(self) -> str:
        return f"{KIND} {self.namespace}/{self.name}"

    def to_wire(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> DomainRef:
        return cls(str(data["namespace"]), str(data["name"]))

    def domain_name(self) -> str:
        """The domain's DNS-safe name in the daemon's record (``gpuweave-domain.json``)."""
        return imex_domain_name(f"{self.namespace}/{self.name}")


def parse_config(parameters: object, *, where: str) -> ImexChannelConfig:
    """``parameters`` as an ImexChannelConfig, or ``ImexDomainError`` naming the field at fault."""
    try:
        return ImexChannelConfig.model_validate(parameters)
    except ValidationError as exc:
        field, problem = first_problem(exc, whole="parameters")
        raise ImexDomainError(
            clip(
                f"{where}: opaque parameters of driver {DRIVER} are not an {CONFIG_KIND} (apiVersion "
                f"{API_VERSION}, kind {CONFIG_KIND}, domain: a {KIND} name): at {field}: {problem}"
            )
        ) from None


def _applies(requests: Sequence[str], request: str) -> bool:
    """A config entry's ``requests`` name ``request`` (a subrequest ``main/sub`` is named by ``main``);
    an empty list names every request."""
    return not requests or request in requests or request.split("/", 1)[0] in requests


def channel_domain(
    claim: Mapping[str, Any], *, wanted: Sequence[tuple[str, str]], channels: Collection[str]
) -> str | None:
    """The GpuImexDomain that the claim's config names for its IMEX channel, None when none does.

    ``wanted`` is (request, device) of every allocation result on this node; ``channels`` the
    node's IMEX channel devices. The config is read from ``status.allocation.devices.config`` (the
    allocator's copy of the class's and the claim's config, in that order); every entry of driver
    ``gpuweave.io`` must be a valid ImexChannelConfig, and one that names a request on this node
    that holds no channel is refused. Of the entries that apply to a channel request the last wins
    (DRA's precedence). Raises ``ImexDomainError``.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    configs = ((allocation.get("devices") or {}) if isinstance(allocation, Mapping) else {}).get("config")
    channel_requests = {request for request, device in wanted if device in channels}
    other_requests = {request for request, device in wanted if device not in channels}
    found: str | None = None
    for index, entry in enumerate(configs if isinstance(configs, list) else []):
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER:
            continue
        where = f"allocation config[{index}]"
        requests = [str(r) for r in entry.get("requests") or []]
        config = parse_config(opaque.get("parameters"), where=where)
        named_others = sorted(r for r in other_requests if requests and _applies(requests, r))
        if named_others:
            raise ImexDomainError(
                f"{where}: an {CONFIG_KIND} applies to the IMEX channel only, but names request "
                f"{', '.join(named_others)}, which holds no IMEX channel"
            )
        if any(_applies(requests, r) for r in channel_requests):
            found = config.domain
    return found


def domain_status(obj: Mapping[str, Any], *, ref: DomainRef) -> tuple[int, tuple[DomainNode, ...]]:
    """A GpuImexDomain's ``spec.numNodes`` and ``status.nodes`` (``ImexDomainError`` when they do not
    parse: the CRD's schema normally keeps them right)."""
    try:
        spec = _Spec.model_validate(obj.get("spec") or {})
        status = _Status.model_validate(obj.get("status") or {})
    except ValidationError as exc:
        field, problem = first_problem(exc, whole="object")
        raise ImexDomainError(f"{ref.describe()}: at {field}: {problem}") from None
    return spec.num_nodes, status.nodes


def joined(entries: Sequence[DomainNode], entry: DomainNode, *, num_nodes: int) -> tuple[DomainNode, ...]:
    """``entries`` with ``entry`` in (replacing the node's own entry), ordered by node name.
    Idempotent; raises ``ImexDomainError`` when the domain already lists ``num_nodes`` other nodes."""
    others = [e for e in entries if e.name != entry.name]
    if len(others) >= num_nodes:
        raise ImexDomainError(
            f"the domain already lists {len(others)} node(s) ({echo(', '.join(e.name for e in others))}) "
            f"and spec.numNodes is {num_nodes}: node {entry.name} cannot join (a node of another job, "
            "or a numNodes too small)"
        )
    return tuple(sorted([*others, entry], key=lambda e: e.name))


def left(entries: Sequence[DomainNode], node: str) -> tuple[DomainNode, ...]:
    """``entries`` without ``node``'s entry; the others unchanged, in their order."""
    return tuple(e for e in entries if e.name != node)


def only_own_entry_changed(before: Iterable[DomainNode], after: Iterable[DomainNode], *, node: str) -> bool:
    """True when ``after`` differs from ``before`` in ``node``'s entry at most: an agent writes no
    other node's entry (checked before every write)."""
    return sorted(e.to_wire().items() for e in before if e.name != node) == sorted(
        e.to_wire().items() for e in after if e.name != node
    )


def status_patch(entries: Sequence[DomainNode], *, resource_version: str) -> dict[str, Any]:
    """A merge patch of ``status.nodes``, preconditioned on the version the entries were read at (a
    write in between is a 409 Conflict, and the caller reads again)."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "status": {"nodes": [e.to_wire() for e in entries]},
    }


def domain_decision(
    obj: Mapping[str, Any] | None, *, ref: DomainRef, holder: str, node: str, clique: str | None
) -> ImexDecision:
    """The domain this node's IMEX daemon serves for the claim ``holder`` that joined ``ref``: the
    status entries of this node's clique, in their order (an entry of another clique is left out and
    said so). None (with the reason) when the object is gone, does not parse or does not list this
    node."""
    if obj is None:
        return ImexDecision(None, holder, f"{ref.describe()} of claim {holder} is gone; IMEX not configured")
    try:
        _, entries = domain_status(obj, ref=ref)
    except ImexDomainError as exc:
        return ImexDecision(None, holder, str(exc))
    if node not in {e.name for e in entries}:
        return ImexDecision(None, holder, f"{ref.describe()} does not list node {node}; IMEX not configured")
    mine = tuple(e.name for e in entries if e.name == node or e.clique == clique)
    elsewhere = [e.name for e in entries if e.name not in mine]
    problem = ""
    if elsewhere:
        problem = clip(
            f"{ref.describe()}: left out {', '.join(elsewhere)} (registered in another clique than {clique})"
        )
    return ImexDecision(ImexDomain(name=ref.domain_name(), nodes=mine), holder, problem)
