"""Degraded NVLink links on disk: ``STATE_DIR/degraded-links.json``, so a restart keeps them.

Written atomically through the agent's ``StateWriter`` (a crash leaves the old file or the new one;
a full disk keeps the links in memory and retries every round), as the bad-hardware list is. A file
that does not parse stops the start with one line naming it (``HealthStateError``), as a broken
bad-hardware list does: the agent never silently forgets what it found.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from health.errors import HealthStateError
from health.links import LinkRecord
from health.persist import StateWriter, read_json

DEGRADED_LINKS_FILE = "degraded-links.json"


class DegradedLinkFile:
    def __init__(self, state_dir: Path, *, writer: StateWriter | None = None) -> None:
        self._writer = writer or StateWriter()
        self._path = state_dir / DEGRADED_LINKS_FILE

    def load(self) -> dict[frozenset[str], LinkRecord]:
        raw = read_json(self._path)
        if raw is None:
            return {}
        try:
            records = [_record(entry) for entry in list(raw)]
        except (TypeError, ValueError, KeyError) as exc:
            raise HealthStateError(
                f"{self._path} has an entry that is not a degraded-link record: {exc}; fix or delete it"
            ) from exc
        return {record.pair: record for record in records}

    def save(self, links: Mapping[frozenset[str], LinkRecord]) -> None:
        entries = [
            {"gpus": list(r.gpus), "fraction": r.fraction, "reason": r.reason}
            for r in sorted(links.values(), key=lambda r: r.gpus)
        ]
        self._writer.write(self._path, entries)


def _record(entry: object) -> LinkRecord:
    if not isinstance(entry, dict):
        raise TypeError(f"{entry!r} is not an object")
    gpus = entry["gpus"]
    if not isinstance(gpus, list) or len(gpus) != 2 or not all(isinstance(g, str) and g for g in gpus):
        raise ValueError(f"gpus {gpus!r} is not two GPU UUIDs")
    if gpus[0] == gpus[1]:
        raise ValueError(f"gpus {gpus!r} names one GPU twice")
    fraction = entry["fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction {fraction!r} is not a number in 0..1")
    a, b = sorted(gpus)
    return LinkRecord((a, b), float(fraction), str(entry.get("reason") or ""))
