"""The workload the scorer places against: learned from pods, pinned by a file, and the ranking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.assignment import device_id_share
from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE
from devicemodel.errors import InvalidInputError
from devicemodel.sharing import GpuSharing, SharingMode
from gpuweave.simulate.cluster_objects import pod_object, profile_inventory
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.ranking import ranked_scores
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.verdict import Verdict, fail
from scheduler_ext.decide.workload import (
    COLD_START_PRIOR,
    WorkloadLearner,
    load_workload_file,
    pod_shape,
    workload_document,
)
from scheduler_ext.pods.requests import PodRequest, pod_request
from topology.fragmentation import TargetWorkload, TaskShape


def _pod(name: str, limits: dict[str, int | str]) -> tuple[PodRequest, dict[str, Any]]:
    pod = pod_object(name, uid=name, limits=limits)
    return pod_request(pod), pod


def _shape(name: str, limits: dict[str, int | str]) -> tuple[TaskShape, int]:
    shaped = pod_shape(*_pod(name, limits))
    assert shaped is not None
    return shaped


def test_a_pods_shape_is_read_in_the_scorers_units() -> None:
    assert _shape("a", {RESOURCE_GPU_COMPUTE: 25, "cpu": "1500m", "memory": "2Gi"}) == (
        TaskShape(1500, 250, 1),
        2048,
    )
    assert _shape("b", {RESOURCE_GPU: 2, "cpu": "8"})[0] == TaskShape(8000, 1000, 2)


def test_learning_follows_the_pods_and_counts_each_pod_once() -> None:
    learner = WorkloadLearner(prior_pods=10, refresh_pods=20)
    shape = TaskShape(0, 300, 1)
    for i in range(40):
        learner.observe(f"pod-{i}", shape, 0)
        learner.observe(f"pod-{i}", shape, 0)  # a retried filter
    mix = learner.mix
    assert mix.version == 2 and mix.pods_seen == 40
    assert mix.workload.shapes[0] == shape
    assert mix.workload.probabilities[0] == pytest.approx(40 / 50, abs=0.02)  # prior weighs 10 pods


def test_decay_lets_a_new_mix_outvote_an_old_one() -> None:
    learner = WorkloadLearner(prior_pods=1, half_life_pods=50, refresh_pods=10)
    old, new = TaskShape(0, 100, 1), TaskShape(0, 700, 1)
    for i in range(200):
        learner.observe(f"old-{i}", old, 0)
    for i in range(100):
        learner.observe(f"new-{i}", new, 0)
    weights = dict(zip(learner.mix.workload.shapes, learner.mix.workload.probabilities, strict=True))
    assert weights[new] > 0.7 > weights[old]  # 100 new pods = two half-lives


def test_a_pinned_workload_ignores_pods_and_round_trips_through_its_file(tmp_path: Path) -> None:
    pinned = TargetWorkload((TaskShape(4000, 500, 1, "T4"), TaskShape(0, 1000, 8)), (0.75, 0.25), (8192, 0))
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(workload_document(pinned)))
    loaded = load_workload_file(path)
    assert loaded == pinned
    learner = WorkloadLearner(pinned=loaded)
    learner.observe("x", TaskShape(0, 100, 1), 0)
    assert learner.mix.workload == pinned and learner.mix.pinned


def test_a_bad_workload_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text('{"shapes": [{"gpuMilli": 2000, "weight": 1}]}')
    with pytest.raises(InvalidInputError, match=r"shapes\.0\.gpuMilli"):
        load_workload_file(path)


def test_the_learned_mix_changes_where_a_share_goes() -> None:
    """GPU 1 is half used. Once the cluster has shown only half-GPU pods, a 30% share goes to the
    idle GPU 0 (GPU 1 keeps room for one); with only whole-GPU pods it goes to GPU 1."""
    inventory = profile_inventory("p5.48xlarge", "n1")
    sharing = {str(i): GpuSharing(SharingMode.FRACTIONAL) for i in range(2)}
    for seen_milli, expected in ((50, 0), (100, 1)):
        core = DecisionCore(LayoutRegistry(), workload=WorkloadLearner(prior_pods=1, refresh_pods=50))
        for i in range(200):
            core.workload.observe(f"seen-{i}", *_shape(f"seen-{i}", {RESOURCE_GPU_COMPUTE: seen_milli}))
        state = core.registry.node_state(inventory, name="n1", sharing=sharing).with_holders(
            {device_id_share(inventory.gpus[1].uuid, "compute", u): "x" for u in range(50)}
        )
        request, _ = _pod("p", {RESOURCE_GPU_COMPUTE: 30})
        verdict = core.decide(request, state)
        assert verdict.plan[0].share_gpu == expected


def test_the_best_node_alone_gets_ten_and_the_rest_at_most_nine() -> None:
    verdicts = [
        Verdict(fits=True, score=6, quality=0.61),
        Verdict(fits=True, score=6, quality=0.6100001),
        Verdict(fits=True, score=6, quality=0.6),
        fail("no room"),
        Verdict(fits=True, score=2, quality=0.2),
    ]
    assert ranked_scores(verdicts) == [8, 10, 8, 0, 0]
    assert ranked_scores([Verdict(fits=True, score=5)] * 3) == [10, 10, 10]


def test_the_cold_start_prior_is_a_proper_mix() -> None:
    assert sum(COLD_START_PRIOR.probabilities) == pytest.approx(1.0)
    assert WorkloadLearner().mix.workload == COLD_START_PRIOR
