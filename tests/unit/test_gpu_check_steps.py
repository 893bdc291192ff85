"""gpu-check's report and its contract step's skips: a step that cannot run says why, never passes."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from gpuweave.gpucheck import check, process
from gpuweave.gpucheck.process import CheckFailedError, StepSkippedError
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
