"""gpu-check's nvidia-smi guard: queries reach the real nvidia-smi, changes to the machine never do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuweave.gpucheck.agent import guard_environment


@pytest.fixture
def guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    real = tmp_path / "driver"
    real.mkdir()
    (real / "nvidia-smi").write_text('#!/bin/sh\necho "real nvidia-smi $*"\n')
    (real / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{real}:/usr/bin:/bin")
    (tmp_path / "check").mkdir()
    return guard_environment(tmp_path / "check")


@pytest.mark.parametrize(
    "args",
    [["-r", "-i", "GPU-1"], ["--gpu-reset", "-i", "0"], ["-pm", "1"], ["-mig", "1"], ["mig", "-cgi", "9"],
     ["-c", "EXCLUSIVE_PROCESS"], ["-pl", "300"], ["-lgc", "1500"], ["-e", "0"]],
)
def test_the_guard_refuses_every_change(guarded: dict[str, str], args: list[str]) -> None:
    done = subprocess.run(["nvidia-smi", *args], env=guarded, capture_output=True, text=True, check=False)
    assert done.returncode == 9
    assert "gpu-check: refused nvidia-smi" in done.stderr and "real" not in done.stdout


def test_the_guard_passes_queries_to_the_real_nvidia_smi(guarded: dict[str, str]) -> None:
    done = subprocess.run(["nvidia-smi", "-L"], env=guarded, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout == "real nvidia-smi -L\n"
