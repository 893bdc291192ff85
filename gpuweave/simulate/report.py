"""The simulation report: summary per policy, a text table, JSON and PNG plots."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from gpuweave.simulate.engine import RunResult
from gpuweave.simulate.faults import FaultKind
from gpuweave.simulate.lifecycle_report import lifecycle_figures, lifecycle_rows
from gpuweave.simulate.timeline import Sample
from gpuweave.simulate.workload import JobKind

LOG_RATIO = 20.0  # a summary panel whose largest bar is more than this times its smallest gets a log axis
COLOURS = {
    "gpuweave": "tab:green",
    "random": "tab:gray",
    "best-fit": "tab:blue",
    "go-gpuallocator-like": "tab:red",
}


def _mean(values: list[float]) -> float:
    return float(statistics.fmean(values)) if values else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _lowest_window_mean(samples: list[Sample], *, window_s: float) -> float:
    """The lowest mean allocation over any ``window_s`` of samples: a collapse shows here."""
    values = [s.allocation for s in samples]
    if not values:
        return 0.0
    step = samples[1].t_s - samples[0].t_s if len(samples) > 1 else window_s
    span = max(1, round(window_s / max(step, 1.0)))
    if len(values) <= span:
        return _mean(values)
    return min(_mean(values[i : i + span]) for i in range(len(values) - span + 1))


def _job_figures(result: RunResult) -> dict[str, Any]:
    """Job completion, faults' cost and gang recovery (``outcomes``); training placements' links."""
    ledger = result.ledger
    done = [c.completion_s / 60.0 for c in ledger.completions]
    training = [c.completion_s / 60.0 for c in ledger.completions if c.kind == JobKind.GANG.value]
    recovered = [r.seconds for r in ledger.recoveries if r.seconds is not None]
    links: dict[str, int] = {}
    for placed in ledger.training:
        links[placed.slowest] = links.get(placed.slowest, 0) + 1
    multi = [p for p in ledger.training if p.pods > 1]
    decisions = result.gang_tier_decisions
    return {
        "job_completion_mean_min": _mean(done),
        "job_completion_p95_min": _percentile(done, 0.95),
        "jobs_completed": len(done),
        "training_completion_mean_min": _mean(training),
        "job_completion_by_kind_mean_min": {
            kind: _mean([c.completion_s / 60.0 for c in ledger.completions if c.kind == kind])
            for kind in sorted({c.kind for c in ledger.completions})
        },
        "training_stretch_mean": _mean([p.stretch for p in ledger.training]),
        "multi_node_gang_stretch_mean": _mean([p.stretch for p in multi]) if multi else None,
        # the trade behind the stretch: how long those gangs waited for the places they got
        "multi_node_gang_wait_mean_min": _mean([p.waited_s / 60.0 for p in multi]) if multi else None,
        "training_slowest_links": dict(sorted(links.items())),
        "gpu_hours_lost_to_faults": ledger.gpu_seconds_lost / 3600.0,
        "gang_recovery_s": [round(s, 3) for s in recovered],
        "gang_recovery_median_s": float(statistics.median(recovered)) if recovered else None,
        "gang_recovery_parts_median_s": _median_parts([r.parts for r in ledger.recoveries if r.parts]),
        "gangs_not_recovered": sum(1 for r in ledger.recoveries if r.seconds is None),
        "inventories_received": result.inventories_received,
        "pods_preempted": result.pods_preempted,
        "drained_min": result.drained_s / 60.0,
        "jobs_unfinished": result.jobs_unfinished,
        # gangs whose tightest tier was busy: waited for it / took a looser one (the extender's
        # cost decision; None for a scheduler without it)
        "gang_tier_waited": decisions.get("waited") if decisions is not None else None,
        "gang_tier_looser": decisions.get("looser") if decisions is not None else None,
    }


def clique_figures(result: RunResult) -> dict[str, Any]:
    """On a fleet of NVLink cliques: multi-node gang starts inside one clique and across cliques,
    starts per clique (every clique of the fleet, 0 included), the mean wait per gang size, and
    how many gangs a fault evicted were placed again inside one clique. {} without cliques."""
    if not result.cliques:
        return {}
    multi = [p for p in result.ledger.training if p.pods > 1]
    inside = [p for p in multi if len(p.cliques) == 1 and p.cliques[0]]
    per_clique = dict.fromkeys(result.cliques, 0)
    for placed in inside:
        per_clique[placed.cliques[0]] = per_clique.get(placed.cliques[0], 0) + 1
    by_size: dict[int, list[float]] = {}
    for placed in multi:
        by_size.setdefault(placed.gpus, []).append(placed.waited_s / 60.0)
    back = [r for r in result.ledger.recoveries if r.seconds is not None and r.pods > 1]
    return {
        "multi_node_gangs_in_one_clique": len(inside),
        "multi_node_gangs_across_cliques": len(multi) - len(inside),
        "multi_node_gangs_per_clique": per_clique,
        "multi_node_gang_wait_by_gpus_mean_min": {str(g): _mean(w) for g, w in sorted(by_size.items())},
        "multi_node_gang_starts_by_gpus": {str(g): len(w) for g, w in sorted(by_size.items())},
        "gangs_recovered_in_one_clique": sum(1 for r in back if len(r.cliques) == 1 and r.cliques[0]),
        "gangs_recovered": len(back),
    }


def summarize(result: RunResult, *, warmup_fraction: float = 0.1) -> dict[str, Any]:
    """Headline numbers of one run; time averages skip the first ``warmup_fraction``."""
    end = result.samples[-1].t_s if result.samples else 0.0
    steady = [s for s in result.samples if s.t_s >= warmup_fraction * end] or result.samples
    multi = result.topology
    waits = [t / 60.0 for t in result.pending_times_s]
    return (
        {
            "policy": result.policy,
            "scheduler": result.transport,
            "node_agents": result.agents or "-",
            "placement_mismatches": result.placement_mismatches,
            "admission_failures": result.admission_failures,
            "kubelet_admissions": f"{result.admissions} / {result.admission_failures}"
            if result.agents
            else "-",
            "gpu_allocation_pct": _mean([s.allocation for s in steady]),
            "fragmentation_pct": _mean([s.fragmentation for s in steady]),
            "multi_gpu_placements": len(multi),
            "topology_best_set_pct": 100.0 * sum(o.got_best for o in multi) / len(multi) if multi else 0.0,
            "topology_value_vs_best": _mean(
                [o.chosen_value / o.best_value for o in multi if o.best_value > 0]
            ),
            "pending_mean_min": _mean(waits),
            "pending_p95_min": _percentile(waits, 0.95),
            "jobs_started": result.jobs_started,
            "jobs_pending_at_end": result.jobs_pending_at_end,
            "faults": [{k: v for k, v in asdict(f).items() if k != "evicted_pods"} for f in result.faults],
            "pods_evicted_by_faults": sum(f.pods_evicted for f in result.faults),
            "mig_reshapes": len(result.reshapes),
            "mig_pods_started": result.mig_pods_started,
            "allocation_lowest_30min_pct": _lowest_window_mean(steady, window_s=1800.0),
        }
        | _job_figures(result)
        | clique_figures(result)
        | latent_figures(result)
        | lifecycle_figures(result)
    )


def latent_figures(result: RunResult) -> dict[str, Any]:
    """Latent faults (``latent``): caught by active checks before a job, hit by a job first, the
    jobs that ran on one; none when the run injected none (``--no-latent``)."""
    if result.latent is None:
        return {}
    return result.latent.summary() | {"latent_records": [r.to_json() for r in result.latent.records]}


def _median_parts(parts: list[dict[str, float]]) -> dict[str, float] | None:
    """Per part of a gang recovery (detection, waiting, preemption grace), the median seconds."""
    if not parts:
        return None
    return {name: float(statistics.median(p[name] for p in parts)) for name in parts[0]}


def _parts_cell(parts: dict[str, float] | None) -> str:
    """``5 + 0 + 30``: the median detection, waiting and preemption-grace seconds."""
    return " + ".join(f"{seconds:.0f}" for seconds in parts.values()) if parts else "-"


def _recovery_cell(summary: dict[str, Any]) -> str:
    """Median seconds, then (jobs running again / training jobs evicted by faults)."""
    back = len(summary["gang_recovery_s"])
    total = back + summary["gangs_not_recovered"]
    if not total:
        return "-"
    median = summary["gang_recovery_median_s"]
    return f"{median:.0f} s ({back}/{total})" if median is not None else f"- (0/{total})"


def _pair_cell(first: Any, second: Any) -> str:
    """``3 / 7``, or ``-`` for a scheduler that does not count them."""
    return "-" if first is None or second is None else f"{first} / {second}"


def _number(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


def add_common_completion(results: list[RunResult], summaries: list[dict[str, Any]]) -> None:
    """Each summary gets ``job_completion_common_mean_min``: the mean completion over the jobs
    that every compared run finished, and ``jobs_completed_by_all``. Each run's own mean covers
    the jobs it finished, and a policy that finishes a long-waiting job the others leave running
    at the end pays for it in its mean alone; over the common jobs the means compare alike."""
    finished = [{c.job_id: c.completion_s for c in r.ledger.completions} for r in results]
    common = set.intersection(*(set(f) for f in finished)) if finished else set()
    for times, summary in zip(finished, summaries, strict=True):
        summary["job_completion_common_mean_min"] = _mean([times[j] / 60.0 for j in sorted(common)])
        summary["jobs_completed_by_all"] = len(common)


ROWS = (
    ("scheduler", "scheduler", "{}"),
    ("nodes", "node_agents", "{}"),
    ("GPU allocation (% of healthy GPUs)", "gpu_allocation_pct", "{:.1f}"),
    ("  lowest 30-min mean allocation (%)", "allocation_lowest_30min_pct", "{:.1f}"),
    ("fragmentation (% of healthy GPUs)", "fragmentation_pct", "{:.1f}"),
    ("multi-GPU pods placed", "multi_gpu_placements", "{}"),
    ("  got the best set on their node (%)", "topology_best_set_pct", "{:.1f}"),
    ("  set quality vs best (mean ratio)", "topology_value_vs_best", "{:.3f}"),
    ("pending time, mean (min)", "pending_mean_min", "{:.1f}"),
    ("pending time, p95 (min)", "pending_p95_min", "{:.1f}"),
    ("job completion, mean (min)", "job_completion_mean_min", "{:.1f}"),
    ("  over jobs every policy finished (min)", "job_completion_common_mean_min", "{:.1f}"),
    ("job completion, p95 (min)", "job_completion_p95_min", "{:.1f}"),
    ("  training jobs, mean (min)", "training_completion_mean_min", "{:.1f}"),
    ("  training run time vs best set (mean)", "training_stretch_mean", "{:.3f}"),
    ("  multi-node gangs vs best set (mean)", "multi_node_gang_stretch_mean", "{:.3f}"),
    ("  multi-node gangs' wait, mean (min)", "multi_node_gang_wait_mean_min", "{:.1f}"),
    ("  busy tightest tier: waited / took looser", "gang_tier", "pair"),
    ("jobs started / pending at the window's end", None, ""),
    ("  jobs not finished after the drain", "jobs_unfinished", "{}"),
    ("pods evicted by faults", "pods_evicted_by_faults", "{}"),
    ("pods preempted", "pods_preempted", "{}"),
    ("GPU-hours lost to faults", "gpu_hours_lost_to_faults", "{:.1f}"),
    ("latent faults: caught before a job / after / not", "latent", ""),
    ("  jobs that ran on a latent fault", "latent_jobs_hit", "{}"),
    ("gang recovery: median (back / evicted)", "", ""),
    ("  detection + waiting + grace (median s)", "gang_recovery_parts_median_s", "parts"),
    ("scheduler/node disagreements", "placement_mismatches", "{}"),
    ("kubelet Allocate calls ok / refused", "kubelet_admissions", "{}"),
    ("MIG reshapes", "mig_reshapes", "{}"),
    ("MIG pods started", "mig_pods_started", "{}"),
)


def _clique_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The NVLink-clique rows, on a fleet of cliques only: gangs inside one / across, per clique,
    recoveries re-placed inside one clique."""
    if not all("multi_node_gangs_per_clique" in s for s in summaries):
        return []
    rows = [
        (
            "multi-node gangs inside one clique / across",
            [
                f"{s['multi_node_gangs_in_one_clique']} / {s['multi_node_gangs_across_cliques']}"
                for s in summaries
            ],
        )
    ]
    for clique in summaries[0]["multi_node_gangs_per_clique"]:
        rows.append(
            (f"  in {clique}", [str(s["multi_node_gangs_per_clique"].get(clique, 0)) for s in summaries])
        )
    rows.append(
        (
            "  gangs re-placed inside one clique",
            [f"{s['gangs_recovered_in_one_clique']} / {s['gangs_recovered']}" for s in summaries],
        )
    )
    return rows


