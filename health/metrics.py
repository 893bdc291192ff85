"""Prometheus metrics of the health monitor, in a registry the caller owns (no global state).

Availability and job impact are split by cause (hardware, driver, platform, user) so a cluster
can tell "our GPUs broke" from "the job crashed" from "the platform withheld devices".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from health.policy import DeviceState
from health.scope import HealthSnapshot
from health.xid import Cause


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.device_state = Gauge(
            "gpuweave_health_device_state",
            "1 for the state each device is in",
            ["device", "kind", "state"],
            registry=r,
        )
        self.last_xid = Gauge(
            "gpuweave_health_last_xid", "Last Xid seen per GPU (0: none)", ["device"], registry=r
        )
        self.seconds_unhealthy = Gauge(
            "gpuweave_health_seconds_unhealthy",
            "Seconds since the device left Healthy (0 when Healthy)",
            ["device"],
            registry=r,
        )
        self.unavailable_seconds = Counter(
            "gpuweave_health_device_unavailable_seconds",
            "Device-seconds withheld from scheduling, by cause",
            ["cause"],
            registry=r,
        )
        self.faults = Counter(
            "gpuweave_health_faults",
            "Graded faults observed, by signal, severity and cause",
            ["signal", "severity", "cause"],
            registry=r,
        )
        self.remediations = Counter(
            "gpuweave_health_remediations",
            "Remediation attempts, by action and result",
            ["action", "result"],
            registry=r,
        )
        self.evictions = Counter(
            "gpuweave_health_pod_evictions",
            "Pods evicted off failed devices (job impact), by cause and outcome",
            ["cause", "outcome"],
            registry=r,
        )
        self.check_timeouts = Counter(
            "gpuweave_health_check_timeouts", "Device checks that timed out or failed to run", registry=r
        )
        self.startup_pending = Gauge(
            "gpuweave_health_startup_pending", "1 until two clean check rounds have run", registry=r
        )
        self.kernel_log_bad_lines = Counter(
            "gpuweave_health_kernel_log_bad_lines",
            "Kernel-log lines that looked like a record but could not be parsed or applied (skipped)",
            registry=r,
        )
        self.loop_restarts = Counter(
            "gpuweave_health_loop_restarts",
            "Health loops (events, rounds, watchdog) found dead and started again",
            ["loop"],
            registry=r,
        )
        self.state_write_failures = Counter(
            "gpuweave_health_state_write_failures",
            "Failed writes of a health state file (kept in memory and retried every round)",
            ["file"],
            registry=r,
        )
        self.state_unsaved = Gauge(
            "gpuweave_health_state_unsaved_files",
            "Health state files whose newest contents are only in memory (a restart would lose them)",
            registry=r,
        )
        self.active_checks = Counter(
            "gpuweave_health_active_checks",
            "Active checks run, by check (memory, compute, h2d, d2h, p2p, dcgm) and result status",
            ["check", "status"],
            registry=r,
        )
        self.active_gpus = Counter(
            "gpuweave_health_active_gpus",
            "GPUs through an active check, by trigger (burn-in, on-demand, recheck) and verdict",
            ["trigger", "verdict"],
            registry=r,
        )
        self.active_bandwidth = Gauge(
            "gpuweave_health_active_bandwidth_gbps",
            "Bandwidth the last active check measured, per GPU and copy (h2d, d2h, p2p to a peer)",
            ["device", "check", "peer"],
            registry=r,
        )
        self._last_at: float | None = None

    def observe(self, snapshot: HealthSnapshot, *, now: float) -> None:
        """Refresh gauges from a snapshot and add the withheld device-seconds since the last call."""
        elapsed = 0.0 if self._last_at is None else max(now - self._last_at, 0.0)
        self._last_at = now
        for kind, book in (("gpu", snapshot.gpus), ("mig", snapshot.migs)):
            for device, record in book.items():
                for state in DeviceState:
                    self.device_state.labels(device, kind, state.value).set(1 if record.state is state else 0)
                withheld = record.state is not DeviceState.HEALTHY
                self.seconds_unhealthy.labels(device).set(now - record.since if withheld else 0)
                if kind == "gpu":
                    self.last_xid.labels(device).set(record.last_xid or 0)
                if withheld and elapsed:
                    self.unavailable_seconds.labels((record.cause or Cause.PLATFORM).value).inc(elapsed)
        self.startup_pending.set(1 if snapshot.startup_pending else 0)
