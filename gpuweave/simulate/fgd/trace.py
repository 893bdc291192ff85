"""The Alibaba GPU cluster trace (v2023, the FGD paper's trace): node list and pod lists.

The trace is read from a path at run time and never packaged. A node list has
``sn,cpu_milli,memory_mib,gpu,model``; a pod list has at least
``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and optionally ``gpu_spec`` (allowed models,
``|``-separated) and ``creation_time``/``deletion_time`` (seconds).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import MILLI_PER_GPU
from topology.fragmentation import TaskShape

# ../shared/data/alibaba-gpu-2023/csv beside the repository (this file is gpuweave/simulate/fgd/trace.py)
DEFAULT_TRACE_DIR = (
    Path(__file__).resolve().parents[3].parent / "shared" / "data" / "alibaba-gpu-2023" / "csv"
)
GPU_NODE_LIST = "openb_node_list_gpu_node.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int  # per GPU; 1000 for whole GPUs
    gpu_types: str = ""
    creation_time: int = 0
    deletion_time: int = 0

    @property
    def shape(self) -> TaskShape:
        return TaskShape(self.cpu_milli, self.gpu_milli, self.gpu_count, self.gpu_types)

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count


def pod_list_path(data_dir: Path, variant: str) -> Path:
    return data_dir / f"openb_pod_list_{variant}.csv"


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise InvalidInputError(
            f"trace file {path} not found; point --data-dir at the folder holding the Alibaba "
            "cluster-trace-gpu-v2023 CSVs"
        )
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInputError(f"{path} lacks column(s) {missing}; expected at least {list(required)}")
        return list(reader)


def _int(row: dict[str, str], column: str, path: Path) -> int:
    value = (row.get(column) or "").strip()
    if not value or value == "nan":
        return 0
    try:
        return int(float(value))
    except ValueError as exc:
        raise InvalidInputError(f"{path}: column {column} holds {value!r}, not a number") from exc


def load_nodes(path: Path) -> list[TraceNode]:
    """GPU nodes of a node list (nodes without GPUs are skipped, as in the paper's cluster)."""
    nodes = []
    for row in _rows(path, NODE_COLUMNS):
        gpus = _int(row, "gpu", path)
        if gpus <= 0:
            continue
        model = (row["model"] or "").strip()
        nodes.append(
            TraceNode(row["sn"], _int(row, "cpu_milli", path), _int(row, "memory_mib", path), gpus, model)
        )
    if not nodes:
        raise InvalidInputError(f"{path} lists no GPU nodes")
    return nodes


def load_pods(path: Path) -> list[TracePod]:
    """Every pod of a pod list, CPU-only pods included (they shape the target workload)."""
    pods = []
    for row in _rows(path, POD_COLUMNS):
        count = _int(row, "num_gpu", path)
        milli = _int(row, "gpu_milli", path) if count > 0 else 0
        if count > 1:
            milli = MILLI_PER_GPU
        if milli > MILLI_PER_GPU or milli < 0:
            raise InvalidInputError(
                f"{path}: pod {row['name']} asks {milli} milli-GPU per GPU (0..1000 allowed)"
            )
        spec = (row.get("gpu_spec") or "").strip()
        pods.append(
            TracePod(
                name=row["name"],
                cpu_milli=_int(row, "cpu_milli", path),
                memory_mib=_int(row, "memory_mib", path),
                gpu_count=count if milli > 0 else 0,
                gpu_milli=milli,
                gpu_types="" if spec == "nan" else spec,
                creation_time=_int(row, "creation_time", path),
                deletion_time=_int(row, "deletion_time", path),
            )
        )
    if not pods:
        raise InvalidInputError(f"{path} lists no pods")
    return pods


def inflate(pods: list[TracePod], *, capacity_gpus: int, ratio: float, seed: int) -> list[TracePod]:
    """The paper's workload: GPU requests tuned to ``ratio`` x capacity, in random arrival order.

    Below the target, random clones of trace pods (drawn with replacement) are appended until the
    requests reach it (the last clone may overshoot slightly); above it (the multigpu variants),
    pods are pruned in random order until they fit. The result is shuffled.
    """
    rng = np.random.default_rng(seed)
    target = ratio * capacity_gpus * MILLI_PER_GPU
    requested = sum(p.total_gpu_milli for p in pods)
    if requested > target:
        return _prune(pods, target=target, rng=rng)
    inflated = list(pods)
    clone = 0
    while requested < target:
        source = pods[int(rng.integers(len(pods)))]
        clone += 1
        inflated.append(
            TracePod(
                f"{source.name}-tuned-{clone}",
                source.cpu_milli,
                source.memory_mib,
                source.gpu_count,
                source.gpu_milli,
                source.gpu_types,
            )
        )
        requested += source.total_gpu_milli
    order = rng.permutation(len(inflated))
    return [inflated[i] for i in order]


def _prune(pods: list[TracePod], *, target: float, rng: np.random.Generator) -> list[TracePod]:
    kept: list[TracePod] = []
    requested = 0
    for index in rng.permutation(len(pods)):
        pod = pods[int(index)]
        if requested + pod.total_gpu_milli <= target:
            kept.append(pod)
            requested += pod.total_gpu_milli
    return kept