def summary_table(summaries: list[dict[str, Any]]) -> str:
    width = 42
    lines = [f"{'':<{width}}" + "".join(f"{s['policy']:>22}" for s in summaries)]
    for label, key, fmt in ROWS:
        if key == "pods_evicted_by_faults":
            for clique_label, clique_cells in _clique_rows(summaries):
                lines.append(f"{clique_label:<{width}}" + "".join(f"{c:>22}" for c in clique_cells))
        if key == "latent":
            if not all("latent_faults" in s for s in summaries):
                continue
            cells = [
                f"{s['latent_caught_before_job']} / {s['latent_found_after_job']} / {s['latent_not_found']}"
                for s in summaries
            ]
        elif key == "latent_jobs_hit" and not all(key in s for s in summaries):
            continue
        elif key is None:
            cells = [f"{s['jobs_started']} / {s['jobs_pending_at_end']}" for s in summaries]
        elif not key:
            cells = [_recovery_cell(s) for s in summaries]
        elif fmt == "parts":
            cells = [_parts_cell(s.get(key)) for s in summaries]
        elif fmt == "pair":
            cells = [_pair_cell(s.get(f"{key}_waited"), s.get(f"{key}_looser")) for s in summaries]
        else:
            cells = [_number(fmt, s[key]) for s in summaries]
        lines.append(f"{label:<{width}}" + "".join(f"{c:>22}" for c in cells))
        if key == "fragmentation_pct" and all("gpu_hours_paid" in s for s in summaries):
            for life_label, life_cells in lifecycle_rows(summaries):
                lines.append(f"{life_label:<{width}}" + "".join(f"{c:>22}" for c in life_cells))
    return "\n".join(lines)


