"""Kernel-log signals: NVRM Xid lines, fallen-off-the-bus lines and NVSwitch SXid lines.

The kernel log is the fallback when NVML events are missed and the only record of what happened
before the agent registered for events (NVML does not replay older events). ``parse_line`` is pure
and raises ``ValueError`` for a line that looks like a record but cannot be one (an Xid number of
5,000 digits, a bad PCI address). ``KernelLogTail`` hands out new lines one by one with the
position after each; the reader marks each line handled once it acted on it (or counted and
skipped it), and only handled lines move the saved cursor, so a restarted agent reads again
exactly what it had not finished.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from health.persist import StateWriter, read_json

PciKey = tuple[int, int, int]  # (domain, bus, device): Xid lines carry no function number

_PREFIX = re.compile(r"^(?:<\d+>)?(?:\d+,\d+,\d+,[^;]*;)?\s*(?:\[\s*[\d.]+\]\s*)?")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)"
    r"(?:\s+GPU-I:(?P<gi>\d+))?(?:\s+GPU-CI:(?P<ci>\d+))?[^)]*\).*?: (?P<xid>\d+),(?P<rest>.*)$"
)
_OFF_BUS = re.compile(
    r"NVRM: (?:The NVIDIA GPU|GPU at|GPU) (?:PCI:)?(?P<pci>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.\d)?"
    r"\b.*fallen off the bus"
)
_SXID = re.compile(
    r"nvidia-nvswitch\d*: SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+)(?:\.\d)?\): "
    r"(?P<sxid>\d+), (?P<kind>Non-fatal|Fatal)"
)
_FATAL_TOKEN = re.compile(r"\b(Fatal|Nonfatal)\b")
_RECOVERY = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<action>[0-9a-fA-F]+)")

FALLEN_OFF_BUS_XID = 79
MAX_XID_DIGITS = 6  # Xids are below 1,000 today; a longer number is a corrupt line, not a new Xid
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def pci_key(address: str) -> PciKey:
    """(domain, bus, device) of ``0000:3b:00``, ``00000000:3B:00.0`` or ``PCI:0000:3b:00``."""
    parts = address.removeprefix("PCI:").split(".")[0].split(":")
    if len(parts) != 3:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, device = (int(p, 16) for p in parts)
    return domain, bus, device


@dataclass(frozen=True)
class KernelXid:
    pci: PciKey
    xid: int
    gpu_instance: int | None
    compute_instance: int | None
    nonfatal_hint: bool  # the line says "Nonfatal" (NVLink5 144-150)
    text: str
    recovery_action: int | None = None  # Xid 154: the action the driver now recommends


@dataclass(frozen=True)
class KernelSxid:
    pci: PciKey
    sxid: int
    fatal: bool
    text: str


KernelRecord = KernelXid | KernelSxid


def parse_line(line: str) -> KernelRecord | None:
    """One kernel-log line (plain, ``dmesg`` or ``/dev/kmsg`` framing) as a record, or None."""
    text = _PREFIX.sub("", line.strip(), count=1)
    if (match := _XID.search(text)) is not None:
        if len(match["xid"]) > MAX_XID_DIGITS:
            raise ValueError(f"Xid number of {len(match['xid'])} digits (at most {MAX_XID_DIGITS})")
        token = _FATAL_TOKEN.search(match["rest"])
        recovery = _RECOVERY.search(match["rest"])
        return KernelXid(
            pci=pci_key(match["pci"]),
            xid=int(match["xid"]),
            gpu_instance=int(match["gi"]) if match["gi"] else None,
            compute_instance=int(match["ci"]) if match["ci"] else None,
            nonfatal_hint=token is not None and token[1] == "Nonfatal",
            text=text,
            recovery_action=int(recovery["action"], 16) if recovery else None,
        )
    if (match := _OFF_BUS.search(text)) is not None:
        return KernelXid(pci_key(match["pci"]), FALLEN_OFF_BUS_XID, None, None, False, text)
    if (match := _SXID.search(text)) is not None:
        return KernelSxid(pci_key(match["pci"]), int(match["sxid"]), match["kind"] == "Fatal", text)
    return None


@dataclass(frozen=True)
class KernelLine:
    """One kernel-log line and the cursor just past it (byte offset in a file, or kmsg sequence)."""

    text: str
    offset: int
    seq: int


class KernelLogTail:
    """New kernel-log lines since the last handled one, from a file or ``/dev/kmsg``, with a cursor.

    For a file the cursor is a byte offset (a file shorter than the cursor was rotated: start over);
    for ``/dev/kmsg`` it is the last sequence number handled. ``read_new`` starts at the cursor;
    ``handled(line)`` moves it past one line; ``save()`` persists it (through a ``StateWriter``: a
    failed write keeps it in memory and is retried). The cursor is kept with the boot ID and
    dropped after a reboot. ``fresh_start`` is True when no cursor applied, i.e. what the first
    read returns happened before the agent ran on this boot (boot history).
    """

    def __init__(
        self,
        path: Path,
        *,
        cursor_file: Path,
        boot_id_file: Path = BOOT_ID_FILE,
        writer: StateWriter | None = None,
    ) -> None:
        self._path = path
        self._cursor_file = cursor_file
        self._writer = writer or StateWriter()
        self._boot_id = _read_text(boot_id_file)
        saved = read_json(cursor_file)
        if isinstance(saved, dict) and saved.get("boot") != self._boot_id:
            saved = None  # the machine rebooted: the kernel log (and its sequence numbers) started over
        self.fresh_start = not isinstance(saved, dict)
        self._offset = int(saved.get("offset", 0)) if isinstance(saved, dict) else 0
        self._seq = int(saved.get("seq", -1)) if isinstance(saved, dict) else -1

    def read_new(self) -> list[KernelLine]:
        """Complete lines after the cursor (the cursor does not move); a missing log yields nothing."""
        try:
            mode = os.stat(self._path).st_mode
        except FileNotFoundError:
            return []
        return self._read_kmsg() if stat.S_ISCHR(mode) else self._read_file()

    def handled(self, line: KernelLine) -> None:
        """The reader is done with ``line`` (acted on, or counted and skipped): move the cursor past it."""
        self._offset, self._seq = line.offset, line.seq

    def save(self) -> bool:
        """Persist the cursor; False when the disk refused (kept in memory, retried by the writer)."""
        cursor = {"offset": self._offset, "seq": self._seq, "boot": self._boot_id}
        return self._writer.write(self._cursor_file, cursor)

    def _read_file(self) -> list[KernelLine]:
        with self._path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size < self._offset:
                self._offset = 0
            handle.seek(self._offset)
            data = handle.read()
        lines, offset = [], self._offset
        for raw in data[: data.rfind(b"\n") + 1].splitlines(keepends=True):
            offset += len(raw)
            lines.append(KernelLine(raw.decode("utf-8", errors="replace").rstrip("\r\n"), offset, self._seq))
        return lines

    def _read_kmsg(self) -> list[KernelLine]:
        lines: list[KernelLine] = []
        fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True:
                try:
                    record = os.read(fd, 8192).decode("utf-8", errors="replace")
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten while we read: keep going
                        continue
                    if exc.errno == errno.EAGAIN:
                        break
                    raise
                seq = _kmsg_seq(record, after=lines[-1].seq if lines else self._seq)
                if seq > self._seq:
                    lines.append(KernelLine(record, self._offset, seq))
        finally:
            os.close(fd)
        return lines


def _kmsg_seq(record: str, *, after: int) -> int:
    """The sequence number of a ``/dev/kmsg`` record (``PRI,SEQ,TIME,FLAGS;text``)."""
    fields = record.split(",", 2)
    if len(fields) == 3 and fields[1].isascii() and fields[1].isdigit() and len(fields[1]) <= 20:
        return int(fields[1])
    return after + 1


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""
