"""Who holds a GPU open, and the errors a reset can end in.

A GPU reset (``nvidia-smi -r``) needs every client of the GPU gone, not only its compute
processes: ``nvidia-persistenced``, DCGM and its exporter, another NVML agent, an X server each
keep ``/dev/nvidia<minor>`` open and make the reset fail "In use by another client". NVML lists
compute processes only, so the holders are found the way ``fuser`` finds them: the open files of
every process in ``/proc``. That is the host's ``/proc`` only when the agent runs with ``hostPID``
(the DaemonSet does); in a pod of its own PID namespace only the pod's processes are seen.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devicemodel.errors import GpuweaveError


class ResetRefusedError(GpuweaveError):
    """A GPU reset failed (the tool failed or the GPU did not come back)."""


class GpuInUseError(ResetRefusedError):
    """A GPU reset was refused because something still uses the GPU: retry once it is idle."""


class RebootRequiredError(ResetRefusedError):
    """The GPU cannot be reset in place (NVML_ERROR_RESET_REQUIRED, e.g. a pass-through VM): the
    node (or VM) must reboot; retrying the reset cannot help."""


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


def device_holders(
    proc_root: Path, device_node: str, *, exclude_pid: int | None = None
) -> tuple[Holder, ...]:
    """Processes under ``proc_root`` with ``device_node`` (``/dev/nvidia3``) open, by pid; processes
    that exit or whose files cannot be read while scanning are skipped."""
    found = []
    for entry in proc_root.iterdir() if proc_root.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == exclude_pid:
            continue
        if _holds(entry / "fd", device_node):
            found.append(Holder(int(entry.name), _comm(entry)))
    return tuple(sorted(found, key=lambda h: h.pid))


def in_use_message(uuid: str, holders: tuple[Holder, ...]) -> str:
    names = ", ".join(str(h) for h in holders)
    hint = ""
    if any(h.name.startswith("nvidia-persist") for h in holders):
        hint = " (nvidia-persistenced: run it with --no-persistence-mode, or nvidia-smi -pm 0 on this GPU)"
    return f"GPU {uuid} is held open by {names}{hint}; the reset waits until they let go"


def _holds(fd_dir: Path, device_node: str) -> bool:
    try:
        descriptors = list(fd_dir.iterdir())
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor) == device_node:
                return True
        except OSError:
            continue
    return False


def _comm(process_dir: Path) -> str:
    try:
        return (process_dir / "comm").read_text(encoding="utf-8").strip() or "?"
    except OSError:
        return "?"


class SessionGate:
    """Readers of our NVML session against a reset that closes it: readers wait while it is closed,
    and the reset waits for the readers in flight."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._closed = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def closed(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._readers == 0 and not self._closed)
            self._closed = True
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


def nvidia_smi_reset(uuid: str, *, timeout_s: float = 120.0) -> None:
    """Reset one GPU with ``nvidia-smi -r -i <uuid>`` (NVML has no public reset call)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-r", "-i", uuid], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        message = f"nvidia-smi -r -i {uuid} failed: {exc}; a node reboot may be needed"
        raise ResetRefusedError(message) from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        last = (output.splitlines() or ["no output"])[-1]
        if "in use" in output.lower():
            raise GpuInUseError(f"nvidia-smi -r -i {uuid}: {last}")
        if "requires restart" in output.lower() or "reboot" in output.lower():
            raise RebootRequiredError(f"nvidia-smi -r -i {uuid}: {last}; reboot the node")
        raise ResetRefusedError(f"nvidia-smi -r -i {uuid} exited {done.returncode}: {last}")
