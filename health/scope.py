"""Who a fault touches, and what the node as a whole should say (pure).

A fault on a GPU fans out to the devices the device plugin serves from it (its MIG devices and
its share/replica IDs, named per ``devicemodel.assignment``) and to nothing else: sibling GPUs keep
serving. A fault attributed to one GPU instance stays on that MIG device. Node-level faults (EFA
adapters missing or down, a fatal NVSwitch SXid, a GPU that needs a reboot) become node conditions
and a taint, the taint bounded by a cluster-wide disruption cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from devicemodel.assignment import parent_gpu_of_share
from devicemodel.contracts import (
    CONDITION_NODE_SERVICEABLE,
    VERDICT_REBOOT,
    VERDICT_REPLACE,
    VERDICT_SERVICEABLE,
)
from health.policy import DeviceRecord, DeviceState, worst

NO_INSTANCE = 0xFFFFFFFF  # NVML's "not attributed to a GPU/compute instance"

CONDITION_GPU = "GpuweaveGpuHealthy"
CONDITION_EFA = "EfaHealthy"
CONDITION_STATE_SAVED = "GpuweaveHealthStateSaved"
# Every Node condition the agent writes: what manifests/admission-node-agent.yaml lets it change
# and what ``node-agent --cleanup`` removes.
AGENT_CONDITIONS = (CONDITION_GPU, CONDITION_EFA, CONDITION_STATE_SAVED, CONDITION_NODE_SERVICEABLE)
TAINT_NODE_FAULT = "gpuweave.io/node-fault"
TAINT_HEALTH_PENDING = "gpuweave.io/health-pending"


class NodeFaultKind(StrEnum):
    EFA_MISSING = "efa-missing"
    EFA_LINK_DOWN = "efa-link-down"
    NVSWITCH_FATAL = "nvswitch-fatal"
    REBOOT_REQUIRED = "reboot-required"


@dataclass(frozen=True)
class NodeFault:
    kind: NodeFaultKind
    subject: str  # adapter name, switch address, GPU UUID
    detail: str


@dataclass(frozen=True)
class NodeCondition:
    type: str
    status: str  # "True" | "False" (Ready polarity: True = healthy)
    reason: str
    message: str


@dataclass(frozen=True)
class HealthSnapshot:
    """Per-device health at one moment; the agent reads device health from here only."""

    gpus: Mapping[str, DeviceRecord] = field(default_factory=dict)  # GPU UUID -> record
    migs: Mapping[str, DeviceRecord] = field(default_factory=dict)  # MIG UUID -> record
    mig_parent: Mapping[str, str] = field(default_factory=dict)  # MIG UUID -> GPU UUID
    efa_up: Mapping[str, bool] = field(default_factory=dict)  # adapter name -> link up
    node_faults: frozenset[NodeFault] = frozenset()
    startup_pending: bool = True

    def state_of(self, device_id: str) -> DeviceState:
        """Effective state of a device-plugin device ID (GPU, MIG, share or EFA)."""
        parent = parent_gpu_of_share(device_id)
        if parent is not None:
            return self.state_of(parent)
        if device_id in self.migs:
            own = self.migs[device_id].state
            gpu = self.gpus.get(self.mig_parent.get(device_id, ""))
            return worst(own, gpu.state) if gpu else own
        if device_id in self.gpus:
            return self.gpus[device_id].state
        if device_id in self.efa_up:
            return DeviceState.HEALTHY if self.efa_up[device_id] else DeviceState.FAILED
        return (
            DeviceState.HEALTHY
        )  # not a device health tracks (a new MIG device is judged by its GPU once known)

    def is_healthy(self, device_id: str) -> bool:
        return self.state_of(device_id) is DeviceState.HEALTHY

    def unhealthy_gpus(self) -> tuple[str, ...]:
        return tuple(sorted(u for u, r in self.gpus.items() if r.withheld))


def mig_target(
    gpu_uuid: str,
    *,
    gpu_instance: int | None,
    compute_instance: int | None,
    mig_ids: Mapping[tuple[str, int, int], str],
) -> str | None:
    """The MIG UUID an event with GI/CI ids belongs to, or None when it concerns the whole GPU.

    An event with a GI but no CI (or CI = 0xFFFFFFFF) matches the GPU instance's only compute
    instance when there is exactly one; otherwise it is charged to the whole GPU (fail closed).
    """
    if gpu_instance is None or gpu_instance == NO_INSTANCE:
        return None
    if compute_instance is not None and compute_instance != NO_INSTANCE:
        return mig_ids.get((gpu_uuid, gpu_instance, compute_instance))
    matches = [uuid for (g, gi, _), uuid in mig_ids.items() if g == gpu_uuid and gi == gpu_instance]
    return matches[0] if len(matches) == 1 else None


def node_conditions(snapshot: HealthSnapshot) -> tuple[NodeCondition, ...]:
    """Ready-polarity conditions: True when healthy, False with the reason and the devices named."""
    failed = sorted(
        f"{u} {r.state}: {r.reason}"
        for u, r in snapshot.gpus.items()
        if r.state in (DeviceState.FAILED, DeviceState.REMEDIATING, DeviceState.RETIRED)
    )
    gpu_node = sorted(
        f"{f.kind} {f.subject}: {f.detail}"
        for f in snapshot.node_faults
        if f.kind in (NodeFaultKind.NVSWITCH_FATAL, NodeFaultKind.REBOOT_REQUIRED)
    )
    efa = sorted(
        f"{f.kind} {f.subject}: {f.detail}"
        for f in snapshot.node_faults
        if f.kind in (NodeFaultKind.EFA_MISSING, NodeFaultKind.EFA_LINK_DOWN)
    )
    gpu_reason = "NodeGpuFault" if gpu_node else "GpuFailed" if failed else "AllGpusHealthy"
    gpu = NodeCondition(
        CONDITION_GPU, "False" if gpu_node or failed else "True", gpu_reason, "; ".join(gpu_node + failed)
    )
    efa_condition = NodeCondition(
        CONDITION_EFA, "False" if efa else "True", "EfaFault" if efa else "EfaHealthy", "; ".join(efa)
    )
    return gpu, efa_condition


def node_verdict(snapshot: HealthSnapshot) -> NodeCondition:
    """What only the node's engine can do, as a condition the lifecycle controller reads: False
    ``ReplaceRequired`` once a GPU is retired (the bad-hardware list: the machine must go, and the
    GPU is kept out wherever it turns up), else False ``RebootRequired`` while a device can come
    back only through a reboot (a reset that failed or was refused, a fatal NVSwitch error), else
    True. Replacement wins: a reboot does not bring a retired GPU back."""
    retired = sorted(f"{u}: {r.reason}" for u, r in snapshot.gpus.items() if r.state is DeviceState.RETIRED)
    if retired:
        return NodeCondition(CONDITION_NODE_SERVICEABLE, "False", VERDICT_REPLACE, "; ".join(retired))
    reboot = sorted(
        f"{f.kind} {f.subject}: {f.detail}"
        for f in snapshot.node_faults
        if f.kind in (NodeFaultKind.NVSWITCH_FATAL, NodeFaultKind.REBOOT_REQUIRED)
    )
    if reboot:
        return NodeCondition(CONDITION_NODE_SERVICEABLE, "False", VERDICT_REBOOT, "; ".join(reboot))
    return NodeCondition(CONDITION_NODE_SERVICEABLE, "True", VERDICT_SERVICEABLE, "")


def state_condition(unsaved: Mapping[str, str]) -> NodeCondition:
    """True while every health state file is on disk; False names each file held only in memory.

    Not a node fault (no taint): health checking goes on from memory, only a restart would lose
    the unsaved part, so the operator is told and nothing is withdrawn for it.
    """
    if not unsaved:
        return NodeCondition(CONDITION_STATE_SAVED, "True", "StateSaved", "")
    files = "; ".join(f"{name}: {error}" for name, error in sorted(unsaved.items()))
    return NodeCondition(
        CONDITION_STATE_SAVED, "False", "StateUnsaved", f"kept in memory, retried every round: {files}"
    )


@dataclass(frozen=True)
class TaintDecision:
    taint: bool
    blocked_by_cap: bool
    reason: str


def taint_decision(
    faults: frozenset[NodeFault],
    *,
    already_tainted: bool,
    nodes_total: int,
    nodes_tainted: int,
    cap_fraction: float,
) -> TaintDecision:
    """Taint this node for a node-level fault unless the cluster already has its cap of tainted nodes.

    The cap is ``ceil(cap_fraction * nodes_total)`` nodes (at least one); nodes tainted already count,
    this node included when it is one of them. A node without node-level faults is untainted.
    """
    if not faults:
        return TaintDecision(False, False, "no node-level fault")
    if already_tainted:
        return TaintDecision(True, False, "already tainted")
    cap = max(1, math.ceil(cap_fraction * nodes_total))
    if nodes_tainted >= cap:
        reason = f"disruption cap reached: {nodes_tainted} of {nodes_total} nodes tainted, cap {cap}"
        return TaintDecision(False, True, reason)
    return TaintDecision(True, False, f"{len(faults)} node-level fault(s); {nodes_tainted + 1} of cap {cap}")


@dataclass(frozen=True)
class StartupGate:
    """The startup taint stays until ``rounds_required`` consecutive rounds ran every check to
    completion and the burn-in (the active check at start, when configured) has ended. A GPU the
    burn-in failed is withheld on its own; the gate is the node's, so it opens for the rest."""

    rounds_required: int = 2
    clean_rounds: int = 0
    burn_in_pending: bool = False

    @property
    def pending(self) -> bool:
        return self.clean_rounds < self.rounds_required or self.burn_in_pending

    def after_round(self, *, all_checks_completed: bool) -> StartupGate:
        if not self.pending:
            return self  # once open the gate stays open; device faults are per device from then on
        rounds = self.clean_rounds + 1 if all_checks_completed else 0
        return replace(self, clean_rounds=min(rounds, self.rounds_required))

    def burn_in_started(self) -> StartupGate:
        return self if not self.pending else replace(self, burn_in_pending=True)

    def burn_in_ended(self) -> StartupGate:
        return replace(self, burn_in_pending=False)
