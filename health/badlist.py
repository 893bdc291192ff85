"""The bad-hardware list: GPUs (by UUID) that failed too often, remembered across restarts and nodes.

Kept in ``STATE_DIR/bad-hardware.json`` (written atomically) and mirrored to the cluster as one
``GpuBadHardware`` object per GPU, so a bad GPU moved into another node is refused there too.
Strike counts live beside it (``health-strikes.json``) so a restart does not forgive failures.
Both are written through a ``StateWriter``: on a full disk the list is kept (and acted on) in
memory and written again every round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from health.errors import HealthStateError
from health.persist import StateWriter, read_json

BAD_HARDWARE_FILE = "bad-hardware.json"
STRIKES_FILE = "health-strikes.json"


@dataclass(frozen=True)
class BadGpu:
    uuid: str
    reason: str
    node: str
    since: str  # RFC 3339 wall-clock time
    strikes: int


class BadHardwareList:
    def __init__(self, state_dir: Path, *, writer: StateWriter | None = None) -> None:
        self._writer = writer or StateWriter()
        self._path = state_dir / BAD_HARDWARE_FILE
        self._strikes_path = state_dir / STRIKES_FILE
        raw = read_json(self._path) or {}
        try:
            self._entries = {uuid: BadGpu(**entry) for uuid, entry in dict(raw).items()}
        except (TypeError, ValueError) as exc:
            raise HealthStateError(
                f"{self._path} has an entry that is not a bad-GPU record: {exc}; fix or delete it"
            ) from exc
        strikes = read_json(self._strikes_path) or {}
        self._strikes = {str(k): int(v) for k, v in dict(strikes).items()}

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._entries

    def entries(self) -> dict[str, BadGpu]:
        return dict(self._entries)

    def add(self, entry: BadGpu) -> bool:
        """Record a bad GPU; False when it was listed already."""
        if entry.uuid in self._entries:
            return False
        self._entries[entry.uuid] = entry
        self._writer.write(self._path, {u: asdict(e) for u, e in sorted(self._entries.items())})
        return True

    def merge(self, entries: dict[str, BadGpu]) -> list[str]:
        """Adopt entries the cluster knows about; returns the UUIDs that were new here."""
        return [uuid for uuid, entry in entries.items() if self.add(entry)]

    def strikes(self) -> dict[str, int]:
        return dict(self._strikes)

    def save_strikes(self, strikes: dict[str, int]) -> None:
        if strikes != self._strikes:
            self._strikes = dict(strikes)
            self._writer.write(self._strikes_path, dict(self._strikes))
