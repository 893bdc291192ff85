"""Health configuration: a pydantic model at the edge, a frozen ``HealthSettings`` inside.

Every interval is configurable so tests run 50 ms rounds and production runs seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.validation import first_problem
from health.errors import HealthConfigError
from health.policy import PolicySettings, Window
from health.xid import Action, Cause, Severity, XidOverride


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
        )


def load_health_settings(data: object) -> HealthSettings:
    """Validate a decoded ``health`` section; a bad field raises ``HealthConfigError`` naming it."""
    try:
        return HealthConfig.model_validate(data or {}).to_settings()
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="health")
        raise HealthConfigError(f"bad health configuration at health.{where}: {problem}") from exc
