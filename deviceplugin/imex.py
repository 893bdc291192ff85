"""Which IMEX domain this node's IMEX daemon serves, and with which peers: a pure decision.

An IMEX daemon runs per node and serves one domain at a time: the nodes of one multi-node NVLink
job, which import and export GPU memory to each other through the channel the job's pods hold.
The node has one channel (``gpuweave.io/imex-channel``), so the kubelet admits at most one pod that
asks for it; that pod's ``gpuweave.io/assignment`` names the domain (``imex``: its name and nodes,
written by the extender at bind). The daemon is configured for that domain while the pod lives,
and for none otherwise.

Trust: only the extender writes the annotation where the admission policy
(``manifests/admission-assignment.yaml``) is installed; without it anyone who may create a pod
could, so the agent counts only what the kubelet makes true. The domain is taken only from a
live pod on this node whose spec asks for the channel (one such pod holds it, or none), only when
its domain lists this node, and only with peers that carry this node's own
``nvidia.com/gpu.clique`` label (a pod cannot make the daemon reach out of its NVLink
partition); a listed node outside the clique, or without an address, is left out and reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from devicemodel.assignment import ImexDomain
from deviceplugin.handoff import PendingPod


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


def wanted_domain(pods: Iterable[PendingPod], *, node: str) -> ImexDecision:
    """The domain of the one live pod on ``node`` that asks for the node's IMEX channel."""
    claimants = [p for p in pods if p.requests_imex and p.assignment.node == node]
    if not claimants:
        return ImexDecision(None)
    if len(claimants) > 1:
        names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in claimants))
        return ImexDecision(None, problem=f"pods {names} all ask for the node's one IMEX channel")
    pod = claimants[0]
    holder = f"{pod.namespace}/{pod.name}"
    domain = pod.assignment.imex
    if domain is None:
        return ImexDecision(None, holder, f"pod {holder} asks for an IMEX channel but names no IMEX domain")
    if node not in domain.nodes:
        problem = f"pod {holder}'s IMEX domain {domain.name} does not list node {node}"
        return ImexDecision(None, holder, problem)
    return ImexDecision(domain, holder)


def imex_config(
    domain: ImexDomain, *, node: str, clique: str | None, peers: Mapping[str, str]
) -> tuple[ImexConfig | None, str]:
    """The daemon's configuration for ``domain`` and what was left out of it.

    ``peers`` is node name -> InternalIP of the nodes that carry this node's clique label; a listed
    node not among them (another clique, no such node, no address) is left out. None when this
    node has no clique or is not among them itself.
    """
    if clique is None:
        return None, f"node {node} is in no multi-node NVLink domain (no clique); IMEX not configured"
    kept = [(name, peers[name]) for name in domain.nodes if peers.get(name)]
    left = [name for name in domain.nodes if not peers.get(name)]
    if node not in {name for name, _ in kept}:
        return None, f"node {node} has no InternalIP or clique label in the API; IMEX not configured"
    problem = ""
    if left:
        problem = (
            f"IMEX domain {domain.name}: left out {', '.join(left)} (not nodes of clique {clique}, "
            "or without an InternalIP)"
        )
    return ImexConfig(domain.name, tuple(n for n, _ in kept), tuple(a for _, a in kept)), problem
