"""Placement experiment pieces: trace loading and inflation, policies, published curves, ITP sizes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.placement import left_at_end, parse_seeds, run_variant, verdict
from benchmarks.placement_published import load_published
from benchmarks.topology_quality import choose_first_fit, churn, itp_gang_sizes
from devicemodel.errors import InvalidInputError
from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.experiment import experiment_for, make_policy
from gpuweave.simulate.fgd.packing import PackingCurves, run_packing
from gpuweave.simulate.fgd.trace import DEFAULT_TRACE_DIR, TracePod, inflate, load_pods
from gpuweave.simulate.fleet import build_fleet

NODES = (NodeSpec("a", 32000, 131072, 2, "T4"), NodeSpec("b", 32000, 131072, 2, "T4"))
PODS = (
    TracePod("p0", 4000, 8192, 1, 500),
    TracePod("p1", 4000, 8192, 1, 500),
    TracePod("p2", 8000, 8192, 1, 1000),
    TracePod("p3", 2000, 4096, 0, 0),
)


def test_load_pods_reads_the_alibaba_columns(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,4000,1024,1,460,\nb,88000,327680,8,1000,V100M16|V100M32\nc,1000,512,0,0,nan\n"
    )
    pods = load_pods(path)
    assert [(p.gpu_count, p.gpu_milli, p.gpu_types) for p in pods] == [
        (1, 460, ""),
        (8, 1000, "V100M16|V100M32"),
        (0, 0, ""),
    ]


def test_load_pods_rejects_a_file_without_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,cpu\nx,1\n")
    with pytest.raises(InvalidInputError, match="lacks column"):
        load_pods(path)


def test_inflate_reaches_the_ratio_and_is_seeded() -> None:
    pods = list(PODS)
    inflated = inflate(pods, capacity_gpus=4, ratio=1.3, seed=1)
    requested = sum(p.total_gpu_milli for p in inflated)
    assert requested >= 5200
    assert requested - 5200 < 1000  # the last clone overshoots by less than one pod
    assert [p.name for p in inflated] == [p.name for p in inflate(pods, capacity_gpus=4, ratio=1.3, seed=1)]


def test_fgd_puts_a_share_on_the_gpu_that_is_already_shared() -> None:
    experiment = experiment_for("t", nodes=NODES, pods=PODS)
    cluster = ClusterState(NODES, experiment.metric_model)
    share = Request(4000, 8192, 1, 500)
    cluster.place(1, (0,), share)
    rng = np.random.default_rng(0)
    for name in ("fgd", "gpuweave"):
        placement = make_policy(name, experiment, node_rank=np.arange(2)).choose(
            cluster, share, np.arange(2), rng
        )
        assert (placement.node, placement.gpus) == (1, (0,))


@pytest.mark.parametrize("policy", ["random", "best-fit", "dot-product", "fgd", "gpuweave"])
def test_packing_places_until_full_and_never_overcommits(policy: str) -> None:
    experiment = experiment_for("t", nodes=NODES, pods=PODS)
    pods = inflate(list(PODS), capacity_gpus=4, ratio=1.3, seed=3)
    curves = run_packing(
        nodes=NODES,
        pods=pods,
        fragment_model=experiment.metric_model,
        policy=make_policy(policy, experiment, node_rank=np.asarray([1, 0])),
        seed=3,
    )
    assert curves.placed + curves.failed == len(pods)
    final = [v for v in curves.allocation if not np.isnan(v)][-1]
    assert 0 < final <= 100


def _pack(
    nodes: tuple[NodeSpec, ...], trace: list[TracePod], stream: list[TracePod], policy: str
) -> PackingCurves:
    """``stream`` placed by ``policy`` on ``nodes`` (the mix from ``trace``), node rank 0, 1, ..."""
    experiment = experiment_for("t", nodes=nodes, pods=trace)
    return run_packing(
        nodes=nodes,
        pods=stream,
        fragment_model=experiment.metric_model,
        policy=make_policy(policy, experiment, node_rank=np.arange(len(nodes))),
        seed=1,
    )


def test_a_run_says_what_it_left_idle_and_which_pods_fit_nowhere() -> None:
    """One 2-GPU node: a 700m share, a 200m share beside it, a whole GPU; then a 1-GPU pod and a
    500m share fit nowhere, and the 100m left is below the smallest share that failed."""
    nodes = (NodeSpec("a", 32000, 131072, 2, "T4"),)
    pods = [
        TracePod("s700", 1000, 1024, 1, 700),
        TracePod("s200", 1000, 1024, 1, 200),
        TracePod("w1", 1000, 1024, 1, 1000),
        TracePod("w2", 1000, 1024, 1, 1000),
        TracePod("s500", 1000, 1024, 1, 500),
        TracePod("cpu", 1000, 1024, 0, 0),
    ]
    curves = _pack(nodes, pods, pods, "fgd")
    assert curves.failed_by_request == {"1 GPU": 1, "500m": 1}
    assert (curves.leftovers, curves.idle_gpus) == ((100,), 0)
    assert curves.idle_gpus_short_of == {"cpu": 0, "memory": 0}
    left = left_at_end(curves)
    assert left["smallest_failed_share_milli"] == 500 and left["leftover_gpus_below_it"] == 0.1
    assert left["leftover_histogram_milli"] == {100: 1}


def test_idle_gpus_are_counted_by_what_their_node_lacks() -> None:
    """Node a's CPU goes to a CPU-only pod, b's memory to another: a 1-GPU pod fits neither, and
    their idle GPUs are counted as short of CPU and of memory."""
    nodes = (NodeSpec("a", 4000, 65536, 2, "T4"), NodeSpec("b", 64000, 8192, 2, "T4"))
    pods = [
        TracePod("cpu-a", 3500, 1024, 0, 0),
        TracePod("mem-b", 1000, 7000, 0, 0),
        TracePod("gpu", 1000, 2048, 1, 1000),
    ]
    curves = _pack(nodes, pods, pods, "best-fit")
    assert curves.failed_by_request == {"1 GPU": 1} and curves.smallest_failed_share_milli == 1000
    assert curves.idle_gpus == 4 and curves.idle_gpus_short_of == {"cpu": 2, "memory": 2}
    fitting = _pack(nodes, pods, pods[:1], "best-fit")
    assert fitting.idle_gpus == 4 and fitting.idle_gpus_short_of == {"cpu": 0, "memory": 0}


def test_experiment_baselines_are_the_artifacts_and_follow_the_node_rank() -> None:
    experiment = experiment_for("t", nodes=NODES, pods=PODS)
    empty = ClusterState(NODES, experiment.metric_model)
    whole = Request(8000, 8192, 1, 1000)  # scores the same on both empty nodes: the rank decides
    for name in ("best-fit", "dot-product", "fgd"):
        for rank, node in (([0, 1], 0), ([1, 0], 1)):
            policy = make_policy(name, experiment, node_rank=np.asarray(rank))
            assert policy.choose(empty, whole, np.arange(2), np.random.default_rng(0)).node == node
    with pytest.raises(InvalidInputError, match="unknown placement policy 'tetris'"):
        make_policy("tetris", experiment, node_rank=np.arange(2))


def test_published_medians_and_verdict(tmp_path: Path) -> None:
    header = "workload,sc_policy,tune,seed," + ",".join(str(i) for i in range(131))
    rows = [
        f"openb_pod_list_default,06-FGD,1.3,{s}," + ",".join(str(min(i, 90.0 + s - 42)) for i in range(131))
        for s in (42, 43, 44)
    ]
    for name in (
        "analysis_allo_discrete.csv",
        "analysis_frag_discrete.csv",
        "analysis_frag_ratio_discrete.csv",
    ):
        (tmp_path / name).write_text("\n".join([header, *rows]) + "\n")
    published = load_published(tmp_path)
    assert published.curve("allocation", "default", "fgd")[130] == 91.0  # median of 90, 91, 92
    ours = {"gpuweave": {"median": {"allocation": [min(i, 92.0) for i in range(131)]}}}
    result = verdict(ours, published, "default")
    assert result["target_met"] is True
    assert result["min_gap_vs_fgd_published"] == 0.0


def test_runs_in_forked_workers_give_the_same_curves_as_one_after_another() -> None:
    pods = tuple(TracePod(f"p{i}", 2000 + 500 * (i % 3), 4096, i % 2, (250, 1000)[i % 2]) for i in range(12))
    experiment = experiment_for("t", nodes=NODES, pods=pods)
    one = run_variant(experiment, policies=["fgd", "gpuweave"], seeds=[1, 2])
    forked = run_variant(experiment, policies=["fgd", "gpuweave"], seeds=[1, 2], jobs=2)
    assert json.dumps(forked, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert [r["seed"] for r in forked["gpuweave"]["runs"]] == [1, 2]


def test_the_default_trace_folder_is_the_shared_data_beside_the_repository() -> None:
    repository = Path(__file__).resolve().parents[2]
    assert repository.parent / "shared" / "data" / "alibaba-gpu-2023" / "csv" == DEFAULT_TRACE_DIR


def test_parse_seeds() -> None:
    assert parse_seeds("42..44") == [42, 43, 44]
    assert parse_seeds("42,50") == [42, 50]


def test_itp_sizes_are_read_from_the_tar_in_place(tmp_path: Path) -> None:
    path = tmp_path / "raw.tar.gz"
    content = b"job_id,submission_time,duration,num_gpu\na,1,10,8\nb,2,10,1\n"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("cluster01.csv")
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    assert itp_gang_sizes(path) == [8, 1]


def test_churn_records_multi_gpu_allocations_against_the_best_set() -> None:
    [node] = build_fleet(["dgx1-v100"], nodes=1)
    records = churn(node, [1, 2, 4], chooser=choose_first_fit, allocations=50, fill=0.9, seed=1)
    assert len(records) == 50
    assert all(0 < r["value_ratio"] <= 1.0 + 1e-9 for r in records)
    assert any(r["best"] == 0.0 for r in records)  # first-fit misses the cube-mesh's best sets


def test_gpuweave_spares_the_gpu_model_type_bound_tasks_need() -> None:
    nodes = (NodeSpec("t4", 64000, 262144, 2, "T4"), NodeSpec("v100", 64000, 262144, 2, "V100M16"))
    pods = (TracePod("bound", 4000, 8192, 1, 1000, "T4"), TracePod("free", 4000, 8192, 1, 1000))
    experiment = experiment_for("t", nodes=nodes, pods=pods)
    cluster = ClusterState(nodes, experiment.metric_model)
    unconstrained = Request(4000, 8192, 1, 1000)
    for seed in range(5):
        # each choice binds in the extender: a fresh one
        policy = make_policy("gpuweave", experiment, node_rank=np.arange(2))
        placement = policy.choose(cluster, unconstrained, np.arange(2), np.random.default_rng(seed))
        assert placement.node == 1
