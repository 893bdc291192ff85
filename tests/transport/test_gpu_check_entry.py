"""gpu-check runs from the product, not the repository: ``python -m gpuweave gpu-check`` with this
interpreter from a directory outside the checkout, and ``scripts/gpu-check`` choosing its Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuweave.gpucheck.process import product_env
from tests.support.agent_process import REPO_ROOT

COMMITTED = REPO_ROOT / "tests" / "fixtures" / "nvml" / "nvidia-h100-80gb-hbm3-550.90.07.json"
SCRIPT = REPO_ROOT / "scripts" / "gpu-check"


def test_the_product_entry_point_checks_the_simulator_from_any_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "gpuweave").mkdir(parents=True)  # a decoy package in the working directory is never run
    (elsewhere / "gpuweave" / "__init__.py").write_text("raise SystemExit('the decoy gpuweave ran')\n")
    done = subprocess.run(
        [sys.executable, "-P", "-m", "gpuweave", "gpu-check", "--simulate", "dgx-h100",
         "--only", "inspect", "--only", "agent", "--only", "record", "--out", "recorded"],
        cwd=elsewhere, env=product_env(), capture_output=True, text=True, timeout=150, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [["ok", "inspect"], ["ok", "agent"], ["ok", "record"]]
    assert "8 GPUs in --json" in lines[0]
    assert "registered, 8 GPUs listed, allocated GPU-" in lines[1] and "one health round" in lines[1]
    assert lines[2].endswith(f"recorded/{COMMITTED.name}")  # --out relative to the working directory
    assert (elsewhere / "recorded" / COMMITTED.name).read_text() == COMMITTED.read_text()
    assert lines[3].startswith("total ") and "skipped" not in lines[3]


def test_without_a_checkout_the_contract_step_is_reported_skipped(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "gpuweave", "gpu-check", "--simulate", "dgx-h100", "--only", "contract",
         "--repo", str(tmp_path)],
        cwd=tmp_path, env=product_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first, total = done.stdout.splitlines()
    assert first.startswith("skip contract ") and f"--repo {tmp_path} has no tests/contract" in first
    assert total.endswith("(skipped: contract)")


def _script(tmp_path: Path, *args: str, python: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWEAVE_PYTHON": python}
    return subprocess.run(
        [str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_script_runs_the_python_named_by_gpuweave_python_from_any_directory(tmp_path: Path) -> None:
    done = _script(tmp_path, "--simulate", "l40s-pcie-8", "--only", "inspect", python=sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok   inspect ") and "8 GPUs in --json" in done.stdout


def test_the_script_says_how_to_fix_a_python_without_gpuweave(tmp_path: Path) -> None:
    bare = tmp_path / "bare-python"  # this interpreter without site-packages: no gpuweave
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    done = _script(tmp_path, "--only", "inspect", python=str(bare))
    assert done.returncode == 2 and done.stdout == ""
    assert f"{bare} ($GPUWEAVE_PYTHON) cannot import gpuweave's check: ModuleNotFoundError" in done.stderr
    assert "pip install -e" in done.stderr and "GPUWEAVE_PYTHON=/path/to/python" in done.stderr
    missing = _script(tmp_path, "--only", "inspect", python=str(tmp_path / "no-such-python"))
    assert missing.returncode == 2 and "is not an executable" in missing.stderr
