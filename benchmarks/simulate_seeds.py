"""The simulation over many seeds: every policy's mean job completion, and what gpuweave's run
paid for its gang recovery (pods preempted, GPU-hours lost to faults, pending time, recovery).

Runs ``gpuweave simulate --seed S --no-progress`` (every policy compared, the default fleet,
faults and lifecycle) for each seed, at most ``--parallel`` at a time, each in its own process,
and keeps per seed: each policy's mean job completion, the lowest of them, and for gpuweave and
best-fit the pods preempted, GPU-hours lost to faults, pending time, GPU allocation and gang
recovery (median and every recovery). Seeds 42..51 are the ones the extender's rules were tuned
on; 1000..1009 are held out (docs/simulate.md). These are simulated figures: the seed decides
them, not the machine, so the results file changes only when the code does.

``--reports DIR`` reads ``DIR/<seed>/report.json`` where it exists (a run made before, by the
same command) and runs only the seeds missing there, into that folder.

Writes ``benchmarks/results/<name>.json`` (``--name``, default ``simulate_seeds``).

    .venv/bin/python -m benchmarks.simulate_seeds [--seeds 42-51,1000-1009] [--parallel 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.results_file import write_results

TUNING = tuple(range(42, 52))
HELD_OUT = tuple(range(1000, 1010))
DETAILED = ("gpuweave", "best-fit")  # the policies whose costs the table spells out
DETAIL_KEYS = (
    "pods_preempted",
    "gpu_hours_lost_to_faults",
    "pods_evicted_by_faults",
    "pending_mean_min",
    "gpu_allocation_pct",
    "gang_recovery_median_s",
    "gang_recovery_s",
    "jobs_unfinished",
)


def parse_seeds(text: str) -> list[int]:
    """``42-51,1000`` -> [42, ..., 51, 1000]."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def run_seed(seed: int, *, folder: Path) -> Path:
    """``folder/<seed>/report.json``, run now unless it is there already."""
    out = folder / str(seed)
    report = out / "report.json"
    if not report.exists():
        command = [sys.executable, "-m", "gpuweave", "simulate", "--no-progress"]
        command += ["--seed", str(seed), "--out", str(out)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return report


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def seed_row(seed: int, report: dict[str, Any]) -> dict[str, Any]:
    """One seed's figures from its ``report.json``."""
    summaries = {s["policy"]: s for s in report["summaries"]}
    completion = {p: round(s["job_completion_mean_min"], 2) for p, s in summaries.items()}
    lowest = min(completion, key=lambda p: completion[p])
    gpuweave = summaries["gpuweave"]
    evicted = bool(gpuweave["gang_recovery_s"]) or bool(gpuweave["gangs_not_recovered"])
    median = gpuweave["gang_recovery_median_s"]
    others = min(v for p, v in completion.items() if p != "gpuweave")
    return {
        "seed": seed,
        "held_out": seed not in TUNING,
        "job_completion_mean_min": completion,
        "lowest": lowest,
        "gpuweave_lead_min": round(others - completion["gpuweave"], 2),
        "gpuweave_lowest": completion["gpuweave"] < others,
        "recovery_under_60s": (not evicted) or (median is not None and median < 60),
        **{
            policy.replace("-", "_"): {k: _rounded(summaries[policy].get(k)) for k in DETAIL_KEYS}
            for policy in DETAILED
            if policy in summaries
        },
    }


def _mean(values: Iterable[float]) -> float:
    kept = list(values)
    return round(sum(kept) / len(kept), 2)


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per seed set: seeds meeting each half of the goal, and mean completion per policy."""
    out: dict[str, Any] = {}
    for name, held in (("tuning", False), ("held_out", True)):
        chosen = [r for r in rows if r["held_out"] == held]
        if not chosen:
            continue
        names = chosen[0]["job_completion_mean_min"]
        out[name] = {
            "seeds": len(chosen),
            "gpuweave_lowest": sum(r["gpuweave_lowest"] for r in chosen),
            "recovery_under_60s": sum(r["recovery_under_60s"] for r in chosen),
            "both": sum(r["gpuweave_lowest"] and r["recovery_under_60s"] for r in chosen),
            "job_completion_mean_min": {
                p: _mean(r["job_completion_mean_min"][p] for r in chosen) for p in names
            },
            "gpuweave_pods_preempted": sum(r["gpuweave"]["pods_preempted"] for r in chosen),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="42-51,1000-1009", help="seed list: 42-51,1000-1009")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--reports", type=Path, help="reuse DIR/<seed>/report.json; new runs go there")
    parser.add_argument("--name", default="simulate_seeds", help="results file name")
    parser.add_argument("--label", default="", help="the code the reports came from (a commit)")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    with tempfile.TemporaryDirectory(prefix="gpuweave-sim-seeds-") as work:
        folder = args.reports or Path(work)
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            reports = list(pool.map(lambda s: run_seed(s, folder=folder), seeds))
        rows = [seed_row(s, json.loads(p.read_text())) for s, p in zip(seeds, reports, strict=True)]
    for row in rows:
        jct = "  ".join(f"{p} {v:.1f}" for p, v in row["job_completion_mean_min"].items())
        g = row["gpuweave"]
        print(
            f"seed {row['seed']:>4}: {jct} | lowest {row['lowest']}; gpuweave preempted "
            f"{g['pods_preempted']}, lost {g['gpu_hours_lost_to_faults']} GPU-h, pending "
            f"{g['pending_mean_min']} min, recovery {g['gang_recovery_s']}"
        )
    summary = totals(rows)
    print(json.dumps(summary, indent=1))
    report = {"benchmark": "simulate over seeds", "label": args.label, "seeds": seeds, "totals": summary}
    report["rows"] = rows
    write_results(args.name, report, module="benchmarks.simulate_seeds", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
