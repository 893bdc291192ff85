"""The agent's own record of the MPS daemons it started, and the test that a process is one of them.

The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe directory, which every share
tenant of that GPU has mounted read-write, so a tenant can put any pid there (another GPU's
daemon, a process of its own): the agent never acts on it. It keeps the process it started
(``hardware/mps_process.py``) and, for the agent that runs after a restart, one entry per daemon
in ``STATE_DIR/mps-daemons.json``: the agent's state directory, which no container has mounted,
replaced atomically.

An entry holds a *stamp*: the pid, the process's start time (clock ticks after boot, field 22 of
``/proc/<pid>/stat``) and the boot id. A pid that now names another process (reused, or after a
reboot) has another start time or boot id, and a tenant cannot make a process of its own take a
recorded pid with the recorded start time. The command line (an MPS control program), the
environment (that GPU's ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES``) and the owner
(the agent's user) are checked too; a tenant could copy those on a node whose agent sees the
host's processes (``hostPID``), which is why the stamp comes first.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from devicemodel.state_file import replace_file_atomically
from hardware.mps import DEFAULT_BINARY, MpsDaemonSpec, is_mps_control
from hardware.simulated import mps_control

log = logging.getLogger(__name__)

LEDGER_FILE = "mps-daemons.json"
SocketId = tuple[int, int]  # (st_dev, st_ino) of the control socket the daemon made


@dataclass(frozen=True)
class ProcessStamp:
    """One process, told apart from any later process that gets the same pid."""

    pid: int
    start_ticks: int
    boot_id: str


@dataclass(frozen=True)
class LedgerEntry:
    stamp: ProcessStamp
    pipe_dir: Path
    socket_id: SocketId | None  # None until the daemon answered (or where it makes no `control`)


def boot_id(proc_root: Path = Path("/proc")) -> str:
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def stamp_of(pid: int, *, proc_root: Path = Path("/proc")) -> ProcessStamp | None:
    """The process's stamp now; None when no process has that pid."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": field 3 on
    try:
        return ProcessStamp(pid, int(fields[19]), boot_id(proc_root))
    except (IndexError, ValueError):
        return None


def runs_daemon_for(
    pid: int, spec: MpsDaemonSpec, *, program: str = DEFAULT_BINARY, proc_root: Path = Path("/proc")
) -> bool:
    """Whether process ``pid`` is an MPS control program of the agent's user serving ``spec``'s GPU."""
    root = proc_root / str(pid)
    try:
        owner = root.stat().st_uid
        environ = (root / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    variables = dict(item.decode(errors="replace").partition("=")[::2] for item in environ if item)
    return (
        owner == os.geteuid()
        and is_mps_control(pid, program=program, proc_root=proc_root)
        and variables.get(mps_control.PIPE_ENV) == str(spec.pipe_dir)
        and variables.get("CUDA_VISIBLE_DEVICES") == spec.gpu_uuid
    )


def is_recorded_daemon(
    entry: LedgerEntry, spec: MpsDaemonSpec, *, program: str, proc_root: Path = Path("/proc")
) -> bool:
    """Whether the entry's process still runs, is the very process recorded, and serves ``spec``."""
    return (
        entry.pipe_dir == spec.pipe_dir
        and bool(entry.stamp.boot_id)
        and stamp_of(entry.stamp.pid, proc_root=proc_root) == entry.stamp
        and runs_daemon_for(entry.stamp.pid, spec, program=program, proc_root=proc_root)
    )


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (a signal through it reaches that process or none); None where the
    kernel has no pidfd_open (before Linux 5.3)."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class _EntryWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pid: int = Field(gt=0)
    start_ticks: int = Field(ge=0)
    boot_id: str = Field(max_length=64)
    pipe_dir: str = Field(max_length=4096)
    socket: tuple[int, int] | None = None


class _LedgerWire(BaseModel):
    model_config = ConfigDict(extra="forbid")
    daemons: dict[str, _EntryWire] = Field(default_factory=dict)


class DaemonLedger:
    """``STATE_DIR/mps-daemons.json``: GPU UUID -> the daemon the agent started for it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def read(self) -> dict[str, LedgerEntry]:
        """The recorded daemons; none (with a warning) when the file is missing or unreadable:
        the agent then starts new daemons rather than trusting a process it cannot tell apart."""
        if self.path is None or not self.path.exists():
            return {}
        try:
            wire = _LedgerWire.model_validate_json(self.path.read_bytes())
        except (OSError, ValidationError) as exc:
            log.warning("MPS daemon ledger %s is unreadable (%s): no daemon is kept", self.path, exc)
            return {}
        return {uuid: _from_wire(entry) for uuid, entry in wire.daemons.items()}

    def write(self, entries: Mapping[str, LedgerEntry]) -> None:
        if self.path is None:
            return
        wire = _LedgerWire(daemons={uuid: _to_wire(entry) for uuid, entry in entries.items()})
        payload = json.dumps(wire.model_dump(), indent=2, sort_keys=True).encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_file_atomically(self.path, payload)
        except OSError as exc:  # the daemons still run; only an adoption after a restart is lost
            log.error("cannot write the MPS daemon ledger %s: %s", self.path, exc)


def _from_wire(entry: _EntryWire) -> LedgerEntry:
    stamp = ProcessStamp(entry.pid, entry.start_ticks, entry.boot_id)
    return LedgerEntry(stamp, Path(entry.pipe_dir), entry.socket)


def _to_wire(entry: LedgerEntry) -> _EntryWire:
    stamp = entry.stamp
    return _EntryWire(
        pid=stamp.pid,
        start_ticks=stamp.start_ticks,
        boot_id=stamp.boot_id,
        pipe_dir=str(entry.pipe_dir),
        socket=entry.socket_id,
    )
