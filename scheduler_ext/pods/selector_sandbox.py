"""Selector evaluation in worker processes, under a wall-clock deadline.

A CEL program cannot be interrupted and holds the GIL while it runs: evaluated in a request
thread, one expensive selector would stall every other request and ``/healthz`` with it. Here the
request thread hands the expression to a worker process (``selector_worker``) and waits on a pipe,
which releases the GIL; a worker that misses the deadline is killed and replaced on next use.

Workers start on first use (0.7-1.2 s each on a 2-core machine at load 10), so an extender that
never sees a looping selector never starts one. At most ``workers`` evaluations run at once; a
request that finds them all busy for ``queue_wait_s`` gets ``SandboxBusyError`` (not the
selector's fault: not cached as its verdict).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from devicemodel.errors import GpuweaveError

DEADLINE_S = 0.25  # Kubernetes sizes its 1,000,000 cost limit at "roughly 0.1 second"; 2.5x slack
QUEUE_WAIT_S = 3.0  # under kube-scheduler's 5 s extender timeout; 12 deadlines of queue for 2 workers
START_TIMEOUT_S = 30.0  # a worker imports the CEL library: 0.7-1.2 s measured at load 10 on 2 cores
WORKERS = 2
_MAX_ANSWER_BYTES = 4096


class SandboxError(GpuweaveError):
    """The sandbox could not produce a verdict."""


class EvaluationTimeoutError(SandboxError):
    """The selector ran past the deadline; its worker was killed."""


class WorkerDiedError(SandboxError):
    """The worker ended while evaluating (a crash in the CEL library, or ``close``)."""


class SandboxBusyError(SandboxError):
    """Every worker stayed busy for the whole queue wait."""


class _Worker:
    """One ``python -m scheduler_ext.pods.selector_worker`` process and its pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scheduler_ext.pods.selector_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        try:
            ready = self.read_answer(deadline_s=START_TIMEOUT_S)
        except SandboxError:
            self.stop()
            raise
        if ready.get("ready") is not True:
            self.stop()
            raise SandboxError(f"selector worker {self.process.pid} started with {ready!r}")

    def ask(self, line: bytes, *, deadline_s: float) -> dict[str, Any]:
        """Send one request line, read one answer line; raise on deadline, EOF or garbage."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line)
        except OSError as exc:
            raise SandboxError(f"selector worker {self.process.pid} is gone: {exc}") from None
        return self.read_answer(deadline_s=deadline_s)

    def read_answer(self, *, deadline_s: float) -> dict[str, Any]:
        """One JSON line from the worker within ``deadline_s``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        answer = b""
        until = time.monotonic() + deadline_s
        while not answer.endswith(b"\n"):
            left = until - time.monotonic()
            try:
                ready = left > 0 and select.select([fd], [], [], left)[0]
                chunk = os.read(fd, _MAX_ANSWER_BYTES) if ready else None
            except OSError as exc:
                raise SandboxError(f"selector worker {self.process.pid} is gone: {exc}") from None
            if chunk is None:
                raise EvaluationTimeoutError(f"selector ran past the {deadline_s:g} s deadline")
            if not chunk or len(answer) > _MAX_ANSWER_BYTES:
                raise WorkerDiedError(f"selector worker {self.process.pid} ended without an answer")
            answer += chunk
        try:
            decoded = json.loads(answer)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise SandboxError(f"selector worker {self.process.pid} answered {answer[:80]!r}")
        return decoded

    def stop(self) -> None:
        _stop(self.process)

    def kill(self) -> None:
        """End the process but leave its pipes to the thread reading them (it sees EOF)."""
        if self.process.poll() is None:
            self.process.kill()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in list(workers):
        worker.stop()
    workers.clear()


class SelectorSandbox:
    """A small pool of selector workers; ``evaluate`` is thread-safe."""

    def __init__(
        self, *, deadline_s: float = DEADLINE_S, workers: int = WORKERS, queue_wait_s: float = QUEUE_WAIT_S
    ) -> None:
        self.deadline_s = deadline_s
        self.queue_wait_s = queue_wait_s
        self._slots = threading.BoundedSemaphore(workers)
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop_all, self._all)
        self.started = 0  # worker processes started so far (for tests and metrics)
        self.closed = False  # ``close`` ran and no worker started since

    def evaluate(self, expression: str, device: dict[str, Any]) -> bool | str:
        """True/False, or the selector's error text; raises ``SandboxError`` on deadline or busy."""
        if not self._slots.acquire(timeout=self.queue_wait_s):
            raise SandboxBusyError(
                f"all selector workers stayed busy for {self.queue_wait_s:g} s; retry the pod later"
            )
        try:
            worker = self._take()
            try:
                answer = worker.ask(self._line(expression, device), deadline_s=self.deadline_s)
            except SandboxError:
                self._discard(worker)
                raise
            self._give_back(worker)
        finally:
            self._slots.release()
        verdict = answer.get("verdict")
        return verdict if isinstance(verdict, bool) else str(answer.get("error", "no verdict"))

    def busy(self) -> int:
        """Evaluations running now (for tests and metrics)."""
        with self._lock:
            return len(self._all) - len(self._idle)

    def close(self) -> None:
        """Stop every worker; one in use is killed and its caller gets ``SandboxError`` (the pool
        starts new workers if used again)."""
        with self._lock:
            self.closed = True
            idle, self._idle[:] = list(self._idle), []
            busy = [w for w in self._all if w not in idle]
            self._all[:] = busy
        for worker in idle:
            worker.stop()
        for worker in busy:
            worker.kill()

    @staticmethod
    def _line(expression: str, device: dict[str, Any]) -> bytes:
        return (json.dumps({"expression": expression, "device": device}) + "\n").encode()

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        worker = _Worker()  # starts outside the lock: other callers keep using idle workers
        with self._lock:
            self._all.append(worker)
            self.started += 1
            self.closed = False
        return worker

    def _give_back(self, worker: _Worker) -> None:
        if worker.process.poll() is not None:  # killed by ``close`` just after it answered
            self._discard(worker)
            return
        with self._lock:
            self._idle.append(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)
        worker.stop()
