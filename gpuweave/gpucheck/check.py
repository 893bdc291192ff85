"""The read-only check of a real NVIDIA host, or of the simulator with --simulate.

Five steps, each timed, each bounded by a deadline so the whole check ends within 4 minutes:

1. ``contract``: the repository's backend contract suite (``pytest tests/contract``) against NVML
   (``GPUWEAVE_CONTRACT_BACKENDS=nvml``), or against the one simulated profile. It needs a
   checkout of the repository and pytest; where either is missing (the node agent's image) the
   step is reported as ``skip`` with the reason.
2. ``inspect``: ``gpuweave inspect`` and ``gpuweave inspect --json`` (the JSON must parse).
3. ``agent``: ``gpuweave node-agent --no-kube`` against the GPUs and the product's kubelet side
   (``gpuweave.gpucheck.agent``).
4. ``exercise``: the active-check exerciser (the CUDA driver with gpuweave's PTX kernels: memory
   pattern, compute, PCIe and NVLink copies) on every GPU at level 1, judged as the agent judges
   it, recorded into ``<out>/exerciser/<product>-<driver>.json`` (``gpuweave.gpucheck.exercise``).
5. ``record``: every NVML answer the product reads (``hardware.nvml_record``) into
   ``<out>/<product>-<driver>.json`` (``gpuweave.gpucheck.record``).

It changes nothing on the machine: the recorder and the contract suite only read; the exerciser
uses the GPUs (memory, kernels, copies) but changes no device setting; the agent runs
with no MIG configuration and no API server, and ``nvidia-smi`` on its PATH is a guard that
refuses every command except queries, so a health remediation cannot reset a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuweave.gpucheck.agent import step_agent
from gpuweave.gpucheck.exercise import step_exercise
from gpuweave.gpucheck.process import (
    CheckFailedError,
    StepSkippedError,
    package_root,
    run_gpuweave,
    tail,
)
from gpuweave.gpucheck.record import record_fixture

STEPS = ("contract", "inspect", "agent", "exercise", "record")
# Limits that add up to under 4 minutes with the recording (whose NVML calls have 10 s deadlines).
CONTRACT_TIMEOUT_S = 100.0
INSPECT_TIMEOUT_S = 20.0  # each of the two runs
CONTRACT_SUITE = Path("tests") / "contract"
FIXTURES = Path("tests") / "fixtures" / "nvml"
# The repository's pytest settings (pyproject addopts: --timeout) need this plugin besides pytest.
PYTEST_MODULES = {"pytest": "pytest", "pytest_timeout": "pytest-timeout"}


@dataclass
class StepResult:
    name: str
    status: str  # "ok", "FAIL" or "skip"
    seconds: float
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


def find_repo(explicit: Path | None) -> Path | None:
    """The repository checkout whose contract suite to run: ``--repo``, else the directory the
    imported gpuweave comes from when it is a checkout (an editable install, a source tree)."""
    candidate = explicit if explicit is not None else package_root()
    return candidate.resolve() if (candidate / CONTRACT_SUITE).is_dir() else None


def step_contract(profile: str | None, repo: Path | None, explicit: Path | None) -> str:
    if repo is None:
        where = (
            f"--repo {explicit} has no {CONTRACT_SUITE}" if explicit is not None
            else f"gpuweave is installed from {package_root()}, not from a repository checkout"
        )
        raise StepSkippedError(f"{where}; the contract suite runs from a checkout (--repo DIR)")
    missing = [name for module, name in PYTEST_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise StepSkippedError(
            f"{' and '.join(missing)} not installed for {sys.executable} "
            f"(pip install pytest pytest-timeout, or use {repo}/.venv/bin/python)"
        )
    env = {**os.environ, "GPUWEAVE_CONTRACT_BACKENDS": "simulated" if profile else "nvml"}
    if profile:
        env["GPUWEAVE_CONTRACT_PROFILES"] = profile
    replay = "--ignore=tests/contract/test_nvml_replay.py"  # it runs this check: no recursion
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(CONTRACT_SUITE), replay, "-q", "-p", "no:cacheprovider"],
        cwd=repo, capture_output=True, text=True, timeout=CONTRACT_TIMEOUT_S, check=False, env=env,
    )
    if done.returncode != 0:
        raise CheckFailedError(f"contract suite failed: {tail(done)}")
    return tail(done)


def step_inspect(profile: str | None) -> str:
    base = ["inspect", *(["--simulate", profile] if profile else [])]
    table = run_gpuweave(*base, timeout=INSPECT_TIMEOUT_S)
    if table.returncode != 0:
        raise CheckFailedError(f"gpuweave inspect failed: {tail(table)}")
    machine = run_gpuweave(*base, "--json", timeout=INSPECT_TIMEOUT_S)
    if machine.returncode != 0:
        raise CheckFailedError(f"gpuweave inspect --json failed: {tail(machine)}")
    gpus = json.loads(machine.stdout)["profile"]["spec"]["gpus"]
    if not gpus:
        raise CheckFailedError("gpuweave inspect --json lists no GPU")
    return f"{len(table.stdout.splitlines())} table lines, {len(gpus)} GPUs in --json"


def run_step(name: str, action: Callable[[], str]) -> StepResult:
    started = time.monotonic()
    try:
        detail, status = action(), "ok"
    except StepSkippedError as exc:
        detail, status = str(exc), "skip"
    except Exception as exc:  # any failure inside a step is that step's FAIL line
        detail, status = str(exc).splitlines()[0] if str(exc) else type(exc).__name__, "FAIL"
    return StepResult(name, status, time.monotonic() - started, detail)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--simulate", metavar="PROFILE", help="check the simulator as this built-in profile")
    add("--out", type=Path, default=None,
        help=f"directory for the recorded fixture and the exerciser's recording (default: {FIXTURES} "
             "in the repository, else the current directory)")
    add("--profile", help="built-in profile describing this host (default: by GPU product)")
    add("--only", choices=STEPS, action="append", help="run only these steps (repeatable)")
    add("--repo", type=Path, default=None, metavar="DIR",
        help="repository checkout for the contract suite and the default --out "
             "(default: where gpuweave is imported from, when that is a checkout)")


def run(args: argparse.Namespace) -> int:
    repo = find_repo(args.repo)
    out: Path = args.out if args.out is not None else (repo / FIXTURES if repo else Path.cwd())
    steps: dict[str, Callable[[], str]] = {
        "contract": lambda: step_contract(args.simulate, repo, args.repo),
        "inspect": lambda: step_inspect(args.simulate),
        "agent": lambda: step_agent(args.simulate),
        "exercise": lambda: step_exercise(simulate=args.simulate, out_dir=out),
        "record": lambda: str(record_fixture(simulate=args.simulate, out_dir=out, profile=args.profile)),
    }
    results = []
    for name, action in steps.items():
        if not args.only or name in args.only:
            results.append(run_step(name, action))
            print(report_line(results[-1]), flush=True)
    skipped = [r.name for r in results if r.status == "skip"]
    note = f" (skipped: {', '.join(skipped)})" if skipped else ""
    print(f"total {sum(r.seconds for r in results):.1f}s{note}")
    return 0 if all(r.ok for r in results) else 1


def report_line(result: StepResult) -> str:
    return f"{result.status:<4} {result.name:<9} {result.seconds:6.1f}s  {result.detail}"
