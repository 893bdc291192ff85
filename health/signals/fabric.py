"""The NVSwitch fabric as a readiness gate and a health signal.

Until the fabric is trained, every CUDA context on an HGX board's GPUs fails (error 802), while
NVML and the device files look fine; offering the GPUs then only turns pods into crash loops. So
the node agent checks the fabric once before its first device list is served and then every
``interval_s``: each GPU whose fabric is not completed is withheld (reported Unhealthy with the
reason and the next step) under its own gate, and released as soon as the fabric completes. A read
that fails (a hung driver) keeps the gate as it was; the health monitor handles the hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from devicemodel.inventory import NodeInventory
from hardware.backend import HardwareError
from hardware.fabric import FabricReport

log = logging.getLogger(__name__)
FABRIC_GATE = "nvswitch-fabric"
DEFAULT_INTERVAL_S = 10.0


class GateSink(Protocol):
    """Where the gate goes (the node agent's ``set_gate``)."""

    def set_gate(self, name: str, reasons: Mapping[str, str]) -> None: ...


def gate_reasons(report: FabricReport) -> dict[str, str]:
    """GPU UUID -> reason for every GPU whose fabric is not completed."""
    return {
        g.uuid: f"NVSwitch fabric {g.state}: {g.detail}" for g in report.gpus if not g.ready
    }


class FabricGate:
    """Checks the fabric through ``read`` and withholds the GPUs it is not ready on."""

    def __init__(
        self,
        read: Callable[[NodeInventory], FabricReport],
        sink: GateSink,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self._read = read
        self._sink = sink
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[str, str] | None = None

    def check(self, inventory: NodeInventory) -> FabricReport | None:
        """One check: the report, or None when the fabric could not be read (gate unchanged)."""
        try:
            report = self._read(inventory)
        except HardwareError as exc:
            log.warning("cannot read the NVSwitch fabric state (%s); keeping the GPUs as they are", exc)
            return None
        reasons = gate_reasons(report)
        if reasons != self._last:
            self._log_change(report, reasons)
        self._last = reasons
        self._sink.set_gate(FABRIC_GATE, reasons)
        return report

    def start(self, inventory: Callable[[], NodeInventory]) -> None:
        """Check every ``interval_s`` on a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._loop, args=(inventory,), name="fabric-gate", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self, inventory: Callable[[], NodeInventory]) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check(inventory())
            except Exception:  # a bug here must not end the gate: the next round tries again
                log.exception("NVSwitch fabric check failed")

    @staticmethod
    def _log_change(report: FabricReport, reasons: Mapping[str, str]) -> None:
        if reasons:
            log.error("%s; withholding %d GPU(s) until it completes", report.summary(), len(reasons))
        elif report.gpus:
            log.warning("%s; offering its GPUs", report.summary())
