"""MIG pods go through the real extender and the node agents: the agent's MIG reconciler reshapes
the simulated GPU, its device plugin lists the new MIG devices, the extender binds a pod to one
and the node's kubelet admits it."""

from __future__ import annotations

from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from gpuweave.simulate.fleet import build_fleet
from gpuweave.simulate.workload import Job, JobKind
from tests.support.sim_agents import simulation_with_agents


def _mig_job(index: int, profile: str, *, at: float) -> Job:
    return Job(f"mig-{index}", JobKind.MIG, at, 1200.0, 1, 1, 0, 4000, 16_384, profile)


def test_mig_pods_are_bound_by_the_extender_to_devices_the_agent_created() -> None:
    fleet = build_fleet(["dgx-a100"], nodes=1)
    jobs = [_mig_job(i, p, at=60.0 * i) for i, p in enumerate(["3g.40gb", "1g.10gb", "1g.10gb"])]
    with simulation_with_agents(fleet, jobs, duration_s=1100.0) as (sim, pool, _):
        result = sim.run()
        resources = pool.resources(0)
        mig_devices = pool.inventory(0).mig_devices
    assert result.jobs_started == 3 and result.reshapes
    assert result.placement_mismatches == 0 and result.admission_failures == 0
    assert result.admissions == 3  # each MIG pod admitted by the kubelet with its device
    assert pool.reshape_refusals == []
    profiles = sorted(m.profile for m in mig_devices)
    assert "3g.40gb" in profiles and profiles.count("1g.10gb") >= 2
    assert resources[mig_resource_name("3g.40gb")] >= 1
    assert resources[RESOURCE_GPU] < 8  # the reshaped GPU left the whole-GPU list