def _measured(fault: dict[str, Any]) -> str:
    seen = fault["agent_to_kubelet_s"]
    if seen is None:
        return ""
    if fault["kind"] == FaultKind.NVLINK_TRAY.value:
        return (
            f" measured: fabric failed in NVML -> kubelet sees the tray's {fault['gpus_withheld']} GPUs"
            f" Unhealthy {seen * 1000:.0f} ms later (the agent's fabric gate);"
        )
    if fault.get("efa_adapter"):
        return (
            f" measured: EFA adapter {fault['efa_adapter']} gone from sysfs -> kubelet sees it Unhealthy"
            f" {seen * 1000:.0f} ms later (next health round);"
        )
    return f" measured: Xid raised in NVML -> kubelet sees the GPU Unhealthy in {seen * 1000:.0f} ms;"


def _restored(fault: dict[str, Any]) -> str:
    if fault["restored_at_s"] is None:
        return "stays out"
    back = f"back at t={fault['restored_at_s'] / 60:.0f} min"
    rounds, seen = fault.get("health_rounds", 0), fault.get("agent_back_s")
    if fault["kind"] == FaultKind.NVLINK_TRAY.value:
        return back + (
            f" (fabric completed: kubelet sees the GPUs Healthy {seen * 1000:.0f} ms later)" if seen else ""
        )
    if fault["gpu"] is not None and rounds:
        return f"{back} (agent: GPU reset + probation over {rounds} health rounds, one per simulated minute)"
    if seen is not None:
        return f"{back} (link back: kubelet sees the adapter Healthy {seen * 1000:.0f} ms after the round)"
    return back


