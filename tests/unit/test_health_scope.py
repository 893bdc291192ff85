"""Fan-out of device faults, node conditions, the disruption cap and the startup gate."""

from __future__ import annotations

import pytest

from devicemodel.assignment import device_id_share
from health.policy import DeviceRecord, DeviceState
from health.scope import (
    CONDITION_EFA,
    CONDITION_GPU,
    NO_INSTANCE,
    HealthSnapshot,
    NodeFault,
    NodeFaultKind,
    StartupGate,
    mig_target,
    node_conditions,
    node_verdict,
    taint_decision,
)

GPU0, GPU1 = "GPU-0000", "GPU-1111"
MIG_A, MIG_B = "MIG-aaaa", "MIG-bbbb"
FAILED = DeviceRecord(state=DeviceState.FAILED, reason="Xid 79")


def snapshot(*, gpu0: DeviceRecord | None = None, mig_a: DeviceRecord | None = None) -> HealthSnapshot:
    return HealthSnapshot(
        gpus={GPU0: gpu0 or DeviceRecord(), GPU1: DeviceRecord()},
        migs={MIG_A: mig_a or DeviceRecord(), MIG_B: DeviceRecord()},
        mig_parent={MIG_A: GPU0, MIG_B: GPU0},
        efa_up={"efa0": True, "efa1": False},
    )


def test_gpu_fault_fans_out_to_its_mig_devices_and_shares_only() -> None:
    snap = snapshot(gpu0=FAILED)
    assert not snap.is_healthy(GPU0)
    assert not snap.is_healthy(MIG_A)
    assert not snap.is_healthy(MIG_B)
    assert not snap.is_healthy(device_id_share(GPU0, "replica", 3))
    assert snap.is_healthy(GPU1)
    assert snap.is_healthy(device_id_share(GPU1, "compute", 0))
    assert snap.unhealthy_gpus() == (GPU0,)


def test_mig_fault_stays_on_that_mig_device() -> None:
    snap = snapshot(mig_a=FAILED)
    assert not snap.is_healthy(MIG_A)
    assert snap.is_healthy(MIG_B)
    assert snap.is_healthy(GPU0)


def test_efa_and_unknown_devices() -> None:
    snap = snapshot()
    assert snap.is_healthy("efa0")
    assert not snap.is_healthy("efa1")
    assert snap.is_healthy("MIG-not-yet-known")


MIG_IDS = {(GPU0, 1, 0): MIG_A, (GPU0, 2, 0): MIG_B, (GPU0, 3, 0): "MIG-c", (GPU0, 3, 1): "MIG-d"}


@pytest.mark.parametrize(
    ("gi", "ci", "expected"),
    [
        (None, None, None),
        (NO_INSTANCE, NO_INSTANCE, None),
        (1, 0, MIG_A),
        (2, NO_INSTANCE, MIG_B),  # one compute instance in GI 2
        (3, NO_INSTANCE, None),  # two compute instances: charge the GPU (fail closed)
        (3, 1, "MIG-d"),
        (9, 0, None),
    ],
)
def test_mig_target(gi: int | None, ci: int | None, expected: str | None) -> None:
    assert mig_target(GPU0, gpu_instance=gi, compute_instance=ci, mig_ids=MIG_IDS) == expected


def test_node_conditions_name_the_failed_devices() -> None:
    gpu, efa = node_conditions(snapshot())
    assert (gpu.type, gpu.status, efa.type, efa.status) == (CONDITION_GPU, "True", CONDITION_EFA, "True")
    faults = frozenset({NodeFault(NodeFaultKind.EFA_MISSING, "efa3", "3 of 4 adapters present")})
    gpu, efa = node_conditions(HealthSnapshot(gpus={GPU0: FAILED}, node_faults=faults))
    assert gpu.status == "False"
    assert GPU0 in gpu.message
    assert efa.status == "False"
    assert "efa3" in efa.message


REBOOT = NodeFault(NodeFaultKind.REBOOT_REQUIRED, GPU1, "reset-gpu failed: GPU 1 did not come back")
RETIRED = DeviceRecord(state=DeviceState.RETIRED, reason="Xid 79: reset failed 3 times")
EFA_DOWN = NodeFault(NodeFaultKind.EFA_LINK_DOWN, "efa0", "link down")
SWITCH = NodeFault(NodeFaultKind.NVSWITCH_FATAL, "sw0", "SXid 20034")


@pytest.mark.parametrize(
    ("gpus", "faults", "status", "reason", "named"),
    [
        ({GPU0: DeviceRecord()}, frozenset(), "True", "Serviceable", ""),
        ({GPU0: FAILED}, frozenset(), "True", "Serviceable", ""),  # a reset may still bring it back
        ({GPU0: FAILED}, frozenset({EFA_DOWN}), "True", "Serviceable", ""),  # no reboot or swap helps
        ({GPU0: FAILED}, frozenset({REBOOT}), "False", "RebootRequired", GPU1),
        ({GPU0: DeviceRecord()}, frozenset({SWITCH}), "False", "RebootRequired", "sw0"),
        (
            {GPU0: RETIRED},
            frozenset({REBOOT}),
            "False",
            "ReplaceRequired",
            GPU0,
        ),  # a reboot brings no retired GPU back
    ],
)
def test_the_node_verdict_names_the_act_only_its_engine_can_do(
    gpus: dict[str, DeviceRecord], faults: frozenset[NodeFault], status: str, reason: str, named: str
) -> None:
    verdict = node_verdict(HealthSnapshot(gpus=gpus, node_faults=faults))
    assert (verdict.type, verdict.status, verdict.reason) == ("GpuweaveNodeServiceable", status, reason)
    assert named in verdict.message


FAULT = frozenset({NodeFault(NodeFaultKind.NVSWITCH_FATAL, "0000:05:00.0", "SXid 20034")})


@pytest.mark.parametrize(
    ("faults", "already", "total", "tainted", "taint", "blocked"),
    [
        (frozenset(), False, 10, 0, False, False),
        (frozenset(), True, 10, 1, False, False),
        (FAULT, False, 10, 0, True, False),
        (FAULT, False, 10, 1, False, True),  # cap 10% of 10 = 1, already used
        (FAULT, False, 100, 9, True, False),
        (FAULT, False, 100, 10, False, True),
        (FAULT, True, 10, 5, True, False),  # keeps its own taint
        (FAULT, False, 3, 0, True, False),  # rounds up to at least one node
    ],
)
def test_taint_decision_under_disruption_cap(  # noqa: PLR0917
    faults: frozenset[NodeFault], already: bool, total: int, tainted: int, taint: bool, blocked: bool
) -> None:
    decision = taint_decision(
        faults, already_tainted=already, nodes_total=total, nodes_tainted=tainted, cap_fraction=0.1
    )
    assert (decision.taint, decision.blocked_by_cap) == (taint, blocked)


def test_startup_gate_needs_two_consecutive_complete_rounds() -> None:
    gate = StartupGate()
    gate = gate.after_round(all_checks_completed=True)
    assert gate.pending
    gate = gate.after_round(all_checks_completed=False)
    gate = gate.after_round(all_checks_completed=True)
    assert gate.pending
    gate = gate.after_round(all_checks_completed=True)
    assert not gate.pending
    assert not gate.after_round(all_checks_completed=False).pending
