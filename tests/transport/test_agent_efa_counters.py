"""The real node-agent process sees an EFA-only adapter fail through its hardware counters.

p5.48xlarge's 32 adapters have no netdev and a verbs port that always reads ACTIVE, so neither
``operstate`` nor port state can show a failed adapter; ``no_completion_cmds`` rising does.
"""

from __future__ import annotations

import yaml

from devicemodel.contracts import RESOURCE_EFA
from nodeagent.control import call_agent
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import short_temp_dir
from tests.support.waiting import wait_until

HEALTH_CONFIG = {"health": {"round_interval_s": 0.05, "check_timeout_s": 0.4, "event_wait_ms": 50}}


def test_an_efa_adapter_that_stops_completing_commands_is_reported_unhealthy() -> None:
    root = short_temp_dir()
    (root / "health.yaml").write_text(yaml.safe_dump(HEALTH_CONFIG))
    node = AgentNode("p5.48xlarge", extra=("--health-config", str(root / "health.yaml")), root=root)
    try:
        wait_until("32 healthy EFA", lambda: len(node.kubelet.healthy(RESOURCE_EFA)) == 32, timeout=60)
        # the adapters are listed Healthy before the first health round; the counters' baseline is
        # taken by the first EFA check that completes, which also fills health.status's ``efa`` map:
        # a rise injected before that baseline would be the baseline itself
        wait_until("an EFA check completed", lambda: len(efa_checked(node)) == 32, timeout=60)
        inject = run_sim_inject(node.state_dir, "--efa-stalled", "rdmap80s0")
        assert inject.returncode == 0, inject.stderr
        wait_until("rdmap80s0 unhealthy", lambda: "rdmap80s0" not in node.kubelet.healthy(RESOURCE_EFA))
        assert len(node.kubelet.healthy(RESOURCE_EFA)) == 31
        assert node.kubelet.devices(RESOURCE_EFA)["rdmap80s0"].health == "Unhealthy"
    finally:
        node.close()


def efa_checked(node: AgentNode) -> dict[str, bool]:
    """The adapters the agent's last completed EFA check saw (empty before the first one)."""
    return dict(call_agent(node.state_dir, "health.status")["efa"])
