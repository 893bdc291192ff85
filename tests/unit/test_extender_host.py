"""Host CPU and memory in the extender's cache, and reservation by node kind."""

from __future__ import annotations

import pytest

from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.decide.ranking import ranked_scores
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.reservation import ReservedDemand
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.pods.host import host_allocatable, host_requests
from topology.fragmentation import TargetWorkload, TaskShape


def test_a_pods_host_request_is_kube_schedulers() -> None:
    pod = pod_object("p", limits={"cpu": "1500m", "memory": "2Gi"})
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "0.5"}}})
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"memory": "3Gi"}}}]
    assert host_requests(pod) == (2000, 3072)  # sum of app containers, or the largest init container
    assert host_allocatable(node_object("n")) == (96_000, 1024 * 1024)


def test_the_cache_counts_bound_pods_against_node_allocatable() -> None:
    cache = ClusterCache(LayoutRegistry())
    cache.upsert_node(node_object("n1", gpus=8))
    cache.upsert_inventory(inventory_object(profile_inventory("p5.48xlarge", "n1")))
    state = cache.node("n1")
    assert state is not None and state.host_free == (96_000, 1024 * 1024)
    cache.upsert_pod(pod_object("web", uid="web", limits={"cpu": "8", "memory": "64Gi"}, node="n1"))
    state = cache.node("n1")
    assert state is not None and state.host_free == (88_000, 960 * 1024)
    cache.delete_pod("web")
    state = cache.node("n1")
    assert state is not None and state.host_free == (96_000, 1024 * 1024)
    capacity = dict(cache.kinds.capacity)
    assert capacity == {("NVIDIA H100 80GB HBM3", 8, 96_000, 1024 * 1024): 8}


def test_reservation_spares_a_scarce_kind_and_eases_as_its_free_share_grows() -> None:
    t4, g2 = ("T4", 2, 64_000, 262_144), ("G2", 6, 64_000, 262_144)
    workload = TargetWorkload((TaskShape(4000, 1000, 1, "T4"), TaskShape(4000, 1000, 1)), (0.25, 0.75))
    reserved = ReservedDemand.of(workload, {t4: 2, g2: 6})
    assert reserved.share == {t4: pytest.approx(0.25)}
    assert reserved.pressure({t4: 2000.0, g2: 6000.0})[t4] == pytest.approx(1.0)  # 25% of demand, 2/8 free
    assert reserved.pressure({t4: 2000.0, g2: 2000.0})[t4] == pytest.approx(0.5)  # G2 filling: eases
    untyped = TargetWorkload((TaskShape(4000, 1000, 1),), (1.0,))
    assert ReservedDemand.of(untyped, {t4: 2, g2: 6}).share == {}


def test_reservation_counts_shapes_only_big_nodes_fit() -> None:
    big, small = ("G3", 8, 128_000, 786_432), ("G3", 8, 96_000, 393_216)
    workload = TargetWorkload(
        (TaskShape(120_000, 1000, 8), TaskShape(4000, 1000, 1)), (0.5, 0.5), (737_280, 8192)
    )
    reserved = ReservedDemand.of(workload, {big: 8, small: 8})
    assert reserved.share == {big: pytest.approx(8 / 9)}


def test_a_reservation_cost_can_move_the_best_node() -> None:
    cheap = Verdict(fits=True, score=5, quality=0.5, level=0.0, idle=0.0)
    scarce = Verdict(fits=True, score=5, quality=0.51, level=-40.0, idle=0.0)
    assert ranked_scores([cheap, scarce]) == [0, 10]
    assert ranked_scores([cheap, scarce], reserve=[0.0, 1000.0]) == [10, 0]  # spends a reserved kind
