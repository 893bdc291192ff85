"""Each GPU's NVML counters as a health signal, read in parallel and time-boxed, with the
temperature gap across the node.

Every GPU is read on its own worker (``RoundContext.runner``) under ``check_timeout_s``: a read
that hangs or fails gives that GPU a failure finding (Suspect, "check timed out") while the others
go on, and the round does not count as complete. A GPU whose temperature stands ``temperature_gap_c``
above the node's median for ``temperature_window`` rounds gets a Suspect finding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hardware.health_probe import GpuReadings
from health.checks import Finding, judge_failure, judge_readings, temperature_outliers
from health.policy import Window, WindowCounter
from health.signals.protocol import HealthProbe, Observations, RoundContext
from health.xid import Severity


class GpuChecks:
    """``HealthSignal`` over the probe's per-GPU reads."""

    name = "gpu-checks"

    def __init__(self) -> None:
        self._temperature: dict[str, WindowCounter] = {}

    def observe(self, context: RoundContext) -> Observations:
        findings, completed, temps = self._read(context)
        findings = self._add_temperature(context, findings, temps)
        return Observations(findings=findings, complete=completed)

    @staticmethod
    def _read(context: RoundContext) -> tuple[dict[str, list[Finding]], bool, dict[str, int]]:
        inventory, runner, clock = context.inventory, context.runner, context.clock
        timeout_s = context.settings.check_timeout_s
        links = nvlinks_per_gpu(inventory)
        started = {}
        for gpu in inventory.gpus:
            read = _reader(context.probe, gpu.uuid, links.get(gpu.index, 0))
            started[gpu.uuid] = runner.start(gpu.uuid, read)
        deadline = clock() + timeout_s
        findings: dict[str, list[Finding]] = {}
        temps: dict[str, int] = {}
        completed = True
        for uuid, fresh in started.items():
            status, value = runner.collect(uuid, deadline - clock()) if fresh else ("timeout", None)
            if status == "ok" and isinstance(value, GpuReadings):
                findings[uuid] = judge_readings(value)
                if value.temperature_c is not None:
                    temps[uuid] = value.temperature_c
                continue
            completed = False
            error = value if status == "error" else None
            findings[uuid] = [judge_failure(error, timeout_s=timeout_s)]
        return findings, completed, temps

    def _add_temperature(
        self, context: RoundContext, findings: dict[str, list[Finding]], temps: dict[str, int]
    ) -> dict[str, list[Finding]]:
        window: Window = context.settings.temperature_window
        at = context.clock()
        for uuid, gap in temperature_outliers(temps, gap_c=context.settings.temperature_gap_c).items():
            counter, tripped = self._temperature.get(uuid, WindowCounter()).observe(at, window)
            self._temperature[uuid] = counter
            if tripped:
                reason = f"{gap:.0f} C above the node median for {window.threshold} rounds"
                findings[uuid].append(Finding("temperature-gap", Severity.SUSPECT, reason))
        return findings


def _reader(probe: HealthProbe, uuid: str, links: int) -> Callable[[], GpuReadings]:
    return lambda: probe.read_gpu(uuid, expected_nvlinks=links)


def nvlinks_per_gpu(inventory: Any) -> dict[int, int]:
    """NVLink links each GPU should have active (direct links plus NVSwitch links)."""
    links: dict[int, int] = {}
    for link in inventory.nvlinks:
        links[link.gpu_a] = links.get(link.gpu_a, 0) + link.links
        links[link.gpu_b] = links.get(link.gpu_b, 0) + link.links
    if inventory.nvswitch is not None:
        for index in inventory.nvswitch.gpus:
            links[index] = links.get(index, 0) + inventory.nvswitch.links_per_gpu
    return links
