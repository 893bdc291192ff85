"""The kernel log as a health signal: NVRM Xid, fallen-off-the-bus and SXid lines each round.

Reads the lines after the saved cursor (``health.signals.kmsg.KernelLogTail``) and parses each
(``parse_line``, pure); the monitor applies the records one by one, counts and skips a line that
cannot be parsed or applied, and then calls ``handled``: the cursor moves past every line read and
is saved, so a restarted agent reads again exactly what it had not finished. The lines of the
first read after a fresh start happened before the agent ran on this boot (``at_boot``).
"""

from __future__ import annotations

import logging
from functools import partial

from health.signals.kmsg import KernelLine, KernelLogTail, parse_line
from health.signals.protocol import NOTHING, KernelEntry, Observations, RoundContext

log = logging.getLogger(__name__)


class KernelLogSignal:
    """``HealthSignal`` over a ``KernelLogTail``."""

    name = "kmsg"

    def __init__(self, tail: KernelLogTail) -> None:
        self._tail = tail
        self._first_read = True

    def observe(self, context: RoundContext) -> Observations:
        """New lines parsed; nothing when the log cannot be read (the next round tries again)."""
        at_boot = self._first_read and self._tail.fresh_start
        self._first_read = False
        try:
            lines = self._tail.read_new()
        except OSError as exc:
            log.warning("cannot read the kernel log: %s", exc)
            return NOTHING
        if not lines:
            return NOTHING
        entries = tuple(_entry(line) for line in lines)
        return Observations(kernel=entries, at_boot=at_boot, handled=partial(self._handled, lines))

    def _handled(self, lines: list[KernelLine]) -> None:
        for line in lines:
            self._tail.handled(line)
        self._tail.save()


def _entry(line: KernelLine) -> KernelEntry:
    try:
        return KernelEntry(line, parse_line(line.text))
    except Exception as exc:  # a line that looks like a record but cannot be one
        return KernelEntry(line, problem=str(exc))
