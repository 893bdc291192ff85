"""Child processes of the check run the gpuweave this process imported, from any directory.

Every child is ``sys.executable -P -m gpuweave ...``: ``-P`` keeps the working directory off
``sys.path`` (a ``gpuweave/`` folder there must not stand in for the installed one), and when the
imported package's directory is not on this interpreter's own path (a source tree, an editable
install) it goes first on the child's ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import gpuweave


class CheckFailedError(Exception):
    """One step of the check failed; the message says what it saw."""


class StepSkippedError(Exception):
    """One step cannot run here (no repository, no pytest); the message says why."""


def package_root() -> Path:
    """The directory holding the imported ``gpuweave`` package (and its sibling packages)."""
    return Path(gpuweave.__file__).resolve().parents[1]


def product_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) with ``PYTHONPATH`` reaching this gpuweave."""
    env = dict(os.environ if base is None else base)
    root = package_root()
    on_path = {Path(entry).resolve() for entry in sys.path if entry}
    if root not in on_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def gpuweave_command(*args: str) -> list[str]:
    """The command line of ``gpuweave ARGS`` with this interpreter."""
    return [sys.executable, "-P", "-m", "gpuweave", *args]


def run_gpuweave(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpuweave_command(*args), capture_output=True, text=True, timeout=timeout, check=False,
        env=product_env(),
    )


def tail(done: subprocess.CompletedProcess[str]) -> str:
    """The last line a finished child printed (stdout, then stderr), or its exit status."""
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"
