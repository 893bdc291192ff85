"""MPS control daemons as the agent's own processes: the real nvidia-cuda-mps-control or the simulated one.

Each daemon runs in the foreground (``-f``) as the agent's own child, so the agent holds its
process from the start: a pidfd to signal it (a signal through it never reaches another process),
a thread that waits for it to end (``on_exit``: the supervisor restarts it at once) and a stamp in
the ledger (``hardware/mps_ledger.py``), from which the agent that runs after a restart takes it
back. Nothing read from the pipe directory, which share tenants have mounted, names a process to
the agent. Commands go through the control program (``control``), only while the ``control``
socket in the pipe directory is the one the daemon made (``socket_identity``): a tenant that
swaps in a socket of its own gets a down daemon, restarted in a cleaned directory, not an answer.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hardware.mps import (
    CONTROL_LOG,
    MpsControlError,
    MpsDaemonQuitError,
    MpsDaemonSpec,
    OnExit,
    clean_directory,
    make_directories,
)
from hardware.mps_ledger import (
    DaemonLedger,
    LedgerEntry,
    ProcessStamp,
    SocketId,
    is_recorded_daemon,
    open_pidfd,
    stamp_of,
)
from hardware.simulated import mps_control

START_WAIT_S = 5.0  # a started daemon must answer within this
STOP_WAIT_S = 5.0  # after ``quit``, before SIGKILL
QUIT_WAIT_S = 1.0  # for a daemon whose command failed during its start to end, if it was quit
FOREGROUND_LOG = "control.out"  # the daemon's standard output and error, in its log directory


@dataclass
class _OwnDaemon:
    """One daemon the agent started or, after a restart, took back from its ledger."""

    entry: LedgerEntry
    pidfd: int | None  # closed by the watcher once the process ended (under ``lock``)
    process: subprocess.Popen[bytes] | None = None  # None: taken back from the ledger
    on_exit: OnExit | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to this process only; False when it has ended."""
        with self.lock:
            if self.exited.is_set():
                return False
            try:
                if self.pidfd is not None:
                    signal.pidfd_send_signal(self.pidfd, signum)
                elif self.process is not None:
                    self.process.send_signal(signum)
            except ProcessLookupError:
                return False
            return True


def socket_identity(spec: MpsDaemonSpec) -> SocketId | None:
    """(device, inode) of the unix socket at ``<pipe dir>/control``; None when none is there."""
    try:
        found = os.lstat(spec.pipe_dir / mps_control.SOCKET_NAME)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISSOCK(found.st_mode) else None


def _told_to_quit(own: _OwnDaemon) -> bool:
    """Whether the agent's own child ended with status 0, as ``quit`` ends it (a crash, a kill
    or a refused start ends otherwise); waits a moment for it to end."""
    own.exited.wait(QUIT_WAIT_S)
    return own.process is not None and own.exited.is_set() and own.process.returncode == 0


def _in_start(spec: MpsDaemonSpec, own: _OwnDaemon, step: Callable[[], None]) -> None:
    """One step of a start; failing because the daemon was told to quit, it is ``MpsDaemonQuitError``."""
    try:
        step()
    except MpsControlError as exc:
        if _told_to_quit(own):
            raise MpsDaemonQuitError(
                f"MPS daemon of GPU {spec.gpu_uuid} was told to quit while it started: {exc}"
            ) from exc
        raise


def _own_socket(spec: MpsDaemonSpec, own: _OwnDaemon) -> bool:
    """Whether ``control`` is the socket the daemon made (unknown before its first answer: yes)."""
    made = own.entry.socket_id
    return made is None or socket_identity(spec) == made


