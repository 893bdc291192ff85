"""The node lifecycle's part of the report: GPU-hours paid against used, replacements, scale-ups.

GPU-hours **paid** are every machine's GPUs times the time it existed within the arrival window
(a machine the lifecycle launched counts from its launch, through its boot); GPU-hours **used**
are the GPUs allocated over the same window (whole GPUs, shares by their fraction, MIG instances
by compute slices). A run without the lifecycle (``--no-lifecycle``) pays for its fixed fleet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuweave.simulate.engine import RunResult


def lifecycle_figures(result: RunResult) -> dict[str, Any]:
    """The summary keys of the lifecycle (paid and used GPU-hours in any run)."""
    figures: dict[str, Any] = {
        "gpu_hours_used": result.gpu_hours_used,
        "gpu_hours_paid": result.gpu_hours_paid,
        "gpu_hours_used_pct_of_paid": (
            100.0 * result.gpu_hours_used / result.gpu_hours_paid if result.gpu_hours_paid else None
        ),
    }
    lifecycle = result.lifecycle
    if lifecycle is None:
        return figures
    return (
        figures
        | lifecycle.summary(until_s=result.window_s)
        | {
            "gpu_hours_paid": result.gpu_hours_paid,
            "replacement_records": [r.to_json() for r in lifecycle.replacements],
            "scale_up_records": [s.to_json() for s in lifecycle.scale_ups],
            "replacement_waits": dict(lifecycle.waits),
        }
    )


def lifecycle_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Rows of the policy table: paid / used GPU-hours always; replacements and scale-ups where
    every run had the lifecycle."""
    rows = [
        (
            "GPU-hours paid / used",
            [f"{s['gpu_hours_paid']:.0f} / {s['gpu_hours_used']:.0f}" for s in summaries],
        )
    ]
    if not all("replacements" in s for s in summaries):
        return rows
    rows.append(
        (
            "nodes replaced: count, fault -> running (s)",
            [f"{s['replacements']}, {_seconds(s['replacement_fault_to_running_mean_s'])}" for s in summaries],
        )
    )
    rows.append(
        (
            "scale-ups / machines added / consolidated",
            [f"{s['scale_ups']} / {s['machines_added']} / {s['machines_consolidated']}" for s in summaries],
        )
    )
    rows.append(
        (
            "  pending demand -> machines ready (s)",
            [_seconds(s["scale_up_demand_to_ready_mean_s"]) for s in summaries],
        )
    )
    return rows


def replacement_line(summary: dict[str, Any]) -> str:
    """Each replacement: fault -> handed over -> new node ready -> the affected jobs running again."""
    records = summary.get("replacement_records")
    if records is None:
        return "off (--no-lifecycle: a broken node stays broken)"
    if not records:
        waits = summary.get("replacement_waits") or {}
        held = "; ".join(f"{node} waits: {why}" for node, why in sorted(waits.items()))
        return "no node needed its engine" + (f" ({held})" if held else "")
    parts = []
    for r in records:
        fault = r["fault"] or "a fault"
        parts.append(
            f"{r['node']} ({r['verdict']} after {fault} at t={r['fault_at_s'] / 60:.0f} min): "
            f"handed over +{_seconds(r['handed_over_after_s'])} s, {r['new_node']} ready "
            f"+{_seconds(r['new_node_ready_after_s'])} s, its {len(r['jobs'])} job(s) running again "
            f"+{_seconds(r['jobs_running_again_after_s'])} s ({r['pods_drained']} pod(s) drained)"
        )
    mean = summary["replacement_fault_to_running_mean_s"]
    return "; ".join(parts) + f"; fault -> running again, mean {_seconds(mean)} s"


def scale_up_line(summary: dict[str, Any]) -> str:
    """The scale-ups: how many, machines added, pending demand -> machines ready."""
    records = summary.get("scale_up_records")
    if records is None:
        return "off (--no-lifecycle: a fixed fleet)"
    if not records:
        bound = summary["max_new_nodes"]
        return f"none (no pending demand the autoscaler cannot read; at most {bound} machines)"
    pools: dict[str, int] = {}
    for record in records:
        pools[record["pool"]] = pools.get(record["pool"], 0) + record["machines"]
    per_pool = ", ".join(f"{count}x {pool}" for pool, count in sorted(pools.items()))
    return (
        f"{summary['scale_ups']} buffer(s), {summary['machines_added']} machine(s) added ({per_pool}), "
        f"{summary['machines_consolidated']} consolidated away when empty; pending demand -> machines "
        f"ready, mean {_seconds(summary['scale_up_demand_to_ready_mean_s'])} s "
        f"(boot {summary['node_boot_s']:.0f} s, at most {summary['max_new_nodes']} added at once)"
    )


def paid_line(summary: dict[str, Any]) -> str:
    pct = summary["gpu_hours_used_pct_of_paid"]
    return (
        f"{summary['gpu_hours_paid']:.0f} GPU-hours paid, {summary['gpu_hours_used']:.0f} used "
        f"({'-' if pct is None else f'{pct:.1f}'} %) over the arrival window; pending time mean "
        f"{_minutes(summary['pending_mean_min'])} min, p95 {_minutes(summary['pending_p95_min'])} min"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
