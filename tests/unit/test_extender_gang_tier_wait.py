"""A gang whose tightest tier is busy waits for it when that costs its job less than the looser
tier's stretch, through the extender's filter (``gangs.tier_cost``, ``gangs.tier_wait``).

The cluster of ``test_extender_gang_tier``: NVLink cliques A (``a0``..``a2``) and B (``b0``..``b2``)
of 4-GPU trays in one layer-3 block. Every tray is busy but ``a0`` and ``b0``, so no clique holds a
2-tray gang now; the block does (``a0`` + ``b0``). ``a1``'s pod is expected to end in 5 minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.gangs import ANNOTATION_EXPECTED_DURATION
from gpuweave.simulate.cluster_objects import (
    pod_object,
)
from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.report import add_common_completion, summarize, summary_table
from gpuweave.simulate.workload import Job, JobKind
from scheduler_ext.app import Extender
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.gangs.tier_cost import TierCostSettings
from scheduler_ext.gangs.tier_wait import TierWaits
from tests.unit.test_extender_gang_tier import TTL_S, Clock, _bind, _extender, _filter, _member
from tests.unit.test_extender_gangs import _created
from topology.fragmentation import FragmentModel, TaskShape, typical_workload

BUSY = {"a1": "5m", "a2": "10h", "b1": "10h", "b2": "10h"}


def _cluster(tmp_path: Path, clock: Clock, **cost: float) -> Extender:
    settings = GangSettings(ttl_s=TTL_S, clock=clock, wall_clock=clock, tier_cost=TierCostSettings(**cost))
    extender = _extender(tmp_path, clock, settings=settings)
    for node, left in BUSY.items():
        pod = pod_object(
            f"busy-{node}", limits={RESOURCE_GPU: 4}, annotations={ANNOTATION_EXPECTED_DURATION: left}
        )
        _bind(extender.service, pod, [node])
    return extender


def _gang(extender: Extender, run: str | None) -> list[dict[str, Any]]:
    members = [_member("train", i, size=2, tier=None) for i in range(2)]
    for member in members:
        if run is not None:
            member["metadata"]["annotations"][ANNOTATION_EXPECTED_DURATION] = run
    _created(extender, *members)
    return members


def test_a_long_gang_waits_for_its_clique_that_frees_soon(tmp_path: Path) -> None:
    clock = Clock()
    extender = _cluster(tmp_path, clock)
    members = _gang(extender, "4h")
    result = _filter(extender.service, members[0])
    assert not result.NodeNames  # the old plan took a0 + b0 across the cliques at once
    reason = result.FailedAndUnresolvableNodes["a0"]
    assert "waits for nvidia.com/gpu.clique=" in reason and "(waiting costs less)" in reason
    assert "expected run 4.0h (annotation)" in reason and "expected wait 5m" in reason
    assert "wait + run 4.1h vs looser run 4.6h" in reason
    assert extender.gangs is not None and extender.gangs.book.get("ml/gang:train") is None  # nothing held
    assert extender.gangs.book.kept_nodes() == {"a0"}  # its room kept from other pods
    assert _waits(extender).counts == {"waited": 1, "looser": 0}


def test_a_short_gang_takes_the_looser_tier_now(tmp_path: Path) -> None:
    extender = _cluster(tmp_path, Clock())
    members = _gang(extender, "10m")
    result = _filter(extender.service, members[0])
    assert result.NodeNames and result.NodeNames[0] in {"a0", "b0"}
    assert _waits(extender).counts == {"waited": 0, "looser": 1}


def test_a_gang_that_waited_its_maximum_takes_the_looser_tier(tmp_path: Path) -> None:
    clock = Clock()
    extender = _cluster(tmp_path, clock, max_wait_s=600.0)
    members = _gang(extender, "bogus")  # a bad value: the default hour, said in the reason
    first = _filter(extender.service, members[0])
    assert not first.NodeNames
    assert "(default; gpuweave.io/expected-duration is 'bogus'" in first.FailedAndUnresolvableNodes["a0"]
    clock.now += 200  # a0's neighbour has not ended yet: 200 + 300 <= 600, still waiting
    assert not _filter(extender.service, members[0]).NodeNames
    clock.now += 200  # waited 400 s: 400 + 300 passes the 600 s maximum
    assert _filter(extender.service, members[0]).NodeNames


def _waits(extender: Extender) -> TierWaits:
    assert extender.gangs is not None and extender.gangs.tier_waits is not None
    return extender.gangs.tier_waits


def test_the_simulation_counts_a_gang_that_waited_for_its_block() -> None:
    """Through the simulation's extender: four p5 nodes in two layer-3 blocks, a 10-minute and a
    10-hour one-node job on one node of each; a 4-hour two-node gang arriving at one minute waits
    the 9 minutes left for a block instead of spanning both, and the report counts it."""
    fleet = build_fleet(["p5.48xlarge"], nodes=4, nodes_per_block=2)
    jobs = [
        Job("short", JobKind.GANG, 0.0, 600.0, 1, 8, 1000, 12_000, 65_536),
        Job("long", JobKind.GANG, 0.0, 36000.0, 1, 8, 1000, 12_000, 65_536),
        Job("train-0", JobKind.GANG, 60.0, 4 * 3600.0, 2, 8, 1000, 88_000, 786_432),
    ]
    model = FragmentModel(typical_workload([TaskShape(88_000, 1000, 8)]), models=["p5.48xlarge"], max_gpus=8)
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    sim = Simulation(
        fleet=fleet,
        jobs=jobs,
        placer=placer,
        metric_model=model,
        duration_s=2 * 3600.0,
        faults=(),
        share_nodes=frozenset(),
    )
    try:
        result = sim.run()
    finally:
        placer.close()
    (gang,) = [p for p in result.ledger.training if p.job_id == "train-0"]
    assert gang.slowest == "network-block" and gang.waited_s == 540.0  # one block, after the short job
    summary = summarize(result)
    assert (summary["gang_tier_waited"], summary["gang_tier_looser"]) == (1, 0)
    add_common_completion([result], [summary])
    row = next(line for line in summary_table([summary]).splitlines() if "busy tightest tier" in line)
    assert row.split()[-3:] == ["1", "/", "0"]
