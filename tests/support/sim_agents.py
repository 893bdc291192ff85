"""A simulation with a node agent on every node and the real extender client: the set-up the
simulation tests that follow devices from agent to extender share."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.engine import Simulation
from gpuweave.simulate.extender_client import ExtenderPlacer
from gpuweave.simulate.faults import FaultSpec
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.workload import Job
from topology.fragmentation import FragmentModel, TaskShape, typical_workload


def one_shape_model(fleet: Sequence[FleetNode]) -> FragmentModel:
    """The fragmentation model of a one-GPU, 4-core workload over the fleet's profiles."""
    profiles = list(dict.fromkeys(node.profile for node in fleet))
    return FragmentModel(typical_workload([TaskShape(4000, 1000, 1)]), models=profiles, max_gpus=8)


def _extender(fleet: tuple[FleetNode, ...]) -> ExtenderPlacer:
    return ExtenderPlacer(fleet, share_nodes=frozenset())


class AgentRun(NamedTuple):
    sim: Simulation  # not yet run
    pool: NodeAgentPool
    placer: ExtenderPlacer


@contextmanager
def simulation_with_agents(
    fleet: tuple[FleetNode, ...],
    jobs: Sequence[Job],
    *,
    duration_s: float,
    faults: Sequence[FaultSpec] = (),
    placer: Callable[[tuple[FleetNode, ...]], ExtenderPlacer] = _extender,
) -> Iterator[AgentRun]:
    """The simulation, its agents and its placer (``placer(fleet)``), closed after."""
    pool = NodeAgentPool(fleet, share_nodes=frozenset())
    extender = placer(fleet)
    try:
        yield AgentRun(
            Simulation(
                fleet=fleet,
                jobs=jobs,
                placer=extender,
                metric_model=one_shape_model(fleet),
                duration_s=duration_s,
                faults=faults,
                share_nodes=frozenset(),
                agents=pool,
            ),
            pool,
            extender,
        )
    finally:
        extender.close()
        pool.close()
