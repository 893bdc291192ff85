"""Every NVML call with a deadline, and NVML's error codes mapped to gpuweave's error types.

NVML calls can hang for minutes when a GPU falls off the bus or the driver wedges. Calls run on
one worker thread; the caller waits up to the deadline and then raises ``HardwareTimeoutError``.
While that call is still stuck, further calls fail at once instead of queueing behind it (the
node agent must keep serving with what it knows). When the stuck call finally returns, calls
work again. The worker is a daemon thread so a wedged driver never blocks process exit.

The library object is injected (``pynvml`` or the simulated library); error classes and codes
are read from it, so this module never imports pynvml.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hardware.backend import (
    DriverNotLoadedError,
    GpuLostError,
    HardwareError,
    HardwareTimeoutError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
)

T = TypeVar("T")
LOG = logging.getLogger(__name__)
DEFAULT_CALL_TIMEOUT_S = 10.0

# NVML return code name -> (our error type, next step for the operator).
_ERROR_TYPES: dict[str, tuple[type[HardwareError], str]] = {
    "NVML_ERROR_GPU_IS_LOST": (GpuLostError, "the GPU fell off the bus; it needs a reset or a reboot"),
    "NVML_ERROR_NOT_SUPPORTED": (NotSupportedError, ""),
    "NVML_ERROR_FUNCTION_NOT_FOUND": (NotSupportedError, "the installed driver lacks this call"),
    "NVML_ERROR_NO_PERMISSION": (NoPermissionError, "run as root or mount the /dev/nvidia* device nodes"),
    "NVML_ERROR_TIMEOUT": (HardwareTimeoutError, "the driver timed out; check dmesg for Xid errors"),
    "NVML_ERROR_DRIVER_NOT_LOADED": (DriverNotLoadedError, "load the NVIDIA kernel driver"),
    "NVML_ERROR_LIBRARY_NOT_FOUND": (DriverNotLoadedError, "install the NVIDIA driver (libnvidia-ml.so.1)"),
    "NVML_ERROR_NOT_FOUND": (NotFoundError, ""),
}


@dataclass
class _Job:
    name: str
    thunk: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    started: float = 0.0


class NvmlCaller:
    """Runs NVML calls on a worker thread with a per-call deadline; maps NVML errors.

    Use as ``caller(name, thunk)`` (the shape ``hardware.mig_ops`` takes) or ``caller.invoke(name,
    *args)`` which calls ``lib.<name>(*args)``.
    """

    def __init__(self, lib: Any, *, timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        self.lib = lib
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stuck: _Job | None = None
        self._worker: threading.Thread | None = None
        self._codes = self._code_table(lib)

    def invoke(self, name: str, *args: Any, target: str = "") -> Any:
        """``lib.<name>(*args)`` under the deadline; ``target`` names the device in errors."""
        function = getattr(self.lib, name, None)
        if function is None:
            raise NotSupportedError(f"NVML call {name} is not available in this pynvml/driver", call=name)
        return self(name, lambda: function(*args), target=target)

    def __call__(self, name: str, thunk: Callable[[], T], *, target: str = "") -> T:
        job = _Job(name, thunk)
        with self._lock:
            stuck = self._stuck
            if stuck is None:
                self._ensure_worker()
                self._jobs.put(job)
        if stuck is not None:
            hung_for = time.monotonic() - stuck.started
            raise HardwareTimeoutError(
                f"NVML call {name} not attempted: {stuck.name} has not returned for {hung_for:.1f}s "
                f"(deadline {self.timeout_s:g}s); the driver is treated as hung",
                call=name,
            )
        if not job.done.wait(self.timeout_s):
            with self._lock:
                if not job.done.is_set():
                    self._stuck = job
            if not job.done.is_set():
                where = f" on {target}" if target else ""
                raise HardwareTimeoutError(
                    f"NVML call {name}{where} did not return within {self.timeout_s:g}s; treating the driver "
                    "as hung (further NVML calls fail fast until it returns)",
                    call=name,
                )
        if job.error is not None:
            raise self._translate(job.error, name=name, target=target)
        return job.result  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the worker (a stuck worker is left to finish on its own: it is a daemon)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            if self._stuck is None:
                worker.join(timeout=self.timeout_s)

    @property
    def hung_call(self) -> str | None:
        """Name of the call the worker is stuck in, if any."""
        stuck = self._stuck
        return stuck.name if stuck is not None else None

    # -- internals -----------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="nvml-call", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.started = time.monotonic()
            try:
                job.result = job.thunk()
            except BaseException as exc:  # handed to the waiting caller
                job.error = exc
            with self._lock:
                job.done.set()
                if self._stuck is job:
                    LOG.warning("NVML call %s returned after its deadline; NVML calls resume", job.name)
                    self._stuck = None

    def _translate(self, error: BaseException, *, name: str, target: str) -> BaseException:
        nvml_error = getattr(self.lib, "NVMLError", None)
        if nvml_error is None or not isinstance(error, nvml_error):
            return error
        code = int(getattr(error, "value", -1))
        kind, hint = self._codes.get(code, (HardwareError, ""))
        where = f" on {target}" if target else ""
        text = f"NVML call {name}{where} failed: {error} (NVML error {code})"
        return kind(f"{text}; {hint}" if hint else text, call=name, code=code)

    @staticmethod
    def _code_table(lib: Any) -> dict[int, tuple[type[HardwareError], str]]:
        table: dict[int, tuple[type[HardwareError], str]] = {}
        for constant, entry in _ERROR_TYPES.items():
            code = getattr(lib, constant, None)
            if isinstance(code, int):
                table[code] = entry
        return table


def is_code(error: HardwareError, lib: Any, constant: str) -> bool:
    """Whether ``error`` carries the NVML return code named ``constant`` in ``lib``."""
    return error.code is not None and error.code == getattr(lib, constant, object())
