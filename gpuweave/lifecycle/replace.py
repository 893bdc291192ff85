"""Which broken nodes are handed to their engine now (pure: facts in, decisions out).

The node agent says, per node, whether only its engine can bring it back
(``GpuweaveNodeServiceable=False``: ``ReplaceRequired`` when a GPU is retired, ``RebootRequired``
when a device comes back only through a reboot). gpuweave does not reboot or terminate machines:
it hands the node to the engine that owns the machine (a Karpenter NodeClaim or a Cluster API
Machine is deleted, and the engine drains the node, honouring its termination grace period and
PodDisruptionBudgets, then replaces it), or, where neither is found, only publishes the node
condition an engine repairs on. This module decides when, under three guards:

- a pod on the node labelled ``gpuweave.io/no-node-replacement=true`` (or
  ``gpuweave.io/no-health-eviction=true``, which the agent already leaves running on its failed
  device) holds the node until it ends;
- a PodDisruptionBudget that allows no disruption now, over a pod on the node, holds it too,
  unless the operator allows the failure override (the engine then drains within its own
  termination grace period);
- at most ``ceil(cap_fraction x GPU nodes)`` nodes (at least one) are handed over at a time,
  counting nodes handed over earlier that still exist.

A ``RebootRequired`` node is replaced unless a reboot path is configured (``reboot="leave"``:
something else reboots it, gpuweave leaves it alone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from devicemodel.contracts import VERDICT_REBOOT, VERDICT_REPLACE


class Engine(StrEnum):
    KARPENTER = "karpenter"  # delete the node's NodeClaim
    CLUSTER_API = "cluster-api"  # delete the node's Machine
    CONDITION = "condition"  # only the node condition an engine's repair policy reads


class Act(StrEnum):
    HAND_OVER = "hand-over"
    WAIT = "wait"
    LEAVE = "leave"


@dataclass(frozen=True)
class EngineHandle:
    """What the engine owns for the node: the object to delete, or only the condition."""

    engine: Engine
    name: str = ""
    namespace: str = ""

    def describe(self) -> str:
        if self.engine is Engine.CONDITION:
            return "the node condition only (no NodeClaim or Machine found)"
        kind = "NodeClaim" if self.engine is Engine.KARPENTER else "Machine"
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{kind} {where}{self.name}"


@dataclass(frozen=True)
class PodFacts:
    key: str  # namespace/name
    opted_out: bool = False
    pdb_blocking: str = ""  # a PodDisruptionBudget over the pod that allows no disruption now


@dataclass(frozen=True)
class NodeFacts:
    name: str
    verdict: str  # VERDICT_REPLACE | VERDICT_REBOOT
    detail: str  # the condition's message: which devices, why
    handle: EngineHandle
    pods: tuple[PodFacts, ...] = ()
    handed_over: bool = False  # handed to its engine earlier (still exists: counts against the cap)


@dataclass(frozen=True)
class ReplacementPolicy:
    cap_fraction: float = 0.1
    reboot: Literal["replace", "leave"] = "replace"
    pdb_override: bool = False


@dataclass(frozen=True)
class Decision:
    node: str
    act: Act
    reason: str
    handle: EngineHandle | None = None


def disruption_cap(cap_fraction: float, nodes_total: int) -> int:
    return max(1, math.ceil(cap_fraction * nodes_total))


def decide(
    candidates: Sequence[NodeFacts], *, nodes_total: int, policy: ReplacementPolicy
) -> tuple[Decision, ...]:
    """One decision per candidate. Nodes to replace come before nodes to reboot, then by name, so
    the cap goes to the worse verdict first and the order does not depend on listing order."""
    cap = disruption_cap(policy.cap_fraction, nodes_total)
    room = cap - sum(1 for node in candidates if node.handed_over)
    decisions = []
    for node in sorted(candidates, key=lambda n: (n.verdict != VERDICT_REPLACE, n.name)):
        if node.handed_over:
            reason = f"handed to its engine already ({node.handle.describe()})"
            decisions.append(Decision(node.name, Act.HAND_OVER, reason, node.handle))
            continue
        decision = _guarded(node, policy)
        if decision is None and room <= 0:
            in_flight = cap - room
            reason = f"disruption cap reached: {in_flight} of {nodes_total} GPU nodes handed over, cap {cap}"
            decision = Decision(node.name, Act.WAIT, reason)
        if decision is None:
            room -= 1
            reason = f"{_verdict_text(node)}: handing {node.handle.describe()} to its engine"
            decision = Decision(node.name, Act.HAND_OVER, reason, node.handle)
        decisions.append(decision)
    return tuple(decisions)


def _guarded(node: NodeFacts, policy: ReplacementPolicy) -> Decision | None:
    """The decision a guard takes for the node, or None when nothing holds it."""
    if node.verdict not in (VERDICT_REPLACE, VERDICT_REBOOT):
        return Decision(node.name, Act.LEAVE, f"verdict {node.verdict!r} asks nothing of the engine")
    if node.verdict == VERDICT_REBOOT and policy.reboot == "leave":
        return Decision(
            node.name, Act.LEAVE, "reboot required; a reboot path other than replacement is configured"
        )
    opted = sorted(p.key for p in node.pods if p.opted_out)
    if opted:
        return Decision(node.name, Act.WAIT, f"pods opted out of replacement still run: {_some(opted)}")
    blocked = sorted(f"{p.key} (PodDisruptionBudget {p.pdb_blocking})" for p in node.pods if p.pdb_blocking)
    if blocked and not policy.pdb_override:
        return Decision(node.name, Act.WAIT, f"disruption budgets allow no eviction now: {_some(blocked)}")
    return None


def _verdict_text(node: NodeFacts) -> str:
    what = "replacement required" if node.verdict == VERDICT_REPLACE else "reboot required, no reboot path"
    return f"{what} ({node.detail})" if node.detail else what


def _some(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
