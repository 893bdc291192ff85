"""Wiring for trace experiments: the cluster, workload and policies of one trace variant.

One place builds what the placement benchmark and its tests share: node specs from the node list,
the pods of a variant, the target workload of every task shape (the paper's measure, used for the
reported fragmentation), FGD's own model of the artifact's 95% workload, and the memory-aware
variant the extender is pinned to (``gpuweave extender --workload FILE`` with
``scheduler_ext.decide.workload.workload_document`` of it). A policy is one of the artifact's baselines
(``baselines``) or gpuweave, the extender's own service objects (``product_policy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devicemodel.errors import InvalidInputError
from gpuweave.simulate.cluster import NodeSpec
from gpuweave.simulate.fgd.artifact import artifact_model
from gpuweave.simulate.fgd.baselines import BASELINE_NAMES, make_baseline
from gpuweave.simulate.fgd.policies import PlacementPolicy
from gpuweave.simulate.fgd.product_policy import ProductPolicy
from gpuweave.simulate.fgd.trace import GPU_NODE_LIST, TracePod, load_nodes, load_pods, pod_list_path
from topology.fragmentation import FragmentModel, IntArray, TargetWorkload, typical_workload, with_memory

POLICY_NAMES = (*BASELINE_NAMES, "gpuweave")
# Paper traces (the 17 the artifact's run scripts use); "default" first.
PAPER_VARIANTS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
# Share of the trace's tasks the reported fragmentation (and gpuweave's pinned mix) covers: every
# shape. FGD scores against the artifact's own 95% (``artifact.artifact_model``).
DEFAULT_COVERAGE = 1.0


@dataclass(frozen=True)
class TraceExperiment:
    variant: str
    nodes: tuple[NodeSpec, ...]
    pods: tuple[TracePod, ...]
    workload: TargetWorkload
    metric_model: FragmentModel  # the paper's measure (memory-blind)
    fgd_model: FragmentModel  # what the faithful FGD scores against: the artifact's 95% workload
    gpuweave_model: FragmentModel  # memory-aware, the mix gpuweave's extender is pinned to

    @property
    def capacity_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


def nodes_from_trace(path: Path) -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(n.name, n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in load_nodes(path))


def build_experiment(
    data_dir: Path, variant: str, *, coverage: float = DEFAULT_COVERAGE, pods_file: Path | None = None
) -> TraceExperiment:
    """The cluster of the node list and the pods of one variant (or of ``pods_file``)."""
    nodes = nodes_from_trace(data_dir / GPU_NODE_LIST)
    pods = tuple(load_pods(pods_file or pod_list_path(data_dir, variant)))
    return experiment_for(variant, nodes=nodes, pods=pods, coverage=coverage)


def experiment_for(
    variant: str, *, nodes: Sequence[NodeSpec], pods: Sequence[TracePod], coverage: float = DEFAULT_COVERAGE
) -> TraceExperiment:
    workload = typical_workload([p.shape for p in pods], coverage=coverage)
    models = sorted({n.model for n in nodes})
    max_gpus = max(n.gpus for n in nodes)
    aware = with_memory(workload, [(p.shape, p.memory_mib) for p in pods])
    return TraceExperiment(
        variant=variant,
        nodes=tuple(nodes),
        pods=tuple(pods),
        workload=workload,
        metric_model=FragmentModel(workload, models=models, max_gpus=max_gpus),
        fgd_model=artifact_model(pods, models=models, max_gpus=max_gpus),
        gpuweave_model=FragmentModel(aware, models=models, max_gpus=max_gpus),
    )


def make_policy(name: str, experiment: TraceExperiment, *, node_rank: IntArray) -> PlacementPolicy:
    """A fresh policy for one run (FGD and the extender keep per-run state); ``node_rank`` is the
    run's node tie order (``artifact.ArtifactRun.node_rank``), which the baselines follow."""
    if name in BASELINE_NAMES:
        return make_baseline(name, rank=node_rank, fgd_model=experiment.fgd_model)
    if name == "gpuweave":  # the extender's service objects, its workload pinned to the trace's mix
        return ProductPolicy(experiment.nodes, workload=experiment.gpuweave_model.workload)
    raise InvalidInputError(f"unknown placement policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