def fault_table(summary: dict[str, Any]) -> str:
    lines = [f"faults ({summary['policy']} run): what failed, what it reached"]
    for f in summary["faults"]:
        where = f"{f['node']}" + (f" GPU {f['gpu']}" if f["gpu"] is not None else "")
        withheld = f"{f['gpus_withheld']} GPU withheld" + (
            ", 1 EFA adapter withheld" if f.get("efa_adapter") else ""
        )
        if f["kind"] == FaultKind.NVLINK_TRAY.value:
            withheld = f"{f['gpus_withheld']} GPUs withheld until the fabric completes"
        lines.append(
            f"  t={f['at_s'] / 60:5.0f} min  {f['kind']:<26} {where:<24} "
            f"nominal detection ~{f['detection_s']:.0f} s; {f['pods_evicted']} pods of "
            f"{f['jobs_requeued']} jobs evicted and requeued, {withheld}, "
            f"{f['other_pods_on_node_kept']} other pods on the node kept running;"
            f"{_measured(f)} {_restored(f)}"
        )
    return "\n".join(lines)


# The report's wall-clock measurements: how long the run took and its memory, and per fault how
# long the node agent took to get the change to its kubelet. Everything else is simulated and the
# same for the same seed (``gpuweave.simulate.agents``): ``simulated_figures`` leaves these out.
WALL_CLOCK_FIELDS = ("elapsed_s", "peak_rss_mib")
WALL_CLOCK_FAULT_FIELDS = ("agent_to_kubelet_s", "agent_back_s")


