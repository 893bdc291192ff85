"""One writer for every benchmark's ``benchmarks/results/<name>.json``.

A figure in the docs is only as good as what it can be traced to: the committed results file
says which command produced it, when, and on what machine (its cores and its load while the
benchmark ran, since the development machine is shared and its speed moves with the hour).
``tests/unit/test_doc_figures.py`` checks the figures the docs quote against these files.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    """What the run's figures depend on: the CPU, how many cores, how busy they were."""
    load_1m, load_5m, load_15m = os.getloadavg()
    return {
        "system": f"{platform.system()} {platform.release()}",
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1_5_15m_at_end": [round(load_1m, 2), round(load_5m, 2), round(load_15m, 2)],
    }


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces the run, as the docs give it."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([".venv/bin/python", "-m", module, *args])


def write_results(
    name: str,
    payload: Mapping[str, Any],
    *,
    module: str,
    argv: Sequence[str] | None = None,
    directory: Path = RESULTS_DIR,
) -> Path:
    """Write ``<directory>/<name>.json``: the command, the date, the machine, then ``payload``.

    Written to a temporary name and renamed, so an interrupted run leaves the last good file."""
    record = {
        "command": command_line(module, argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **payload,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    scratch = path.with_suffix(".json.tmp")
    scratch.write_text(json.dumps(record, indent=2) + "\n")
    scratch.replace(path)
    print(f"\nwrote {path}")
    return path


def read_results(name: str, *, directory: Path = RESULTS_DIR) -> dict[str, Any]:
    """A committed results file, as the doc-figure test reads it."""
    loaded = json.loads((directory / f"{name}.json").read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{name}.json: expected a JSON object, got {type(loaded).__name__}")
    return loaded
