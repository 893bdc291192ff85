"""MPS control daemons, one per fractional GPU: what a daemon is, and the daemons kept in memory.

The control program ``nvidia-cuda-mps-control`` is the only documented interface to a daemon, so
every operation runs it as NVIDIA documents (``-f`` runs the daemon, in the foreground, with
``CUDA_VISIBLE_DEVICES`` naming the one GPU and the daemon's own ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY``; commands go to the program's standard input: ``get_server_list`` is
the liveness query, ``quit`` stops it). A daemon that does not answer within the control timeout
counts as down: a hung daemon enforces nothing we can see, so it fails closed like a dead one.

A GPU's pipe directory is mounted into every share tenant's container, so nothing in it (the pid
file, the socket that answers) tells the agent which process is its daemon: the agent keeps that
itself. ``hardware/mps_process.py`` runs the real binary on a GPU host and
``hardware/simulated/mps_control.py`` in simulation (same command surface and files);
``InMemoryMpsDaemons`` keeps daemons as records in this process for the many-node
``gpuweave simulate``, where one process per GPU would not fit.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from devicemodel.errors import GpuweaveError
from hardware.simulated import mps_control

DEFAULT_BINARY = "nvidia-cuda-mps-control"
CONTROL_LOG = mps_control.CONTROL_LOG

OnExit = Callable[[], None]  # called once, from another thread, when a started daemon's process ends


class MpsControlError(GpuweaveError):
    """An MPS control daemon could not be started, did not answer, or refused a command."""


class MpsDaemonQuitError(MpsControlError):
    """The daemon being started was told to ``quit`` (it exited with status 0) before its start
    completed: what a share tenant can do at any time, not a start that failed."""


@dataclass(frozen=True)
class MpsDaemonSpec:
    """One GPU's daemon: where it listens and logs, and the default limits it hands to clients."""

    gpu_uuid: str
    pipe_dir: Path
    log_dir: Path
    thread_percentage: int | None = None  # set_default_active_thread_percentage
    pinned_memory_mib: int | None = None  # set_default_device_pinned_mem_limit 0 <N>M

    def setup_commands(self) -> list[str]:
        commands = []
        if self.thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {self.thread_percentage}")
        if self.pinned_memory_mib is not None:
            commands.append(f"set_default_device_pinned_mem_limit 0 {self.pinned_memory_mib}M")
        return commands


class MpsDaemons(Protocol):
    """Start, query and stop daemons; every failure is an ``MpsControlError`` naming the GPU.

    ``start`` keeps a daemon of the agent's that still answers; ``on_exit`` is called when the
    process of the daemon it started or kept ends (not after ``stop``). ``pid`` is the agent's
    own record of the daemon's process, never a pid read from the pipe directory."""

    def start(self, spec: MpsDaemonSpec, *, on_exit: OnExit | None = None) -> None: ...

    def query(self, spec: MpsDaemonSpec) -> tuple[int, ...]: ...

    def stop(self, spec: MpsDaemonSpec) -> None: ...

    def kill(self, spec: MpsDaemonSpec) -> str: ...

    def pid(self, spec: MpsDaemonSpec) -> int | None: ...


def simulated_command() -> list[str]:
    """The simulated control program as a command line (this interpreter, the script's path)."""
    return [sys.executable, "-I", "-S", mps_control.__file__]


def make_directories(spec: MpsDaemonSpec) -> None:
    """The daemon's pipe and log directories; a refusal (read-only host path) is the GPU's start failure."""
    try:
        spec.pipe_dir.mkdir(parents=True, exist_ok=True)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MpsControlError(f"cannot create the MPS directories of GPU {spec.gpu_uuid}: {exc}") from exc


def clean_directory(spec: MpsDaemonSpec) -> None:
    """Empty the GPU's pipe directory without following any link out of it (entries are
    unlinked, directories removed with their content); a refusal is the GPU's start failure."""
    try:
        with os.scandir(spec.pipe_dir) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
    except OSError as exc:
        raise MpsControlError(
            f"cannot clean the MPS pipe directory {spec.pipe_dir} of GPU {spec.gpu_uuid}: {exc}"
        ) from exc


def is_mps_control(pid: int, *, program: str = DEFAULT_BINARY, proc_root: Path = Path("/proc")) -> bool:
    """Whether process ``pid`` runs an MPS control program: the driver's, the simulated one, or
    ``program`` (compared by file name)."""
    try:
        command = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    names = {os.path.basename(arg) for arg in command.decode(errors="replace").split("\0")}
    return bool(names & {DEFAULT_BINARY, os.path.basename(mps_control.__file__), os.path.basename(program)})


class InMemoryMpsDaemons:
    """Daemons as records in this process: the same calls and directories, no process per GPU."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[mps_control.DaemonState, OnExit | None]] = {}
        self._lock = threading.Lock()

    def start(self, spec: MpsDaemonSpec, *, on_exit: OnExit | None = None) -> None:
        make_directories(spec)
        state = mps_control.DaemonState()
        for command in spec.setup_commands():
            state.answer(command)
        with self._lock:
            self._live[spec.gpu_uuid] = (state, on_exit)

    def query(self, spec: MpsDaemonSpec) -> tuple[int, ...]:
        with self._lock:
            live = self._live.get(spec.gpu_uuid)
        if live is None:
            raise MpsControlError(f"Cannot find MPS control daemon process on {spec.pipe_dir}")
        return tuple(live[0].servers)

    def stop(self, spec: MpsDaemonSpec) -> None:
        with self._lock:
            self._live.pop(spec.gpu_uuid, None)

    def kill(self, spec: MpsDaemonSpec) -> str:
        """End the daemon as a crash would: its ``on_exit`` is called, here, before this returns."""
        with self._lock:
            gone = self._live.pop(spec.gpu_uuid, None)
        if gone is None:
            return f"GPU {spec.gpu_uuid}: MPS daemon was not running"
        if gone[1] is not None:
            gone[1]()
        return f"GPU {spec.gpu_uuid}: MPS daemon killed"

    def pid(self, spec: MpsDaemonSpec) -> int | None:
        return None
