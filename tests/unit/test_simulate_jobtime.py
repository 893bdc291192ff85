"""Job time: a training job runs steps x (compute + communication over its slowest link), so a job
on a worse set of GPUs, or on nodes further apart in the network, takes longer."""

from __future__ import annotations

import pytest

from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.fleet import FleetNode, build_fleet, network_labels
from gpuweave.simulate.jobtime import Ring, SlowestLink, TrainingStep, job_timing
from gpuweave.simulate.placers import make_placer
from gpuweave.simulate.workload import Job, JobKind
from topology.fragmentation import FragmentModel, TaskShape, typical_workload
from topology.network import DEFAULT_TIER_LABELS, LABEL_AWS_LAYER_3, lowest_common_tier

ALL = tuple(range(8))


def _of(fleet: tuple[FleetNode, ...], profile: str) -> list[FleetNode]:
    return [n for n in fleet if n.profile == profile]


def test_the_fleet_fills_network_blocks_per_profile() -> None:
    fleet = build_fleet(["p5.48xlarge", "p4d.24xlarge"], nodes=8, nodes_per_block=2)
    p5 = _of(fleet, "p5.48xlarge")
    layer3 = DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3)
    assert lowest_common_tier([p5[0].labels, p5[1].labels]) == layer3
    assert lowest_common_tier([p5[0].labels, p5[2].labels]) == layer3 + 1  # layer 2
    assert lowest_common_tier([p5[0].labels, _of(fleet, "p4d.24xlarge")[0].labels]) == layer3 + 2
    assert network_labels("p5.48xlarge", 3, nodes_per_block=2)[LABEL_AWS_LAYER_3] == "nn-p548xlarge-b1"


def test_a_gang_further_apart_in_the_network_takes_longer() -> None:
    fleet = build_fleet(["p5.48xlarge", "p4d.24xlarge"], nodes=8, nodes_per_block=2)
    p5, p4d = _of(fleet, "p5.48xlarge"), _of(fleet, "p4d.24xlarge")
    block = job_timing([(p5[0], ALL), (p5[1], ALL)])
    layer2 = job_timing([(p5[0], ALL), (p5[2], ALL)])
    slow_block = job_timing([(p4d[0], ALL), (p4d[1], ALL)])
    spine = job_timing([(p4d[0], ALL), (p5[0], ALL)])
    assert block.slowest is SlowestLink.NET_BLOCK and block.stretch == pytest.approx(1.0)
    assert layer2.slowest is SlowestLink.NET_LAYER2
    assert spine.slowest is SlowestLink.NET_SPINE
    assert block.stretch < layer2.stretch < slow_block.stretch < spine.stretch
    assert slow_block.gbps == pytest.approx(50.0)  # p4d: 4 x 100 Gbps EFA


def test_a_worse_set_inside_a_node_takes_longer() -> None:
    (v100,) = build_fleet(["dgx1-v100"], nodes=1)
    nvlink = job_timing([(v100, (0, 1))])  # two NVLink lanes in the hybrid cube-mesh
    cross_numa = job_timing([(v100, (0, 5))])  # no NVLink: PCIe across the sockets
    assert nvlink.slowest is SlowestLink.NVLINK
    assert cross_numa.slowest is SlowestLink.CROSS_NUMA
    assert 1.0 < nvlink.stretch < cross_numa.stretch
    assert job_timing([(v100, (3,))]).stretch == 1.0  # one GPU: nothing to communicate


def test_the_step_is_compute_plus_ring_all_reduce() -> None:
    step = TrainingStep(compute_s=1.0, gradient_bytes=8e9, bucket_bytes=8e9)
    # 2(n-1)/n of 8 GB at 100 GB/s = 0.12 s for n = 4; one bucket: 8.4 us + 6 hops of 10 us
    assert step.step_s(Ring(4, 100.0, 10.0)) == pytest.approx(1.0 + 0.12 + 68.4e-6)
    # two nodes of 8: 30 steps, 4 of them across the network
    assert Ring(16, 100.0, 3.0, nodes=2, inter_us=20.0).latency_us() == pytest.approx(8.4 + 26 * 3 + 4 * 20)
    assert step.comm_s(Ring(1, 1.0, 1.0)) == 0.0


def _gang_completion(nodes_per_block: int) -> float:
    fleet = build_fleet(["p5.48xlarge"], nodes=2, nodes_per_block=nodes_per_block)
    job = Job("train-0", JobKind.GANG, 0.0, 3600.0, 2, 8, 1000, 88_000, 786_432)
    model = FragmentModel(typical_workload([TaskShape(88_000, 1000, 8)]), models=["p5.48xlarge"], max_gpus=8)
    sim = Simulation(
        fleet=fleet,
        jobs=[job],
        placer=make_placer("random", node_count=2, seed=0),
        metric_model=model,
        duration_s=3 * 3600.0,
        faults=(),
        share_nodes=frozenset(),
    )
    (done,) = sim.run().ledger.completions
    return done.completion_s


def test_in_the_loop_a_gang_across_blocks_finishes_later_than_in_one_block() -> None:
    one_block = _gang_completion(nodes_per_block=2)
    two_blocks = _gang_completion(nodes_per_block=1)
    assert one_block == pytest.approx(3600.0)  # the best placement runs the drawn duration
    assert two_blocks > one_block
