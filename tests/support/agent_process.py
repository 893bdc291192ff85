"""Run the real ``gpuweave node-agent`` process for transport tests and benchmarks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]


def short_temp_dir() -> Path:
    """A temporary directory with a short path: unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))


STOP_GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds, which the DaemonSet keeps


class AgentProcess:
    """``python -m gpuweave node-agent --simulate PROFILE --no-kube`` in a child process."""

    def __init__(
        self,
        kubelet_dir: Path,
        state_dir: Path,
        *,
        profile: str,
        extra: tuple[str, ...] = (),
        node: str = "node-a",
    ) -> None:
        self.kubelet_dir = kubelet_dir
        self.state_dir = state_dir
        command = [sys.executable, "-m", "gpuweave", "--log-level", "WARNING", "node-agent"]
        command += ["--kubelet-dir", str(kubelet_dir), "--state-dir", str(state_dir)]
        command += ["--simulate", profile, "--node-name", node, *extra]
        if "--kubeconfig" not in extra:
            command.append("--no-kube")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self) -> dict[str, object] | None:
        try:
            return dict(json.loads((self.state_dir / "agent.json").read_text()))
        except (OSError, json.JSONDecodeError):
            return None

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def thread_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:  # stuck: its threads' stacks go to stderr, then kill
                self.process.send_signal(signal.SIGABRT)
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        if self.process.stderr is not None:
            self.stderr = self.process.stderr.read().decode(errors="replace")
            self.process.stderr.close()
        return self.process.returncode

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
