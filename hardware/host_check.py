"""The node agent's start-up self-check: is everything a real GPU node needs visible to it?

A DaemonSet that misses one setting fails far from its cause: without the NVIDIA runtime's
injection ``nvmlInit`` says "library not found"; without ``hostPID`` a reset sees no other pod's
process and fails "in use"; without ``hostNetwork`` an EFA adapter's netdev is invisible. So the
agent checks each prerequisite before it touches the driver and says, in one line, every one
that is missing and the setting that supplies it (docs/deploy.md lists them). Missing the driver
library or its control device is fatal (nothing can be served); the rest degrade one feature and
are logged.

Every path is read below ``root`` and the library loader is a parameter, so tests run the same
checks against a fake host.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NVML_LIBRARY = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class Missing:
    what: str
    fix: str
    fatal: bool


@dataclass(frozen=True)
class SelfCheck:
    missing: tuple[Missing, ...]

    @property
    def fatal(self) -> bool:
        return any(m.fatal for m in self.missing)

    def line(self) -> str:
        """One line naming everything missing, fatal first, each with its fix; "" when nothing is."""
        if not self.missing:
            return ""
        ordered = sorted(self.missing, key=lambda m: not m.fatal)
        parts = "; ".join(f"{m.what} ({m.fix})" for m in ordered)
        return f"node self-check: missing {parts}; see docs/deploy.md"


def _load_library(name: str) -> None:
    ctypes.CDLL(name)


def run_self_check(
    *,
    root: Path = Path("/"),
    load_library: Callable[[str], None] = _load_library,
    which: Callable[[str], str | None] = shutil.which,
) -> SelfCheck:
    """Check the host as the agent's container sees it (``root`` is ``/`` on a node)."""
    checks = (
        _nvml_library(load_library),
        _control_device(root),
        _nvidia_smi(which),
        _host_pid(root),
        _host_network(root),
    )
    return SelfCheck(tuple(m for m in checks if m is not None))


def _nvml_library(load_library: Callable[[str], None]) -> Missing | None:
    try:
        load_library(NVML_LIBRARY)
    except OSError:
        return Missing(
            NVML_LIBRARY,
            "run the pod with runtimeClassName nvidia (or nvidia as the default runtime), "
            "NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=utility",
            fatal=True,
        )
    return None


def _control_device(root: Path) -> Missing | None:
    if (root / "dev" / "nvidiactl").exists():
        return None
    fix = "mount the host's /dev and run privileged; is the driver loaded?"
    return Missing("/dev/nvidiactl", fix, fatal=True)


def _nvidia_smi(which: Callable[[str], str | None]) -> Missing | None:
    if which("nvidia-smi") is not None:
        return None
    fix = "GPU resets need it: NVIDIA_DRIVER_CAPABILITIES must include utility"
    return Missing("nvidia-smi", fix, fatal=False)


def _host_pid(root: Path) -> Missing | None:
    """Kernel threads (kthreadd is PID 2) are visible only in the host's PID namespace."""
    try:
        comm = (root / "proc" / "2" / "comm").read_text(encoding="utf-8").strip()
    except OSError:
        comm = ""
    if comm == "kthreadd":
        return None
    fix = "set hostPID: true so resets and MIG changes see every process on a GPU"
    return Missing("hostPID", fix, fatal=False)


def _host_network(root: Path) -> Missing | None:
    """The agent's network namespace is the host's when it equals PID 1's (needs hostPID to tell)."""
    try:
        ours = os.readlink(root / "proc" / "self" / "ns" / "net")
        hosts = os.readlink(root / "proc" / "1" / "ns" / "net")
    except OSError:
        return None  # cannot tell (no hostPID: reported above)
    if ours == hosts:
        return None
    return Missing("hostNetwork", "set hostNetwork: true so EFA adapters' netdevs are visible", fatal=False)
