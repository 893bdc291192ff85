"""Degraded NVLink links on disk: ``STATE_DIR/degraded-links.json``, so a restart keeps them.

Written atomically through the agent's ``StateWriter`` (a crash leaves the old file or the new one;
a full disk keeps the links in memory and retries every round), as the bad-hardware list is. A file
that does not parse stops the start with one line naming it and the field at fault
(``HealthStateError``), as a broken bad-hardware list does: the agent never silently forgets what
it found.

The file is a JSON list of ``{"gpus": [uuid, uuid], "fraction": 0.425, "reason": "..."}``, read
through ``LinkRecordEntry``: strict types, two distinct non-empty GPU UUIDs, a finite fraction in
0..1, no field the agent does not write (an unknown one is a file this agent did not write, so the
start stops rather than guess), at most ``MAX_RECORDS`` entries. What ``save`` writes always reads
back: reasons clipped to ``MAX_REASON``, past ``MAX_RECORDS`` only the slowest links (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from devicemodel.degraded import LinkEntry, slowest_entries
from devicemodel.validation import first_problem
from health.errors import HealthStateError
from health.links import LinkRecord
from health.persist import StateWriter, read_json

log = logging.getLogger(__name__)

DEGRADED_LINKS_FILE = "degraded-links.json"
MAX_RECORDS = 4096  # every pair of 90 GPUs: far past what a node has, even after GPU swaps
MAX_UUID = 256  # an NVML GPU UUID has 40 characters

GpuUuid = Annotated[str, Field(min_length=1, max_length=MAX_UUID)]


class LinkRecordEntry(LinkEntry[GpuUuid]):
    """One entry of the file: a degraded pair by GPU UUID."""

    model_config = ConfigDict(extra="forbid")

    def record(self) -> LinkRecord:
        a, b = sorted(self.gpus)
        return LinkRecord((a, b), self.fraction, self.reason or "")


_FILE = TypeAdapter(Annotated[list[LinkRecordEntry], Field(max_length=MAX_RECORDS)])


class DegradedLinkFile:
    def __init__(self, state_dir: Path, *, writer: StateWriter | None = None) -> None:
        self._writer = writer or StateWriter()
        self._path = state_dir / DEGRADED_LINKS_FILE

    def load(self) -> dict[frozenset[str], LinkRecord]:
        raw = read_json(self._path)
        if raw is None:
            return {}
        try:
            entries = _FILE.validate_python(raw)
        except ValidationError as exc:
            raise HealthStateError(f"{self._path} {_problem(exc)}; fix or delete it") from exc
        records = [entry.record() for entry in entries]
        return {record.pair: record for record in records}

    def save(self, links: Mapping[frozenset[str], LinkRecord]) -> None:
        if len(links) > MAX_RECORDS:
            log.error(
                "%d degraded links, more than the %d %s keeps; saving the slowest",
                len(links),
                MAX_RECORDS,
                self._path,
            )
        entries = slowest_entries(
            links.values(),
            limit=MAX_RECORDS,
            fraction=lambda r: r.fraction,
            gpus=lambda r: r.gpus,
            reason=lambda r: r.reason,
        )
        self._writer.write(self._path, entries)


def _problem(exc: ValidationError) -> str:
    """What is wrong, in one clause: the entry and its field, or the file as a whole."""
    where, problem = first_problem(exc, whole="")
    entry, _, field = where.partition(".")
    if not entry.isdigit():
        return f"is not a list of at most {MAX_RECORDS} degraded-link records: {problem}"
    at = f"[{entry}].{field}" if field else f"[{entry}]"
    return f"has an entry that is not a degraded-link record: {at}: {problem}"
