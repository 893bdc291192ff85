"""The real node-agent process serving the kubelet emulator: one node for transport tests and benchmarks.

Everything lives under one short temporary directory (unix socket paths are limited): ``k`` is the
kubelet's device-plugin directory, ``s`` the agent's state directory.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.agent_process import REPO_ROOT, AgentProcess, remove_tree, short_temp_dir
from tests.support.kubelet_emulator import KubeletEmulator


class AgentNode:
    """A started ``KubeletEmulator`` and ``gpuweave node-agent --simulate PROFILE`` registering with it."""

    def __init__(
        self, profile: str, *, extra: tuple[str, ...] = (), node: str = "node-a", root: Path | None = None
    ) -> None:
        self.root = root or short_temp_dir()
        self.profile = profile
        self.extra = extra
        self.node_name = node
        self.kubelet = KubeletEmulator(self.kubelet_dir)
        self.kubelet.start()
        self.agent = self.start_agent()

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "k"

    @property
    def state_dir(self) -> Path:
        return self.root / "s"

    def start_agent(self) -> AgentProcess:
        return AgentProcess(
            self.kubelet_dir, self.state_dir, profile=self.profile, extra=self.extra, node=self.node_name
        )

    def stop_all(self) -> int:
        """Stop the agent, then the kubelet, remove the directory; the agent's exit status."""
        rc = self.agent.stop()
        self.kubelet.stop()
        remove_tree(self.root)
        return rc

    def close(self) -> None:
        """``stop_all``, failing when the agent did not exit cleanly (its stderr in the message)."""
        rc = self.stop_all()
        assert rc == 0, getattr(self.agent, "stderr", "")


def run_sim_inject(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpuweave sim inject --state-dir STATE_DIR ARGS`` as a process; its exit status and output."""
    command = [sys.executable, "-m", "gpuweave", "sim", "inject", "--state-dir", str(state_dir), *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False)
