"""Health state files: atomic JSON writes that never stop health checking when the disk fails.

Files are replaced atomically (``devicemodel.state_file``: temporary file, fsync, ``os.replace``), so a
crash leaves the old file or the new one, never half. A write can still fail: a full disk, a
read-only remount, a lost volume. ``StateWriter`` then keeps the unsaved contents in memory (the
running agent keeps acting on them), reports the failure to its ``on_result`` callback (metric,
Event, node condition) and writes the newest contents again on every ``retry()``, i.e. every
check round, until the disk takes them. A failed write never raises into a health loop.

``require_writable_dir`` is the start-up check: a state directory the agent cannot write is a
one-line ``HealthStateError`` before anything starts, not a traceback later.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devicemodel.state_file import write_json_atomically
from health.errors import HealthStateError

log = logging.getLogger(__name__)

WriteResult = Callable[[Path, OSError | None], None]  # after every attempt: the file, its error or None


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON so a crash leaves the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, data, indent=1)


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when the file does not exist."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HealthStateError(f"cannot read health state file {path}: {exc}; fix or delete it") from exc


class StateWriter:
    """Writes state files; what a write cannot save is kept, reported and written again later.

    One writer serves every health state file of an agent, so ``unsaved()`` is the whole answer
    to "what would a restart lose now". Writes are serialised (they are small and rare).
    """

    def __init__(self, *, on_result: WriteResult | None = None) -> None:
        self._lock = threading.RLock()  # ``on_result`` may ask ``unsaved()``
        self._pending: dict[Path, Any] = {}
        self._errors: dict[Path, str] = {}
        self._on_result = on_result

    def write(self, path: Path, data: Any) -> bool:
        """Save ``data`` in ``path`` now if the disk allows; False when it is kept for a retry."""
        with self._lock:
            self._pending[path] = data
            return self._flush(path)

    def retry(self) -> dict[str, str]:
        """Write every unsaved file again (newest contents); returns what is still unsaved."""
        with self._lock:
            for path in list(self._pending):
                self._flush(path)
            return self._unsaved()

    def unsaved(self) -> dict[str, str]:
        """File name -> the error that keeps it from being saved (empty when all is on disk)."""
        with self._lock:
            return self._unsaved()

    def _unsaved(self) -> dict[str, str]:
        return {path.name: error for path, error in sorted(self._errors.items())}

    def _flush(self, path: Path) -> bool:
        try:
            write_json_atomic(path, self._pending[path])
        except OSError as exc:
            self._failed(path, exc)
            return False
        del self._pending[path]
        if self._errors.pop(path, None) is not None:
            log.warning("health state file %s saved again", path)
        self._report(path, None)
        return True

    def _failed(self, path: Path, exc: OSError) -> None:
        error = f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror or exc}"
        if self._errors.get(path) != error:  # log each new problem once, not every round
            log.error(
                "cannot save health state file %s (%s); keeping it in memory and retrying every round",
                path,
                error,
            )
        self._errors[path] = error
        _remove_temporary_files(path)
        self._report(path, exc)

    def _report(self, path: Path, exc: OSError | None) -> None:
        if self._on_result is None:
            return
        try:
            self._on_result(path, exc)
        except Exception:
            log.exception("reporting the state write of %s failed", path)


def _remove_temporary_files(path: Path) -> None:
    """Drop half-written temporary files of ``path``: on a full disk they hold the space we need."""
    try:
        for leftover in path.parent.glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)
    except OSError:
        pass


def require_writable_dir(path: Path, *, what: str = "state directory") -> None:
    """Create ``path`` if needed and prove a file can be written there; else one ``HealthStateError``."""
    probe = path / f".write-probe.{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise HealthStateError(
            f"{what} {path} is not writable ({reason}); the agent keeps its journal and health "
            "state there: mount it read-write or pass another --state-dir"
        ) from exc
