"""How much GPU any scheduler could allocate from the placement benchmark's task stream.

Two offline figures for the same stream the policies see (``artifact_run``, one seed), both as %
of cluster GPU capacity at 130% arrived load:

- ``bound``: an upper bound no scheduler can pass, online or offline. It is the maximum flow of
  GPU demand from task shapes to node kinds (GPU model, GPU count, CPU, memory), where a shape may
  use a kind only if one empty node of that kind could hold one of its tasks (GPU type, GPU count,
  CPU, memory) and a kind holds at most its GPUs. Any real placement is such a flow (it puts each
  task whole on one node of a kind that fits it), so the flow maximum bounds it. It relaxes the
  per-node packing: shares that do not fill a GPU exactly, CPU and memory beyond one task are not
  charged. Computed exactly as the minimum cut, enumerating the source side among the kinds.
- ``offline_pack``: what one greedy packer that sees the whole stream before placing reaches. It
  drops CPU-only tasks (they allocate no GPU), places whole-GPU tasks before shares, within each
  the ones fewer node kinds fit first, then the least CPU per milli-GPU (CPU strands GPUs), each on
  the node left with the least idle GPU (then the least free CPU), a share on the tightest GPU. It
  is achievable, so the offline optimum is at least it (and at least every online result) and at
  most ``bound``. It is a plain greedy packer, not an optimiser: on share-heavy traces it ends
  below the online policies.

    .venv/bin/python -m benchmarks.upper_bound --variants all --seeds 1000..1002

Writes ``upper_bound.json`` to ``--out`` (default ``benchmarks/results/placement``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.placement import DEFAULT_OUT, HELD_OUT_SEEDS, parse_seeds
from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.artifact import artifact_run
from gpuweave.simulate.fgd.experiment import PAPER_VARIANTS, TraceExperiment, build_experiment
from gpuweave.simulate.fgd.policies import default_gpus
from gpuweave.simulate.fgd.trace import DEFAULT_TRACE_DIR, TracePod
from topology.fragmentation import BoolArray, FragmentModel, TargetWorkload, TaskShape

MAX_KINDS = 20  # the cut enumerates 2**kinds subsets


def node_kinds(nodes: Sequence[NodeSpec]) -> tuple[list[NodeSpec], list[int]]:
    """Distinct (model, GPUs, CPU, memory) node kinds and the GPUs each kind holds in all."""
    gpus: dict[NodeSpec, int] = {}
    for n in nodes:
        kind = NodeSpec("", n.cpu_milli, n.memory_mib, n.gpus, n.model)
        gpus[kind] = gpus.get(kind, 0) + n.gpus
    return list(gpus), list(gpus.values())


def fits_kind(pod: TracePod, kind: NodeSpec) -> bool:
    """Whether one task of ``pod``'s shape fits one empty node of ``kind``."""
    shape = TaskShape(pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_types)
    return (
        pod.gpu_count <= kind.gpus
        and pod.cpu_milli <= kind.cpu_milli
        and pod.memory_mib <= kind.memory_mib
        and shape.allows_model(kind.model)
    )


def flow_bound(nodes: Sequence[NodeSpec], pods: Sequence[TracePod]) -> float:
    """Maximum GPU flow (milli-GPU) from ``pods`` to node kinds; see the module docstring.

    The minimum cut puts a set T of kinds on the source side: it pays T's GPUs, plus the demand of
    every shape that may use a kind outside T. The smallest such sum over all T is the maximum flow.
    """
    kinds, capacity = node_kinds(nodes)
    if len(kinds) > MAX_KINDS:
        raise InvalidInputError(f"{len(kinds)} node kinds; the exact cut handles at most {MAX_KINDS}")
    demand: dict[int, int] = {}
    for pod in pods:
        if pod.total_gpu_milli == 0:
            continue
        mask = sum(1 << k for k, kind in enumerate(kinds) if fits_kind(pod, kind))
        demand[mask] = demand.get(mask, 0) + pod.total_gpu_milli
    subsets = np.arange(1 << len(kinds), dtype=np.int64)
    members: BoolArray = ((subsets[:, None] >> np.arange(len(kinds))) & 1).astype(np.bool_)
    cost = members @ (np.asarray(capacity, dtype=np.float64) * MILLI_PER_GPU)
    for mask, milli in demand.items():
        cost += milli * ((np.int64(mask) & ~subsets) != 0)
    return float(cost.min())


