"""Judging one round of hardware readings: findings per GPU and node-level EFA faults.

Pure functions over the values ``hardware.health_probe`` returns. A read that failed or timed out
is itself a finding (fail closed): the device is withheld until the check passes again.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hardware.health_probe import EfaAdapter, GpuReadings, ProbeError
from health.scope import NodeFault, NodeFaultKind
from health.xid import Action, Cause, Severity

RESET_THEN_REPLACE = (Action.RESET_GPU, Action.REPLACE)
LOST_LADDER = (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE)


@dataclass(frozen=True)
class Finding:
    """One failed check on one GPU, graded."""

    signal: str
    severity: Severity
    reason: str
    cause: Cause = Cause.HARDWARE
    ladder: tuple[Action, ...] = RESET_THEN_REPLACE
    strike: bool = True


def judge_readings(readings: GpuReadings) -> list[Finding]:
    """Findings for one GPU's counters (empty when the GPU is clean)."""
    found: list[Finding] = []
    if readings.volatile_dbe:
        found.append(
            Finding("ecc-dbe", Severity.FATAL, f"{readings.volatile_dbe} volatile double-bit ECC errors")
        )
    if readings.remapped_rows is not None:
        _, uncorrectable, pending, failure = readings.remapped_rows
        if failure:
            found.append(
                Finding("row-remap-failure", Severity.FATAL, "row remapping failed", ladder=(Action.REPLACE,))
            )
        elif pending:
            reason = f"row remap pending ({uncorrectable} uncorrectable rows); a reset activates it"
            found.append(Finding("row-remap-pending", Severity.FATAL, reason, strike=False))
    if readings.retired_pages_pending:
        found.append(
            Finding("retired-pages-pending", Severity.SUSPECT, "retired pages pending a driver reload")
        )
    if readings.nvlinks_down:
        links = ", ".join(str(n) for n in readings.nvlinks_down)
        found.append(Finding("nvlink-down", Severity.FATAL, f"NVLink link(s) {links} inactive"))
    if readings.pcie_width is not None and readings.pcie_width[0] < readings.pcie_width[1]:
        current, widest = readings.pcie_width
        found.append(Finding("pcie-degraded", Severity.SUSPECT, f"PCIe link x{current} of x{widest}"))
    return found


def judge_failure(error: BaseException | None, *, timeout_s: float) -> Finding:
    """A check that could not run: a lost GPU is fatal, anything else withholds the GPU."""
    if isinstance(error, ProbeError) and error.kind == "lost":
        return Finding("gpu-lost", Severity.FATAL, str(error), ladder=LOST_LADDER)
    if error is None:
        return Finding(
            "check-timeout", Severity.SUSPECT, f"check timed out after {timeout_s:g} s", Cause.PLATFORM
        )
    return Finding("check-failed", Severity.SUSPECT, f"check failed: {error}", Cause.PLATFORM)


def temperature_outliers(temperatures: Mapping[str, int], *, gap_c: float) -> dict[str, float]:
    """GPUs hotter than the node's median by more than ``gap_c`` (needs three GPUs to have a median)."""
    if len(temperatures) < 3:
        return {}
    median = statistics.median(temperatures.values())
    return {uuid: t - median for uuid, t in temperatures.items() if t - median > gap_c}


def judge_efa(
    adapters: Sequence[EfaAdapter],
    *,
    expected: Sequence[str],
    expected_count: int,
    counter_down: Mapping[str, str] | None = None,
) -> tuple[dict[str, bool], frozenset[NodeFault]]:
    """Per-adapter link state and node faults: fewer adapters than expected, a netdev link down, or
    an adapter its hardware counters show down (``counter_down``: adapter -> reason)."""
    counter_down = counter_down or {}
    present = {a.name: a for a in adapters}
    up = {name: name in present and present[name].operstate in (None, "up", "unknown") for name in expected}
    for adapter in adapters:
        up[adapter.name] = adapter.operstate in (None, "up", "unknown") and adapter.name not in counter_down
    faults: set[NodeFault] = set()
    if len(adapters) < expected_count:
        missing = sorted(set(expected) - set(present)) or ["(renamed)"]
        detail = f"{len(adapters)} of {expected_count} EFA adapters present"
        faults.update(NodeFault(NodeFaultKind.EFA_MISSING, name, detail) for name in missing)
    for adapter in adapters:
        if not up[adapter.name]:
            netdev = f"netdev {adapter.netdev} operstate {adapter.operstate}"
            detail = counter_down.get(adapter.name) or netdev
            faults.add(NodeFault(NodeFaultKind.EFA_LINK_DOWN, adapter.name, detail))
    return up, frozenset(faults)