def simulated_figures(report: dict[str, Any]) -> dict[str, Any]:
    """``report.json`` without its wall-clock measurements and its output folder: what the options
    and the seed decide, equal between two runs of them on any machine under any load."""
    figures = {k: v for k, v in report.items() if k not in WALL_CLOCK_FIELDS}
    figures["options"] = {k: v for k, v in report["options"].items() if k != "out"}
    summaries = report["summaries"]
    figures["summaries"] = [{**s, "faults": [_simulated(f) for f in s["faults"]]} for s in summaries]
    return figures


def _simulated(fault: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fault.items() if k not in WALL_CLOCK_FAULT_FIELDS}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def plot_timeline(results: list[RunResult], main: RunResult, path: Path) -> Path:
    figure, axes = plt.subplots(4, 1, figsize=(12, 14), sharex=True)
    panels = (
        ("allocation", "GPU allocation (% of healthy GPUs)"),
        ("fragmentation", "GPU fragmentation (% of healthy GPUs)"),
        ("pending", "jobs waiting"),
        ("waiting_demand", "GPUs asked for by waiting jobs\n(% of healthy GPUs)"),
    )
    for axis, (field_name, label) in zip(axes, panels, strict=True):
        for result in results:
            xs = [s.t_s / 3600 for s in result.samples]
            ys = [getattr(s, field_name) for s in result.samples]
            width = 2.2 if result is main else 1.2
            axis.plot(xs, ys, label=result.policy, color=COLOURS.get(result.policy), linewidth=width)
        for fault in main.faults:
            axis.axvline(fault.at_s / 3600, color="crimson", linestyle=":", linewidth=1)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    for fault in main.faults:
        axes[0].annotate(
            fault.kind.split(" ")[0],
            (fault.at_s / 3600, axes[0].get_ylim()[0]),
            rotation=90,
            fontsize=8,
            color="crimson",
            va="bottom",
            ha="right",
        )
    for reshape in main.reshapes[:1]:
        axes[0].axvline(reshape.at_s / 3600, color="purple", linestyle="--", linewidth=1)
        axes[0].annotate(
            "first MIG reshape",
            (reshape.at_s / 3600, 0.97),
            xycoords=("data", "axes fraction"),  # inside the frame, under the figure's title
            rotation=90,
            fontsize=8,
            color="purple",
            va="top",
            ha="right",
        )
    axes[0].legend(loc="lower right", fontsize=8)
    example = (
        "a 64-GPU gang needs 16 whole trays of one NVLink clique free at once"
        if main.cliques
        else "a 2x8-GPU gang needs two whole EFA nodes free at once"
    )
    axes[3].set_title(
        f"a dip in allocation with demand here is work that waits (e.g. {example}), not idle capacity",
        fontsize=8,
    )
    axes[-1].set_xlabel("simulated time (hours)")
    figure.suptitle("gpuweave simulate: policies compared on the same workload (faults as dotted lines)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_summary(summaries: list[dict[str, Any]], path: Path) -> Path:
    """The headline numbers as bars (``summary_figure``), written to ``path``."""
    figure = summary_figure(summaries)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def summary_figure(summaries: list[dict[str, Any]]) -> Figure:
    """The headline numbers as bars, each labelled with its value; a panel where one bar is more
    than ``LOG_RATIO`` times another (a 5 s recovery beside a 4,448 s one) has a log axis, so the
    small bar still shows. On a fleet of NVLink cliques the third panel counts the multi-node
    gangs placed across cliques instead of the multi-GPU pods on their best set. A run's GPU-hours
    paid, and the share of them used, get two more panels."""
    cliques = all("multi_node_gangs_across_cliques" in s for s in summaries)
    metrics: tuple[tuple[str, str], ...] = (
        ("gpu_allocation_pct", "GPU allocation %"),
        ("fragmentation_pct", "fragmentation %"),
        ("multi_node_gangs_across_cliques", "multi-node gangs across NVLink cliques")
        if cliques
        else ("topology_best_set_pct", "multi-GPU pods on best set %"),
        ("pending_mean_min", "mean pending (min)"),
        ("job_completion_mean_min", "mean job completion (min)"),
        ("job_completion_p95_min", "p95 job completion (min)"),
        ("gpu_hours_lost_to_faults", "GPU-hours lost to faults"),
        ("gang_recovery_median_s", "median gang recovery (s)"),
    )
    if all("gpu_hours_paid" in s for s in summaries):  # what the fleet cost, and how much of it ran work
        metrics += (
            ("gpu_hours_paid", "GPU-hours paid"),
            ("gpu_hours_used_pct_of_paid", "GPU-hours used, % of paid"),
        )
    figure, axes = plt.subplots(2, len(metrics) // 2, figsize=(4 * len(metrics) // 2, 8))
    for axis, (key, label) in zip(axes.flat, metrics, strict=True):
        _bars(axis, summaries, key=key, label=label)
    figure.tight_layout()
    return figure


def _bars(axis: Any, summaries: list[dict[str, Any]], *, key: str, label: str) -> None:
    names = [s["policy"] for s in summaries]
    measured = [s[key] for s in summaries]
    positive = [float(v) for v in measured if v is not None and v > 0]
    log = len(positive) > 1 and max(positive) > LOG_RATIO * min(positive)
    floor = min(positive) / 3 if log else 0.0  # where a log axis starts: a 0 bar has no height there
    values = [float(v) if v is not None and v > 0 else floor for v in measured]
    bars = axis.bar(names, values, color=[COLOURS.get(n, "tab:gray") for n in names])
    axis.bar_label(bars, labels=[value_label(v) for v in measured], fontsize=8, padding=2)
    if log:
        axis.set_yscale("log")
        axis.set_ylim(floor, max(positive) * 4)  # room above the tallest bar for its label
    else:
        axis.margins(y=0.15)
    axis.set_title(label + (" (log scale)" if log else ""))
    axis.tick_params(axis="x", rotation=25, labelsize=8)
    axis.grid(axis="y", alpha=0.3)


def value_label(value: float | None) -> str:
    """A bar's label: ``n/a`` where nothing was measured (no training job evicted), else the
    value with as many digits as it needs (``4,448``, ``69.4``, ``1.22``, ``0``)."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"
