"""The realnode tier's image archives: an OCI layout whose blobs match their digests, named for
containerd's import, and the same bytes for the same files."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

from release.oci_image import ImageFile, write_image_archive


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_archive_is_a_named_oci_layout_whose_blobs_match_their_digests(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    program.write_bytes(b"#!/bin/true\n")
    out = tmp_path / "img.tar"
    digest = write_image_archive(
        out, name="gpuweave.test/x:2", files={"bin/prog": ImageFile(program)}, entrypoint=["/bin/prog"]
    )
    members = _members(out)
    index = json.loads(members["index.json"])
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "gpuweave.test/x:2"
    for name, blob in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(members["blobs/sha256/" + digest.removeprefix("sha256:")])
    config = json.loads(members["blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:")])
    assert config["config"]["Entrypoint"] == ["/bin/prog"]
    layer = members["blobs/sha256/" + manifest["layers"][0]["digest"].removeprefix("sha256:")]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    (tmp_path / "layer.tar").write_bytes(layer)
    with tarfile.open(tmp_path / "layer.tar") as tar:
        prog = tar.getmember("bin/prog")
        assert (prog.mode, prog.mtime, prog.uid) == (0o755, 0, 0)


def test_same_files_give_the_same_digest(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    program.write_bytes(b"x")
    first = write_image_archive(
        tmp_path / "a.tar", name="t/a:1", files={"p": ImageFile(program)}, entrypoint=["/p"]
    )
    program.touch()  # a new mtime on the source changes nothing
    again = write_image_archive(
        tmp_path / "b.tar", name="t/a:1", files={"p": ImageFile(program)}, entrypoint=["/p"]
    )
    assert first == again and (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    program.write_bytes(b"y")
    assert (
        write_image_archive(
            tmp_path / "c.tar", name="t/a:1", files={"p": ImageFile(program)}, entrypoint=["/p"]
        )
        != first
    )
