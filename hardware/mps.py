"""MPS control daemons, one per fractional GPU: start, query, stop, through ``nvidia-cuda-mps-control``.

The control program is the only documented interface to a daemon, so every operation runs it as
NVIDIA documents: ``-d`` (with ``CUDA_VISIBLE_DEVICES`` naming the one GPU and the daemon's own
``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``) starts a daemon in the background,
and commands go to its standard input (``get_server_list`` is the liveness query, ``quit`` stops
it). A daemon that does not answer within ``timeout_s`` counts as down: a hung daemon enforces
nothing we can see, so it fails closed exactly like a dead one.

``ProcessMpsDaemons`` runs the real binary on a GPU host and ``hardware/simulated/mps_control.py``
in simulation (same command surface and files); ``InMemoryMpsDaemons`` keeps daemons as records in
this process for the many-node ``gpuweave simulate``, where one process per GPU would not fit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from devicemodel.errors import GpuweaveError
from hardware.simulated import mps_control

DEFAULT_BINARY = "nvidia-cuda-mps-control"
PID_FILE = mps_control.PID_FILE
CONTROL_LOG = mps_control.CONTROL_LOG
START_WAIT_S = 5.0  # a started daemon must answer within this


class MpsControlError(GpuweaveError):
    """An MPS control daemon could not be started, did not answer, or refused a command."""


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
    """Start, query and stop daemons; every failure is an ``MpsControlError`` naming the GPU."""

    def start(self, spec: MpsDaemonSpec) -> None: ...

    def query(self, spec: MpsDaemonSpec) -> tuple[int, ...]: ...

    def stop(self, spec: MpsDaemonSpec) -> None: ...

    def kill(self, spec: MpsDaemonSpec) -> str: ...


def simulated_command() -> list[str]:
    """The simulated control program as a command line (this interpreter, the script's path)."""
    return [sys.executable, "-I", "-S", mps_control.__file__]


class ProcessMpsDaemons:
    """Daemons run by a control program (the real ``nvidia-cuda-mps-control`` or the simulated one)."""

    def __init__(self, command: Sequence[str], *, timeout_s: float = 3.0) -> None:
        self.command = list(command)
        self.timeout_s = timeout_s

    def start(self, spec: MpsDaemonSpec) -> None:
        """Start the daemon, wait until it answers, then set its default limits. A daemon that
        already answers on the pipe directory (left by an agent that crashed) is kept. Otherwise
        the directory is made clean first: share tenants have it mounted, so whatever is there
        (a daemon told to ``quit``, a directory planted where the ``control`` socket goes, a pid
        file naming another process) may be theirs, and a start must not depend on it."""
        make_directories(spec)
        try:
            self.query(spec)
        except MpsControlError:
            self.kill(spec)  # a hung daemon of ours, by its pid file (checked to be a control program)
            clean_directory(spec)
            self._run(spec, ["-d"], stdin="")
        deadline = time.monotonic() + START_WAIT_S
        while True:
            try:
                self.query(spec)
                break
            except MpsControlError:
                if time.monotonic() > deadline:
                    raise MpsControlError(
                        f"MPS control daemon for GPU {spec.gpu_uuid} started but did not answer on "
                        f"{spec.pipe_dir} within {START_WAIT_S:g} s; see {spec.log_dir / CONTROL_LOG}"
                    ) from None
                time.sleep(0.02)
        for command in spec.setup_commands():
            answer = self.control(spec, command)
            if answer.startswith(("Unrecognized", "Invalid")):
                raise MpsControlError(f"MPS daemon of GPU {spec.gpu_uuid} refused {command!r}: {answer}")

    def query(self, spec: MpsDaemonSpec) -> tuple[int, ...]:
        """The daemon's MPS server pids (``get_server_list``); raises when it does not answer."""
        answer = self.control(spec, "get_server_list")
        try:
            return tuple(int(word) for word in answer.split())
        except ValueError as exc:
            raise MpsControlError(f"MPS daemon of GPU {spec.gpu_uuid} answered {answer!r}") from exc

    def control(self, spec: MpsDaemonSpec, command: str) -> str:
        return self._run(spec, [], stdin=command + "\n").strip()

    def stop(self, spec: MpsDaemonSpec) -> None:
        """``quit``; a daemon that does not answer is killed by the pid in its pid file."""
        try:
            self.control(spec, "quit")
        except MpsControlError:
            self.kill(spec)

    def kill(self, spec: MpsDaemonSpec) -> str:
        """SIGKILL the daemon named by its pid file (fault injection, and a daemon that ignores quit)."""
        pid = read_pid(spec.pipe_dir)
        if pid is None:
            return f"GPU {spec.gpu_uuid}: no MPS daemon pid file in {spec.pipe_dir}"
        if not is_mps_control(pid, program=self.command[-1]):  # stale: the pid may be reused
            return f"GPU {spec.gpu_uuid}: MPS daemon {pid} was not running (stale pid file)"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return f"GPU {spec.gpu_uuid}: MPS daemon {pid} was not running"
        return f"GPU {spec.gpu_uuid}: MPS daemon {pid} killed"

    def _run(self, spec: MpsDaemonSpec, args: list[str], *, stdin: str) -> str:
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": spec.gpu_uuid,
            mps_control.PIPE_ENV: str(spec.pipe_dir),
            mps_control.LOG_ENV: str(spec.log_dir),
        }
        try:
            done = subprocess.run(
                [*self.command, *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=env,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsControlError(f"MPS control for GPU {spec.gpu_uuid} ({self.command[0]}): {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise MpsControlError(f"MPS control for GPU {spec.gpu_uuid}: {detail}")
        return done.stdout


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
    ``program`` (compared by file name, so a pid file left by a dead daemon never names another process)."""
    try:
        command = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    names = {os.path.basename(arg) for arg in command.decode(errors="replace").split("\0")}
    return bool(names & {DEFAULT_BINARY, os.path.basename(mps_control.__file__), os.path.basename(program)})


def read_pid(pipe_dir: Path) -> int | None:
    try:
        return int((pipe_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


class InMemoryMpsDaemons:
    """Daemons as records in this process: the same calls and directories, no process per GPU."""

    def __init__(self) -> None:
        self._live: dict[str, mps_control.DaemonState] = {}
        self._lock = threading.Lock()

    def start(self, spec: MpsDaemonSpec) -> None:
        make_directories(spec)
        state = mps_control.DaemonState()
        for command in spec.setup_commands():
            state.answer(command)
        with self._lock:
            self._live[spec.gpu_uuid] = state

    def query(self, spec: MpsDaemonSpec) -> tuple[int, ...]:
        with self._lock:
            state = self._live.get(spec.gpu_uuid)
        if state is None:
            raise MpsControlError(f"Cannot find MPS control daemon process on {spec.pipe_dir}")
        return tuple(state.servers)

    def stop(self, spec: MpsDaemonSpec) -> None:
        with self._lock:
            self._live.pop(spec.gpu_uuid, None)

    def kill(self, spec: MpsDaemonSpec) -> str:
        with self._lock:
            gone = self._live.pop(spec.gpu_uuid, None)
        return f"GPU {spec.gpu_uuid}: MPS daemon {'killed' if gone else 'was not running'}"
