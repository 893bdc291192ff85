"""The device plugin's GPU-set chooser: same answers as the topology search, prepared off the start path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from itertools import combinations

import pytest

from devicemodel.inventory import NodeInventory, NvLink
from deviceplugin.topology_choice import gpu_chooser_for
from hardware.profiles import load_profile
from tests.support.agent_process import REPO_ROOT
from topology.graph import TopologyGraph
from topology.search import PlacementPolicy, best_set


def inventory(profile: str) -> NodeInventory:
    return load_profile(profile).to_inventory(node_name="node-a")


@pytest.mark.parametrize("profile", ["dgx1-v100", "l40s-pcie-8", "p4d.24xlarge"])
def test_chooser_answers_what_the_topology_search_answers(profile: str) -> None:
    node = inventory(profile)
    graph = TopologyGraph.from_inventory(node)
    chooser = gpu_chooser_for(node)
    for size in (1, 2, 4):
        for free in combinations(range(8), 6):
            expected = best_set(graph, available=frozenset(free), size=size)
            assert expected is not None
            assert chooser(frozenset(free), size, frozenset()) == expected.gpus


def test_policy_is_honoured_and_unsatisfiable_requests_answer_none() -> None:
    node = inventory("dgx1-v100")
    strict = gpu_chooser_for(node, policy=PlacementPolicy.NVLINK_REQUIRED)
    # GPUs 0 and 5 have no NVLink between them (cube mesh): no NVLink-only pair exists.
    assert strict(frozenset({0, 5}), 2, frozenset()) is None
    assert gpu_chooser_for(node)(frozenset({0, 5}), 2, frozenset()) == (0, 5)


def test_a_graph_that_cannot_be_built_degrades_to_numa_order(caplog: pytest.LogCaptureFixture) -> None:
    node = inventory("dgx1-v100")
    broken = dataclasses.replace(node, nvlinks=(*node.nvlinks, NvLink(gpu_a=0, gpu_b=42, links=1)))
    chooser = gpu_chooser_for(broken)
    assert chooser.prepare() is False
    assert chooser(frozenset(range(8)), 2, frozenset()) is None  # None: the caller uses NUMA order
    assert "topology graph unavailable for node node-a" in caplog.text


def test_the_agent_command_loads_no_kubernetes_networkx_or_matplotlib() -> None:
    """Start-up time and memory of ``node-agent --no-kube``: heavy libraries stay out of the process."""
    script = (
        "import sys\n"
        "heavy = ('kubernetes', 'networkx', 'numpy', 'matplotlib')\n"
        "import gpuweave.commands.node_agent\n"
        "from deviceplugin.topology_choice import gpu_chooser_for\n"
        "from hardware.profiles import load_profile\n"
        "loaded_at_start = sorted(m for m in heavy if m in sys.modules)\n"
        "chooser = gpu_chooser_for(load_profile('p5.48xlarge').to_inventory(node_name='n'))\n"
        "assert chooser(frozenset(range(8)), 4, frozenset()) is not None\n"
        "loaded_after = sorted(m for m in heavy if m in sys.modules and m != 'numpy')\n"
        "print(loaded_at_start, loaded_after)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split("\n")[0] == "[] []"
