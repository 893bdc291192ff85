"""Which IMEX domain this node's IMEX daemon serves, and with which peers: a pure decision.

An IMEX daemon runs per node and serves one domain at a time: the nodes of one multi-node NVLink
job, which import and export GPU memory to each other through the channel the job's pods hold.
The node has one channel (``gpuweave.io/imex-channel``), so the kubelet admits at most one pod that
asks for it; in device-plugin mode that pod's ``gpuweave.io/assignment`` names the domain
(``imex``: its name and nodes, written by the extender at bind; ``deviceplugin.imex_pods``). The
daemon is configured for that domain while the pod lives, and for none otherwise.

Trust: only the extender writes the annotation where the admission policy
(``manifests/admission-assignment.yaml``) is installed; without it anyone who may create a pod
could, so the agent counts only what the kubelet makes true. The domain is taken only from a
live pod on this node whose spec asks for the channel (one such pod holds it, or none), only when
its domain lists this node, and only with peers that carry this node's own
``nvidia.com/gpu.clique`` label (a pod cannot make the daemon reach out of its NVLink
partition); a listed node outside the clique, or without an address, is left out and reported.

A peer's address comes from its Node's InternalIP, which whoever may write that Node's status sets:
``nodes_config.cfg`` takes exactly one IP address per peer (``ipaddress``, written in its canonical
form), so no value can add a line, a path or a host name to the daemon's list; anything else, a
repeated address, and peers past the largest NVLink domain (``MAX_IMEX_NODES``) are left out and
reported with their count (``ImexPlan.left_out``).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from devicemodel.assignment import MAX_IMEX_NODES, ImexDomain
from devicemodel.errors import echo

# The longest text of one IP address: an IPv6 address with an embedded IPv4 one (45 characters).
MAX_ADDRESS_CHARS = 45
_NAMES_SHOWN = 8  # of the nodes left out for one reason, named in the problem (the rest counted)


@dataclass(frozen=True)
class ImexConfig:
    """One domain as this node's daemon runs it: ``addresses`` in the domain's node order."""

    domain: str
    nodes: tuple[str, ...]
    addresses: tuple[str, ...]

    def nodes_config(self) -> str:
        """``nodes_config.cfg`` as nvidia-imex reads it: one peer address per line."""
        return "".join(f"{address}\n" for address in self.addresses)


@dataclass(frozen=True)
class ImexDecision:
    domain: ImexDomain | None  # the domain asked for (None: the daemon serves nothing)
    holder: str = ""  # namespace/name of the pod that asks for it
    problem: str = ""  # why a domain asked for is refused, or what is left out of it


class LeftOut(StrEnum):
    """Why a node of the domain is not among the daemon's peers (the metric's ``reason``)."""

    NOT_IN_CLIQUE = "not-in-clique"  # no Node of this clique by that name, or it has no InternalIP
    NOT_AN_ADDRESS = "not-an-address"  # its InternalIP is not exactly one IP address
    DUPLICATE = "duplicate-address"  # an address an earlier peer of the domain already has
    OVER_CAP = "over-cap"  # past MAX_IMEX_NODES peers


@dataclass(frozen=True)
class ImexPlan:
    """What the daemon serves for a domain (``config``; None for nothing), what was left out of it
    (node, why; in the domain's order) and the problem to report ("" when nothing was)."""

    config: ImexConfig | None
    problem: str = ""
    left_out: tuple[tuple[str, LeftOut], ...] = ()

    def counts(self) -> dict[LeftOut, int]:
        """How many nodes were left out, for every reason (0 included)."""
        found = Counter(why for _, why in self.left_out)
        return {why: found[why] for why in LeftOut}


def peer_address(raw: object) -> str | None:
    """``raw`` as one line of ``nodes_config.cfg``: exactly one IP address, in canonical form; None
    for anything else (a second line, a path, a host name, a scoped IPv6 address, whose scope may
    hold any character, the unspecified or a multicast address, text past ``MAX_ADDRESS_CHARS``)."""
    if not isinstance(raw, str) or len(raw) > MAX_ADDRESS_CHARS:
        return None
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        return None
    if address.is_unspecified or address.is_multicast:
        return None
    return str(address)


def imex_config(domain: ImexDomain, *, node: str, clique: str | None, peers: Mapping[str, str]) -> ImexPlan:
    """The daemon's configuration for ``domain`` and what was left out of it.

    ``peers`` is node name -> InternalIP of the nodes that carry this node's clique label; a listed
    node not among them (another clique, no such node, no address) is left out, and so is one whose
    address is not one IP address, repeats an earlier peer's, or comes past ``MAX_IMEX_NODES``.
    No configuration when this node has no clique or is not among the peers kept.
    """
    if clique is None:
        problem = f"node {node} is in no multi-node NVLink domain (no clique); IMEX not configured"
        return ImexPlan(None, problem)
    kept: dict[str, str] = {}  # address -> node, in the domain's order
    left: list[tuple[str, LeftOut]] = []
    shown: dict[str, str] = {}  # node -> its refused address, quoted and clipped for the report
    for name in domain.nodes:
        raw = peers.get(name)
        address = peer_address(raw)
        why = _left_out(raw, address, kept=kept)
        if why is None:
            kept[str(address)] = name
            continue
        left.append((name, why))
        if why is LeftOut.NOT_AN_ADDRESS:
            shown[name] = echo(raw, limit=MAX_ADDRESS_CHARS)
    if node not in kept.values():
        own = next((why for name, why in left if name == node), LeftOut.NOT_IN_CLIQUE)
        reason = _REASONS[own].format(clique=clique)
        problem = f"node {node} is left out of its own IMEX domain {domain.name} ({reason}); not configured"
        return ImexPlan(None, problem, tuple(left))
    config = ImexConfig(domain.name, tuple(kept.values()), tuple(kept))
    return ImexPlan(config, _left_out_problem(domain.name, clique, left, shown), tuple(left))


def _left_out(raw: str | None, address: str | None, *, kept: Mapping[str, str]) -> LeftOut | None:
    if not raw:
        return LeftOut.NOT_IN_CLIQUE
    if address is None:
        return LeftOut.NOT_AN_ADDRESS
    if address in kept:
        return LeftOut.DUPLICATE
    if len(kept) >= MAX_IMEX_NODES:
        return LeftOut.OVER_CAP
    return None


_REASONS = {
    LeftOut.NOT_IN_CLIQUE: "not nodes of clique {clique}, or without an InternalIP",
    LeftOut.NOT_AN_ADDRESS: "an InternalIP that is not one IP address",
    LeftOut.DUPLICATE: "an InternalIP an earlier node of the domain has",
    LeftOut.OVER_CAP: f"past the largest NVLink domain, {MAX_IMEX_NODES} nodes",
}


def _left_out_problem(
    domain: str, clique: str, left: list[tuple[str, LeftOut]], shown: Mapping[str, str]
) -> str:
    """One clause per reason: the first nodes named (with a refused address quoted), the rest counted."""
    clauses = []
    for why in LeftOut:
        names = [f"{n} {shown[n]}" if n in shown else n for n, w in left if w is why]
        if not names:
            continue
        more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
        listed = ", ".join(names[:_NAMES_SHOWN]) + more
        clauses.append(f"left out {listed} ({_REASONS[why].format(clique=clique)})")
    return f"IMEX domain {domain}: {'; '.join(clauses)}" if clauses else ""
