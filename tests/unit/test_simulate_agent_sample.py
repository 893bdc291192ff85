"""Node agents on a sample of a large simulated cluster: which nodes, and what the pool says."""

from __future__ import annotations

from itertools import pairwise

from gpuweave.simulate import FULL_AGENTS_UP_TO, SAMPLED_AGENTS
from gpuweave.simulate.agents import NodeAgentPool
from gpuweave.simulate.fleet import DEFAULT_PROFILES, build_fleet
from gpuweave.simulate.runner import agent_sample


def test_every_node_runs_an_agent_up_to_the_limit_and_a_spread_sample_beyond() -> None:
    assert agent_sample(FULL_AGENTS_UP_TO, None) is None
    sample = agent_sample(1000, None)
    assert sample is not None and len(sample) == SAMPLED_AGENTS
    assert {i % len(DEFAULT_PROFILES) for i in sample} == set(range(len(DEFAULT_PROFILES)))  # every profile
    assert max(b - a for a, b in pairwise(sample)) <= 1000 // SAMPLED_AGENTS + 1
    assert agent_sample(16, 4) == [0, 4, 8, 12]
    assert agent_sample(16, 40) is None


def test_a_sampled_pool_starts_agents_only_where_asked() -> None:
    fleet = build_fleet(("l40s-pcie-8",), nodes=3)
    pool = NodeAgentPool(fleet, share_nodes=frozenset(), only=[1])
    try:
        assert pool.sampled and len(pool) == 1
        assert [pool.has(i) for i in range(3)] == [False, True, False]
        assert pool.resources(1)["nvidia.com/gpu"] == 8
    finally:
        pool.close()
