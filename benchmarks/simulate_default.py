"""The simulation's default run, gpuweave's column only: with the node lifecycle, and on a fixed
fleet with and without latent faults.

Runs ``gpuweave simulate --no-compare --no-progress`` (seed 42: the default run, with latent
faults and the node lifecycle), then ``--no-lifecycle`` (the fixed fleet the docs' earlier tables
measured) and ``--no-lifecycle --no-latent``, each in its own process, and keeps the figures the
docs quote of them: the node agents' admissions (kubelet Allocate calls granted and refused), GPU
allocation, job completion, pending time, and the lifecycle's GPU-hours paid and used,
replacements and scale-ups. These are simulated figures: the seed decides them, not the machine
(docs/simulate.md), so the results file changes only when the code does.

Writes ``benchmarks/results/simulate_default.json``.

    .venv/bin/python -m benchmarks.simulate_default [--seed 42]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.results_file import write_results

KEPT = (
    "gpu_allocation_pct",
    "admission_failures",
    "job_completion_mean_min",
    "pending_mean_min",
    "pending_p95_min",
    "gpu_hours_paid",
    "gpu_hours_used",
    "replacements",
    "replacement_fault_to_running_mean_s",
    "scale_ups",
    "machines_added",
    "machines_consolidated",
    "scale_up_demand_to_ready_mean_s",
)
REPLACEMENT_KEPT = (
    "node",
    "verdict",
    "handed_over_after_s",
    "new_node_ready_after_s",
    "jobs_running_again_after_s",
)


def one_run(seed: int, *, latent: bool, lifecycle: bool, work: Path) -> dict[str, Any]:
    out = work / f"{'latent' if latent else 'no-latent'}-{'lifecycle' if lifecycle else 'fixed'}"
    command = [sys.executable, "-m", "gpuweave", "simulate", "--no-compare", "--no-progress"]
    command += ["--seed", str(seed), "--out", str(out), *([] if latent else ["--no-latent"])]
    command += [] if lifecycle else ["--no-lifecycle"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "report.json").read_text())["summaries"][0]
    granted, refused = (int(part) for part in str(summary["kubelet_admissions"]).split(" / "))
    kept = {key: summary[key] for key in KEPT if key in summary}
    replaced = [{k: r[k] for k in REPLACEMENT_KEPT} for r in summary.get("replacement_records", [])]
    records = {"replacement_records": replaced} if "replacement_records" in summary else {}
    return {
        "policy": summary["policy"],
        "admissions": granted,
        "admissions_refused": refused,
        **kept,
        **records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuweave-sim-bench-") as work:
        runs = {
            "lifecycle": one_run(args.seed, latent=True, lifecycle=True, work=Path(work)),
            "latent": one_run(args.seed, latent=True, lifecycle=False, work=Path(work)),
            "no_latent": one_run(args.seed, latent=False, lifecycle=False, work=Path(work)),
        }
    for name, run in runs.items():
        print(f"{name:>9}: " + ", ".join(f"{k} {v}" for k, v in run.items()))
    report = {"benchmark": "simulate default run", "seed": args.seed, "runs": runs}
    write_results("simulate_default", report, module="benchmarks.simulate_default", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
