"""The active GPU exerciser's one protocol: a plan in, one result per planned check out.

Three backends implement ``Exerciser``: the CUDA driver through ``libcuda.so.1`` in a child
process (``hardware.exerciser.process``), DCGM's diagnostic (``hardware.exerciser.dcgm``) and the
simulator (``hardware.simulated.exerciser``). Each returns within the run's deadline with every
planned check accounted for: a check still running at the deadline is ``TIMEOUT`` (the caller
fails its GPU closed), one that never started is ``NOT_RUN``. Measurements only: whether a
bandwidth or a time is good enough is judged in ``health.active`` against
``hardware.exerciser.model``'s expectations.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from hardware.backend import HardwareError


class CheckKind(StrEnum):
    MEMORY = "memory"  # address-dependent pattern written, read back, mismatches counted
    COMPUTE = "compute"  # a kernel with a known answer, timed
    HOST_TO_DEVICE = "h2d"  # pinned host -> device copies over PCIe
    DEVICE_TO_HOST = "d2h"
    PEER = "p2p"  # device -> peer device copies over the NVLink pair
    DCGM = "dcgm"  # one test of DCGM's diagnostic


class ResultStatus(StrEnum):
    DONE = "done"  # measured (good or bad is judged elsewhere)
    ERROR = "error"  # the driver refused or failed a call
    TIMEOUT = "timeout"  # still running at the deadline: hung
    NOT_RUN = "not-run"  # the run ended (deadline, earlier error) before it started
    SKIPPED = "skipped"  # not applicable here (no peer access asked for, DCGM skipped it)


CheckKey = tuple[CheckKind, str, str | None]  # kind, GPU, peer
GPU_CHECKS = (CheckKind.MEMORY, CheckKind.COMPUTE, CheckKind.HOST_TO_DEVICE, CheckKind.DEVICE_TO_HOST)
# A gang's preflight: the links a multi-node job leans on (host <-> device, and peer copies), no more
BANDWIDTH_CHECKS = (CheckKind.HOST_TO_DEVICE, CheckKind.DEVICE_TO_HOST)
CANCELLED = "the run was cancelled before it finished (a pod claimed a GPU of it)"


@dataclass(frozen=True)
class GpuTarget:
    index: int
    uuid: str
    pci_bus_id: str
    memory_mib: int


@dataclass(frozen=True)
class PeerPair:
    """Two GPUs joined by NVLink (``lanes`` links, or an NVSwitch's links per GPU)."""

    src: str  # GPU UUIDs
    dst: str
    lanes: int


@dataclass(frozen=True)
class ExercisePlan:
    """What one run does; ``level`` follows DCGM's diagnostic levels (1 quick .. 4 extended)."""

    level: int
    gpus: tuple[GpuTarget, ...]
    pairs: tuple[PeerPair, ...] = ()
    memory_fraction: float = 0.02  # of each GPU's memory the pattern covers
    compute_threads: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> threads launched
    compute_iterations: int = 1 << 16  # loop trips per thread (8 multiply-adds each)
    compute_seconds: float = 0.2  # what the iterations were sized to take on the GPU model
    copy_bytes: int = 256 << 20  # per timed host<->device or peer copy
    copy_repeats: int = 4
    peer_only: bool = False  # a pair whose ends were exercised in other batches: its copies only
    gpu_checks: tuple[CheckKind, ...] = GPU_CHECKS  # the per-GPU checks, in this order (peer copies follow)

    def threads_for(self, uuid: str) -> int:
        return self.compute_threads.get(uuid, 4096)

    def checks(self) -> tuple[CheckKey, ...]:
        """Every (kind, GPU, peer) the plan asks for, in the order a backend runs them."""
        per_gpu = tuple(
            (kind, gpu.uuid, None)
            for gpu in ([] if self.peer_only else self.gpus)
            for kind in self.gpu_checks
        )
        return per_gpu + tuple((CheckKind.PEER, p.src, p.dst) for p in self.pairs)


@dataclass(frozen=True)
class CheckResult:
    check: CheckKind
    gpu: str  # GPU UUID (the sender of a peer copy)
    status: ResultStatus
    peer: str | None = None
    seconds: float = 0.0  # the measured part (kernel or copies), not set-up
    bytes: int = 0  # tested (memory) or moved (copies)
    mismatches: int = 0
    first_bad_byte: int | None = None  # offset of the first mismatching word
    answer_ok: bool | None = None  # the compute kernel's known answer came back
    gbps: float | None = None  # copies: bytes / seconds / 1e9
    verdict: str = ""  # DCGM: pass, fail, warn, skip
    test: str = ""  # DCGM: category/test
    detail: str = ""  # the error, the hung call, DCGM's text (clipped)


@dataclass(frozen=True)
class ExerciseReport:
    backend: str  # "cuda", "dcgm", "simulated"
    plan: ExercisePlan
    results: tuple[CheckResult, ...]
    seconds: float

    def for_gpu(self, uuid: str) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if uuid in (r.gpu, r.peer))


class Exerciser(Protocol):
    """Runs a plan and returns within ``deadline_s`` (plus a second or two to report); soon after
    ``cancel`` is set it stops touching the GPUs and returns, every check it had not finished then
    ``NOT_RUN`` (detail ``CANCELLED``): a cancelled check is not a hung one."""

    name: str

    def run(
        self, plan: ExercisePlan, *, deadline_s: float, cancel: threading.Event | None = None
    ) -> ExerciseReport: ...


class ExerciserError(HardwareError):
    """The exerciser could not be started (no libcuda, no dcgmi, a bad plan)."""


def unfinished(
    plan: ExercisePlan, done: list[CheckResult], *, hung: Collection[CheckKey], detail: str
) -> list[CheckResult]:
    """Results for the planned checks with none in ``done``: those ``hung`` (started, not finished)
    time out, the rest never ran. A backend stopped at its deadline calls this to account for
    every check."""
    seen = {(r.check, r.gpu, r.peer) for r in done}
    missing = []
    for key in plan.checks():
        if key in seen:
            continue
        status = ResultStatus.TIMEOUT if key in hung else ResultStatus.NOT_RUN
        missing.append(CheckResult(key[0], key[1], status, peer=key[2], detail=detail))
    return missing
