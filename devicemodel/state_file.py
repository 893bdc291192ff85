"""Persistent state files written atomically: a crash leaves the old file or the new one, never half.

The node agent's status file, the health state files and the MIG journal all write this way
(temporary file beside the target, fsync, ``os.replace``), so the sequence lives here, below
every package that keeps state. Standard library only: no transport or hardware library.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def replace_file_atomically(path: Path, payload: bytes, *, sync_directory: bool = False) -> None:
    """Replace ``path`` with ``payload``: write a temporary file beside it, fsync it, rename it over.

    The temporary name carries the writing thread's id, so two threads writing the same file never
    share one; a write that fails (a full disk, a rename refused) removes it before the error goes
    on. ``sync_directory`` also fsyncs the directory, making the rename itself durable.
    """
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk or a refused rename leaves no temporary file
            os.unlink(tmp)
        raise
    if sync_directory:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_json_atomically(path: Path, data: Any, *, indent: int = 2, sync_directory: bool = False) -> None:
    """``data`` as JSON (keys sorted) in ``path``, replaced atomically (``replace_file_atomically``)."""
    payload = json.dumps(data, indent=indent, sort_keys=True).encode()
    replace_file_atomically(path, payload, sync_directory=sync_directory)
