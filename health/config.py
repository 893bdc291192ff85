"""Health configuration: a pydantic model at the edge, a frozen ``HealthSettings`` inside.

Every interval is configurable so tests run 50 ms rounds and production runs seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.validation import first_problem
from health.errors import HealthConfigError
from health.policy import PolicySettings, Window
from health.xid import Action, Cause, Severity, XidOverride


@dataclass(frozen=True)
class IdleSettings:
    """Checks of idle GPUs between jobs (``health.active_idle``)."""

    interval_s: float = 86400.0  # each GPU at most once per this (its last check, burn-in included); 0: never
    after_job: bool = False  # also check a GPU once a job ended on it
    settle_s: float = 60.0  # idle at least this long before a check (the next job of a queue goes first)
    max_gpus: int = 2  # GPUs of the node withheld for it at once
    level: int = 1

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 or self.after_job


@dataclass(frozen=True)
class ActiveSettings:
    """Active checks (``health.active``): burn-in at start, on-demand runs, re-checks."""

    burn_in_level: int = 1  # 1 quick .. 4 extended (DCGM's levels); 0: no burn-in
    deadline_s: float | None = None  # one run (batch of GPUs); None: the level's own (120 s at 1)
    max_gpus: int = 8  # GPUs of the node exercised at once
    memory_fraction: float | None = None  # of each GPU's memory; None: the level's (2 % at 1)
    min_pcie_fraction: float = 0.55  # of the PCIe link's rate the copies must reach (x8 of x16: 0.5)
    min_nvlink_fraction: float = 0.55  # of the NVLink pair's lanes' rate
    compute_slack: float = 2.5  # the compute kernel may take this many times the model's time
    sbe_limit: int = 10  # corrected ECC errors during one run that withhold the GPU
    recheck_interval_s: float = 600.0  # re-check GPUs withheld by a failed check; 0: on demand only
    backend: str = "auto"  # auto (DCGM where its host engine answers, else CUDA), cuda, dcgm
    driver_root: str = "/"  # where the host's driver (libcuda.so.1) is mounted
    idle: IdleSettings = field(default_factory=IdleSettings)


@dataclass(frozen=True)
class HealthSettings:
    round_interval_s: float = 5.0  # periodic checks
    check_timeout_s: float = 2.0  # one GPU's reads; a hang past this fails closed
    event_wait_ms: int = 200  # one nvmlEventSetWait; the listener's heartbeat period
    stall_after_s: float = 0.0  # watchdog: a loop silent this long is restarted (0: derived)
    policy: PolicySettings = field(default_factory=PolicySettings)
    startup_rounds: int = 2  # clean rounds before the startup taint goes
    temperature_gap_c: float = 15.0  # above the node median
    temperature_window: Window = field(default_factory=lambda: Window(3, 3600.0))
    sbe_window: Window = field(default_factory=lambda: Window(1000, 3600.0))
    xid_windows: dict[int, Window] = field(default_factory=lambda: {94: Window(3, 3600.0)})
    xid_overrides: tuple[XidOverride, ...] = ()
    boot_ignored_xids: frozenset[int] = frozenset()
    eviction_grace_s: int = 120  # checkpointing time for evicted pods
    disruption_cap_fraction: float = 0.1  # share of cluster nodes our node taint may cover
    cordon_node_faults: bool = False
    expected_efa: int | None = None  # None: the inventory's count
    reset_in_use_rounds: int = 60  # rounds a reset may wait for a GPU's users before a reboot is asked for
    active: ActiveSettings = field(default_factory=ActiveSettings)

    @property
    def stall_threshold_s(self) -> float:
        return self.stall_after_s or 3 * self.round_interval_s + 2 * self.check_timeout_s


class WindowModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    threshold: int = Field(ge=1)
    seconds: float = Field(gt=0)


class XidOverrideModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    xid: int = Field(ge=0)
    severity: Severity | None = None
    ladder: list[Action] | None = None
    cause: Cause | None = None


class IdleConfig(BaseModel):
    """``health.active_checks.idle``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    interval_s: float = Field(default=86400.0, ge=0)
    after_job: bool = False
    settle_s: float = Field(default=60.0, ge=0)
    max_gpus: int = Field(default=2, ge=1, le=1024)
    level: int = Field(default=1, ge=1, le=4)


