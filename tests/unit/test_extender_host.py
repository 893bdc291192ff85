"""Host CPU and memory in the extender's cache, and reservation by node kind."""

from __future__ import annotations

import pytest

from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.decide.ranking import ranked_scores
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.reservation import HostCores, KindTotals, ReservedDemand
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
    assert dict(cache.kinds.cores) == {("NVIDIA H100 80GB HBM3", 8, 96_000, 1024 * 1024): 96_000.0}


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


# A CPU-poor kind (8 cores per GPU) beside a CPU-rich one (52 per GPU), as on the Alibaba trace's
# V100 and T4 nodes; the mix's GPU tasks ask 10 cores per GPU.
POOR, RICH = ("V100", 4, 32_000, 131_072), ("T4", 2, 104_000, 524_288)


def test_cores_spent_faster_than_a_cpu_poor_kinds_gpus_cost_the_gpus_they_strand() -> None:
    cores = HostCores(per_gpu_milli=10.0, other_per_gpu_milli=0.0)
    free, host = {POOR: 4000.0, RICH: 2000.0}, {POOR: 32_000.0, RICH: 104_000.0}
    # POOR can use 3200 of its 4000 milli-GPU; after an 11-core 470m share, (32 - 11) / 10 = 2100
    heavy = cores.stranded(470, 11_000, free, host, spare=0.0)
    assert heavy == {POOR: pytest.approx(3200 - 470 - 2100)}  # nothing on RICH: its cores are spare
    assert cores.stranded(810, 3_000, free, host, spare=0.0) == {}  # fewer cores than the GPU needs
    spared = {POOR: 2000.0, RICH: 2000.0}
    assert cores.stranded(470, 11_000, spared, {POOR: 32_000.0, RICH: 104_000.0}, spare=0.0) == {}
    assert cores.stranded(470, 11_000, {POOR: 4000.0}, {POOR: 32_000.0}, spare=0.0) == {}  # one kind


def test_when_cpu_only_tasks_need_more_than_the_spare_cores_every_kind_costs_the_same() -> None:
    free, host = {POOR: 4000.0, RICH: 2000.0}, {POOR: 32_000.0, RICH: 104_000.0}
    short = HostCores(per_gpu_milli=10.0, other_per_gpu_milli=20.0)  # 120 cores asked, RICH spares 84
    costs = short.stranded(470, 30_000, free, host, spare=0.0)
    assert costs[POOR] == pytest.approx(costs[RICH])  # a core spent anywhere strands a GPU somewhere
    plenty = HostCores(per_gpu_milli=10.0, other_per_gpu_milli=20.0)
    assert set(plenty.stranded(470, 30_000, free, host, spare=200_000.0)) == {POOR}  # CPU-only nodes


def test_the_reservation_no_longer_sends_a_cpu_heavy_share_to_strand_a_cpu_poor_kinds_gpus() -> None:
    # some tasks ask for 64 cores, which only RICH holds: RICH is reserved; the mix's GPU tasks ask
    # 12.6 cores per GPU, the 11-core 470m share 23
    workload = TargetWorkload(
        (TaskShape(64_000, 1000, 1), TaskShape(11_000, 470, 1), TaskShape(3_000, 810, 1)),
        (0.05, 0.35, 0.6),
    )
    reserved = ReservedDemand.of(workload, {POOR: 16, RICH: 2})
    assert reserved.share == {RICH: pytest.approx(50 / (50 + 164.5 + 486))}
    assert reserved.cores is not None and reserved.cores.other_per_gpu_milli == 0.0
    kinds = KindTotals()
    for n in range(4):  # every GPU free
        kinds.put(f"poor-{n}", POOR, 4, 4000.0, 32_000.0)
    kinds.put("rich-0", RICH, 2, 2000.0, 104_000.0)
    heavy = reserved.costs(470, 11_000, kinds)
    plain = reserved.pressure(dict(kinds.free))[RICH] * 470
    assert heavy[RICH] == pytest.approx(plain)  # the cores cost nothing where they are spare
    assert heavy[POOR] > heavy[RICH]  # POOR's cores would strand its GPUs: RICH is the cheaper kind
    light = reserved.costs(810, 3_000, kinds)
    assert POOR not in light  # a share that needs fewer cores than its GPU still spares RICH
    same = Verdict(fits=True, score=5, quality=0.5, level=100.0, idle=0.0)
    assert ranked_scores([same, same], reserve=[heavy.get(POOR, 0.0), heavy[RICH]]) == [0, 10]
    assert ranked_scores([same, same], reserve=[0.0, heavy[RICH]]) == [10, 0]  # pressure alone: POOR


def test_kind_totals_count_a_nodes_cores_with_its_kind_while_it_has_gpu_free() -> None:
    kinds = KindTotals()
    kinds.put("a", POOR, 4, 1000.0, 20_000.0)
    kinds.put("b", POOR, 4, 0.0, 6_000.0)  # no GPU free: its cores serve CPU-only tasks
    kinds.put("cpu", None, 0, 0.0, 64_000.0)  # no GPUs at all
    assert kinds.cores == {POOR: 20_000.0} and kinds.spare == 70_000.0
    kinds.put("a", POOR, 4, 0.0, 9_000.0)
    assert kinds.cores == {POOR: 0.0} and kinds.spare == 79_000.0
    kinds.put("b", None, 0, 0.0)  # gone
    kinds.put("cpu", None, 0, 0.0)
    assert kinds.spare == 9_000.0 and kinds.free == {POOR: 0.0}
