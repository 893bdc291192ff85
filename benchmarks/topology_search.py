"""Time the best-set search on 8- and 16-GPU nodes: p50/p99, cold and warm, against baselines.

For each node and request size it draws random free masks (seeded), then times:

- ``cold``: ``best_set`` with the look-ahead, every memo cache cleared before each call;
- ``warm``: the same requests again once the caches hold them (identical nodes share them);
- ``cold-no-lookahead``: the exact search alone, caches cleared (the look-ahead's cost);
- ``go-gpuallocator-like``: the baseline policy, its caches cleared (same run, same requests).

It also reports how often the baseline's set is as good as ours by our own score, a cheap view
of placement quality. Writes ``benchmarks/results/topology_search.json`` and prints a table.

    .venv/bin/python -m benchmarks.topology_search [--requests N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.results_file import RESULTS_DIR, write_results
from devicemodel.inventory import Architecture, Gpu, NodeInventory, NvSwitchFabric, PcieSwitch
from hardware.profiles import load_profile
from topology.baselines import clear_baseline_caches, go_gpuallocator_like
from topology.graph import TopologyGraph
from topology.scoring import score_set
from topology.search import LOOKAHEAD_TOLERANCE, best_set, clear_search_caches

RESULTS = RESULTS_DIR / "topology_search.json"
SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Request:
    available: frozenset[int]
    size: int


@dataclass(frozen=True)
class Row:
    node: str
    gpus: int
    size: int
    mode: str
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float


def sixteen_gpu_node(*, nvswitch: bool) -> NodeInventory:
    """A 16-GPU node (HGX-2-like when ``nvswitch``): two sockets, two GPUs per PCIe switch."""
    switches = tuple(PcieSwitch(name=f"sw{s}", numa_node=s // 4, root=f"pci{s // 4:04x}:{s % 4 // 2:02x}")
                     for s in range(8))
    gpus = tuple(
        Gpu(index=i, uuid=f"GPU-00000000-0000-4000-8000-{i:012d}", pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
            product="Tesla V100-SXM3-32GB", architecture=Architecture.VOLTA, compute_capability="7.0",
            memory_mib=32768, numa_node=switches[i // 2].numa_node, pcie_switch=switches[i // 2].name,
            pcie_root=switches[i // 2].root, minor=i)
        for i in range(16)
    )
    fabric = NvSwitchFabric(gpus=tuple(range(16)), links_per_gpu=6) if nvswitch else None
    name = "hgx2-16-nvswitch" if nvswitch else "pcie-16"
    return NodeInventory(name=name, numa_nodes=2, gpus=gpus, pcie_switches=switches, nvswitch=fabric)


def nodes() -> list[TopologyGraph]:
    inventories = [load_profile("p5.48xlarge").to_inventory(), load_profile("dgx1-v100").to_inventory(),
                   sixteen_gpu_node(nvswitch=True), sixteen_gpu_node(nvswitch=False)]
    return [TopologyGraph.from_inventory(inventory) for inventory in inventories]


def draw_requests(graph: TopologyGraph, *, size: int, count: int, rng: random.Random) -> list[Request]:
    indices = list(graph.gpu_indices)
    requests = []
    for _ in range(count):
        free = rng.randint(size, len(indices))
        requests.append(Request(frozenset(rng.sample(indices, free)), size))
    return requests


def timed(requests: list[Request], run: Callable[[Request], object], *,
          before: Callable[[], None] | None) -> list[float]:
    """Milliseconds per request; ``before`` (untimed) runs ahead of each call."""
    samples = []
    for request in requests:
        if before is not None:
            before()
        start = time.perf_counter_ns()
        run(request)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return samples


def summarize(graph: TopologyGraph, size: int, mode: str, samples: list[float]) -> Row:
    values = np.array(samples)
    return Row(node=graph.name, gpus=len(graph.gpu_indices), size=size, mode=mode, samples=len(samples),
               p50_ms=float(np.percentile(values, 50)), p99_ms=float(np.percentile(values, 99)),
               mean_ms=float(values.mean()))


def measure(graph: TopologyGraph, requests: list[Request]) -> list[Row]:
    size = requests[0].size

    def ours(r: Request) -> object:
        return best_set(graph, available=r.available, size=r.size)

    def greedy(r: Request) -> object:
        return best_set(graph, available=r.available, size=r.size, lookahead=False)

    def baseline(r: Request) -> object:
        return go_gpuallocator_like(graph, available=r.available, size=r.size)

    rows = [summarize(graph, size, "cold", timed(requests, ours, before=clear_search_caches))]
    timed(requests, ours, before=None)  # fill the caches
    rows.append(summarize(graph, size, "warm", timed(requests, ours, before=None)))
    rows.append(summarize(graph, size, "cold-no-lookahead",
                          timed(requests, greedy, before=clear_search_caches)))
    rows.append(summarize(graph, size, "go-gpuallocator-like",
                          timed(requests, baseline, before=clear_baseline_caches)))
    return rows


def baseline_best_share(graph: TopologyGraph, requests: list[Request]) -> float:
    """Share of requests where the baseline's set scores within the tie tolerance of ours."""
    matches = 0
    for request in requests:
        ours = best_set(graph, available=request.available, size=request.size)
        theirs = go_gpuallocator_like(graph, available=request.available, size=request.size)
        assert ours is not None and theirs is not None
        floor = ours.score.value * (1 - LOOKAHEAD_TOLERANCE)
        matches += score_set(graph, theirs).value >= floor
    return matches / len(requests)


def print_table(rows: list[Row], shares: dict[tuple[str, int], float]) -> None:
    header = (f"{'node':<18} {'gpus':>4} {'size':>4} {'mode':<21} {'n':>4} "
              f"{'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row.node:<18} {row.gpus:>4} {row.size:>4} {row.mode:<21} {row.samples:>4} "
              f"{row.p50_ms:>9.3f} {row.p99_ms:>9.3f} {row.mean_ms:>9.3f}")
    print()
    print("share of requests where go-gpuallocator-like picks a set as good as ours (by our score):")
    for (node, size), share in shares.items():
        print(f"  {node:<18} size {size}: {share:6.1%}")


def write_report(output: Path, rows: list[Row], shares: dict[tuple[str, int], float], *,
                 requests: int, seed: int, argv: list[str] | None = None) -> None:
    report = {
        "benchmark": "topology_search",
        "requests_per_cell": requests,
        "seed": seed,
        "rows": [asdict(row) for row in rows],
        "go_gpuallocator_best_share": [{"node": node, "size": size, "share": share}
                                       for (node, size), share in shares.items()],
    }
    module = "benchmarks.topology_search"
    write_results(output.stem, report, module=module, argv=argv, directory=output.parent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=30, help="random free masks per node and size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows: list[Row] = []
    shares: dict[tuple[str, int], float] = {}
    for graph in nodes():
        for size in (s for s in SIZES if s <= len(graph.gpu_indices)):
            requests = draw_requests(graph, size=size, count=args.requests, rng=rng)
            rows += measure(graph, requests)
            shares[(graph.name, size)] = baseline_best_share(graph, requests)
            print(f"measured {graph.name} size {size}", flush=True)
    write_report(args.output, rows, shares, requests=args.requests, seed=args.seed, argv=argv)
    print()
    print_table(rows, shares)
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