def offline_pack(nodes: Sequence[NodeSpec], pods: Sequence[TracePod]) -> int:
    """Milli-GPU one whole-stream packer allocates (see the module docstring)."""
    kinds, _ = node_kinds(nodes)
    gpu_pods = [p for p in pods if p.total_gpu_milli > 0]
    reach = {p.name: sum(fits_kind(p, k) for k in kinds) for p in gpu_pods}
    order = sorted(
        gpu_pods,
        key=lambda p: (p.gpu_milli < MILLI_PER_GPU, reach[p.name], p.cpu_milli / p.total_gpu_milli, p.name),
    )
    cluster = ClusterState(nodes, _unused_model(nodes))
    for pod in order:
        request = Request(pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli, pod.gpu_types)
        candidates = np.flatnonzero(cluster.feasible(request))
        if len(candidates) == 0:
            continue
        idle_after = cluster.gpu_free[candidates].sum(axis=1) - request.total_gpu_milli
        key = (candidates, cluster.cpu_free[candidates], idle_after)
        node = int(candidates[np.lexsort(key)[0]])
        cluster.place(node, default_gpus(cluster, node, request), request)
    return cluster.used_gpu_milli


def _unused_model(nodes: Sequence[NodeSpec]) -> FragmentModel:
    """A one-shape fragment model: ClusterState keeps one up to date; the packer never reads it."""
    workload = TargetWorkload((TaskShape(0, MILLI_PER_GPU, 1),), (1.0,))
    models = sorted({n.model for n in nodes})
    return FragmentModel(workload, models=models, max_gpus=max(n.gpus for n in nodes))


def bounds_of(experiment: TraceExperiment, *, seed: int) -> dict[str, float]:
    """Both figures for one seed's stream, % of cluster GPU capacity at 130% arrived load."""
    run = artifact_run(
        experiment.pods,
        capacity_gpus=experiment.capacity_gpus,
        node_count=len(experiment.nodes),
        seed=seed,
    )
    total = experiment.capacity_gpus * MILLI_PER_GPU
    return {
        "bound": 100.0 * flow_bound(experiment.nodes, run.pods) / total,
        "offline_pack": 100.0 * offline_pack(experiment.nodes, run.pods) / total,
    }


def run(data_dir: Path, variants: Sequence[str], seeds: Sequence[int]) -> dict[str, object]:
    """Per variant: each seed's figures and their medians."""
    report: dict[str, object] = {"seeds": list(seeds), "variants": {}}
    for variant in variants:
        experiment = build_experiment(data_dir, variant)
        runs = [{"seed": s, **bounds_of(experiment, seed=s)} for s in seeds]
        medians = {m: statistics.median(r[m] for r in runs) for m in ("bound", "offline_pack")}
        report["variants"][variant] = {"runs": runs, "median": medians}  # type: ignore[index]
        print(
            f"{variant:<12} bound {medians['bound']:6.2f}%  offline pack {medians['offline_pack']:6.2f}%",
            flush=True,
        )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.upper_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_TRACE_DIR, help="folder of the trace CSVs")
    parser.add_argument("--variants", default="default", help="comma list, or 'all' for the 17 paper traces")
    parser.add_argument("--seeds", default=HELD_OUT_SEEDS, help=f"default the held-out {HELD_OUT_SEEDS}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    variants = list(PAPER_VARIANTS) if args.variants == "all" else args.variants.split(",")
    try:
        report = run(args.data_dir, variants, parse_seeds(args.seeds))
    except GpuweaveError as exc:
        print(f"benchmarks.upper_bound: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "upper_bound.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
