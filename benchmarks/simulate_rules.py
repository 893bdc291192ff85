"""What-if rules for job completion, tried in the simulation's scheduling loop before any is built.

Each rule changes which nodes the loop offers a job, or whether it tries a job at all, in the
gpuweave run only (``gpuweave simulate --no-compare``): a cheap stand-in for an extender rule of the
same effect, to learn whether the rule is worth building. None of them is in the product; the
figures they gave are in docs/simulate.md ("Seeds 42..51 and 1000..1009").

- ``none``: no change (the control: it must give ``simulate_seeds.json``'s gpuweave figures);
- ``gang-defers``: a multi-node gang not recovering from a fault is not tried while a one-pod
  8-GPU job with a shorter run waits, for at most ``DEFER_LIMIT_S`` after its first try (Smith's
  rule between the two kinds that want whole nodes);
- ``small-off-gang-nodes``: a one-pod job of fewer than 8 whole GPUs is first offered only the
  nodes multi-node gangs cannot use (no EFA, no NVLink clique), then every node;
- ``small-partial-first``: such a job is first offered only the partly used nodes that have its
  GPUs free, then every node (no whole node opened while a partly used one fits).

    .venv/bin/python -m benchmarks.simulate_rules --rule small-partial-first [--seeds 42-51] [--parallel 2]

Writes ``benchmarks/results/simulate_rule_<rule>.json``: per seed gpuweave's mean job completion
with the rule, and main's gpuweave and best-fit figures from ``simulate_seeds.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_file import RESULTS_DIR, write_results
from benchmarks.simulate_seeds import TUNING, parse_seeds
from gpuweave.cli import main as gpuweave_main
from gpuweave.simulate import engine
from gpuweave.simulate.workload import JobKind

DEFER_LIMIT_S = 1800.0
RULES = ("none", "gang-defers", "small-off-gang-nodes", "small-partial-first")


def _small(job: Any) -> bool:
    return job.pods == 1 and job.gpus_per_pod < 8 and job.kind not in (JobKind.SHARE, JobKind.MIG)


def _first_offer(pick: Callable[[Any, Any, np.ndarray], np.ndarray]) -> None:
    """Offer a small job the nodes ``pick`` keeps first, then every allowed node."""
    place_all = engine.Simulation._place_all

    def patched(self: Any, job: Any, request: Any, allowed: np.ndarray, gang: Any) -> Any:
        if _small(job):
            first = pick(self, job, allowed)
            if first.any():
                placed = place_all(self, job, request, first, gang)
                if placed is not None:
                    return placed
        return place_all(self, job, request, allowed, gang)

    engine.Simulation._place_all = patched  # type: ignore[method-assign]


def _off_gang_nodes(sim: Any, job: Any, allowed: np.ndarray) -> np.ndarray:
    result: np.ndarray = allowed & ~sim._gang_nodes
    return result


def _partly_used(sim: Any, job: Any, allowed: np.ndarray) -> np.ndarray:
    state = sim.state
    keep = np.zeros_like(allowed)
    for node in np.flatnonzero(allowed):
        if state.present(int(node)):
            free = len(state.full_free_gpus(int(node)))
            keep[node] = job.gpus_per_pod <= free < state.fleet[node].gpus
    return keep


def _gang_defers() -> None:
    start = engine.Simulation._start
    first_try: dict[str, float] = {}

    def patched(self: Any, job: Any, now: float, *, delay_s: float = 0.0) -> bool:
        if job.pods > 1 and job.job_id not in self._disrupted:
            since = first_try.setdefault(job.job_id, now)
            shorter = any(
                q.job.pods == 1 and q.job.gpus_per_pod == 8 and q.job.duration_s < job.duration_s * job.pods
                for q in self._queue
            )
            if shorter and now - since < DEFER_LIMIT_S:
                return False
        return start(self, job, now, delay_s=delay_s)

    engine.Simulation._start = patched  # type: ignore[method-assign]


def apply(rule: str) -> None:
    if rule == "gang-defers":
        _gang_defers()
    elif rule == "small-off-gang-nodes":
        _first_offer(_off_gang_nodes)
    elif rule == "small-partial-first":
        _first_offer(_partly_used)
    elif rule != "none":
        raise SystemExit(f"unknown rule {rule!r}: one of {', '.join(RULES)}")


def run_one(rule: str, seed: int, out: Path) -> None:
    """The gpuweave run of ``seed`` with ``rule``, in this process; its report in ``out``."""
    apply(rule)
    gpuweave_main(["simulate", "--no-compare", "--no-progress", "--seed", str(seed), "--out", str(out)])


def _child(rule: str, seed: int, folder: Path) -> float:
    out = folder / str(seed)
    command = [sys.executable, "-m", "benchmarks.simulate_rules", "--child", rule, str(seed), str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    return round(float(report["summaries"][0]["job_completion_mean_min"]), 2)


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--child"]:
        run_one(args_in[1], int(args_in[2]), Path(args_in[3]))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rule", required=True, choices=RULES)
    parser.add_argument("--seeds", default="42-51", help="seed list (default the tuning seeds 42-51)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2)")
    args = parser.parse_args(args_in)
    seeds = parse_seeds(args.seeds)
    main_rows = {r["seed"]: r for r in json.loads((RESULTS_DIR / "simulate_seeds.json").read_text())["rows"]}
    with (
        tempfile.TemporaryDirectory(prefix="gpuweave-sim-rule-") as work,
        ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool,
    ):
        means = list(pool.map(lambda s: _child(args.rule, s, Path(work)), seeds))
    rows = []
    for seed, mean in zip(seeds, means, strict=True):
        before = main_rows.get(seed, {}).get("job_completion_mean_min", {})
        others = [v for p, v in before.items() if p != "gpuweave"]
        rows.append(
            {
                "seed": seed,
                "gpuweave_with_rule": mean,
                "gpuweave_main": before.get("gpuweave"),
                "best_fit": before.get("best-fit"),
                "lowest_with_rule": bool(others) and mean < min(others),
            }
        )
        print(
            f"seed {seed:>4}: with the rule {mean:.2f}, main {before.get('gpuweave')}, "
            f"best-fit {before.get('best-fit')}"
        )
    total = {}
    for name, chosen in (
        ("tuning", [r for r in rows if r["seed"] in TUNING]),
        ("held_out", [r for r in rows if r["seed"] not in TUNING]),
    ):
        if chosen:
            total[name] = {
                "seeds": len(chosen),
                "mean_with_rule": round(sum(r["gpuweave_with_rule"] for r in chosen) / len(chosen), 2),
                "lowest_with_rule": sum(r["lowest_with_rule"] for r in chosen),
            }
    print(json.dumps(total))
    report = {
        "benchmark": "simulate what-if rule",
        "rule": args.rule,
        "seeds": seeds,
        "totals": total,
        "rows": rows,
    }
    write_results(
        f"simulate_rule_{args.rule.replace('-', '_')}", report, module="benchmarks.simulate_rules", argv=argv
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
