"""A slow NVLink pair is a degraded link, not two failed GPUs: the health verdict, the transition
the agent keeps, the published field read back by the extender, the extender's set choice around
it, and the simulated job time across it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.contracts import ANNOTATION_PLACEMENT, RESOURCE_GPU
from devicemodel.degraded import links_from_wire, links_to_wire
from devicemodel.inventory import DegradedLink, NodeInventory
from gpuweave.simulate.cluster_objects import pod_object, profile_inventory
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.jobtime import SlowestLink, job_timing
from hardware.exerciser.levels import plans
from hardware.exerciser.model import expectations
from hardware.exerciser.protocol import BANDWIDTH_CHECKS, ExerciseReport
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.exerciser import SimulatedExerciser
from health.active import LinkVerdict, Thresholds, judge, judge_links, verdicts
from health.active_book import GpuOutcome, RunOutcome
from health.links import inventory_links, next_links
from health.preflight import status_for
from nodeagent.published import inventory_object
from scheduler_ext.cluster.objects import inventory_record
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.pods.requests import pod_request
from topology.graph import TopologyGraph
from topology.scoring import score_set

ALL = tuple(range(8))


# ---- health: the verdict ---------------------------------------------------------------------


def _peer_run(tmp_path: Path, slow: tuple[int, int] | None) -> tuple[ExerciseReport, NodeInventory, dict]:
    backend = SimulatedBackend(load_profile("dgx-h100"), tmp_path / "sysfs", kmsg_path=tmp_path / "kmsg")
    try:
        inventory = backend.discover()
        if slow is not None:
            backend.node.exerciser.slow_pair(*slow)
        exerciser = SimulatedExerciser(inventory, backend.node.health, backend.node.exerciser)
        gpus = list(inventory.gpus)
        (plan,) = plans(inventory, gpus, level_number=1, max_gpus=8, gpu_checks=BANDWIDTH_CHECKS)
        report = exerciser.run(plan, deadline_s=30.0)
        return report, inventory, {g.uuid: (16, 5) for g in inventory.gpus}
    finally:
        backend.close()


def test_a_slow_peer_copy_fails_neither_gpu_and_is_a_slow_link(tmp_path: Path) -> None:
    report, inventory, links = _peer_run(tmp_path, (2, 3))
    expected = expectations(inventory, {u: (5, 16) for u in links})
    found = judge(report, expected, thresholds=Thresholds())
    assert all(not items for items in found.values())  # no finding on any GPU
    assert set(verdicts(report, found).values()) == {"passed"}
    measured = judge_links([report], expected, thresholds=Thresholds())
    slow = [v for v in measured.values() if v.slow]
    a, b = inventory.gpu(2).uuid, inventory.gpu(3).uuid
    assert [v.pair for v in slow] == [frozenset((a, b))]
    assert slow[0].fraction == pytest.approx(0.425)
    assert "below 55% of its 18 lanes' 450.0 GB/s" in slow[0].text
    assert all(not v.slow for pair, v in measured.items() if pair != frozenset((a, b)))


# ---- health: the transition ------------------------------------------------------------------


def _verdict(a: str, b: str, gbps: float) -> LinkVerdict:
    return LinkVerdict(a, b, gbps, 450.0, gbps < 450.0 * 0.55, f"{a}-{b} at {gbps}")


def test_next_links_adds_a_slow_pair_keeps_it_unmeasured_and_clears_it_at_its_rate() -> None:
    first = next_links({}, {frozenset(("B", "A")): _verdict("B", "A", 200.0)})
    assert [r.gpus for r in first.added] == [("A", "B")] and first.changed
    (record,) = first.links.values()
    assert record.fraction == pytest.approx(0.444)
    unmeasured = next_links(first.links, {frozenset(("C", "D")): _verdict("C", "D", 440.0)})
    assert not unmeasured.changed and unmeasured.links == first.links
    again = next_links(first.links, {frozenset(("A", "B")): _verdict("A", "B", 100.0)})
    assert not again.changed  # already degraded: its first record stays
    cleared = next_links(first.links, {frozenset(("A", "B")): _verdict("A", "B", 445.0)})
    assert [r.gpus for r in cleared.cleared] == [("A", "B")] and cleared.links == {}


def test_inventory_links_name_gpus_by_index_and_drop_gpus_not_on_the_node() -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    u = [g.uuid for g in inventory.gpus]
    records = next_links(
        {},
        {
            frozenset((u[4], u[5])): _verdict(u[4], u[5], 200.0),
            frozenset((u[0], "GPU-gone")): _verdict(u[0], "GPU-gone", 200.0),
        },
    ).links.values()
    (link,) = inventory_links(records, inventory)
    assert link.pair == frozenset((4, 5)) and link.fraction == pytest.approx(0.444)


# ---- the published field ---------------------------------------------------------------------


def test_the_published_degraded_links_reach_the_extenders_inventory() -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    link = DegradedLink(5, 4, 0.425, "active-check: NVLink copies below 55%")
    obj = inventory_object(inventory, degraded=[link])
    assert obj["status"]["degradedLinks"] == [{"gpus": [4, 5], "fraction": 0.425, "reason": link.reason}]
    read = inventory_record(obj).inventory
    assert read.degraded_links == (DegradedLink(4, 5, 0.425),)
    assert read.degraded_fraction(5, 4) == pytest.approx(0.425)


def test_an_inventory_without_the_field_or_with_a_bad_entry_still_parses() -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    plain = inventory_object(inventory)
    assert "degradedLinks" not in plain["status"]
    assert inventory_record(plain).inventory.degraded_links == ()
    bad = [{"gpus": [1]}, {"gpus": [2, 9], "fraction": 0.5}]
    odd = {**plain, "status": {**plain["status"], "degradedLinks": bad}}
    assert inventory_record(odd).inventory.degraded_links == ()  # one malformed, one naming no GPU of it
    links, problems = links_from_wire([{"gpus": [0, 1], "fraction": 1.5}, {"gpus": [0, 1], "fraction": 0.3}])
    assert links == (DegradedLink(0, 1, 0.3),) and len(problems) == 1
    assert links_from_wire("nope") == ((), ["degradedLinks is not a list"])
    assert links_to_wire(()) == []


# ---- the extender's set choice ---------------------------------------------------------------


def _degraded(profile: str, pair: tuple[int, int], fraction: float = 0.425) -> NodeInventory:
    inventory = profile_inventory(profile, "n1")
    return replace(inventory, degraded_links=(DegradedLink(*pair, fraction),))


def test_the_graph_scores_a_degraded_pair_at_its_share_and_not_as_nvlink() -> None:
    graph = TopologyGraph.from_inventory(_degraded("p5.48xlarge", (4, 5)))
    assert graph.pair_bandwidth(4, 5) == pytest.approx(450.0 * 0.425)
    assert graph.pair_bandwidth(4, 6) == pytest.approx(450.0)
    assert graph.pair_link(4, 5).label == "NV18"  # nvidia-smi still prints the lanes
    assert not graph.pair_link(4, 5).nvlink_usable and graph.pair_link(4, 6).nvlink_usable
    assert len(graph.largest_nvlink_clique()) == 7
    assert not score_set(graph, (4, 5)).all_nvlink
    assert score_set(graph, (4, 5)).value < score_set(graph, (4, 6)).value


def _pod(gpus: int, placement: str = "") -> object:
    annotations = {ANNOTATION_PLACEMENT: placement} if placement else {}
    return pod_request(pod_object("p", limits={RESOURCE_GPU: gpus}, annotations=annotations))


def _chosen(inventory: NodeInventory, gpus: int, placement: str = "", held: tuple[int, ...] = ()) -> set[int]:
    core = DecisionCore(LayoutRegistry())
    state = core.registry.node_state(inventory, name=inventory.name)
    if held:
        assert state.index is not None
        state = state.with_holders({state.index.gpu_uuids[i]: "other" for i in held})
    verdict = core.decide(_pod(gpus, placement), state)  # type: ignore[arg-type]
    assert verdict.fits, verdict.reason
    return {i for plan in verdict.plan for i in plan.gpus}


def test_a_multi_gpu_pod_avoids_spanning_a_degraded_pair_when_it_can() -> None:
    inventory = _degraded("p5.48xlarge", (0, 1))
    held = (2, 3, 4, 5)  # left free: 0, 1, 6, 7
    assert _chosen(profile_inventory("p5.48xlarge", "n1"), 2, held=held) == {0, 1}
    assert _chosen(inventory, 2, held=held) in ({6, 7}, {0, 6}, {0, 7}, {1, 6}, {1, 7})
    quad = _chosen(_degraded("p5.48xlarge", (1, 2)), 4)  # {0, 1, 2, 3} on a healthy p5
    assert not {1, 2} <= quad
    assert _chosen(inventory, 8) == set(ALL)  # a whole node: it still gets it


def test_nvlink_required_never_gets_a_degraded_pair() -> None:
    core = DecisionCore(LayoutRegistry())
    inventory = _degraded("p5.48xlarge", (0, 1))
    state = core.registry.node_state(inventory, name="n1")
    assert state.index is not None
    only = state.with_holders({state.index.gpu_uuids[i]: "other" for i in range(2, 8)})  # 0, 1 free
    verdict = core.decide(_pod(2, "nvlink-required"), only)  # type: ignore[arg-type]
    assert not verdict.fits and "NVLink" in verdict.reason
    assert not {0, 1} <= _chosen(inventory, 7, "nvlink-required")


def test_single_gpu_work_on_a_degraded_pair_is_unaffected() -> None:
    plain = profile_inventory("p5.48xlarge", "n1")
    held = (1, 2, 3, 4, 5, 6, 7)
    assert _chosen(_degraded("p5.48xlarge", (0, 1)), 1, held=held) == {0} == _chosen(plain, 1, held=held)


# ---- the simulation's job time ---------------------------------------------------------------


def test_a_job_across_a_slow_pair_runs_at_its_slowest_link() -> None:
    (p5,) = build_fleet(["p5.48xlarge"], nodes=1)
    slow = {p5.name: {frozenset((4, 5)): 0.5}}
    healthy = job_timing([(p5, ALL)])
    across = job_timing([(p5, ALL)], slow_pairs=slow)
    beside = job_timing([(p5, (0, 1, 2, 3))], slow_pairs=slow)
    assert healthy.stretch == pytest.approx(1.0)
    assert across.slowest is SlowestLink.NVLINK and across.gbps == pytest.approx(225.0)
    assert across.stretch > 1.01
    assert beside.stretch == pytest.approx(job_timing([(p5, (0, 1, 2, 3))]).stretch)
    assert job_timing([(p5, (4,))], slow_pairs=slow).stretch == 1.0


# ---- a gang's preflight ----------------------------------------------------------------------


def test_a_preflight_fails_on_a_slow_pair_it_found_now_and_passes_on_one_already_published() -> None:
    gpus = {"GPU-a": GpuOutcome(0, "passed", ()), "GPU-b": GpuOutcome(1, "passed", ())}
    found = RunOutcome(7, "preflight", 1, "simulated", state="done", gpus=gpus, slow_links=("slow a-b",))
    assert status_for(replace(found, new_links=("slow a-b",))).phase == "Failed"
    assert "newly degraded link: slow a-b" in status_for(replace(found, new_links=("slow a-b",))).message
    assert status_for(found).phase == "Passed"  # published before the gang was planned: it knew
