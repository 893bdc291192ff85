"""The simulation's default run, gpuweave's column only, with and without latent faults.

Runs ``gpuweave simulate --no-compare --no-progress`` (seed 42, latent faults on: the default)
and the same with ``--no-latent``, each in its own process, and keeps the figures the docs quote
of them: the node agents' admissions (kubelet Allocate calls granted and refused), GPU
allocation, job completion. These are simulated figures: the seed decides them, not the machine
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

KEPT = ("gpu_allocation_pct", "admission_failures", "job_completion_mean_min", "pending_mean_min")


def one_run(seed: int, *, latent: bool, work: Path) -> dict[str, Any]:
    out = work / ("latent" if latent else "no-latent")
    command = [sys.executable, "-m", "gpuweave", "simulate", "--no-compare", "--no-progress"]
    command += ["--seed", str(seed), "--out", str(out), *([] if latent else ["--no-latent"])]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "report.json").read_text())["summaries"][0]
    granted, refused = (int(part) for part in str(summary["kubelet_admissions"]).split(" / "))
    kept = {key: summary[key] for key in KEPT if key in summary}
    return {"policy": summary["policy"], "admissions": granted, "admissions_refused": refused, **kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuweave-sim-bench-") as work:
        runs = {
            "latent": one_run(args.seed, latent=True, work=Path(work)),
            "no_latent": one_run(args.seed, latent=False, work=Path(work)),
        }
    for name, run in runs.items():
        print(f"{name:>9}: " + ", ".join(f"{k} {v}" for k, v in run.items()))
    report = {"benchmark": "simulate default run", "seed": args.seed, "runs": runs}
    write_results("simulate_default", report, module="benchmarks.simulate_default", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
