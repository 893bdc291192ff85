"""MIG benchmark: time to reshape one GPU in simulation, and plan time for 8 GPUs.

Reshape: the real reconciler (journal with fsync, NVML reads, destroy/create with placements,
verify) against the simulated pynvml library of a DGX H100 and a DGX A100, for a cycle of layout
changes on one GPU. The simulated NVML latency per MIG call is a parameter; the overhead beyond
it is ``wall - mig_calls * latency`` (the baseline, measured in the same run, is the simulated
latency itself: what the driver would cost).

Plan: 8 GPUs of each catalogued model, each with a random current layout (a random share of its
instances busy) and a random valid target, planned with explicit placements; the baseline in the
same run is planning the same targets on empty GPUs (no instances to keep or avoid).

Writes ``benchmarks/results/mig.json`` and prints a table.

    .venv/bin/python -m benchmarks.mig [--latency-ms 0,1,5] [--rounds 3] [--plans 200]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.results_file import write_results
from hardware.mig_catalog import GpuModel, default_catalog
from hardware.profiles import load_profile
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from mig.planner import Instance, MigPlanError, TargetEntry, plan_layout
from tests.support.sim_mig import mig_reconciler

T = TypeVar("T")
CYCLES = {
    "dgx-h100": [["3g.40gb", "3g.40gb"], ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"], ["1g.10gb"] * 7, None],
    "dgx-a100": [["3g.40gb", "3g.40gb"], ["4g.40gb", "2g.20gb", "1g.10gb"], ["7g.80gb"], None],
}


class CountingLib(SimulatedNvmlLib):
    """The simulated library, counting the MIG calls that pay the simulated latency."""

    mig_calls = 0

    def _mig_call(self, thunk: Callable[[], T]) -> T:
        self.mig_calls += 1
        return super()._mig_call(thunk)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def reshape_cycle(profile: str, latency_s: float, state_dir: Path) -> list[dict[str, Any]]:
    inventory = load_profile(profile).to_inventory()
    lib = CountingLib(SimulatedNode(inventory))
    lib.nvmlInit()
    lib.mig_latency_s = latency_s
    reconciler = mig_reconciler(lib, inventory, state_dir)
    rows = []
    for target in CYCLES[profile]:
        entries = None if target is None else [TargetEntry(p) for p in target]
        lib.mig_calls = 0
        start = time.perf_counter()
        result = reconciler.apply(3, entries)
        wall = time.perf_counter() - start
        rows.append(
            {
                "target": "whole" if target is None else "+".join(target),
                "wall_ms": wall * 1000,
                "mig_calls": lib.mig_calls,
                "simulated_latency_ms": lib.mig_calls * latency_s * 1000,
                "overhead_ms": (wall - lib.mig_calls * latency_s) * 1000,
                "destroyed": len(result.destroyed),
                "created": len(result.created),
            }
        )
    return rows


def bench_reshape(latencies_ms: list[float], rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for profile in CYCLES:
        for latency_ms in latencies_ms:
            per_step: dict[str, list[dict[str, Any]]] = {}
            for _ in range(rounds):
                state_dir = Path(tempfile.mkdtemp(prefix="gpuweave-mig-bench-"))
                try:
                    for row in reshape_cycle(profile, latency_ms / 1000, state_dir):
                        per_step.setdefault(row["target"], []).append(row)
                finally:
                    shutil.rmtree(state_dir, ignore_errors=True)
            for target, samples in per_step.items():
                rows.append(
                    {
                        "profile": profile,
                        "latency_ms_per_call": latency_ms,
                        "target": target,
                        "mig_calls": samples[0]["mig_calls"],
                        "wall_ms_median": statistics.median(s["wall_ms"] for s in samples),
                        "simulated_latency_ms": samples[0]["simulated_latency_ms"],
                        "overhead_ms_median": statistics.median(s["overhead_ms"] for s in samples),
                    }
                )
    return rows


def random_layout(model: GpuModel, rng: random.Random) -> list[Instance]:
    """A random realisable layout: profiles dropped at random free valid placements."""
    placed: list[Instance] = []
    mask, compute = 0, 0
    for _ in range(rng.randint(0, 8)):
        profile = rng.choice(model.profiles)
        count = sum(1 for i in placed if i.profile == profile.name)
        free = [p for p in profile.placements if not mask & p.mask]
        if not free or count >= profile.max_count or compute + profile.compute_slices > model.compute_slices:
            continue
        placement = rng.choice(free)
        mask |= placement.mask
        compute += profile.compute_slices
        placed.append(Instance(profile.name, placement.start, placement.size, busy=rng.random() < 0.3))
    return placed


def bench_plan(plans: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for model in default_catalog().models:
        node_times, empty_times, impossible = [], [], 0
        for _ in range(plans):
            gpus = [
                (random_layout(model, rng), [i.profile for i in random_layout(model, rng)]) for _ in range(8)
            ]
            start = time.perf_counter()
            for current, target in gpus:
                try:
                    plan_layout(model, current, target)
                except MigPlanError:
                    impossible += 1
            node_times.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            for _, target in gpus:
                plan_layout(model, [], target)
            empty_times.append((time.perf_counter() - start) * 1000)
        rows.append(
            {
                "model": model.key,
                "plan_8_gpus_ms_p50": percentile(node_times, 0.5),
                "plan_8_gpus_ms_p99": percentile(node_times, 0.99),
                "baseline_empty_8_gpus_ms_p50": percentile(empty_times, 0.5),
                "impossible_share": impossible / (plans * 8),
            }
        )
    return rows


def print_tables(reshape: list[dict[str, Any]], plan: list[dict[str, Any]]) -> None:
    header = ("profile", "lat/call", "target", "calls", "wall ms", "sim ms", "over ms")
    print("{:<9} {:>8} {:<38} {:>5} {:>9} {:>8} {:>8}".format(*header))
    for r in reshape:
        print(
            f"{r['profile']:<9} {r['latency_ms_per_call']:>8g} {r['target'][:38]:<38} {r['mig_calls']:>5} "
            f"{r['wall_ms_median']:>9.1f} {r['simulated_latency_ms']:>8.1f} {r['overhead_ms_median']:>8.1f}"
        )
    print()
    print(f"{'model':<15} {'8 GPUs p50 ms':>14} {'p99 ms':>8} {'empty p50 ms':>13} {'impossible':>10}")
    for r in plan:
        print(
            f"{r['model']:<15} {r['plan_8_gpus_ms_p50']:>14.2f} {r['plan_8_gpus_ms_p99']:>8.2f} "
            f"{r['baseline_empty_8_gpus_ms_p50']:>13.2f} {r['impossible_share']:>10.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--latency-ms", default="0,1,5", help="simulated NVML latency per MIG call, comma list"
    )
    parser.add_argument("--rounds", type=int, default=3, help="reshape cycles per profile and latency")
    parser.add_argument("--plans", type=int, default=200, help="random 8-GPU plans per model")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    latencies = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    reshape = bench_reshape(latencies, args.rounds)
    plan = bench_plan(args.plans, args.seed)
    print_tables(reshape, plan)
    report = {"benchmark": "mig", "reshape_one_gpu": reshape, "plan_8_gpus": plan}
    write_results("mig", report, module="benchmarks.mig")


if __name__ == "__main__":
    main()
