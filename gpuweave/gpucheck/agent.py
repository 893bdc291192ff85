"""The ``agent`` step: ``gpuweave node-agent --no-kube`` in its own process against a kubelet.

The kubelet side is the product's own (``gpuweave.simulate.kubelet.SimKubelet``: the
device-plugin API over real unix sockets). The agent must register ``nvidia.com/gpu``, list the
GPUs (ListAndWatch), answer GetPreferredAllocation and Allocate for one GPU, and finish one health
round. It runs with no API server and no MIG or sharing configuration, keeps its kubelet, state
and CDI specs in a temporary directory (never the host's ``/var/run/cdi``, where a running agent's
specs live), and has an ``nvidia-smi`` guard first on its ``PATH`` that passes queries to the real
one and refuses every command that changes the machine, so a health remediation cannot reset a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devicemodel.contracts import RESOURCE_GPU
from gpuweave.gpucheck.process import CheckFailedError, gpuweave_command, product_env
from gpuweave.simulate.kubelet import HEALTHY, SimKubelet
from nodeagent.control import call_agent
from nodeagent.errors import ControlError

AGENT_REGISTER_S = 40.0
AGENT_ROUND_S = 30.0
AGENT_STOP_S = 20.0
_GUARD = """#!/bin/sh
# gpu-check's guard: queries pass to the real nvidia-smi, anything else (reset, -pm, -mig, -lgc) is refused.
for arg in "$@"; do
  case "$arg" in
    -r|--gpu-reset|-pm|--persistence-mode|-mig|--multi-instance-gpu|-c|--compute-mode|-pl|--power-limit|\\
    -lgc|--lock-gpu-clocks|-rgc|--reset-gpu-clocks|-ac|--applications-clocks|-rac|-e|--ecc-config|mig)
      echo "gpu-check: refused nvidia-smi $* (the check changes nothing)" >&2; exit 9;;
  esac
done
for dir in $(echo "$GPU_CHECK_REAL_PATH" | tr ':' ' '); do
  [ -x "$dir/nvidia-smi" ] && exec "$dir/nvidia-smi" "$@"
done
echo "gpu-check: no nvidia-smi on PATH" >&2; exit 127
"""


def guard_environment(root: Path) -> dict[str, str]:
    """An environment whose PATH starts with the nvidia-smi guard (the real one stays reachable)."""
    guard = root / "guard"
    guard.mkdir()
    (guard / "nvidia-smi").write_text(_GUARD)
    (guard / "nvidia-smi").chmod(0o755)
    real = os.environ.get("PATH", "")
    return {**os.environ, "PATH": f"{guard}:{real}", "GPU_CHECK_REAL_PATH": real}


def _short_temp_dir() -> Path:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="gw", dir="/tmp" if os.path.isdir("/tmp") else None))


def step_agent(profile: str | None) -> str:
    root = _short_temp_dir()
    kubelet = SimKubelet(root / "k")
    agent: subprocess.Popen[bytes] | None = None
    try:
        kubelet.start()
        (root / "health.yaml").write_text(  # no burn-in: the exercise step runs the exerciser itself
            "health: {round_interval_s: 1.0, check_timeout_s: 5.0, active_checks: {burn_in_level: 0}}\n"
        )
        command = gpuweave_command(
            "--log-level", "WARNING", "node-agent", "--kubelet-dir", str(root / "k"),
            "--state-dir", str(root / "s"), "--no-kube", "--node-name", "gpu-check",
            "--health-config", str(root / "health.yaml"), "--cdi-spec-dir", str(root / "cdi"),
            *(["--simulate", profile] if profile else []),
        )
        with (root / "agent.log").open("wb") as log:  # a file: a chatty agent never fills a pipe
            agent = subprocess.Popen(
                command, cwd=root, env=product_env(guard_environment(root)),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
        return _exercise_agent(kubelet, root / "s", agent, root / "agent.log")
    finally:
        if agent is not None:
            _stop(agent)
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def _stop(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    try:
        agent.wait(timeout=AGENT_STOP_S)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def _exercise_agent(kubelet: SimKubelet, state_dir: Path, agent: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + AGENT_REGISTER_S
    while not kubelet.wait_for({RESOURCE_GPU}, timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
        if agent.poll() is not None or time.monotonic() >= deadline:
            ended = f"the agent exited ({agent.returncode})" if agent.poll() is not None else (
                f"the agent did not register {RESOURCE_GPU} in {AGENT_REGISTER_S:g}s"
            )
            raise CheckFailedError(f"{ended}: {_log_tail(log)}")
    listed = kubelet.devices(RESOURCE_GPU)
    if not listed:
        raise CheckFailedError(f"{RESOURCE_GPU} registered but ListAndWatch lists no device")
    healthy = sorted(d for d, health in listed.items() if health == HEALTHY)
    if not healthy:
        raise CheckFailedError(f"ListAndWatch lists {len(listed)} devices, none Healthy: {listed}")
    preferred = kubelet.preferred(RESOURCE_GPU, 1)
    if preferred is not None and (len(preferred) != 1 or preferred[0] not in healthy):
        raise CheckFailedError(f"GetPreferredAllocation of one device out of {healthy} answered {preferred}")
    chosen = preferred or healthy[:1]
    response = kubelet.allocate(RESOURCE_GPU, chosen)  # the preference was asked above, as the kubelet does
    if not response.envs and not response.devices and not response.cdi_devices:
        raise CheckFailedError(f"Allocate of {chosen} returned no environment, devices or CDI devices")

    def one_round() -> bool:
        try:
            return int(call_agent(state_dir, "health.status", timeout=5).get("rounds", 0)) >= 1
        except ControlError:
            return False

    if not _wait(one_round, AGENT_ROUND_S):
        raise CheckFailedError(f"no health round finished in {AGENT_ROUND_S:g}s")
    return f"registered, {len(listed)} GPUs listed, allocated {chosen[0]}, one health round"


def _log_tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(lines[-3:])[-400:] or "no output"


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
