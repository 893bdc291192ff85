"""The real exerciser: the CUDA driver in a child process the parent kills at the run's deadline.

A driver call can hang for good (a wedged GPU, a GSP timeout); in the agent's own process that
would leak a thread per check and hold the GPU's file open. In a child the hang is one process:
at the deadline it is killed (its whole process group, SIGKILL), every check that had begun and
not finished is ``TIMEOUT`` (its GPU fails closed) and the ones never begun are ``NOT_RUN``. A
child that cannot use the driver says so in one ``fatal`` line: every check is ``ERROR`` with it.

The child runs the same interpreter and the same packages (``hardware.exerciser.child``), with
``CUDA_VISIBLE_DEVICES`` and MPS variables removed so it sees every GPU by bus id directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from hardware.exerciser.protocol import (
    CANCELLED,
    CheckKey,
    CheckResult,
    ExercisePlan,
    ExerciseReport,
    ResultStatus,
    unfinished,
)
from hardware.exerciser.wire import MAX_LINE_BYTES, child_line, plan_to_json, result_from_dict

log = logging.getLogger(__name__)
CHILD_MODULE = "hardware.exerciser.child"
KILL_WAIT_S = 2.0
CANCEL_POLL_S = 0.05  # how soon a cancelled run kills its child
_DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def package_root() -> Path:
    """The directory holding the ``hardware`` package (the child imports it from there)."""
    return Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root()), env.get("PYTHONPATH")]))
    return env


class ProcessExerciser:
    """``Exerciser`` over a child process; ``command`` is the child's argv (the CUDA child by default)."""

    name = "cuda"

    def __init__(self, *, driver_root: Path = Path("/"), command: Sequence[str] | None = None) -> None:
        self._command = (
            list(command)
            if command is not None
            else [
                sys.executable,
                "-m",
                CHILD_MODULE,
                "--driver-root",
                str(driver_root),
            ]
        )

    def run(
        self, plan: ExercisePlan, *, deadline_s: float, cancel: threading.Event | None = None
    ) -> ExerciseReport:
        started = time.monotonic()
        with tempfile.TemporaryFile() as stderr:
            child = subprocess.Popen(
                self._command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=child_env(),
                start_new_session=True,
            )
            run = _ChildRun(plan, child)
            try:
                run.send_plan()
                finished = run.read(until=started + deadline_s, cancel=cancel)
            finally:
                if child.returncode is None:
                    _kill(child)
                if child.stdout is not None:
                    child.stdout.close()
            if run.cancelled:
                results = run.done + unfinished(plan, run.done, hung=(), detail=CANCELLED)
            else:
                results = run.results(timed_out=not finished, deadline_s=deadline_s, stderr=_tail(stderr))
        return ExerciseReport(self.name, plan, tuple(results), time.monotonic() - started)


class _ChildRun:
    """What one child printed so far: results, checks begun and not finished, a fatal line."""

    def __init__(self, plan: ExercisePlan, child: subprocess.Popen[bytes]) -> None:
        self.plan, self.child = plan, child
        self.done: list[CheckResult] = []
        self.begun: set[CheckKey] = set()
        self.fatal = ""
        self.bad_lines = 0
        self.cancelled = False

    def send_plan(self) -> None:
        assert self.child.stdin is not None
        try:
            self.child.stdin.write(plan_to_json(self.plan).encode())
            self.child.stdin.close()
        except OSError as exc:  # the child died before reading: its exit says why
            log.warning("cannot send the plan to the exerciser process: %s", exc)

    def read(self, *, until: float, cancel: threading.Event | None = None) -> bool:
        """Read lines until the child closes its output (True), the deadline passes or the run is
        cancelled (False; ``cancelled`` says which): ``cancel`` is looked at every ``CANCEL_POLL_S``."""
        assert self.child.stdout is not None
        stream = self.child.stdout
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            while True:
                if cancel is not None and cancel.is_set():
                    self.cancelled = True
                    return False
                left = until - time.monotonic()
                if left <= 0:
                    return False
                if not selector.select(timeout=min(left, CANCEL_POLL_S)):
                    continue
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    self.child.wait()
                    return True
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._take(line)
                if len(buffer) > MAX_LINE_BYTES:
                    self.bad_lines, buffer = self.bad_lines + 1, b""

    def _take(self, line: bytes) -> None:
        try:
            parsed = child_line(line)
            if parsed.event == "fatal":
                self.fatal = parsed.detail[:400]
            elif parsed.event == "begin" and parsed.check is not None and parsed.gpu is not None:
                self.begun.add((parsed.check, parsed.gpu, parsed.peer))
            elif parsed.event == "result":
                result = result_from_dict(parsed.result)
                self.done.append(result)
                self.begun.discard((result.check, result.gpu, result.peer))
        except ValueError as exc:
            self.bad_lines += 1
            log.warning("exerciser process printed a line that is not one of its own: %s", exc)

    def results(self, *, timed_out: bool, deadline_s: float, stderr: str) -> list[CheckResult]:
        if self.fatal:
            rest = unfinished(self.plan, self.done, hung=(), detail=self.fatal)
            return self.done + [_as(r, ResultStatus.ERROR) for r in rest]
        if timed_out:
            detail = f"still running at the {deadline_s:g} s deadline: the exerciser process was killed"
            return self.done + unfinished(self.plan, self.done, hung=self.begun, detail=detail)
        code = self.child.returncode
        detail = f"the exerciser process ended (exit {code}) before finishing it: {stderr}"
        rest = unfinished(self.plan, self.done, hung=self.begun, detail=detail)
        return self.done + [
            _as(r, ResultStatus.ERROR) if r.status is ResultStatus.TIMEOUT else r for r in rest
        ]


def _as(result: CheckResult, status: ResultStatus) -> CheckResult:
    return CheckResult(result.check, result.gpu, status, peer=result.peer, detail=result.detail)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group; a child stuck in the kernel is reaped by a thread later."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    try:
        child.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.error(
            "exerciser process %d did not die within %.0f s of SIGKILL (stuck in the driver)",
            child.pid,
            KILL_WAIT_S,
        )
        threading.Thread(target=child.wait, name=f"reap-{child.pid}", daemon=True).start()


def _tail(stderr: IO[bytes]) -> str:
    """The child's last stderr lines (at most 400 characters)."""
    try:
        size = stderr.seek(0, os.SEEK_END)
        stderr.seek(max(0, size - 4000))
        text = stderr.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:] or "no output on stderr"
