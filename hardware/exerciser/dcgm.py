"""DCGM's diagnostic as the exerciser where DCGM is installed and its host engine answers.

``dcgmi diag -r LEVEL -j -i IDS`` runs DCGM's own suite at the same level number (1 quick ..
4 extended) and prints JSON; each test's result per GPU becomes one ``CheckResult`` of kind
``DCGM`` with DCGM's verdict. Both of DCGM's JSON shapes are read: 4.x (``"DCGM Diagnostic"``,
results per ``entity_id``) and 3.x (``"DCGM GPU Diagnostic"``, results per ``gpu_ids``); a result
that names no GPU (a deployment check) applies to every GPU of the run. DCGM numbers GPUs its own
way, so ``dcgmi discovery -l`` maps each GPU UUID to its DCGM id (NVML's index where it prints
none). The run has the same deadline as any other: at it the ``dcgmi`` process group is killed
and every GPU of the run is ``TIMEOUT``; a cancelled run kills it too, and is ``NOT_RUN``. A
``runtime_error`` is an ``ERROR`` for every GPU. A plan of bandwidth checks only (a gang's
preflight) runs DCGM's PCIe test (``-r pcie``: host <-> device and peer copies) instead of a level.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from devicemodel.errors import clip
from hardware.exerciser.protocol import (
    BANDWIDTH_CHECKS,
    CANCELLED,
    CheckKind,
    CheckResult,
    ExercisePlan,
    ExerciseReport,
    ResultStatus,
)

DCGMI = "dcgmi"
DISCOVERY_TIMEOUT_S = 10.0
MAX_OUTPUT_BYTES = 8 << 20
CANCEL_POLL_S = 0.05
_VERDICTS = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
    "notrun": "skip",
}
_ROW = re.compile(r"^\|\s*(\d+)\s*\|")
_UUID = re.compile(r"Device UUID:\s*(GPU-[0-9A-Fa-f-]+)")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Warning(_Lenient):
    warning: str = ""
    error_id: int | None = None


class _Result(_Lenient):
    status: str = ""
    entity_group: str | None = None
    entity_id: int | None = None
    gpu_id: int | str | None = None
    gpu_ids: str | int | None = None
    warnings: list[_Warning | str] = []


class _Test(_Lenient):
    name: str = ""
    results: list[_Result] = []


class _Category(_Lenient):
    category: str = ""
    tests: list[_Test] = []


class _Diag(_Lenient):
    test_categories: list[_Category] = []
    runtime_error: str | None = None


def dcgm_ids(discovery: str) -> dict[str, int]:
    """GPU UUID -> DCGM GPU id from ``dcgmi discovery -l``'s table."""
    ids: dict[str, int] = {}
    current: int | None = None
    for line in discovery.splitlines():
        row = _ROW.match(line)
        if row:
            current = int(row.group(1))
        found = _UUID.search(line)
        if found and current is not None:
            ids[found.group(1).lower()] = current
    return ids


def parse_diag(text: str, gpus: Mapping[int, str]) -> list[CheckResult]:
    """DCGM's JSON as results for the GPUs of the run (``gpus``: DCGM id -> GPU UUID)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start : end + 1]) if start >= 0 else None
        body = (data or {}).get("DCGM Diagnostic") or (data or {}).get("DCGM GPU Diagnostic")
        diag = _Diag.model_validate(body) if isinstance(body, dict) else None
    except (ValueError, ValidationError) as exc:
        diag, problem = None, f"unreadable output ({clip(str(exc), limit=160)})"
    else:
        problem = "" if diag is not None else "no DCGM diagnostic object in its output"
    if diag is None or diag.runtime_error:
        detail = f"dcgmi diag: {diag.runtime_error if diag is not None else problem}"
        return [
            CheckResult(CheckKind.DCGM, uuid, ResultStatus.ERROR, detail=clip(detail, limit=400))
            for uuid in gpus.values()
        ]
    results = list(_results(diag, gpus))
    seen = {r.gpu for r in results}
    results += [
        CheckResult(CheckKind.DCGM, uuid, ResultStatus.NOT_RUN, detail="DCGM reported nothing for this GPU")
        for uuid in gpus.values()
        if uuid not in seen
    ]
    return results


def _results(diag: _Diag, gpus: Mapping[int, str]) -> Iterable[CheckResult]:
    for category in diag.test_categories:
        for test in category.tests:
            for result in test.results:
                verdict = _VERDICTS.get(result.status.strip().lower(), "fail")  # unknown: fail closed
                notes = "; ".join(w if isinstance(w, str) else w.warning for w in result.warnings)
                name = f"{category.category}/{test.name}".strip("/")
                status = ResultStatus.SKIPPED if verdict == "skip" else ResultStatus.DONE
                for uuid in _targets(result, gpus):
                    yield CheckResult(
                        CheckKind.DCGM,
                        uuid,
                        status,
                        verdict=verdict,
                        test=name,
                        detail=clip(f"{name}: {result.status}" + (f": {notes}" if notes else ""), limit=400),
                    )


def _targets(result: _Result, gpus: Mapping[int, str]) -> list[str]:
    """The run's GPUs a result names (all of them when it names none)."""
    if result.entity_id is not None and (result.entity_group or "GPU").upper() == "GPU":
        ids = [result.entity_id]
    elif result.gpu_id is not None:
        ids = [int(result.gpu_id)]
    elif result.gpu_ids is not None:
        ids = [int(i) for i in str(result.gpu_ids).split(",") if i.strip().isdigit()]
    else:
        return list(gpus.values())
    return [gpus[i] for i in ids if i in gpus]


