"""Atomic state files: the whole new content or the old, and no temporary file left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devicemodel.state_file import replace_file_atomically, write_json_atomically
from tests.support.small_fs import FILLER, fill, small_tmpfs


def test_json_is_written_sorted_with_the_indent_and_no_temporary_file_remains(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomically(path, {"b": 1, "a": [2]}, indent=1)
    assert path.read_text() == json.dumps({"a": [2], "b": 1}, indent=1, sort_keys=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_replace_overwrites_the_old_content_and_syncs_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "journal.json"
    path.write_bytes(b"old")
    replace_file_atomically(path, b"new", sync_directory=True)
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


def test_a_refused_rename_leaves_the_old_state_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    target.mkdir()  # a directory where the file goes: the rename is refused
    (target / "inside").write_text("x")
    with pytest.raises(OSError):
        replace_file_atomically(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


def test_a_full_disk_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small") as directory:
        path = directory / "gpuweave-gpu.json"
        path.write_bytes(b"old")
        fill(directory)
        with pytest.raises(OSError):
            replace_file_atomically(path, b"x" * 65536)
        assert path.read_bytes() == b"old"
        assert sorted(p.name for p in directory.iterdir()) == sorted([FILLER, "gpuweave-gpu.json"])
