"""Topology quality: how often a multi-GPU allocation gets the best GPU set free on its node.

Each node of the default simulated cluster (p5.48xlarge, p4d.24xlarge, dgx-a100, l40s-pcie-8;
``--profiles`` adds others) runs the same churn of jobs whose GPU counts are drawn from the
Microsoft ITP trace (ElasticFlow raw traces, all clusters, read from the tar.gz at run time):
allocations arrive while the node is at most ``--fill`` busy, random running ones finish. Jobs
above 8 GPUs become 8-GPU pods. For every allocation of 2 or more GPUs we compare the chosen
set's score with the best set free at that moment (``topology.search.best_set`` without the
look-ahead, i.e. the best set now). Policies: gpuweave (``best_set`` with its look-ahead, which
may take a set within 2.5% of the best to keep better sets for later), gpuweave without the
look-ahead (the yardstick itself, 100% by construction), go-gpuallocator-like
(``topology.baselines``) and lowest-index first-fit for reference.

    .venv/bin/python -m benchmarks.topology_quality [--allocations 3000] [--seed 42]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from devicemodel.errors import GpuweaveError, InvalidInputError
from gpuweave.simulate.fgd.trace import DEFAULT_TRACE_DIR
from gpuweave.simulate.fleet import DEFAULT_PROFILES, FleetNode, build_fleet
from topology.baselines import go_gpuallocator_like
from topology.scoring import score_set
from topology.search import best_set

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DEFAULT_ITP = DEFAULT_TRACE_DIR.parents[1] / "microsoft-itp-elasticflow" / "raw-traces.tar.gz"
DEFAULT_OUT = Path("benchmarks/results/topology")
Chooser = Callable[[FleetNode, frozenset[int], int], tuple[int, ...] | None]


def itp_gang_sizes(path: Path) -> list[int]:
    """Every job's GPU count in the ITP raw traces (the tar is read in place, never unpacked)."""
    if not path.is_file():
        raise InvalidInputError(f"ITP trace {path} not found; pass --itp-trace with the raw-traces.tar.gz")
    sizes: list[int] = []
    with tarfile.open(path, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.name.endswith(".csv"):
                continue
            handle = archive.extractfile(member)
            if handle is None:
                continue
            for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
                sizes.append(int(row["num_gpu"]))
    if not sizes:
        raise InvalidInputError(f"{path} holds no job rows (expected cluster*.csv with a num_gpu column)")
    return sizes


def choose_gpuweave(node: FleetNode, free: frozenset[int], size: int) -> tuple[int, ...] | None:
    selection = best_set(node.graph, available=free, size=size)
    return selection.gpus if selection is not None else None


def choose_gpuweave_now(node: FleetNode, free: frozenset[int], size: int) -> tuple[int, ...] | None:
    """gpuweave's search without the look-ahead: the best set now (the yardstick itself)."""
    selection = best_set(node.graph, available=free, size=size, lookahead=False)
    return selection.gpus if selection is not None else None


def choose_go(node: FleetNode, free: frozenset[int], size: int) -> tuple[int, ...] | None:
    return go_gpuallocator_like(node.graph, available=free, size=size)


def choose_first_fit(_: FleetNode, free: frozenset[int], size: int) -> tuple[int, ...] | None:
    return tuple(sorted(free)[:size]) if len(free) >= size else None


POLICIES: dict[str, Chooser] = {
    "gpuweave": choose_gpuweave,
    "gpuweave-no-lookahead": choose_gpuweave_now,
    "go-gpuallocator-like": choose_go,
    "first-fit": choose_first_fit,
}


def churn(
    node: FleetNode, sizes: Sequence[int], *, chooser: Chooser, allocations: int, fill: float, seed: int
) -> list[dict[str, float]]:
    """Run the node's job churn with one policy; one record per multi-GPU allocation."""
    rng = np.random.default_rng(seed)
    capacity = node.gpus
    free = frozenset(range(capacity))
    running: list[tuple[int, ...]] = []
    records: list[dict[str, float]] = []
    while len(records) < allocations:
        size = min(int(sizes[int(rng.integers(len(sizes)))]), capacity)
        busy = capacity - len(free)
        if running and (busy + size > fill * capacity or rng.random() < 0.45):
            gone = running.pop(int(rng.integers(len(running))))
            free = free | frozenset(gone)
            continue
        if size > len(free):
            continue
        if size >= 2:
            best = best_set(node.graph, available=free, size=size, lookahead=False)
        chosen = chooser(node, free, size) if size >= 2 else (min(free),)
        if chosen is None:
            continue
        if size >= 2 and best is not None:
            got = score_set(node.graph, chosen)
            records.append(
                {
                    "size": size,
                    "best": float(got.value >= best.score.value - 1e-9),
                    "value_ratio": got.value / best.score.value if best.score.value else 1.0,
                    "bottleneck_gbps": got.bottleneck_gbps,
                    "best_bottleneck_gbps": best.score.bottleneck_gbps,
                }
            )
        free = free - frozenset(chosen)
        running.append(tuple(chosen))
    return records


def summarize(records: list[dict[str, float]]) -> dict[str, float]:
    return {
        "allocations": len(records),
        "best_set_pct": 100.0 * statistics.fmean(r["best"] for r in records),
        "value_vs_best": statistics.fmean(r["value_ratio"] for r in records),
        "bottleneck_gbps": statistics.fmean(r["bottleneck_gbps"] for r in records),
        "best_bottleneck_gbps": statistics.fmean(r["best_bottleneck_gbps"] for r in records),
    }


def run(
    profiles: Sequence[str], sizes: Sequence[int], *, allocations: int, fill: float, seed: int
) -> dict[str, Any]:
    fleet = build_fleet(list(profiles), nodes=len(profiles))
    per_profile: dict[str, dict[str, Any]] = {}
    for node in fleet:
        per_profile[node.profile] = {}
        for name, chooser in POLICIES.items():
            started = time.perf_counter()
            records = churn(node, sizes, chooser=chooser, allocations=allocations, fill=fill, seed=seed)
            per_profile[node.profile][name] = summarize(records) | {"seconds": time.perf_counter() - started}
            result = per_profile[node.profile][name]
            print(
                f"  {node.profile:<22} {name:<22} best set {result['best_set_pct']:6.1f}%  "
                f"value/best {result['value_vs_best']:.3f}  ({result['seconds']:.1f} s)",
                flush=True,
            )
    return per_profile


def plot(per_profile: dict[str, dict[str, Any]], out: Path) -> Path:
    figure, axis = plt.subplots(figsize=(11, 4.5))
    profiles = list(per_profile)
    width = 0.8 / len(POLICIES)
    colours = {
        "gpuweave": "tab:green",
        "gpuweave-no-lookahead": "tab:olive",
        "go-gpuallocator-like": "tab:red",
        "first-fit": "tab:gray",
    }
    for i, name in enumerate(POLICIES):
        heights = [per_profile[p][name]["best_set_pct"] for p in profiles]
        axis.bar(
            [x + i * width for x in range(len(profiles))], heights, width, label=name, color=colours[name]
        )
    axis.set_xticks([x + width for x in range(len(profiles))], profiles)
    axis.set_ylabel("multi-GPU allocations given the best set free (%)")
    axis.set_ylim(0, 118)
    axis.set_title("Topology quality under ITP gang-size churn (higher is better)")
    axis.legend(fontsize=8, loc="upper center", ncol=4)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = out / "topology_quality.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def print_table(per_profile: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'profile':<22}" + "".join(f"{name:>32}" for name in POLICIES))
    print(f"{'':<22}" + "".join(f"{'best set % / value / GB/s':>32}" for _ in POLICIES))
    for profile, results in per_profile.items():
        cells = "".join(
            f"{r['best_set_pct']:>17.1f}% / {r['value_vs_best']:.3f} / {r['bottleneck_gbps']:5.0f}"
            for r in (results[n] for n in POLICIES)
        )
        print(f"{profile:<22}{cells}")
    print("GB/s: mean bottleneck (slowest pair) bandwidth of the chosen sets")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.topology_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--itp-trace", type=Path, default=DEFAULT_ITP, help="ElasticFlow raw-traces.tar.gz")
    parser.add_argument("--profiles", default=",".join(DEFAULT_PROFILES), help="comma list of node profiles")
    parser.add_argument(
        "--allocations", type=int, default=2000, help="multi-GPU allocations per node and policy"
    )
    parser.add_argument("--fill", type=float, default=0.9, help="arrivals stop above this busy fraction")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        sizes = itp_gang_sizes(args.itp_trace)
        multi = [s for s in sizes if s >= 2]
        print(f"ITP jobs: {len(sizes)}, multi-GPU: {len(multi)} ({100 * len(multi) / len(sizes):.1f}%)")
        per_profile = run(
            args.profiles.split(","), sizes, allocations=args.allocations, fill=args.fill, seed=args.seed
        )
    except GpuweaveError as exc:
        print(f"benchmarks.topology_quality: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "itp_jobs": len(sizes),
        "itp_multi_gpu_jobs": len(multi),
        "seed": args.seed,
        "allocations_per_node_policy": args.allocations,
        "fill": args.fill,
        "profiles": per_profile,
    }
    (args.out / "topology_quality.json").write_text(json.dumps(report, indent=1))
    print_table(per_profile)
    print(f"\nwrote {args.out / 'topology_quality.json'}, {plot(per_profile, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
