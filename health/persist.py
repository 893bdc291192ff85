"""Atomic JSON files in the state directory (topology.state_file: write tmp + fsync + os.replace)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from health.errors import HealthStateError
from topology.state_file import write_json_atomically


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
