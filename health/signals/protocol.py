"""One interface for every health signal the monitor's rounds read.

A signal is a name and ``observe``: given the round's context (the inventory, the settings, the
probe, the time-boxed runner, the clock and the GPUs' current states), it reads its source and
returns ``Observations``, plain values the monitor hands to the engine. The monitor runs the
registered signals in order each round (``health.monitor.HealthMonitor.run_round``): kernel-log
records, device faults and the EFA state are applied as each signal returns them; GPU findings of
every signal are applied together once all have run, and a GPU named in them was checked this
round (clean when its list is empty); a signal that did not complete (a read that timed out)
keeps the round from counting toward the startup gate.

The built-in signals are ``health.signals.kernel_log`` (NVRM lines), ``health.signals.gpu_checks``
(each GPU's NVML counters and the temperature gap) and ``health.signals.efa`` (EFA adapters and
their counters); the node agent adds its own through ``health.service.HealthParts.signals`` (MPS
supervision, ``gpuweave.node.mps.MpsSignal``). A new signal is one module implementing
``HealthSignal`` plus one line where it is registered (docs/health.md, "Adding a signal").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devicemodel.inventory import NodeInventory
from hardware.health_probe import EfaAdapter, GpuReadings, XidEvent
from health.checks import Finding
from health.config import HealthSettings
from health.policy import DeviceState, Fault
from health.runner import TimeoutRunner
from health.scope import NodeFault, NodeFaultKind
from health.signals.kmsg import KernelLine, KernelRecord


class HealthProbe(Protocol):
    def register_events(self, gpu_uuids: list[str]) -> list[str]: ...
    def wait_event(self, timeout_ms: int) -> XidEvent | None: ...
    def read_gpu(self, uuid: str, *, expected_nvlinks: int) -> GpuReadings: ...
    def read_efa(self) -> tuple[EfaAdapter, ...]: ...


@dataclass(frozen=True)
class RoundContext:
    """What a signal may read in a round; the engine itself stays the monitor's."""

    inventory: NodeInventory
    settings: HealthSettings
    probe: HealthProbe
    runner: TimeoutRunner  # time-boxed reads, one worker per key (a GPU UUID, "efa")
    clock: Callable[[], float]
    gpu_states: Callable[[], Mapping[str, DeviceState]]  # read under the engine's lock when called


@dataclass(frozen=True)
class KernelEntry:
    """One kernel-log line: its record (None: not a record), or why it cannot be one."""

    line: KernelLine
    record: KernelRecord | None = None
    problem: str = ""


@dataclass(frozen=True)
class EfaState:
    """The EFA check's verdict: adapter -> up, and the node faults of the EFA kinds it found."""

    up: Mapping[str, bool]
    faults: frozenset[NodeFault]
    kinds: frozenset[NodeFaultKind] = frozenset({NodeFaultKind.EFA_MISSING, NodeFaultKind.EFA_LINK_DOWN})


@dataclass(frozen=True)
class Observations:
    """What one signal saw in one round, for the engine."""

    kernel: Sequence[KernelEntry] = ()  # applied line by line (a line that fails is counted, skipped)
    at_boot: bool = False  # the kernel lines are from before this agent started (the first read)
    faults: Sequence[tuple[str, Fault]] = ()  # device ID or GPU UUID -> a fault applied at once
    findings: Mapping[str, Sequence[Finding]] = field(default_factory=dict)  # GPU UUID -> this round's
    efa: EfaState | None = None
    complete: bool = True  # False: a read did not finish; the round does not count for the gate
    handled: Callable[[], None] | None = None  # called once the monitor acted on ``kernel``


NOTHING = Observations()


class HealthSignal(Protocol):
    """One source of health evidence, read once per round."""

    @property
    def name(self) -> str: ...

    def observe(self, context: RoundContext) -> Observations: ...
