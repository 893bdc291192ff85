"""Faults reach the node agents: an EFA adapter lost in the simulated sysfs, and a failed GPU that
the agent resets and, after its probation rounds, serves again, in rounds the simulation drives."""

from __future__ import annotations

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.faults import FaultKind, FaultSpec
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.workload import Job, JobKind
from tests.support.sim_agents import simulation_with_agents

RESOURCE_EFA = "vpc.amazonaws.com/efa"


def test_an_efa_adapter_lost_in_sysfs_is_seen_unhealthy_and_back() -> None:
    pool = NodeAgentPool(build_fleet(["p5.48xlarge"], nodes=1), share_nodes=frozenset())
    try:
        adapter = pool.efa_adapter(0)
        assert adapter is not None
        before = pool.resources(0)[RESOURCE_EFA]
        assert pool.set_efa_present(0, adapter, present=False) is not None
        assert pool.resources(0)[RESOURCE_EFA] == before - 1
        assert pool.set_efa_present(0, adapter, present=True) is not None
        assert pool.resources(0)[RESOURCE_EFA] == before
    finally:
        pool.close()


def test_a_failed_gpu_returns_after_its_reset_and_two_clean_driven_rounds() -> None:
    pool = NodeAgentPool(build_fleet(["p4d.24xlarge"], nodes=1), share_nodes=frozenset())
    try:
        assert pool.inject_xid(0, 2, 48) is not None
        assert pool.gpu_back(0, 2) is None  # no round has run: the agent's timer is not wall-clock
        rounds = 0
        while pool.gpu_back(0, 2) is None and rounds < 10:
            pool.health_round(0)
            rounds += 1
        assert rounds == 3  # the round that resets the GPU, then two clean probation rounds
        assert pool.resources(0)[RESOURCE_GPU] == 8
    finally:
        pool.close()


def test_the_report_records_the_gpu_back_and_the_efa_loss_measured() -> None:
    profiles = ["p5.48xlarge", "p4d.24xlarge"]
    fleet = build_fleet(profiles, nodes=2)
    jobs = [Job(f"s{i}", JobKind.SINGLE, 60.0 * i, 7200.0, 1, 1, 1000, 4000, 16_384) for i in range(3)]
    faults = (FaultSpec(FaultKind.ECC_DBE, 0.3, 1800.0), FaultSpec(FaultKind.EFA_LINK, 0.5, 600.0))
    with simulation_with_agents(fleet, jobs, duration_s=3600.0, faults=faults) as run:
        result = run.sim.run()
    gpu, efa = result.faults
    assert gpu.gpu is not None and gpu.restored_at_s is not None
    assert gpu.health_rounds == 3 and gpu.restored_at_s - gpu.at_s == 3 * 60.0
    assert efa.efa_adapter is not None and efa.agent_to_kubelet_s is not None
    assert efa.restored_at_s == efa.at_s + 600.0 and efa.agent_back_s is not None
