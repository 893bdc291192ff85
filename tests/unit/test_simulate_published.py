"""Faults reach the simulated extender only through the GpuNodeInventory its node agents publish."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.cluster import Request
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import FaultKind, FaultSpec
from gpuweave.simulate.fleet import FleetNode, build_fleet
from gpuweave.simulate.state import SimState
from gpuweave.simulate.workload import Job, JobKind
from tests.support.sim_agents import one_shape_model, simulation_with_agents

EIGHT_GPUS = Request(88_000, 786_432, 8, 1000)


def _place_all_eight(placer: ExtenderPlacer, fleet: tuple[FleetNode, ...], pod_id: str) -> bool:
    state = SimState.create(fleet, one_shape_model(fleet))
    rng = np.random.default_rng(0)
    placement = placer.place(state, EIGHT_GPUS, allowed=np.ones(1, dtype=bool), rng=rng, pod_id=pod_id)
    if placement is not None:
        placer.forget(pod_id)
    return placement is not None and len(placement.gpus) == 8


def test_a_gpu_the_agent_saw_fail_stays_offered_until_its_inventory_is_published() -> None:
    fleet = build_fleet(["p4d.24xlarge"], nodes=1)
    pool = NodeAgentPool(fleet, share_nodes=frozenset())
    placer = ExtenderPlacer(fleet, share_nodes=frozenset(), transport="in-process")
    try:
        assert pool.inject_xid(0, 5, 79) is not None  # the node's kubelet already sees it Unhealthy
        assert _place_all_eight(placer, fleet, "before")  # the extender has not been told
        published = pool.published(0)
        assert fleet[0].inventory.gpus[5].uuid in published["status"]["unhealthyDevices"]
        placer.receive_inventory(0, published)
        assert not _place_all_eight(placer, fleet, "after")  # 7 healthy GPUs left
    finally:
        placer.close()
        pool.close()


class _NoDirectFaults(ExtenderPlacer):
    """The real extender client, refusing the simulation's own fault knowledge."""

    told: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.told = []

    def gpu_failed(self, node: int, gpu: int, reason: str) -> None:
        self.told.append(f"failed {node}/{gpu}")

    def gpu_restored(self, node: int, gpu: int) -> None:
        self.told.append(f"restored {node}/{gpu}")


def _in_process(fleet: tuple[FleetNode, ...]) -> _NoDirectFaults:
    return _NoDirectFaults(fleet, share_nodes=frozenset(), transport="in-process")


def test_in_the_loop_the_extender_learns_a_fault_and_the_recovery_from_published_inventories() -> None:
    fleet = build_fleet(["p4d.24xlarge"], nodes=1)
    jobs = [Job(f"s{i}", JobKind.SINGLE, 0.0, 7200.0, 1, 1, 1000, 4000, 16_384) for i in range(8)]
    faults = (FaultSpec(FaultKind.ECC_DBE, 0.3, 1800.0),)
    with simulation_with_agents(fleet, jobs, duration_s=3600.0, faults=faults, placer=_in_process) as run:
        result = run.sim.run()
    placer = run.placer
    (fault,) = result.faults
    assert placer.told == []  # never told by the simulation
    assert fault.restored_at_s is not None  # the agent's reset and probation brought it back
    assert result.inventories_received >= 3  # start, the fault, the recovery
    assert result.placement_mismatches == 0  # it never chose the failed GPU
    assert result.jobs_started == len(jobs) + 1  # the evicted job ran again ...
    assert max(result.pending_times_s) == fault.restored_at_s  # ... on the GPU once it was back
