"""The placement benchmark's gpuweave row is the extender: same decisions in-process and over HTTP."""

from __future__ import annotations

import numpy as np
import pytest

from gpuweave.simulate.cluster import ClusterState, NodeSpec, Request
from gpuweave.simulate.fgd.experiment import experiment_for
from gpuweave.simulate.fgd.packing import run_packing
from gpuweave.simulate.fgd.policies import Placement
from gpuweave.simulate.fgd.product import pod_for
from gpuweave.simulate.fgd.product_policy import ProductPolicy
from gpuweave.simulate.fgd.trace import TracePod, inflate
from scheduler_ext.decide.workload import pod_shape
from scheduler_ext.pods.host import host_requests
from scheduler_ext.pods.requests import pod_request
from topology.fragmentation import TaskShape

NODES = (
    NodeSpec("t4-a", 32000, 131072, 2, "T4"),
    NodeSpec("t4-b", 16000, 65536, 2, "T4"),
    NodeSpec("v100", 64000, 262144, 4, "V100M16"),
    NodeSpec("g2", 96000, 393216, 8, "G2"),
)
PODS = (
    TracePod("share", 4000, 8192, 1, 460),
    TracePod("small", 2000, 4096, 1, 230),
    TracePod("whole", 8000, 16384, 1, 1000),
    TracePod("pair", 12000, 32768, 2, 1000),
    TracePod("typed", 4000, 8192, 1, 500, "T4"),
    TracePod("cpu", 6000, 8192, 0, 0),
    TracePod("eight", 32000, 65536, 8, 1000),
)


class Recording:
    """Wraps a policy and keeps every decision it makes."""

    def __init__(self, policy: ProductPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.decisions: list[Placement] = []

    def choose(
        self, cluster: ClusterState, request: Request, candidates: np.ndarray, rng: np.random.Generator
    ) -> Placement:
        placement = self.policy.choose(cluster, request, candidates, rng)
        self.decisions.append(placement)
        return placement


def test_http_and_in_process_extender_make_the_same_decisions_on_a_small_trace() -> None:
    experiment = experiment_for("small", nodes=NODES, pods=PODS)
    pods = inflate(list(PODS), capacity_gpus=experiment.capacity_gpus, ratio=1.3, seed=3)
    runs = {}
    for transport in ("in-process", "http"):
        policy = ProductPolicy(NODES, workload=experiment.gpuweave_model.workload, transport=transport)
        recording = Recording(policy)
        try:
            curves = run_packing(
                nodes=NODES, pods=pods, fragment_model=experiment.metric_model, policy=recording, seed=3
            )
        finally:
            policy.close()
        runs[transport] = (recording.decisions, curves.placed, curves.failed)
    assert runs["in-process"] == runs["http"]
    decisions, placed, failed = runs["http"]
    assert placed == len(decisions) > 10 and failed > 0  # 130% load: the cluster fills up


@pytest.mark.parametrize(
    ("pod", "shape"),
    [
        (TracePod("s", 4000, 8192, 1, 460), TaskShape(4000, 460, 1)),
        (TracePod("w", 8000, 16384, 8, 1000, "V100M16|V100M32"), TaskShape(8000, 1000, 8, "V100M16|V100M32")),
        (TracePod("c", 6000, 8192, 0, 0), TaskShape(6000, 0, 0)),
    ],
)
def test_trace_units_map_to_the_products_and_back(pod: TracePod, shape: TaskShape) -> None:
    request = Request(pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli, pod.gpu_types)
    obj = pod_for(request, uid="p")
    assert host_requests(obj) == (pod.cpu_milli, pod.memory_mib)
    if pod.gpu_count:
        assert pod_shape(pod_request(obj), obj) == (shape, pod.memory_mib)
