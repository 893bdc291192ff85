"""A simulated ``nvidia-cuda-mps-control``: the same command line, environment and files.

Run as ``python hardware/simulated/mps_control.py [-d | -f]`` (a plain script: it imports only the
standard library, so a control query costs one small interpreter start, as the real client is one
small binary). It behaves as NVIDIA documents the real program:

- ``-d`` starts the control daemon in the background and returns at once; ``-f`` runs it in the
  foreground. The daemon serves ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``): a unix
  socket ``control`` there and the pid file ``nvidia-cuda-mps-control.pid``; it appends to
  ``control.log`` in ``$CUDA_MPS_LOG_DIRECTORY`` (default ``/var/log/nvidia-mps``). A second daemon
  on a pipe directory that one already serves refuses to start.
- With no option it is the control client: it reads commands from standard input, one a line,
  and prints each answer (``echo get_server_list | nvidia-cuda-mps-control``). Without a daemon on
  the pipe directory it says so and exits 1.
- Commands: ``get_server_list``, ``start_server -uid UID``, ``get_client_list PID``,
  ``get_default_active_thread_percentage``, ``set_default_active_thread_percentage N``,
  ``get_default_device_pinned_mem_limit DEV``, ``set_default_device_pinned_mem_limit DEV VALUE``
  and ``quit``. There are no CUDA clients here, so a server exists only once ``start_server``
  asked for one (its pid is a number the daemon hands out, not a process).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
SOCKET_NAME = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_LOG = "control.log"
END = b"\0"  # ends one answer on the socket


@dataclass
class DaemonState:
    """What one control daemon holds: its default limits and the servers it started."""

    thread_percentage: float = 100.0
    pinned_limits: dict[str, str] = field(default_factory=dict)
    servers: dict[int, int] = field(default_factory=dict)  # server pid -> uid
    next_pid: int = 0
    stopping: bool = False

    def answer(self, line: str) -> str:
        """The text the real daemon prints for one command line."""
        words = line.split()
        if not words:
            return ""
        verb, args = words[0], words[1:]
        handler = _HANDLERS.get(verb)
        if handler is None:
            return f"Unrecognized command: {verb}"
        try:
            return handler(self, args)
        except (IndexError, ValueError):
            return f"Invalid arguments for {verb}: {' '.join(args)}"


def _server_list(state: DaemonState, args: list[str]) -> str:
    return "\n".join(str(pid) for pid in state.servers)


def _start_server(state: DaemonState, args: list[str]) -> str:
    if args[0] != "-uid":
        raise ValueError(args[0])
    state.next_pid += 1
    pid = os.getpid() * 100 + state.next_pid
    state.servers[pid] = int(args[1])
    return ""


def _client_list(state: DaemonState, args: list[str]) -> str:
    return "" if int(args[0]) in state.servers else f"Server {args[0]} not found"


def _get_percentage(state: DaemonState, args: list[str]) -> str:
    return f"{state.thread_percentage:.1f}"


def _set_percentage(state: DaemonState, args: list[str]) -> str:
    value = float(args[0])
    if not 0 < value <= 100:
        raise ValueError(args[0])
    state.thread_percentage = value
    return f"{value:.1f}"


def _get_pinned(state: DaemonState, args: list[str]) -> str:
    return state.pinned_limits.get(str(int(args[0])), "0")


def _set_pinned(state: DaemonState, args: list[str]) -> str:
    device, value = str(int(args[0])), args[1]
    if not value[:-1].isdigit() or value[-1] not in "MG":
        raise ValueError(value)
    state.pinned_limits[device] = value
    return ""


def _quit(state: DaemonState, args: list[str]) -> str:
    state.stopping = True
    return ""


_HANDLERS = {
    "get_server_list": _server_list,
    "start_server": _start_server,
    "get_client_list": _client_list,
    "get_default_active_thread_percentage": _get_percentage,
    "set_default_active_thread_percentage": _set_percentage,
    "get_default_device_pinned_mem_limit": _get_pinned,
    "set_default_device_pinned_mem_limit": _set_pinned,
    "quit": _quit,
}


def _directories() -> tuple[Path, Path]:
    pipe = Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE_DIR)
    logs = Path(os.environ.get(LOG_ENV) or DEFAULT_LOG_DIR)
    return pipe, logs


def _log(log_dir: Path, text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    with (log_dir / CONTROL_LOG).open("a", encoding="utf-8") as handle:
        handle.write(f"[{stamp} Control {os.getpid()}] {text}\n")


def _already_served(path: Path) -> bool:
    """True when a live daemon answers on ``path``; a stale socket file is removed."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        path.unlink(missing_ok=True)
        return False
    finally:
        probe.close()


def serve(pipe_dir: Path, log_dir: Path) -> int:
    """Run one control daemon in this process until ``quit``; 1 when the pipe directory is served."""
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    path = pipe_dir / SOCKET_NAME
    if _already_served(path):
        _log(log_dir, f"An instance of this daemon is already running on {pipe_dir}")
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    (pipe_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    _log(log_dir, f"Starting control daemon on {path} for devices {visible}")
    state = DaemonState()
    try:
        while not state.stopping:
            connection, _ = listener.accept()
            with connection:
                _session(connection, state, log_dir)
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        (pipe_dir / PID_FILE).unlink(missing_ok=True)
        _log(log_dir, "Exit")
    return 0


def _session(connection: socket.socket, state: DaemonState, log_dir: Path) -> None:
    """Answer every command line one client sends, each answer ended by ``END``."""
    reader = connection.makefile("rb")
    for raw in reader:
        line = raw.decode(errors="replace").strip()
        if line:
            _log(log_dir, f"Command: {line}")
        connection.sendall(state.answer(line).encode() + END)
        if state.stopping:
            return


def daemonize(pipe_dir: Path, log_dir: Path) -> int:
    """``-d``: serve from a detached grandchild and return 0 at once, as the real ``-d`` does."""
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os._exit(serve(pipe_dir, log_dir))


def client(pipe_dir: Path, commands: list[str]) -> int:
    """Send each command to the daemon on ``pipe_dir`` and print its answer."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(pipe_dir / SOCKET_NAME))
    except OSError:
        print(f"Cannot find MPS control daemon process on {pipe_dir}", file=sys.stderr)
        return 1
    with connection:
        reader = connection.makefile("rb")
        for command in commands:
            connection.sendall(command.encode() + b"\n")
            answer = _read_answer(reader)
            if answer is None:
                print("MPS control daemon closed the connection", file=sys.stderr)
                return 1
            if answer:
                print(answer)
    return 0


def _read_answer(reader: object) -> str | None:
    data = bytearray()
    while True:
        byte = reader.read(1)  # type: ignore[attr-defined]
        if not byte:
            return None
        if byte == END:
            return data.decode(errors="replace")
        data += byte


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe_dir, log_dir = _directories()
    if args == ["-d"]:
        return daemonize(pipe_dir, log_dir)
    if args == ["-f"]:
        return serve(pipe_dir, log_dir)
    if args:
        print(f"usage: nvidia-cuda-mps-control [-d | -f] (got {' '.join(args)})", file=sys.stderr)
        return 2
    commands = [line.strip() for line in sys.stdin if line.strip()]
    return client(pipe_dir, commands)


if __name__ == "__main__":
    sys.exit(main())