class ProcessMpsDaemons:
    """Daemons as child processes, each known by the process the agent started (``ledger``: the
    file in the agent's state directory that lets the next agent take them back; None: no file)."""

    def __init__(self, command: Sequence[str], *, ledger: Path | None = None, timeout_s: float = 3.0) -> None:
        self.command = list(command)
        self.timeout_s = timeout_s
        self._ledger = DaemonLedger(ledger)
        self._recorded = self._ledger.read()  # left by the agent before: taken back at ``start``
        self._own: dict[str, _OwnDaemon] = {}
        self._lock = threading.Lock()

    # ---- the MpsDaemons protocol ---------------------------------------------------------------
    def start(self, spec: MpsDaemonSpec, *, on_exit: OnExit | None = None) -> None:
        """Keep the GPU's daemon when it is the agent's, runs and answers on its own socket;
        otherwise end it, clean the pipe directory (anything there may be a tenant's) and start a
        new one. Then wait for it to answer and set its default limits."""
        make_directories(spec)
        own = self._current(spec)
        if own is not None:
            own.on_exit = on_exit
            if not self._answers(spec):
                self._end(own)
        if own is None or own.exited.is_set():
            clean_directory(spec)
            spawned = self._spawn(spec, on_exit)
            _in_start(spec, spawned, lambda: self._await_answer(spec, spawned))
            own = spawned
        _in_start(spec, own, lambda: self._set_defaults(spec))

    def _set_defaults(self, spec: MpsDaemonSpec) -> None:
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
        """One command to the GPU's daemon: only to the agent's running daemon, on its own socket."""
        own = self._own_running(spec)
        if not _own_socket(spec, own):
            raise MpsControlError(
                f"GPU {spec.gpu_uuid}: the control socket in {spec.pipe_dir} is not the one its MPS "
                "daemon made (replaced from a share tenant's container?)"
            )
        return self._run(spec, command + "\n").strip()

    def stop(self, spec: MpsDaemonSpec) -> None:
        """``quit``; SIGKILL (to the agent's own process) when it is not gone within a few seconds."""
        with self._lock:
            own = self._own.pop(spec.gpu_uuid, None)
            self._record_locked()
        if own is None:
            return
        own.on_exit = None
        with contextlib.suppress(MpsControlError):
            self._run_if_own_socket(spec, own, "quit")
        if not own.exited.wait(STOP_WAIT_S):
            self._end(own)

    def kill(self, spec: MpsDaemonSpec) -> str:
        """SIGKILL the GPU's daemon, the process the agent started (fault injection)."""
        with self._lock:
            own = self._own.get(spec.gpu_uuid)
        if own is None or not own.signal(signal.SIGKILL):
            return f"GPU {spec.gpu_uuid}: no MPS daemon of the agent's was running"
        return f"GPU {spec.gpu_uuid}: MPS daemon {own.entry.stamp.pid} killed"

    def pid(self, spec: MpsDaemonSpec) -> int | None:
        with self._lock:
            own = self._own.get(spec.gpu_uuid)
        return None if own is None or own.exited.is_set() else own.entry.stamp.pid

    # ---- the agent's own processes -------------------------------------------------------------
    def _current(self, spec: MpsDaemonSpec) -> _OwnDaemon | None:
        """The GPU's daemon if the agent has one running: started here, or recorded in the ledger
        by the agent before and still that very process (else it is left alone, never signalled)."""
        with self._lock:
            own = self._own.get(spec.gpu_uuid)
            if own is not None and not own.exited.is_set():
                return own
            entry = self._recorded.pop(spec.gpu_uuid, None)
        if entry is None:
            return None
        pidfd = open_pidfd(entry.stamp.pid)  # first: the check below then holds for this process
        if pidfd is None or not is_recorded_daemon(entry, spec, program=self.command[-1]):
            if pidfd is not None:
                os.close(pidfd)
            return None
        return self._adopt(spec, _OwnDaemon(entry, pidfd))

    def _own_running(self, spec: MpsDaemonSpec) -> _OwnDaemon:
        with self._lock:
            own = self._own.get(spec.gpu_uuid)
        if own is None or own.exited.is_set():
            raise MpsControlError(
                f"GPU {spec.gpu_uuid}: the MPS control daemon the agent started is not running "
                f"(Cannot find MPS control daemon process on {spec.pipe_dir})"
            )
        return own

    def _answers(self, spec: MpsDaemonSpec) -> bool:
        try:
            self.query(spec)
        except MpsControlError:
            return False
        return True

    def _spawn(self, spec: MpsDaemonSpec, on_exit: OnExit | None) -> _OwnDaemon:
        try:
            with open(spec.log_dir / FOREGROUND_LOG, "ab") as output:
                process = subprocess.Popen(
                    [*self.command, "-f"],
                    env=self._env(spec),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a signal to the agent's process group does not reach it
                )
        except OSError as exc:
            raise MpsControlError(f"MPS control for GPU {spec.gpu_uuid} ({self.command[0]}): {exc}") from exc
        # a process that ended already has no stamp: one no agent can take back (no boot id)
        stamp = stamp_of(process.pid) or ProcessStamp(process.pid, 0, "")
        own = _OwnDaemon(LedgerEntry(stamp, spec.pipe_dir, None), open_pidfd(process.pid), process, on_exit)
        return self._adopt(spec, own)

    def _adopt(self, spec: MpsDaemonSpec, own: _OwnDaemon) -> _OwnDaemon:
        with self._lock:
            self._own[spec.gpu_uuid] = own
            self._record_locked()
        name = f"mps-{spec.gpu_uuid[:12]}"
        threading.Thread(target=self._watch, args=(own,), name=name, daemon=True).start()
        return own

    def _watch(self, own: _OwnDaemon) -> None:
        """Wait for the process to end (reaping it when it is the agent's child), then report it."""
        if own.process is not None:
            own.process.wait()
        elif own.pidfd is not None:
            poller = select.poll()
            poller.register(own.pidfd, select.POLLIN)
            while not poller.poll(None):
                continue
        with own.lock:
            own.exited.set()
            if own.pidfd is not None:
                os.close(own.pidfd)
                own.pidfd = None
        callback = own.on_exit
        if callback is not None:
            callback()

    def _await_answer(self, spec: MpsDaemonSpec, own: _OwnDaemon) -> None:
        deadline = time.monotonic() + START_WAIT_S
        while True:
            try:
                self.query(spec)
                break
            except MpsControlError:
                if own.exited.is_set() or time.monotonic() > deadline:
                    self._end(own)
                    raise MpsControlError(
                        f"MPS control daemon for GPU {spec.gpu_uuid} "
                        f"{'exited' if own.exited.is_set() else 'did not answer'} on {spec.pipe_dir} "
                        f"within {START_WAIT_S:g} s; see {spec.log_dir / CONTROL_LOG} and "
                        f"{spec.log_dir / FOREGROUND_LOG}"
                    ) from None
                time.sleep(0.02)
        made = socket_identity(spec)
        with self._lock:
            own.entry = replace(own.entry, socket_id=made)
            self._record_locked()

    def _end(self, own: _OwnDaemon) -> None:
        """SIGKILL the agent's own process and wait until it is gone."""
        own.on_exit = None
        own.signal(signal.SIGKILL)
        own.exited.wait(STOP_WAIT_S)

    def _record_locked(self) -> None:
        entries = {**self._recorded, **{uuid: own.entry for uuid, own in self._own.items()}}
        self._ledger.write(entries)

    # ---- the control program ----------------------------------------------------------------
    def _run_if_own_socket(self, spec: MpsDaemonSpec, own: _OwnDaemon, command: str) -> None:
        if _own_socket(spec, own) and not own.exited.is_set():
            self._run(spec, command + "\n")

    def _env(self, spec: MpsDaemonSpec) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": spec.gpu_uuid,
            mps_control.PIPE_ENV: str(spec.pipe_dir),
            mps_control.LOG_ENV: str(spec.log_dir),
        }

    def _run(self, spec: MpsDaemonSpec, stdin: str) -> str:
        try:
            done = subprocess.run(
                self.command,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(spec),
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsControlError(f"MPS control for GPU {spec.gpu_uuid} ({self.command[0]}): {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise MpsControlError(f"MPS control for GPU {spec.gpu_uuid}: {detail}")
        return done.stdout
