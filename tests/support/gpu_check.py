"""``scripts/gpu-check``: the read-only check of a real NVIDIA host, or of the simulator with --simulate.

Four steps, each timed, each bounded by a deadline so the whole check ends within 4 minutes:

1. ``contract``: the backend contract suite (``tests/contract``) against NVML
   (``GPUWEAVE_CONTRACT_BACKENDS=nvml``), or against the one simulated profile.
2. ``inspect``: ``gpuweave inspect`` and ``gpuweave inspect --json`` (the JSON must parse).
3. ``agent``: ``gpuweave node-agent --no-kube`` against the GPUs and the kubelet emulator: it must
   register ``nvidia.com/gpu``, list every GPU (ListAndWatch), answer GetPreferredAllocation and
   Allocate for one GPU, and finish one health round.
4. ``record``: every NVML answer the product reads (``hardware.nvml_record``) into
   ``<out>/<product>-<driver>.json``.

It changes nothing on the machine: the recorder and the contract suite only read; the agent runs
with no MIG configuration and no API server, and ``nvidia-smi`` on its PATH is a guard that
refuses every command except queries, so a health remediation cannot reset a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.control import call_agent
from deviceplugin.errors import ControlError
from tests.support.agent_process import REPO_ROOT, remove_tree, short_temp_dir
from tests.support.gpu_check_record import record_fixture
from tests.support.kubelet_emulator import KubeletEmulator

RESOURCE_GPU = "nvidia.com/gpu"
# Limits that add up to under 4 minutes with the recording (whose NVML calls have 10 s deadlines).
CONTRACT_TIMEOUT_S = 100.0
INSPECT_TIMEOUT_S = 20.0  # each of the two runs
AGENT_REGISTER_S = 40.0
AGENT_ROUND_S = 30.0
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


@dataclass
class StepResult:
    name: str
    ok: bool
    seconds: float
    detail: str


def _python(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
        check=False, env=env,
    )


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def step_contract(profile: str | None) -> str:
    env = {**os.environ, "GPUWEAVE_CONTRACT_BACKENDS": "simulated" if profile else "nvml"}
    if profile:
        env["GPUWEAVE_CONTRACT_PROFILES"] = profile
    replay = "--ignore=tests/contract/test_nvml_replay.py"  # it runs this script: no recursion
    pytest = ("-m", "pytest", "tests/contract", replay, "-q", "-p", "no:cacheprovider")
    done = _python(*pytest, timeout=CONTRACT_TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise CheckFailedError(f"contract suite failed: {_tail(done)}")
    return _tail(done)


def step_inspect(profile: str | None) -> str:
    base = ["-m", "gpuweave", "inspect", *(["--simulate", profile] if profile else [])]
    table = _python(*base, timeout=INSPECT_TIMEOUT_S)
    if table.returncode != 0:
        raise CheckFailedError(f"gpuweave inspect failed: {_tail(table)}")
    machine = _python(*base, "--json", timeout=INSPECT_TIMEOUT_S)
    if machine.returncode != 0:
        raise CheckFailedError(f"gpuweave inspect --json failed: {_tail(machine)}")
    gpus = json.loads(machine.stdout)["profile"]["spec"]["gpus"]
    if not gpus:
        raise CheckFailedError("gpuweave inspect --json lists no GPU")
    return f"{len(table.stdout.splitlines())} table lines, {len(gpus)} GPUs in --json"


def guard_environment(root: Path) -> dict[str, str]:
    """An environment whose PATH starts with the nvidia-smi guard (the real one stays reachable)."""
    guard = root / "guard"
    guard.mkdir()
    (guard / "nvidia-smi").write_text(_GUARD)
    (guard / "nvidia-smi").chmod(0o755)
    real = os.environ.get("PATH", "")
    return {**os.environ, "PATH": f"{guard}:{real}", "GPU_CHECK_REAL_PATH": real}


def step_agent(profile: str | None) -> str:
    root = short_temp_dir()
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    (root / "health.yaml").write_text("health: {round_interval_s: 1.0, check_timeout_s: 5.0}\n")
    command = ["-m", "gpuweave", "--log-level", "WARNING", "node-agent", "--kubelet-dir", str(root / "k"),
               "--state-dir", str(root / "s"), "--no-kube", "--node-name", "gpu-check",
               "--health-config", str(root / "health.yaml"), *(["--simulate", profile] if profile else [])]
    agent = subprocess.Popen([sys.executable, *command], cwd=REPO_ROOT, env=guard_environment(root),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        return _exercise_agent(kubelet, root / "s", agent)
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        kubelet.stop()
        remove_tree(root)


def _exercise_agent(kubelet: KubeletEmulator, state_dir: Path, agent: subprocess.Popen[str]) -> str:

    def registered() -> bool:
        return agent.poll() is None and bool(kubelet.devices(RESOURCE_GPU))

    if not kubelet.wait_for(registered, timeout=AGENT_REGISTER_S):
        stderr = agent.stderr.read() if agent.poll() is not None and agent.stderr else ""
        waited = f"{AGENT_REGISTER_S:g}s"
        raise CheckFailedError(f"the agent did not register {RESOURCE_GPU} in {waited}: {stderr[-400:]}")
    listed = len(kubelet.devices(RESOURCE_GPU))
    chosen, response = kubelet.allocate(RESOURCE_GPU, 1)  # GetPreferredAllocation, then Allocate
    if not response.envs and not response.devices and not response.cdi_devices:
        raise CheckFailedError(f"Allocate of {chosen} returned no environment, devices or CDI devices")

    def one_round() -> bool:
        try:
            return int(call_agent(state_dir, "health.status", timeout=5).get("rounds", 0)) >= 1
        except ControlError:
            return False

    if not _wait(one_round, AGENT_ROUND_S):
        raise CheckFailedError(f"no health round finished in {AGENT_ROUND_S:g}s")
    return f"registered, {listed} GPUs listed, allocated {chosen[0]}, one health round"


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


class CheckFailedError(Exception):
    """One step of the check failed; the message says what it saw."""


def run_step(name: str, action: Callable[[], str]) -> StepResult:
    started = time.monotonic()
    try:
        detail, ok = action(), True
    except Exception as exc:  # any failure inside a step is that step's FAIL line
        detail, ok = str(exc).splitlines()[0] if str(exc) else type(exc).__name__, False
    return StepResult(name, ok, time.monotonic() - started, detail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", metavar="PROFILE", help="check the simulator as this built-in profile")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "nvml",
                        help="directory for the recorded fixture (default: tests/fixtures/nvml)")
    parser.add_argument("--profile", help="built-in profile describing this host (default: by GPU product)")
    parser.add_argument("--only", choices=("contract", "inspect", "agent", "record"), action="append",
                        help="run only these steps (repeatable)")
    args = parser.parse_args(argv)
    steps: dict[str, Callable[[], str]] = {
        "contract": lambda: step_contract(args.simulate),
        "inspect": lambda: step_inspect(args.simulate),
        "agent": lambda: step_agent(args.simulate),
        "record": lambda: str(record_fixture(simulate=args.simulate, out_dir=args.out, profile=args.profile)),
    }
    results = [run_step(name, action) for name, action in steps.items() if not args.only or name in args.only]
    for result in results:
        print(f"{'ok  ' if result.ok else 'FAIL'} {result.name:<9} {result.seconds:6.1f}s  {result.detail}")
    print(f"total {sum(r.seconds for r in results):.1f}s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
