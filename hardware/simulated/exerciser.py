"""The simulated exerciser: active checks answered from the node profile, with injectable faults.

A healthy simulated GPU measures what its model promises (``hardware.exerciser.model``) at a
realistic efficiency: copies at 85 % of the link's rate, the compute kernel at 90 % of the boost
clock's rate, memory at 80 % of its bandwidth. The PCIe rate comes from the simulated link as
NVML reports it (``SimHealthState``: the generation it trains to, its current width), so
``--pcie-width 8`` halves what the copies measure. ``SimExerciserState`` holds the faults only an
active check finds (``gpuweave sim inject``): a stuck memory cell (one mismatch per cell inside
the tested share of memory), an NVLink pair at half its lanes, and a hang (checks block until it
ends or the run's deadline). Bad cells and slow pairs are properties of the hardware, so they
are kept in a file beside the agent's state and survive an agent restart, as a real GPU's would.

The kernel set a plan would load is parsed and validated first (``hardware.exerciser.ptx``), so
a missing or mistyped entry fails here as the driver's JIT would fail it on a GPU.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from devicemodel.inventory import NodeInventory
from devicemodel.state_file import write_json_atomically
from hardware.exerciser.model import Expectations, GpuModel, model_for, pcie_gbps
from hardware.exerciser.protocol import (
    CANCELLED,
    CheckKey,
    CheckKind,
    CheckResult,
    ExercisePlan,
    ExerciseReport,
    ResultStatus,
    unfinished,
)
from hardware.exerciser.ptx import KERNELS, PARAMS, validate
from hardware.simulated.health_calls import SimHealthError, SimHealthState

COPY_EFFICIENCY, COMPUTE_EFFICIENCY, MEMORY_EFFICIENCY = 0.85, 0.9, 0.8
REAP_S = 5.0  # how long a cancelled run waits for its hung checks to return (they poll every 50 ms)
MAX_ACTIVITY_BYTES = 4 << 20  # the activity log stops growing here (a simulated node runs for days)


class SimExerciserState:
    """Faults of one simulated node that only an active check finds; thread-safe."""

    def __init__(
        self, gpu_count: int, *, faults_file: Path | None = None, activity_file: Path | None = None
    ) -> None:
        self.gpu_count = gpu_count
        self.faults_file = faults_file
        self.activity_file = activity_file  # one JSON line as each check begins and ends (tests read it)
        self.bad_cells: dict[int, set[int]] = {}  # GPU index -> byte offsets of stuck cells
        self.slow_pairs: dict[frozenset[int], float] = {}  # GPU pair -> share of its lanes working
        self.hang_until: dict[int | None, float] = {}  # GPU index (None: every GPU) -> monotonic time
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._load()

    def _gpu(self, index: int) -> int:
        if not 0 <= index < self.gpu_count:
            raise SimHealthError(f"no GPU {index} on the simulated node (it has {self.gpu_count})")
        return index

    def add_bad_cell(self, index: int, offset: int) -> None:
        with self._lock:
            self.bad_cells.setdefault(self._gpu(index), set()).add(offset)
        self._save()

    def slow_pair(self, index: int, peer: int, *, share: float = 0.5) -> None:
        if self._gpu(index) == self._gpu(peer):
            raise SimHealthError(f"an NVLink pair needs two GPUs, got {index} twice")
        with self._lock:
            self.slow_pairs[frozenset((index, peer))] = share
        self._save()

    def hang(self, seconds: float, index: int | None = None) -> None:
        with self._lock:
            self.hang_until[None if index is None else self._gpu(index)] = time.monotonic() + seconds

    def clear(self, index: int | None = None) -> None:
        with self._lock:
            if index is None:
                self.bad_cells.clear()
                self.slow_pairs.clear()
                self.hang_until.clear()
            else:
                self.bad_cells.pop(index, None)
                self.hang_until.pop(index, None)
                self.slow_pairs = {p: s for p, s in self.slow_pairs.items() if index not in p}
        self._save()

    def wait_out_hang(self, index: int) -> bool:
        """Block while checks on GPU ``index`` hang; False when the run was cancelled meanwhile."""
        while True:
            with self._lock:
                until = max(self.hang_until.get(None, 0.0), self.hang_until.get(index, 0.0))
            left = until - time.monotonic()
            if left <= 0:
                return True
            if self.cancel.wait(min(left, 0.05)):
                return False

    def note(self, index: int, check: str, *, begun: bool) -> None:
        """Append when a check begins or ends on GPU ``index`` (``time.monotonic``, the system's one
        monotonic clock, so another process's events can be put beside it) to ``activity_file``."""
        if self.activity_file is None:
            return
        with contextlib.suppress(OSError):
            if self.activity_file.stat().st_size > MAX_ACTIVITY_BYTES:
                return
        line = json.dumps({"gpu": index, "check": check, "begun": begun, "at": time.monotonic()})
        with self._lock, self.activity_file.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def _save(self) -> None:
        if self.faults_file is None:
            return
        with self._lock:
            data = {
                "badCells": {str(i): sorted(cells) for i, cells in self.bad_cells.items() if cells},
                "slowPairs": [[*sorted(p), share] for p, share in self.slow_pairs.items()],
            }
        write_json_atomically(self.faults_file, data)

    def _load(self) -> None:
        if self.faults_file is None or not self.faults_file.exists():
            return
        data = json.loads(self.faults_file.read_text(encoding="utf-8"))
        self.bad_cells = {int(i): set(map(int, cells)) for i, cells in data.get("badCells", {}).items()}
        self.slow_pairs = {frozenset((int(a), int(b))): float(s) for a, b, s in data.get("slowPairs", [])}


class SimulatedExerciser:
    """``Exerciser`` over a simulated node; each GPU's checks on their own thread, as the child's."""

    name = "simulated"

    def __init__(self, inventory: NodeInventory, health: SimHealthState, state: SimExerciserState) -> None:
        self._inventory = inventory
        self._health = health
        self.state = state
        self._index = {g.uuid: g.index for g in inventory.gpus}
        self._models = {g.uuid: model_for(g.product, g.architecture) for g in inventory.gpus}

    def run(
        self, plan: ExercisePlan, *, deadline_s: float, cancel: threading.Event | None = None
    ) -> ExerciseReport:
        started = time.monotonic()
        validate(KERNELS, PARAMS)
        done: list[CheckResult] = []
        begun: set[CheckKey] = set()
        lock = threading.Lock()
        stop = cancel or threading.Event()
        killed = threading.Event()  # the deadline passed: nothing more begins
        self.state.cancel.clear()

        def record(key: CheckKey, measure: Callable[[], CheckResult]) -> None:
            if stop.is_set() or killed.is_set():
                return
            with lock:
                begun.add(key)
            index = self._index[key[1]]
            self.state.note(index, key[0].value, begun=True)
            result = measure() if self.state.wait_out_hang(index) else None
            self.state.note(index, key[0].value, begun=False)
            if result is not None and not stop.is_set():
                with lock:
                    done.append(result)
                    begun.discard(key)

        def gpu_checks(uuid: str) -> None:
            for kind in () if plan.peer_only else plan.gpu_checks:
                record((kind, uuid, None), partial(self._measure, plan, kind, uuid))

        def peer_checks() -> None:  # one pair at a time, after every GPU's own checks
            for pair in plan.pairs:
                key = (CheckKind.PEER, pair.src, pair.dst)
                record(key, partial(self._peer, plan, pair.src, pair.dst, pair.lanes))

        threads = [threading.Thread(target=gpu_checks, args=(g.uuid,), daemon=True) for g in plan.gpus]
        finished = _run_all(threads, until=started + deadline_s, cancel=stop)
        if finished and not stop.is_set():
            peer = threading.Thread(target=peer_checks, daemon=True)
            threads.append(peer)
            finished = _run_all([peer], until=started + deadline_s, cancel=stop)
        if not finished:
            # Like the real exerciser's child killed and reaped: the hung checks return (their
            # results are not taken) and the run ends only once none of them still runs.
            killed.set()
            self.state.cancel.set()
            for thread in threads:
                thread.join(REAP_S)
        with lock:
            if stop.is_set():
                results = list(done) + unfinished(plan, list(done), hung=(), detail=CANCELLED)
            else:
                detail = f"still running at the {deadline_s:g} s deadline"
                results = list(done) + unfinished(plan, list(done), hung=set(begun), detail=detail)
        return ExerciseReport(self.name, plan, tuple(results), time.monotonic() - started)

    def _lost(self, uuid: str) -> bool:
        return self._health.gpus[self._index[uuid]].lost

    def _measure(self, plan: ExercisePlan, kind: CheckKind, uuid: str) -> CheckResult:
        if self._lost(uuid):
            return CheckResult(
                kind, uuid, ResultStatus.ERROR, detail="cuCtxCreate failed: CUDA_ERROR_NO_DEVICE"
            )
        model = self._models[uuid]
        if kind is CheckKind.MEMORY:
            return self._memory(plan, uuid, model)
        if kind is CheckKind.COMPUTE:
            seconds = Expectations({uuid: model}, {}, {}).compute_seconds(
                uuid, threads=plan.threads_for(uuid), iterations=plan.compute_iterations
            )
            return CheckResult(
                kind, uuid, ResultStatus.DONE, seconds=seconds / COMPUTE_EFFICIENCY, answer_ok=True
            )
        link = self._health.gpus[self._index[uuid]]
        rate = (pcie_gbps(link.pcie_generation[1], link.pcie_width[0]) or 0.0) * COPY_EFFICIENCY
        return _copies(kind, uuid, None, plan, rate)

    def _memory(self, plan: ExercisePlan, uuid: str, model: GpuModel) -> CheckResult:
        tested = int(
            plan.memory_fraction * next(g.memory_mib for g in plan.gpus if g.uuid == uuid) * (1 << 20)
        )
        tested = tested // 4 * 4
        cells = sorted(c // 4 * 4 for c in self.state.bad_cells.get(self._index[uuid], set()) if c < tested)
        seconds = 4 * tested / (model.memory_gbps * 1e9 * MEMORY_EFFICIENCY)
        return CheckResult(
            CheckKind.MEMORY,
            uuid,
            ResultStatus.DONE,
            seconds=seconds,
            bytes=tested,
            mismatches=len(cells),
            first_bad_byte=cells[0] if cells else None,
        )

    def _peer(self, plan: ExercisePlan, src: str, dst: str, lanes: int) -> CheckResult:
        if self._lost(src) or self._lost(dst):
            return CheckResult(
                CheckKind.PEER,
                src,
                ResultStatus.ERROR,
                peer=dst,
                detail="cuCtxCreate failed: CUDA_ERROR_NO_DEVICE",
            )
        share = self.state.slow_pairs.get(frozenset((self._index[src], self._index[dst])), 1.0)
        rate = lanes * self._models[src].nvlink_lane_gbps * COPY_EFFICIENCY * share
        return _copies(CheckKind.PEER, src, dst, plan, rate)


def _copies(kind: CheckKind, uuid: str, peer: str | None, plan: ExercisePlan, gbps: float) -> CheckResult:
    moved = plan.copy_bytes * plan.copy_repeats
    if gbps <= 0:
        return CheckResult(kind, uuid, ResultStatus.ERROR, peer=peer, detail="no link to copy over")
    return CheckResult(
        kind, uuid, ResultStatus.DONE, peer=peer, seconds=moved / (gbps * 1e9), bytes=moved, gbps=gbps
    )


def _run_all(threads: list[threading.Thread], *, until: float, cancel: threading.Event) -> bool:
    """Start the threads and wait for them until ``until`` or ``cancel``; True when all ended."""
    for thread in threads:
        thread.start()
    alive = [t for t in threads if t.is_alive()]
    while alive and time.monotonic() < until and not cancel.is_set():
        alive[0].join(min(max(until - time.monotonic(), 0.0), 0.02))
        alive = [t for t in alive if t.is_alive()]
    return not alive
