"""Which IMEX domain the node's daemon serves in device-plugin mode: the one live pod on the node
that asks for the node's IMEX channel names it in its ``gpuweave.io/assignment`` (``imex``: its name
and nodes, written by the extender at bind). Pure: the pods from the agent's pod view in, the
decision (``nodeagent.imex.ImexDecision``) out; the trust rules are ``nodeagent.imex``'s. In DRA
mode the claim's GpuImexDomain names it instead (``dradriver.imex_domains``)."""

from __future__ import annotations

from collections.abc import Iterable

from deviceplugin.handoff import PendingPod
from nodeagent.imex import ImexDecision


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