class ActiveConfig(BaseModel):
    """``health.active_checks``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    burn_in_level: int = Field(default=1, ge=0, le=4)
    deadline_s: float | None = Field(default=None, gt=0, le=86400)
    max_gpus: int = Field(default=8, ge=1, le=1024)
    memory_fraction: float | None = Field(default=None, gt=0, le=0.95)
    min_pcie_fraction: float = Field(default=0.55, ge=0, le=1)
    min_nvlink_fraction: float = Field(default=0.55, ge=0, le=1)
    compute_slack: float = Field(default=2.5, ge=1)
    sbe_limit: int = Field(default=10, ge=1)
    recheck_interval_s: float = Field(default=600.0, ge=0)
    backend: Literal["auto", "cuda", "dcgm"] = "auto"
    driver_root: str = Field(default="/", min_length=1, max_length=4096)
    idle: IdleConfig = IdleConfig()  # frozen: one shared default is safe

    def to_settings(self) -> ActiveSettings:
        idle = IdleSettings(**self.idle.model_dump())
        return ActiveSettings(**self.model_dump(exclude={"idle"}), idle=idle)


class HealthConfig(BaseModel):
    """The ``health`` section of the agent configuration (YAML/JSON), validated once at start."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    round_interval_s: float = Field(5.0, gt=0)
    check_timeout_s: float = Field(2.0, gt=0)
    event_wait_ms: int = Field(200, ge=10)
    probation_rounds: int = Field(2, ge=1)
    strike_limit: int = Field(3, ge=1)
    startup_rounds: int = Field(2, ge=1)
    temperature_gap_c: float = Field(15.0, gt=0)
    xid_windows: dict[int, WindowModel] = Field(
        default_factory=lambda: {94: WindowModel(threshold=3, seconds=3600)}
    )
    xid_overrides: list[XidOverrideModel] = Field(default_factory=list)
    boot_ignored_xids: list[int] = Field(default_factory=list)
    eviction_grace_s: int = Field(120, ge=0)
    disruption_cap_fraction: float = Field(0.1, gt=0, le=1)
    cordon_node_faults: bool = False
    expected_efa: int | None = Field(None, ge=0)
    reset_in_use_rounds: int = Field(60, ge=1)
    active_checks: ActiveConfig = ActiveConfig()  # frozen: one shared default is safe

    def to_settings(self) -> HealthSettings:
        return HealthSettings(
            round_interval_s=self.round_interval_s,
            check_timeout_s=self.check_timeout_s,
            event_wait_ms=self.event_wait_ms,
            policy=PolicySettings(probation_rounds=self.probation_rounds, strike_limit=self.strike_limit),
            startup_rounds=self.startup_rounds,
            temperature_gap_c=self.temperature_gap_c,
            xid_windows={x: Window(w.threshold, w.seconds) for x, w in self.xid_windows.items()},
            xid_overrides=tuple(
                XidOverride(o.xid, o.severity, None if o.ladder is None else tuple(o.ladder), o.cause)
                for o in self.xid_overrides
            ),
            boot_ignored_xids=frozenset(self.boot_ignored_xids),
            eviction_grace_s=self.eviction_grace_s,
            disruption_cap_fraction=self.disruption_cap_fraction,
            cordon_node_faults=self.cordon_node_faults,
            expected_efa=self.expected_efa,
            reset_in_use_rounds=self.reset_in_use_rounds,
            active=self.active_checks.to_settings(),
        )


def load_health_settings(data: object) -> HealthSettings:
    """Validate a decoded ``health`` section; a bad field raises ``HealthConfigError`` naming it."""
    try:
        return HealthConfig.model_validate(data or {}).to_settings()
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="health")
        raise HealthConfigError(f"bad health configuration at health.{where}: {problem}") from exc
