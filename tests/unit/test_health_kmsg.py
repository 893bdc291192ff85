"""Kernel-log parsing (Xid, MIG Xid, fallen off the bus, SXid) and the persisted tail cursor."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware.simulated.health_calls import xid_kernel_line as xid_line
from health.signals.kmsg import KernelLogTail, KernelSxid, KernelXid, parse_line, pci_key


@pytest.mark.parametrize(
    ("line", "pci", "xid", "gi", "ci"),
    [
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            (0, 0x3B, 0),
            79,
            None,
            None,
        ),
        ("[ 1234.567] NVRM: Xid (0000:03:00): 14, Channel 00000001", (0, 3, 0), 14, None, None),
        (
            "6,1092,4351001,-;NVRM: Xid (PCI:0000:05:00): 48, pid='<unknown>', name=<unknown>, DBE",
            (0, 5, 0),
            48,
            None,
            None,
        ),
        ("NVRM: Xid (PCI:0000:4e:00 GPU-I:05 GPU-CI:01): 31, pid=77, MMU Fault", (0, 0x4E, 0), 31, 5, 1),
        ("NVRM: Xid (PCI:0000:4e:00 GPU-I:02): 43, pid=77, Ch 0008", (0, 0x4E, 0), 43, 2, None),
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", (0, 0x18, 0), 79, None, None),
        ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", (0, 1, 0), 79, None, None),
        (
            "NVRM: The NVIDIA GPU 0000:18:00.0 has fallen off the bus and is not responding",
            (0, 0x18, 0),
            79,
            None,
            None,
        ),
        (
            "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4",
            (9, 1, 0),
            154,
            None,
            None,
        ),
    ],
)
def test_parse_xid_lines(
    line: str, pci: tuple[int, int, int], xid: int, gi: int | None, ci: int | None
) -> None:
    record = parse_line(line)
    assert isinstance(record, KernelXid)
    assert (record.pci, record.xid, record.gpu_instance, record.compute_instance) == (pci, xid, gi, ci)


def test_nvlink5_fatal_token() -> None:
    fatal = parse_line(
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x0)"
    )
    nonfatal = parse_line("NVRM: Xid (PCI:0018:01:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 02 (0x0 0x0)")
    assert isinstance(fatal, KernelXid) and not fatal.nonfatal_hint
    assert isinstance(nonfatal, KernelXid) and nonfatal.nonfatal_hint


@pytest.mark.parametrize(
    ("line", "sxid", "fatal"),
    [
        (
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress PRIV error",
            12028,
            False,
        ),
        ("nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up", 20034, True),
    ],
)
def test_parse_sxid(line: str, sxid: int, fatal: bool) -> None:
    record = parse_line(line)
    assert isinstance(record, KernelSxid)
    assert (record.sxid, record.fatal) == (sxid, fatal)


@pytest.mark.parametrize(
    "line",
    ["", "usb 1-1: new high-speed USB device", "NVRM: loading NVIDIA UNIX driver", "NVRM: Xid garbage"],
)
def test_other_lines_are_not_records(line: str) -> None:
    assert parse_line(line) is None


def test_pci_key_normalises_nvml_and_kernel_forms() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == pci_key("PCI:0000:3b:00") == (0, 0x3B, 0)
    with pytest.raises(ValueError, match="not a PCI address"):
        pci_key("3b:00")


def test_xid_line_round_trips() -> None:
    record = parse_line(xid_line("00000000:53:00.0", 31, "MMU Fault", gpu_instance=3, compute_instance=0))
    assert isinstance(record, KernelXid)
    assert (record.pci, record.xid, record.gpu_instance, record.compute_instance) == ((0, 0x53, 0), 31, 3, 0)


def xids(tail: KernelLogTail) -> list[int]:
    """Read new lines, mark each handled, save the cursor: the Xids seen (as the monitor reads)."""
    found = []
    for line in tail.read_new():
        if isinstance(record := parse_line(line.text), KernelXid):
            found.append(record.xid)
        tail.handled(line)
    tail.save()
    return found


def test_tail_reads_only_new_complete_lines_and_survives_restart(tmp_path: Path) -> None:
    log, cursor = tmp_path / "kmsg", tmp_path / "cursor.json"
    log.write_text(xid_line("0000:05:00", 79, "off the bus") + "\n")
    tail = KernelLogTail(log, cursor_file=cursor)
    assert tail.fresh_start
    assert xids(tail) == [79]
    with log.open("a") as handle:
        handle.write(xid_line("0000:05:00", 48, "DBE") + "\n" + "NVRM: Xid (PCI:0000:05:00): 4")
    assert xids(tail) == [48]
    restarted = KernelLogTail(log, cursor_file=cursor)
    assert not restarted.fresh_start
    with log.open("a") as handle:
        handle.write("3, pid=1, partial line completed\n")
    assert xids(restarted) == [43]


def test_tail_starts_over_after_rotation_and_tolerates_missing_log(tmp_path: Path) -> None:
    log, cursor = tmp_path / "kmsg", tmp_path / "cursor.json"
    tail = KernelLogTail(log, cursor_file=cursor)
    assert tail.read_new() == []
    log.write_text("filler line that is long enough\n" * 4)
    xids(tail)
    log.write_text(xid_line("0000:07:00", 95, "uncontained") + "\n")
    assert xids(tail) == [95]


def test_cursor_is_dropped_after_a_reboot(tmp_path: Path) -> None:
    log, cursor, boot = tmp_path / "kmsg", tmp_path / "cursor.json", tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    log.write_text(xid_line("0000:05:00", 79, "off the bus") + "\n")
    xids(KernelLogTail(log, cursor_file=cursor, boot_id_file=boot))
    assert not KernelLogTail(log, cursor_file=cursor, boot_id_file=boot).fresh_start
    boot.write_text("boot-2\n")
    after_reboot = KernelLogTail(log, cursor_file=cursor, boot_id_file=boot)
    assert after_reboot.fresh_start
    assert xids(after_reboot) == [79]


def test_cursor_moves_only_past_handled_lines(tmp_path: Path) -> None:
    log, cursor = tmp_path / "kmsg", tmp_path / "cursor.json"
    lines = [xid_line("0000:05:00", x, "fault") for x in (13, 48, 79)]
    log.write_text("\n".join(lines) + "\n")
    tail = KernelLogTail(log, cursor_file=cursor)
    first, *_ = tail.read_new()
    tail.handled(first)  # the reader stopped after one line (it died)
    tail.save()
    assert [parse_line(line.text).xid for line in tail.read_new()] == [48, 79]  # type: ignore[union-attr]
    restarted = KernelLogTail(log, cursor_file=cursor)
    assert [parse_line(line.text).xid for line in restarted.read_new()] == [48, 79]  # type: ignore[union-attr]


def test_an_xid_number_of_5000_digits_is_a_bad_line() -> None:
    with pytest.raises(ValueError, match="Xid number of 5000 digits"):
        parse_line("NVRM: Xid (PCI:0000:05:00): " + "9" * 5000 + ", pid=1, junk")


def test_xid_154_carries_the_recovery_action() -> None:
    record = parse_line(
        "NVRM: Xid (PCI:0009:01:00): 154, "
        "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    )
    assert isinstance(record, KernelXid)
    assert (record.xid, record.recovery_action) == (154, 4)
