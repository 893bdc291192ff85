"""The exerciser's child process: ``python -m hardware.exerciser.child [--driver-root DIR]``.

It reads one plan (JSON) from stdin, runs it through the CUDA driver and prints one JSON line as
each check begins and one with its result, so the parent (``hardware.exerciser.process``) knows
what finished and which check was running when it killed a hung run. Each GPU's checks run on
their own thread (ctypes releases the GIL in driver calls), its host<->device copies one GPU at
a time, then the NVLink pairs one at a time, so no two copies share a link. A failure of one
GPU's set-up or check is that check's ``error`` result; the others go on. Without a usable
driver the one line is ``fatal``. Nothing else is printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hardware.exerciser.cuda import CudaDriver, load_library
from hardware.exerciser.cuda_checks import GpuSession, compute_check, copy_check, memory_check, peer_check
from hardware.exerciser.protocol import (
    CheckKind,
    CheckResult,
    ExercisePlan,
    GpuTarget,
    ResultStatus,
)
from hardware.exerciser.wire import plan_from_json, result_to_dict


class Reporter:
    """Writes the child's lines; one lock, so lines from GPU threads never interleave."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def line(self, **fields: object) -> None:
        with self._lock:
            self._stream.write(json.dumps(fields) + "\n")
            self._stream.flush()

    def begin(self, kind: CheckKind, gpu: str, peer: str | None = None) -> None:
        self.line(event="begin", check=kind.value, gpu=gpu, peer=peer)

    def result(self, result: CheckResult) -> None:
        self.line(event="result", result=result_to_dict(result))


def _error(kind: CheckKind, gpu: str, exc: BaseException, peer: str | None = None) -> CheckResult:
    return CheckResult(kind, gpu, ResultStatus.ERROR, peer=peer, detail=f"{type(exc).__name__}: {exc}"[:400])


def run_gpu(
    cuda: CudaDriver, plan: ExercisePlan, target: GpuTarget, report: Reporter, *, copies: threading.Lock
) -> GpuSession | None:
    """Open the GPU's session and run its checks; the session for the peer phase, None if it failed.

    Memory and compute run beside the other GPUs'; host<->device copies take ``copies`` first, one
    GPU at a time: GPUs behind one PCIe switch share its uplink (two copying at once would each
    measure half), and one pinned buffer at a time bounds the process's host memory. A check is
    begun (and can time out) only once it holds the lock, so a GPU waiting behind a hung copy is
    not-run, not hung."""
    try:
        session = GpuSession(cuda, target)
    except Exception as exc:
        for kind in () if plan.peer_only else plan.gpu_checks:
            report.result(_error(kind, target.uuid, exc))
        return None
    if plan.peer_only:
        return session
    checks: dict[CheckKind, Callable[[], CheckResult]] = {
        CheckKind.MEMORY: lambda: memory_check(session, plan),
        CheckKind.COMPUTE: lambda: compute_check(session, plan),
        CheckKind.HOST_TO_DEVICE: lambda: copy_check(session, plan, CheckKind.HOST_TO_DEVICE),
        CheckKind.DEVICE_TO_HOST: lambda: copy_check(session, plan, CheckKind.DEVICE_TO_HOST),
    }
    for kind, check in ((k, checks[k]) for k in plan.gpu_checks if k in checks):
        if kind in (CheckKind.HOST_TO_DEVICE, CheckKind.DEVICE_TO_HOST):
            with copies:
                _one_check(report, kind, target.uuid, check)
        else:
            _one_check(report, kind, target.uuid, check)
    return session


def _one_check(report: Reporter, kind: CheckKind, gpu: str, check: Callable[[], CheckResult]) -> None:
    report.begin(kind, gpu)
    try:
        report.result(check())
    except Exception as exc:
        report.result(_error(kind, gpu, exc))


def run_plan(cuda: CudaDriver, plan: ExercisePlan, report: Reporter) -> None:
    sessions: dict[str, GpuSession | None] = {}
    copies = threading.Lock()

    def one(target: GpuTarget) -> None:
        sessions[target.uuid] = run_gpu(cuda, plan, target, report, copies=copies)

    threads = [threading.Thread(target=one, args=(t,), name=f"gpu-{t.index}") for t in plan.gpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for pair in plan.pairs:
        src, dst = sessions.get(pair.src), sessions.get(pair.dst)
        report.begin(CheckKind.PEER, pair.src, pair.dst)
        if src is None or dst is None:
            failed = RuntimeError("a GPU of the pair could not be opened (see its checks)")
            report.result(_error(CheckKind.PEER, pair.src, failed, pair.dst))
            continue
        try:
            report.result(peer_check(src, dst, plan, pair))
        except Exception as exc:
            report.result(_error(CheckKind.PEER, pair.src, exc, pair.dst))
    for session in sessions.values():
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # the process exits next: the driver frees what is left
                print(f"cannot destroy the context of {session.target.uuid}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hardware.exerciser.child")
    parser.add_argument("--driver-root", type=Path, default=Path("/"))
    args = parser.parse_args(argv)
    report = Reporter(sys.stdout)
    try:
        plan = plan_from_json(sys.stdin.read(1 << 20))
        cuda = CudaDriver(load_library(args.driver_root))
        cuda.call("cuInit", 0)
    except Exception as exc:
        report.line(event="fatal", detail=f"{type(exc).__name__}: {exc}"[:400])
        return 3
    run_plan(cuda, plan, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
