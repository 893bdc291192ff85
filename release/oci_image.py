"""OCI image archives built from files, without a container engine or registry.

The realnode e2e tier imports these into containerd (``ctr images import``): an OCI image layout
(``oci-layout``, ``index.json``, ``blobs/sha256/``) in one tar, one uncompressed layer holding the
given files, the image config (entrypoint, environment) and the manifest. Every timestamp, owner
and order is fixed, so the same files give the same image digest on every machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
PLATFORM = {"architecture": "amd64", "os": "linux"}


@dataclass(frozen=True)
class ImageFile:
    """One file of the layer: where it comes from on this machine and its mode in the image."""

    source: Path
    mode: int = 0o755


def _add(tar: tarfile.TarFile, name: str, data: bytes, *, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, 0, 0
    tar.addfile(info, io.BytesIO(data))


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
    return info


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def layer_tar(files: Mapping[str, ImageFile], dirs: Sequence[str] = ()) -> bytes:
    """An uncompressed layer: ``dirs`` (created empty) and ``files`` by their path in the image."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs):
            _dir(tar, name.strip("/"))
        for name in sorted(files):
            item = files[name]
            _add(tar, name.strip("/"), item.source.read_bytes(), mode=item.mode)
    return buffer.getvalue()


def layer_from_dir(root: Path, out: Path) -> str:
    """Write ``root``'s tree as an uncompressed layer to ``out`` (directories, files, symlinks;
    owner root, time 0, modes kept; sorted); returns its digest (``sha256:...``)."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            elif info.isdir() or info.issym():
                tar.addfile(info)
    return _file_digest(out)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _descriptor(media_type: str, blob: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        **extra,
    }


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(
    out: Path,
    *,
    name: str,
    files: Mapping[str, ImageFile],
    entrypoint: Sequence[str],
    cmd: Sequence[str] = (),
    env: Sequence[str] = ("PATH=/",),
    dirs: Sequence[str] = ("tmp", "dev", "proc", "sys", "etc"),
    base_layers: Sequence[Path] = (),
) -> str:
    """Write the image ``name`` (``registry/repo:tag``) to ``out``; returns its manifest digest.
    ``base_layers`` (uncompressed layer files, e.g. from ``layer_from_dir``) go below the layer
    of ``files`` and ``dirs``."""
    layer = layer_tar(files, dirs)
    below = [(path, _file_digest(path), path.stat().st_size) for path in base_layers]
    layer_ids = [d for _, d, _ in below] + ["sha256:" + hashlib.sha256(layer).hexdigest()]
    config = _json(
        {
            **PLATFORM,
            "config": {"Entrypoint": list(entrypoint), "Cmd": list(cmd), "Env": list(env), "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": layer_ids},
        }
    )
    descriptors = [{"mediaType": LAYER_TYPE, "digest": d, "size": n} for _, d, n in below]
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": _descriptor(CONFIG_TYPE, config),
            "layers": [*descriptors, _descriptor(LAYER_TYPE, layer)],
        }
    )
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [_descriptor(MANIFEST_TYPE, manifest, platform=PLATFORM, annotations=annotations)],
        }
    )
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add(tar, "index.json", index)
        _dir(tar, "blobs")
        _dir(tar, "blobs/sha256")
        for path, digest, _ in below:
            tar.add(str(path), arcname="blobs/sha256/" + digest.removeprefix("sha256:"), filter=_normalized)
        for blob in (layer, config, manifest):
            _add(tar, "blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)
    return "sha256:" + hashlib.sha256(manifest).hexdigest()
