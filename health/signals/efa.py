"""The node's EFA adapters as a health signal: present, link up, and their hardware counters.

Read once per round on the ``"efa"`` worker under ``check_timeout_s`` (a read that does not finish
leaves the adapters as they were and the round incomplete). The adapters the inventory lists (or
``expected_efa`` of them) must be present and up; an adapter whose counters show it down
(``health.signals.efa_counters``) is down too, and one whose error counters rise fast is logged as
degraded. A node without EFA adapters, and not told to expect any, is not checked.
"""

from __future__ import annotations

import logging

from devicemodel.inventory import NicType
from health.checks import judge_efa
from health.signals.efa_counters import EfaCounterWatch
from health.signals.protocol import NOTHING, EfaState, Observations, RoundContext

log = logging.getLogger(__name__)


class EfaCheck:
    """``HealthSignal`` over the probe's EFA read."""

    name = "efa"

    def __init__(self) -> None:
        self._counters = EfaCounterWatch()

    def observe(self, context: RoundContext) -> Observations:
        settings = context.settings
        expected = [n.name for n in context.inventory.nics if n.type is NicType.EFA]
        if not expected and settings.expected_efa is None:
            return NOTHING
        if not context.runner.start("efa", context.probe.read_efa):
            return Observations(complete=False)
        status, value = context.runner.collect("efa", settings.check_timeout_s)
        if status != "ok":
            log.warning("EFA check did not complete: %s %s", status, value)
            return Observations(complete=False)
        count = settings.expected_efa if settings.expected_efa is not None else len(expected)
        counters = self._counters.observe(value, at=context.clock())
        for reason in counters.degraded.values():
            log.warning("%s", reason)
        up, faults = judge_efa(value, expected=expected, expected_count=count, counter_down=counters.down)
        return Observations(efa=EfaState(up=up, faults=faults))
