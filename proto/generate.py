"""Regenerate the Python stubs of the kubelet APIs we speak from their ``.proto`` files.

The kubelet APIs: the device-plugin API (``proto/v1beta1/api.proto``, package ``v1beta1``), the
pod-resources API (``proto/podresources/v1/api.proto``, package ``v1``), the DRA plugin API
(``proto/dra/v1`` and ``proto/dra/v1beta1``, packages ``k8s.io.kubelet.pkg.apis.dra.v1[beta1]``), its
resource-health API (``proto/dra/health/v1``, package ``v1``) and
the plugin watcher's registration API (``proto/pluginregistration/v1``, package ``pluginregistration``). Run
``python -m proto.generate`` from the repository root after editing a ``.proto``. The stubs are
committed so installs need no code generator; ``tests/unit/test_deviceplugin_proto.py``
regenerates into a temporary directory and fails when a committed file is stale or missing.

The protos are compiled with the repository root as include path, so generated modules import each
other as ``proto.v1beta1.api_pb2`` and work as ``from proto.v1beta1 import api_pb2, api_pb2_grpc``
(and ``from proto.podresources.v1 import api_pb2, api_pb2_grpc``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = (
    "proto/v1beta1/api.proto",
    "proto/podresources/v1/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/dra/health/v1/api.proto",
    "proto/pluginregistration/v1/api.proto",
)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _plugin_path(name: str) -> str | None:
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(name)


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into ``out_root`` (mirroring the repository layout); return the files."""
    from grpc_tools import protoc  # noqa: PLC0415 (dev dependency, needed only when generating)

    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
    ]
    mypy_plugin, mypy_grpc_plugin = _plugin_path("protoc-gen-mypy"), _plugin_path("protoc-gen-mypy_grpc")
    if mypy_plugin and mypy_grpc_plugin:
        args += [
            f"--plugin=protoc-gen-mypy={mypy_plugin}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}",
            f"--mypy_out={out_root}",
            f"--mypy_grpc_out={out_root}",
        ]
    args += [str(REPO_ROOT / name) for name in PROTO_FILES]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status} for {', '.join(PROTO_FILES)}")
    generated_dirs = {(out_root / name).parent for name in PROTO_FILES}
    return sorted(p for d in generated_dirs for p in d.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repository)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