class DcgmExerciser:
    """``Exerciser`` over ``dcgmi diag``; build it with ``DcgmExerciser.find()``."""

    name = "dcgm"

    def __init__(self, dcgmi: str, ids: Mapping[str, int]) -> None:
        self._dcgmi = dcgmi
        self._ids = {uuid.lower(): i for uuid, i in ids.items()}

    @classmethod
    def find(cls, *, which: Callable[[str], str | None] = shutil.which) -> DcgmExerciser | None:
        """The adapter when ``dcgmi`` is on PATH and its host engine answers ``discovery -l``."""
        dcgmi = which(DCGMI)
        if dcgmi is None:
            return None
        try:
            done = subprocess.run(
                [dcgmi, "discovery", "-l"],
                capture_output=True,
                text=True,
                timeout=DISCOVERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        return cls(dcgmi, dcgm_ids(done.stdout))

    def command(self, plan: ExercisePlan) -> tuple[list[str], dict[int, str]]:
        gpus = {self._ids.get(g.uuid.lower(), g.index): g.uuid for g in plan.gpus}
        ids = ",".join(str(i) for i in sorted(gpus))
        test = "pcie" if set(plan.gpu_checks) <= set(BANDWIDTH_CHECKS) else str(plan.level)
        return [self._dcgmi, "diag", "-r", test, "-j", "-i", ids], gpus

    def run(
        self, plan: ExercisePlan, *, deadline_s: float, cancel: threading.Event | None = None
    ) -> ExerciseReport:
        started = time.monotonic()
        command, gpus = self.command(plan)
        output, error = _run_bounded(command, deadline_s, cancel)
        if error:
            status = (
                ResultStatus.NOT_RUN
                if error == CANCELLED
                else ResultStatus.TIMEOUT
                if "deadline" in error
                else ResultStatus.ERROR
            )
            results = [CheckResult(CheckKind.DCGM, uuid, status, detail=error) for uuid in gpus.values()]
        else:
            results = parse_diag(output, gpus)
        return ExerciseReport(self.name, plan, tuple(results), time.monotonic() - started)


def _run_bounded(command: list[str], deadline_s: float, cancel: threading.Event | None) -> tuple[str, str]:
    """(stdout, "") or ("", why it failed); the process group is killed at the deadline, or as soon
    as ``cancel`` is set (``CANCELLED``)."""
    try:
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return "", f"cannot run {command[0]}: {exc}"
    until = time.monotonic() + deadline_s
    while True:
        try:
            out, _ = child.communicate(timeout=max(min(until - time.monotonic(), CANCEL_POLL_S), 0.001))
            return out[:MAX_OUTPUT_BYTES].decode(errors="replace"), ""
        except subprocess.TimeoutExpired:
            cancelled = cancel is not None and cancel.is_set()
            if not cancelled and time.monotonic() < until:
                continue
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            if cancelled:
                return "", CANCELLED
            return "", f"dcgmi diag still running at the {deadline_s:g} s deadline: killed"
