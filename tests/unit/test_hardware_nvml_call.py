"""NvmlCaller: every NVML call has a deadline, a hung driver fails closed, NVML codes become our errors."""

from __future__ import annotations

import threading

import pytest

from hardware.backend import (
    DriverNotLoadedError,
    GpuLostError,
    HardwareError,
    HardwareTimeoutError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
)
from hardware.nvml_call import NvmlCaller
from hardware.simulated.structs import NvmlConstants, NVMLError


class TinyLib(NvmlConstants):
    """Just enough of a pynvml-shaped library: its error class, constants and two calls."""

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        self.gate.wait(30)
        self.calls += 1
        return 4

    def nvmlFail(self, code: int) -> None:  # noqa: N802
        raise NVMLError(code)


@pytest.fixture
def lib() -> TinyLib:
    return TinyLib()


@pytest.mark.parametrize(
    ("code", "kind", "hint"),
    [
        (15, GpuLostError, "needs a reset"),
        (3, NotSupportedError, ""),
        (13, NotSupportedError, "lacks this call"),
        (4, NoPermissionError, "run as root"),
        (10, HardwareTimeoutError, "Xid"),
        (9, DriverNotLoadedError, "kernel driver"),
        (12, DriverNotLoadedError, "libnvidia-ml"),
        (6, NotFoundError, ""),
        (999, HardwareError, ""),
    ],
)
def test_nvml_codes_map_to_our_types(lib: TinyLib, code: int, kind: type[HardwareError], hint: str) -> None:
    caller = NvmlCaller(lib, timeout_s=5)
    with pytest.raises(HardwareError) as exc:
        caller.invoke("nvmlFail", code, target="GPU 2")
    caller.close()
    assert type(exc.value) is kind
    assert exc.value.code == code and exc.value.call == "nvmlFail"
    expected = f"NVML call nvmlFail on GPU 2 failed: {NVMLError(code)} (NVML error {code})"
    assert str(exc.value).startswith(expected)
    assert hint in str(exc.value)


def test_errors_that_are_not_nvml_pass_through(lib: TinyLib) -> None:
    caller = NvmlCaller(lib, timeout_s=5)
    with pytest.raises(ZeroDivisionError):
        caller("divide", lambda: 1 // 0)
    assert caller.invoke("nvmlDeviceGetCount") == 4
    caller.close()


def test_a_missing_call_is_not_supported(lib: TinyLib) -> None:
    with pytest.raises(NotSupportedError, match="nvmlDeviceGetFancyThing is not available"):
        NvmlCaller(lib).invoke("nvmlDeviceGetFancyThing")


def test_hung_call_times_out_then_calls_fail_fast_until_it_returns(lib: TinyLib) -> None:
    caller = NvmlCaller(lib, timeout_s=0.1)
    lib.gate.clear()
    with pytest.raises(HardwareTimeoutError) as first:
        caller.invoke("nvmlDeviceGetCount", target="GPU 0")
    assert "nvmlDeviceGetCount on GPU 0 did not return within 0.1s" in str(first.value)
    assert caller.hung_call == "nvmlDeviceGetCount"
    with pytest.raises(HardwareTimeoutError, match="nvmlFail not attempted: nvmlDeviceGetCount has not"):
        caller.invoke("nvmlFail", 3)
    assert lib.calls == 0  # the second call never reached the library
    lib.gate.set()  # the driver wakes up: the stuck call completes and calls work again
    resumed = threading.Event()
    for _ in range(200):
        if caller.hung_call is None:
            resumed.set()
            break
        resumed.wait(0.01)
    assert resumed.is_set()
    assert caller.invoke("nvmlDeviceGetCount") == 4
    caller.close()
