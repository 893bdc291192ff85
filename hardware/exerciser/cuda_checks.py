"""The checks themselves on one GPU (or one NVLink pair) through the CUDA driver API.

A ``GpuSession`` is one context on one GPU, found by its PCI bus id and confirmed by its UUID (a
GPU the driver numbers differently, or a different GPU at that address, is refused), with the
kernels compiled by the driver's JIT. Each check returns a ``CheckResult`` with what it measured;
timings come from CUDA events on the context's default stream. Nothing here changes a device
setting: contexts, allocations, kernels, copies and peer access (a property of the two contexts)
end with the process.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

from hardware.exerciser.cuda import (
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CudaDriver,
    CudaError,
)
from hardware.exerciser.protocol import (
    CheckKind,
    CheckResult,
    ExercisePlan,
    GpuTarget,
    PeerPair,
    ResultStatus,
)
from hardware.exerciser.ptx import (
    CHECK,
    COMPUTE,
    FILL,
    KERNELS,
    LCG_A,
    LCG_C,
    MASK32,
    PARAMS,
    compute_answer,
    validate,
)

BLOCK = 256
BLOCKS_PER_SM = 8  # grid-stride kernels: enough blocks to fill every SM
MEMORY_RESERVE = 512 << 20  # left free for the driver and the other checks' buffers
SEED = 0x5EED1234


class GpuSession:
    """One context on one GPU with the exerciser's kernels loaded."""

    def __init__(self, cuda: CudaDriver, target: GpuTarget) -> None:
        self.cuda, self.target = cuda, target
        validate(KERNELS, PARAMS)
        self.device = cuda.device(target.pci_bus_id)
        found = cuda.uuid(self.device)
        if found.lower() != target.uuid.lower():
            raise CudaError(
                f"the GPU at {target.pci_bus_id} is {found}, not {target.uuid}: refusing to exercise it"
            )
        self.sms = cuda.attribute(self.device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        context = ctypes.c_void_p()
        cuda.call("cuCtxCreate", ctypes.byref(context), 0, self.device)
        self.context = int(context.value or 0)
        module = cuda.load_module(KERNELS)
        self.kernels = {name: cuda.function(module, name) for name in (FILL, CHECK, COMPUTE)}

    def current(self) -> None:
        self.cuda.call("cuCtxSetCurrent", self.context)

    def close(self) -> None:
        self.cuda.call("cuCtxDestroy", self.context)

    @contextmanager
    def device_buffer(self, size: int) -> Iterator[int]:
        """Memory on this GPU (allocated and freed with this context current)."""
        self.current()
        pointer = ctypes.c_uint64()
        self.cuda.call("cuMemAlloc", ctypes.byref(pointer), size)
        try:
            yield pointer.value
        finally:
            self.current()
            self.cuda.call("cuMemFree", pointer.value)

    @contextmanager
    def host_buffer(self, size: int) -> Iterator[int]:
        """Pinned host memory: copies run at the link's rate, not through a bounce buffer."""
        self.current()
        pointer = ctypes.c_void_p()
        self.cuda.call("cuMemAllocHost", ctypes.byref(pointer), size)
        try:
            yield int(pointer.value or 0)
        finally:
            self.current()
            self.cuda.call("cuMemFreeHost", pointer.value)

    @contextmanager
    def timed(self) -> Iterator[list[float]]:
        """Seconds between two events on the default stream around the block (appended on exit)."""
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self.cuda.call("cuEventCreate", ctypes.byref(start), 0)
        self.cuda.call("cuEventCreate", ctypes.byref(stop), 0)
        box: list[float] = []
        try:
            self.cuda.call("cuEventRecord", start, None)
            yield box
            self.cuda.call("cuEventRecord", stop, None)
            self.cuda.call("cuEventSynchronize", stop)
            elapsed = ctypes.c_float()
            self.cuda.call("cuEventElapsedTime", ctypes.byref(elapsed), start, stop)
            box.append(elapsed.value / 1000)
        finally:
            self.cuda.call("cuEventDestroy", start)
            self.cuda.call("cuEventDestroy", stop)

    def read_words(self, pointer: int, count: int, width: int = 8) -> list[int]:
        raw = ctypes.create_string_buffer(count * width)
        self.cuda.call("cuMemcpyDtoH", raw, pointer, count * width)
        return [int.from_bytes(raw.raw[i : i + width], "little") for i in range(0, count * width, width)]


def memory_check(session: GpuSession, plan: ExercisePlan) -> CheckResult:
    """The pattern and its complement written over the plan's share of memory and read back."""
    session.current()
    size = _memory_bytes(session, plan.memory_fraction)
    with _allocated(session, size) as (base, size), session.device_buffer(16) as result:
        words = size // 4
        mismatches, first = 0, None
        grid = session.sms * BLOCKS_PER_SM
        with session.timed() as seconds:
            for seed in (SEED, ~SEED & MASK32):
                session.cuda.call("cuMemsetD32", result, 0, 2)
                session.cuda.call("cuMemsetD32", result + 8, MASK32, 2)
                args = [ctypes.c_uint64(base), ctypes.c_uint64(words), ctypes.c_uint32(seed)]
                session.cuda.launch(session.kernels[FILL], grid=grid, block=BLOCK, args=args)
                check = [*args, ctypes.c_uint64(result)]
                session.cuda.launch(session.kernels[CHECK], grid=grid, block=BLOCK, args=check)
                count, lowest = session.read_words(result, 2)
                mismatches += count
                if count:
                    first = min(lowest, first if first is not None else lowest)
    return CheckResult(
        CheckKind.MEMORY,
        session.target.uuid,
        ResultStatus.DONE,
        seconds=seconds[0],
        bytes=words * 4,
        mismatches=mismatches,
        first_bad_byte=None if first is None else first * 4,
    )


def _memory_bytes(session: GpuSession, fraction: float) -> int:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    session.cuda.call("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total))
    wanted = int(total.value * fraction)
    return max(min(wanted, free.value - MEMORY_RESERVE), 1 << 20) // 4 * 4


@contextmanager
def _allocated(session: GpuSession, size: int) -> Iterator[tuple[int, int]]:
    """A device buffer of ``size`` bytes, or half that (three times) when memory is fragmented."""
    pointer = ctypes.c_uint64()
    for _ in range(4):
        try:
            session.cuda.call("cuMemAlloc", ctypes.byref(pointer), size)
            break
        except CudaError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY or size <= 1 << 20:
                raise
            size = size // 2 // 4 * 4
    else:
        raise CudaError(f"cannot allocate even {size} bytes on {session.target.uuid}")
    try:
        yield pointer.value, size
    finally:
        session.current()
        session.cuda.call("cuMemFree", pointer.value)


def compute_check(session: GpuSession, plan: ExercisePlan) -> CheckResult:
    """The multiply-add kernel over the plan's threads; its sum must equal the closed form."""
    session.current()
    threads = plan.threads_for(session.target.uuid) // BLOCK * BLOCK
    iterations = plan.compute_iterations
    with session.device_buffer(8) as out:
        session.cuda.call("cuMemsetD32", out, 0, 2)
        args = [
            ctypes.c_uint64(out),
            ctypes.c_uint32(iterations),
            ctypes.c_uint32(LCG_A),
            ctypes.c_uint32(LCG_C),
        ]
        with session.timed() as seconds:
            session.cuda.launch(session.kernels[COMPUTE], grid=threads // BLOCK, block=BLOCK, args=args)
        (value,) = session.read_words(out, 1, width=4)
    expected = compute_answer(threads, iterations)
    return CheckResult(
        CheckKind.COMPUTE,
        session.target.uuid,
        ResultStatus.DONE,
        seconds=seconds[0],
        answer_ok=value == expected,
        detail="" if value == expected else f"sum {value:#x}, expected {expected:#x}",
    )


def copy_check(session: GpuSession, plan: ExercisePlan, kind: CheckKind) -> CheckResult:
    """Timed pinned copies host -> device (``HOST_TO_DEVICE``) or back, after one warm-up copy."""
    session.current()
    size = plan.copy_bytes
    name = "cuMemcpyHtoD" if kind is CheckKind.HOST_TO_DEVICE else "cuMemcpyDtoH"
    with session.host_buffer(size) as host, session.device_buffer(size) as device:
        pair = (device, host) if kind is CheckKind.HOST_TO_DEVICE else (host, device)
        session.cuda.call(name, *pair, size)
        with session.timed() as seconds:
            for _ in range(plan.copy_repeats):
                session.cuda.call(name, *pair, size)
    moved = size * plan.copy_repeats
    return CheckResult(
        kind,
        session.target.uuid,
        ResultStatus.DONE,
        seconds=seconds[0],
        bytes=moved,
        gbps=moved / seconds[0] / 1e9 if seconds[0] > 0 else None,
    )


def peer_check(src: GpuSession, dst: GpuSession, plan: ExercisePlan, pair: PeerPair) -> CheckResult:
    """Timed copies from ``src`` to ``dst`` with peer access on, after one warm-up copy."""
    cuda = src.cuda
    allowed = ctypes.c_int()
    cuda.call("cuDeviceCanAccessPeer", ctypes.byref(allowed), src.device, dst.device)
    if not allowed.value:
        return CheckResult(
            CheckKind.PEER,
            pair.src,
            ResultStatus.ERROR,
            peer=pair.dst,
            detail="the driver reports no peer access between the pair: the NVLink path is not usable",
        )
    for here, there in ((src, dst), (dst, src)):
        here.current()
        try:
            cuda.call("cuCtxEnablePeerAccess", there.context, 0)
        except CudaError as exc:
            if exc.code != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                raise
    size = plan.copy_bytes
    with dst.device_buffer(size) as target, src.device_buffer(size) as source:
        src.current()
        cuda.call("cuMemcpyPeer", target, dst.context, source, src.context, size)
        with src.timed() as seconds:
            for _ in range(plan.copy_repeats):
                cuda.call("cuMemcpyPeerAsync", target, dst.context, source, src.context, size, None)
    moved = size * plan.copy_repeats
    return CheckResult(
        CheckKind.PEER,
        pair.src,
        ResultStatus.DONE,
        peer=pair.dst,
        seconds=seconds[0],
        bytes=moved,
        gbps=moved / seconds[0] / 1e9 if seconds[0] > 0 else None,
    )
