"""Faults of the node-agent process itself, seen from the tools and the kubelet.

The real ``gpuweave node-agent`` process serves the kubelet emulator; the fault is done to the
process (``kill -9``) while a tool talks to it, and what the operator sees is under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import REPO_ROOT
from tests.support.waiting import poll_until


@pytest.fixture
def h100() -> Iterator[AgentNode]:
    node = AgentNode("dgx-h100")
    try:
        assert node.kubelet.wait_for(lambda: len(node.kubelet.devices(RESOURCE_GPU)) == 8, timeout=60)
        yield node
    finally:  # a setup that fails stops the agent too
        node.stop_all()


def accepted_connections(socket_path: Path) -> int:
    """Connected sockets bound to ``socket_path`` (the agent's side of each accepted request)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.endswith(f" {socket_path}") and line.split()[5] == "03")


def test_mig_apply_reports_an_agent_killed_mid_request_in_one_line(h100: AgentNode) -> None:
    inject = run_sim_inject(h100.state_dir, "--gpu", "3", "--nvml-hang", "60")  # the reshape cannot finish
    assert inject.returncode == 0, inject.stderr
    sock = h100.state_dir / "agent.sock"
    command = [sys.executable, "-m", "gpuweave", "mig", "apply", "--state-dir", str(h100.state_dir)]
    apply = subprocess.Popen(
        [*command, "--gpu", "3", "--profiles", "1g.10gb"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert poll_until(lambda: accepted_connections(sock) > 0, timeout=30), "the request never arrived"
        os.kill(h100.agent.pid, signal.SIGKILL)
        _, err = apply.communicate(timeout=60)
    finally:
        if apply.poll() is None:
            apply.kill()
    assert apply.returncode == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "went away before answering" in err
    assert "Traceback" not in err and "JSONDecodeError" not in err
