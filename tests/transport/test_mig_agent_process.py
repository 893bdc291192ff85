"""The real `gpuweave node-agent` process reshapes MIG on `gpuweave mig apply`, and restores after a restart.

A new simulated agent process starts from fresh simulated hardware, exactly as a Hopper node after
a reboot: MIG mode off, no instances. The journal in STATE_DIR still holds GPU 3's layout, so the
agent re-applies it before serving, and the kubelet sees the same MIG resources again.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from nodeagent.control import call_agent
from tests.support.agent_process import REPO_ROOT, AgentProcess, remove_tree, short_temp_dir
from tests.support.kubelet_emulator import KubeletEmulator

MIG_2G = mig_resource_name("2g.20gb")
MIG_1G = mig_resource_name("1g.10gb")


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_temp_dir()
    yield path
    remove_tree(path)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuweave", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_apply_through_the_cli_and_restore_after_restart(root: Path) -> None:
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    try:
        with AgentProcess(root / "k", root / "s", profile="dgx-h100"):
            assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 8, timeout=60)
            done = cli(
                "mig", "apply", "--state-dir", str(root / "s"), "--gpu", "3", "--profiles", "2g.20gb,1g.10gb"
            )
            assert done.returncode == 0, done.stderr
            assert "MIG mode enabled" in done.stdout
            assert "final layout: [4-5] 2g.20gb [6] 1g.10gb" in done.stdout
            assert kubelet.wait_for(lambda: kubelet.healthy(MIG_2G) and kubelet.healthy(MIG_1G), timeout=30)
            refused = cli(
                "mig", "apply", "--state-dir", str(root / "s"), "--gpu", "3", "--profiles", "9g.1gb"
            )
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1
            assert "9g.1gb is not offered by H100-80GB" in refused.stderr
        kubelet.restart()
        with AgentProcess(root / "k", root / "s", profile="dgx-h100"):
            assert kubelet.wait_for(
                lambda: len(kubelet.healthy(MIG_2G)) == 1 and len(kubelet.healthy(MIG_1G)) == 1, timeout=60
            )
            assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 7, timeout=30)
            status = call_agent(root / "s", "mig.status")["gpus"]
            assert status["3"] == [  # type: ignore[index]
                {"profile": "2g.20gb", "start": 4, "size": 2, "busy": False},
                {"profile": "1g.10gb", "start": 6, "size": 1, "busy": False},
            ]
            assert all(status[str(i)] == [] for i in range(8) if i != 3)  # type: ignore[index]
    finally:
        kubelet.stop()
