"""gpu-check's report and its contract step's skips: a step that cannot run says why, never passes."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from gpuweave.gpucheck import check, exercise, process
from gpuweave.gpucheck.process import CheckFailedError, StepSkippedError
from hardware.exerciser.model import expectations
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.exerciser import SimulatedExerciser
from tests.support.agent_process import REPO_ROOT


def test_the_repository_is_found_where_gpuweave_is_imported_from_or_named_by_repo(tmp_path: Path) -> None:
    assert check.find_repo(None) == REPO_ROOT  # this checkout's editable install
    assert check.find_repo(REPO_ROOT) == REPO_ROOT
    assert check.find_repo(tmp_path) is None


def test_without_a_checkout_the_contract_step_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(StepSkippedError, match=rf"--repo {tmp_path} has no tests/contract"):
        check.step_contract("dgx-h100", None, tmp_path)
    monkeypatch.setattr(check, "package_root", lambda: tmp_path / "site-packages")
    with pytest.raises(StepSkippedError, match=r"gpuweave is installed from .*site-packages, not from a"):
        check.step_contract("dgx-h100", None, None)


@pytest.mark.parametrize("absent", ["pytest", "pytest_timeout"])
def test_without_pytest_the_contract_step_is_skipped_with_the_reason(
    absent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == absent else real(name, *a)
    )
    with pytest.raises(StepSkippedError, match=rf"{check.PYTEST_MODULES[absent]} not installed for "):
        check.step_contract("dgx-h100", REPO_ROOT, None)


def test_each_step_reports_ok_skip_or_fail_and_only_fail_fails() -> None:
    def skipped() -> str:
        raise StepSkippedError("no repository")

    def failed() -> str:
        raise CheckFailedError("the agent exited (1)\nsecond line")

    results = [check.run_step("inspect", lambda: "8 GPUs"), check.run_step("contract", skipped),
               check.run_step("agent", failed)]
    assert [(r.status, r.ok, r.detail) for r in results] == [
        ("ok", True, "8 GPUs"), ("skip", True, "no repository"), ("FAIL", False, "the agent exited (1)")
    ]
    lines = [re.sub(r" +\d+\.\ds  ", " | ", check.report_line(r)) for r in results]  # without the time
    assert lines == [
        "ok   inspect | 8 GPUs", "skip contract | no repository", "FAIL agent | the agent exited (1)"
    ]


def test_children_reach_the_imported_gpuweave_only_through_pythonpath_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "package_root", lambda: tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert process.product_env({"PYTHONPATH": "/x"}) == {"PYTHONPATH": "/x"}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    assert process.product_env({"PYTHONPATH": "/x"}) == {"PYTHONPATH": f"{tmp_path}:/x"}
    assert process.product_env({}) == {"PYTHONPATH": str(tmp_path)}
    assert process.gpuweave_command("inspect")[1:] == ["-P", "-m", "gpuweave", "inspect"]


def test_the_exercise_step_records_every_checks_timings_and_bandwidths_by_gpu_index(tmp_path: Path) -> None:
    line = exercise.step_exercise(simulate="dgx-h100", out_dir=tmp_path)
    recorded = tmp_path / "exerciser" / "nvidia-h100-80gb-hbm3-550.90.07.json"
    assert line.startswith("8 GPUs passed level 1") and line.endswith(str(recorded))
    document = json.loads(recorded.read_text())
    assert document["recordedBy"] == "scripts/gpu-check --simulate dgx-h100"
    assert document["expected"]["gpu0"]["pcieLink"] == [5, 16]
    kinds = {(r["check"], r["gpu"]) for r in document["results"]}
    assert ("memory", "gpu7") in kinds and ("p2p", "gpu7") in kinds
    assert all(r["gbps"] for r in document["results"] if r["check"] in ("h2d", "d2h", "p2p"))
    assert "GPU-" not in recorded.read_text()  # GPUs are named by index only


def test_the_exercise_step_fails_naming_the_gpu_and_where_it_recorded_why(tmp_path: Path) -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"))
    try:
        inventory = backend.discover()
        backend.node.exerciser.slow_pair(2, 3)
        simulated = SimulatedExerciser(inventory, backend.node.health, backend.node.exerciser)
        expected = expectations(inventory, {g.uuid: (5, 16) for g in inventory.gpus})
        failed = r"NVLink pair\(s\) 2-3 slow: active-check: NVLink copies gpu2 -> gpu3"
        with pytest.raises(CheckFailedError, match=failed):
            exercise._exercise(inventory, simulated, expected, tmp_path, simulate="dgx-h100")
    finally:
        backend.close()
    assert (tmp_path / "exerciser").is_dir()
