"""Faults injected mid-run and how far each one reaches (its blast radius).

The reaction follows the health policy's per-GPU-family Xid table (``health.xid``): a fatal Xid
fails the one GPU it names, its pods (and the rest of their gangs) are evicted and requeued, and
its sibling GPUs keep running. An EFA link loss takes the node out of multi-node gangs until the
link returns; single-node work on it keeps running. On a fleet of NVLink cliques (NVL72 racks)
an NVLink tray fault fails one compute tray's fabric (its NVSwitch fabric state ``failed``, as
``gpuweave sim inject --fabric-state failed`` sets it): the node agent's fabric gate withholds the
tray's four GPUs until the fabric completes, every job whose GPUs talk over the tray's NVLink (a
multi-node gang with a pod there, the whole gang; a multi-GPU pod, whose GPUs reach each other only
through the switch trays) is evicted and requeued, and single-GPU and fractional pods, which use no
NVLink peer, keep running. Detection latencies are the signal paths' nominal figures (NVML event:
~1 s; ECC counters polled every 10 s; EFA port state every 5 s; the fabric gate's check every
10 s), stated as assumptions, not measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.state import GpuMode, RunningPod, SimState
from health.signals.fabric import DEFAULT_INTERVAL_S as FABRIC_CHECK_S
from health.xid import Severity, table_for
from topology.network import LABEL_GPU_CLIQUE

DETECTION_S = {"xid": 1.0, "ecc": 10.0, "efa": 5.0, "fabric": FABRIC_CHECK_S}


class FaultKind(StrEnum):
    XID_79 = "xid-79-fallen-off-bus"
    ECC_DBE = "ecc-double-bit (xid 48)"
    EFA_LINK = "efa-link-loss"
    NVLINK_TRAY = "nvlink-tray-fault"  # one compute tray's NVSwitch fabric fails (NVL72)


@dataclass(frozen=True)
class FaultSpec:
    kind: FaultKind
    at_fraction: float
    restore_after_s: float  # GPU back after remediation / link back; 0 = stays out


DEFAULT_FAULTS = (
    FaultSpec(FaultKind.XID_79, 0.35, 0.0),
    FaultSpec(FaultKind.ECC_DBE, 0.55, 1800.0),
    FaultSpec(FaultKind.EFA_LINK, 0.7, 1800.0),
)
# Added on a fleet with NVLink cliques, between the Xid and the ECC error
TRAY_FAULT = FaultSpec(FaultKind.NVLINK_TRAY, 0.45, 1800.0)


def faults_for(fleet: Sequence[FleetNode]) -> tuple[FaultSpec, ...]:
    """The default faults, and the NVLink tray fault where some node is in an NVLink clique."""
    if any(LABEL_GPU_CLIQUE in node.labels for node in fleet):
        return (*DEFAULT_FAULTS, TRAY_FAULT)
    return DEFAULT_FAULTS


@dataclass
class FaultRecord:
    kind: str
    at_s: float
    node: str
    gpu: int | None
    severity: str
    detection_s: float
    pods_evicted: int = 0
    jobs_requeued: int = 0
    gpus_withheld: int = 0
    other_pods_on_node_kept: int = 0  # pods on the node outside the evicted jobs, still running
    nodes_affected: int = 1
    restored_at_s: float | None = None
    # measured with the node agents: Xid raised in the simulated NVML until the kubelet sees the GPU
    # Unhealthy (health monitor, Xid policy, agent, ListAndWatch); None without agents
    agent_to_kubelet_s: float | None = None
    efa_adapter: str | None = None  # with agents: the adapter taken away in the node's sysfs
    health_rounds: int = 0  # with agents: health rounds run until the device came back
    agent_back_s: float | None = None  # with agents: last round until the kubelet lists it Healthy
    evicted_pods: list[str] = field(default_factory=list)


Evict = Callable[[RunningPod], int]  # evicts a pod's whole job; returns pods evicted


def _busiest_gpu(state: SimState, *, exclude_nodes: set[int]) -> tuple[int, int] | None:
    best: tuple[int, int, int] | None = None
    for node, modes in enumerate(state.modes):
        if node in exclude_nodes:
            continue
        for gpu, mode in enumerate(modes):
            count = len(state.pods_on_gpu(node, gpu)) if mode is GpuMode.NORMAL else -1
            if count > 0 and (best is None or count > best[0]):
                best = (count, node, gpu)
    return (best[1], best[2]) if best else None


def inject_gpu_fault(
    state: SimState, spec: FaultSpec, *, now: float, evict: Evict, used: set[int]
) -> FaultRecord | None:
    """Fail the busiest GPU (most pods) on a node not hit before."""
    target = _busiest_gpu(state, exclude_nodes=used)
    if target is None:
        return None
    node, gpu = target
    used.add(node)
    xid = 79 if spec.kind is FaultKind.XID_79 else 48
    rule = table_for(state.fleet[node].architecture).rule(xid)
    source = "xid" if xid == 79 else "ecc"
    record = FaultRecord(
        spec.kind.value, now, state.fleet[node].name, gpu, rule.severity.value, DETECTION_S[source]
    )
    if rule.severity is not Severity.FATAL:
        return record
    for pod in state.pods_on_gpu(node, gpu):
        if pod.pod_id in state.pods:
            record.evicted_pods.append(pod.pod_id)
            record.pods_evicted += evict(pod)
            record.jobs_requeued += 1
    state.set_mode(node, gpu, GpuMode.WITHHELD)
    record.gpus_withheld = 1
    record.other_pods_on_node_kept = sum(1 for p in state.pods.values() if p.node == node)
    return record


def inject_efa_loss(state: SimState, *, now: float, evict: Evict) -> FaultRecord | None:
    """Take down the EFA link of the node with the most multi-node gang pods (or any EFA node)."""
    efa_nodes = [
        i for i, n in enumerate(state.fleet) if n.has_efa and i not in state.efa_down and state.present(i)
    ]
    if not efa_nodes:
        return None

    def multi_node_pods(node: int) -> list[RunningPod]:
        return [p for p in state.pods.values() if p.node == node and p.job.pods > 1]

    node = max(efa_nodes, key=lambda n: len(multi_node_pods(n)))
    state.efa_down.add(node)
    record = FaultRecord(
        FaultKind.EFA_LINK.value, now, state.fleet[node].name, None, "node-network", DETECTION_S["efa"]
    )
    for pod in multi_node_pods(node):
        if pod.pod_id in state.pods:
            record.evicted_pods.append(pod.pod_id)
            record.pods_evicted += evict(pod)
            record.jobs_requeued += 1
    record.other_pods_on_node_kept = sum(1 for p in state.pods.values() if p.node == node)
    return record


def _nvlink_pods(state: SimState, node: int) -> list[RunningPod]:
    """Pods on ``node`` that talk over its NVLink: multi-node gang members and multi-GPU pods."""
    return [
        p
        for p in state.pods.values()
        if p.node == node and p.request is not None and (p.job.pods > 1 or len(p.gpus) > 1)
    ]


def inject_tray_fault(state: SimState, *, now: float, evict: Evict) -> FaultRecord | None:
    """Fail the NVLink fabric of the clique tray whose loss evicts the most pods (its NVLink jobs,
    whole gangs counted; ties: the first tray): its GPUs take no new pods until it comes back."""
    trays = [
        i
        for i, n in enumerate(state.fleet)
        if LABEL_GPU_CLIQUE in n.labels and i not in state.fabric_down and state.present(i)
    ]
    if not trays:
        return None

    def reach(node: int) -> int:
        return sum(len(state.pods_of_job(job)) for job in {p.job.job_id for p in _nvlink_pods(state, node)})

    node = max(trays, key=lambda n: (reach(n), -n))
    state.fabric_down.add(node)
    record = FaultRecord(
        FaultKind.NVLINK_TRAY.value, now, state.fleet[node].name, None, "nvlink-fabric", DETECTION_S["fabric"]
    )
    for pod in _nvlink_pods(state, node):
        if pod.pod_id in state.pods:
            record.evicted_pods.append(pod.pod_id)
            record.pods_evicted += evict(pod)
            record.jobs_requeued += 1
    record.gpus_withheld = state.fleet[node].gpus
    record.other_pods_on_node_kept = sum(1 for p in state.pods.values() if p.node == node)
    return record


def restore(state: SimState, record: FaultRecord, *, now: float) -> None:
    node = next(i for i, n in enumerate(state.fleet) if n.name == record.node)
    if record.gpu is not None and state.modes[node][record.gpu] is GpuMode.WITHHELD:
        state.set_mode(node, record.gpu, GpuMode.NORMAL)
    if record.kind == FaultKind.NVLINK_TRAY.value:
        state.fabric_down.discard(node)
    elif record.gpu is None:
        state.efa_down.discard(node)
    record.restored_at_s = now


def detection_s(kind: FaultKind) -> float:
    """The signal path's nominal detection latency for a fault of ``kind`` (``DETECTION_S``)."""
    source = {
        FaultKind.XID_79: "xid",
        FaultKind.ECC_DBE: "ecc",
        FaultKind.EFA_LINK: "efa",
        FaultKind.NVLINK_TRAY: "fabric",
    }[kind]
    return DETECTION_S[source]
