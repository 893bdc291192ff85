"""The per-device health state machine and tolerance windows (pure: no clock, no I/O).

Every device that can fail on its own (a whole GPU, one MIG device) has a ``DeviceRecord``. Events
carry their own timestamps (the caller's clock), so the same sequence always gives the same
states::

    Healthy --suspect fault--> Suspect --clean round--> Probation --N clean rounds--> Healthy
       |                          |                        |
       +------fatal fault---------+------------------------+--> Failed --remediation-->
    Remediating --ok--> Probation;  --failed--> Failed (next ladder step)
    a device failing ``strike_limit`` times --> Retired (bad-hardware list; never comes back)

Suspect, Failed, Remediating, Probation and Retired devices are all withheld from new work; only
Failed devices have their pods evicted and get remediated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from health.xid import Action, Cause, Severity


class DeviceState(StrEnum):
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    FAILED = "Failed"
    REMEDIATING = "Remediating"
    PROBATION = "Probation"
    RETIRED = "Retired"


STATE_ORDER: Mapping[DeviceState, int] = {
    DeviceState.HEALTHY: 0,
    DeviceState.PROBATION: 1,
    DeviceState.SUSPECT: 2,
    DeviceState.REMEDIATING: 3,
    DeviceState.FAILED: 4,
    DeviceState.RETIRED: 5,
}


def worst(a: DeviceState, b: DeviceState) -> DeviceState:
    """The more severe of two states (a MIG device is as sick as the worse of itself and its GPU)."""
    return a if STATE_ORDER[a] >= STATE_ORDER[b] else b


@dataclass(frozen=True)
class PolicySettings:
    probation_rounds: int = 2  # clean check rounds before a device is Healthy again
    strike_limit: int = 3  # failures before a GPU goes on the bad-hardware list


@dataclass(frozen=True)
class Fault:
    """A graded observation against one device."""

    at: float
    signal: str  # "xid", "ecc-dbe", "check-timeout", "nvlink-down" ...
    severity: Severity
    reason: str
    cause: Cause = Cause.HARDWARE
    ladder: tuple[Action, ...] = (Action.RESET_GPU, Action.REPLACE)
    strike: bool = True
    xid: int | None = None


@dataclass(frozen=True)
class RoundCompleted:
    """One round of periodic checks finished; ``clean`` when no check failed for the device."""

    at: float
    clean: bool


@dataclass(frozen=True)
class RemediationStarted:
    at: float
    action: Action


@dataclass(frozen=True)
class RemediationFinished:
    """``retry``: the step could not run yet (the GPU is still in use); it is not a failed attempt."""

    at: float
    ok: bool
    detail: str = ""
    retry: bool = False


@dataclass(frozen=True)
class MarkedBad:
    """The device is on the bad-hardware list (here or seen elsewhere in the cluster)."""

    at: float
    reason: str


Event = Fault | RoundCompleted | RemediationStarted | RemediationFinished | MarkedBad


@dataclass(frozen=True)
class DeviceRecord:
    state: DeviceState = DeviceState.HEALTHY
    reason: str = ""
    since: float = 0.0
    strikes: int = 0
    attempts: int = 0  # failed remediation attempts since the device was last Healthy
    clean_rounds: int = 0
    ladder: tuple[Action, ...] = ()
    cause: Cause | None = None
    last_xid: int | None = None
    action: Action | None = None  # the remediation running while Remediating

    @property
    def withheld(self) -> bool:
        return self.state is not DeviceState.HEALTHY

    def next_action(self) -> Action | None:
        """The remediation step due for a Failed device: the ladder, one step per failed attempt."""
        if self.state is not DeviceState.FAILED or not self.ladder:
            return None
        return self.ladder[min(self.attempts, len(self.ladder) - 1)]


def _enter(
    record: DeviceRecord, state: DeviceState, at: float, reason: str, **changes: object
) -> DeviceRecord:
    return replace(record, state=state, since=at, reason=reason, **changes)  # type: ignore[arg-type]


def _on_fault(record: DeviceRecord, fault: Fault, settings: PolicySettings) -> DeviceRecord:
    if fault.xid is not None:
        record = replace(record, last_xid=fault.xid)
    state = record.state
    if fault.severity is Severity.SUSPECT:
        if state in (DeviceState.HEALTHY, DeviceState.PROBATION, DeviceState.SUSPECT):
            return _enter(
                record, DeviceState.SUSPECT, fault.at, fault.reason, clean_rounds=0, cause=fault.cause
            )
        return record
    if fault.severity is not Severity.FATAL or state in (DeviceState.RETIRED, DeviceState.REMEDIATING):
        return record
    if state is DeviceState.FAILED:
        return record  # a burst of errors on a failed device is one failure
    strikes = record.strikes + (1 if fault.strike else 0)
    if strikes >= settings.strike_limit:
        reason = f"{fault.reason}; failure {strikes} of {settings.strike_limit}: bad hardware"
        return _enter(record, DeviceState.RETIRED, fault.at, reason, strikes=strikes, cause=fault.cause)
    return _enter(
        record,
        DeviceState.FAILED,
        fault.at,
        fault.reason,
        strikes=strikes,
        clean_rounds=0,
        ladder=fault.ladder,
        cause=fault.cause,
    )


def _on_round(record: DeviceRecord, event: RoundCompleted, settings: PolicySettings) -> DeviceRecord:
    if record.state is DeviceState.SUSPECT and event.clean:
        return _enter(
            record, DeviceState.PROBATION, event.at, f"probation after: {record.reason}", clean_rounds=0
        )
    if record.state is not DeviceState.PROBATION:
        return record
    if not event.clean:
        return replace(record, clean_rounds=0)
    rounds = record.clean_rounds + 1
    if rounds >= settings.probation_rounds:
        return _enter(
            record, DeviceState.HEALTHY, event.at, "", clean_rounds=0, attempts=0, ladder=(), action=None
        )
    return replace(record, clean_rounds=rounds)


def step(record: DeviceRecord, event: Event, settings: PolicySettings) -> DeviceRecord:
    """The record after ``event``; events that do not apply in the current state change nothing."""
    if isinstance(event, Fault):
        return _on_fault(record, event, settings)
    if isinstance(event, RoundCompleted):
        return _on_round(record, event, settings)
    if isinstance(event, MarkedBad):
        if record.state is DeviceState.RETIRED:
            return record
        return _enter(record, DeviceState.RETIRED, event.at, event.reason)
    if isinstance(event, RemediationStarted):
        if record.state is not DeviceState.FAILED:
            return record
        return _enter(
            record, DeviceState.REMEDIATING, event.at, f"{event.action}: {record.reason}", action=event.action
        )
    if record.state is not DeviceState.REMEDIATING:
        return record
    if event.ok:
        return _enter(
            record, DeviceState.PROBATION, event.at, f"probation after {record.reason}", clean_rounds=0
        )  # the Remediating reason, "<action>: <fault>": an operator still sees why
    detail = event.detail or "remediation failed"
    attempts = record.attempts + (0 if event.retry else 1)
    return _enter(record, DeviceState.FAILED, event.at, detail, attempts=attempts, action=None)


# --- tolerance windows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """``threshold`` observations within ``seconds`` trip the window."""

    threshold: int
    seconds: float


@dataclass(frozen=True)
class WindowCounter:
    times: tuple[float, ...] = field(default=())

    def observe(self, at: float, window: Window) -> tuple[WindowCounter, bool]:
        """Record one observation; True when the window trips (the counter then starts over)."""
        kept = (*tuple(t for t in self.times if at - t < window.seconds), at)
        if len(kept) >= window.threshold:
            return WindowCounter(), True
        return WindowCounter(kept), False
