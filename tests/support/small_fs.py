"""A small tmpfs for the full-disk and read-only state-directory cases, on the real filesystem layer.

Writes into it fail the way they fail on a full or read-only volume (``ENOSPC`` from the kernel,
``EROFS`` after a read-only remount), so the code under test meets the real errors. Mounting
needs root (CAP_SYS_ADMIN); elsewhere the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = "filler"


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30, check=False)


@contextlib.contextmanager
def small_tmpfs(path: Path, *, size_kib: int = 256) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` KiB at ``path`` (created) for the block; unmount after."""
    path.mkdir(parents=True, exist_ok=True)
    done = _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path} ({done.stderr.strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def fill(path: Path) -> None:
    """Use every free byte of the filesystem holding ``path`` (a file named ``filler``)."""
    with open(path / FILLER, "ab", buffering=0) as handle:
        for size in (1 << 16, 4096, 1):  # big writes first, then the last partial page
            try:
                while handle.write(b"\0" * size):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


def free(path: Path) -> None:
    """Give the space back (remove ``filler``)."""
    (path / FILLER).unlink(missing_ok=True)


def remount_read_only(path: Path) -> None:
    done = _mount("-o", "remount,ro", str(path))
    assert done.returncode == 0, done.stderr
