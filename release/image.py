"""The gpuweave image (node agent, extender and CLI) as an OCI archive, without a container engine.

Two layers: the base ``release/image-base.sh`` builds (Debian's python3.11 and the runtime
dependencies), and the packages the Dockerfile copies (read from its ``COPY dir/ dir/`` lines),
placed where ``pip install .`` puts them, with the ``gpuweave`` entry point. The same inputs give
the same bytes (``release.oci_image``). ``scripts/build-image`` runs it for a release; the realnode
e2e tier for its ``gpuweave.test/gpuweave:dev``.

    python -m release.image --name REGISTRY/REPO:TAG --base BASE.tar --out IMAGE.tar
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from release.oci_image import ImageFile, write_image_archive

REPO = Path(__file__).resolve().parents[1]
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"  # Debian's python3.11 reads it
PACKAGE_DATA = (".py", ".yaml", ".proto", ".pyi")  # pyproject's package-data, plus the code
ENTRY_POINT = "#!/usr/bin/python3.11\nimport sys\nfrom gpuweave.cli import main\nsys.exit(main())\n"


def project_version(repo: Path = REPO) -> str:
    """The one version of a release: pyproject.toml's (tests/unit/test_release.py holds the chart,
    the manifests' image tags and ``gpuweave.__version__`` to it)."""
    with (repo / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def dockerfile_sources(repo: Path = REPO) -> list[str]:
    """The directories the Dockerfile copies into its build (``COPY dir/ dir/``)."""
    sources = []
    for line in (repo / "Dockerfile").read_text().splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "COPY" and words[1].endswith("/") and words[1] == words[2]:
            sources.append(words[1].rstrip("/"))
    return sources


def package_files(repo: Path = REPO) -> dict[str, ImageFile]:
    """The project's packages, at the paths pip installs them to."""
    files: dict[str, ImageFile] = {}
    for source in dockerfile_sources(repo):
        for path in sorted((repo / source).rglob("*")):
            wanted = path.suffix in PACKAGE_DATA or path.name == "py.typed"
            if path.is_file() and wanted and "__pycache__" not in path.parts:
                files[f"{SITE_PACKAGES}/{path.relative_to(repo)}"] = ImageFile(path, 0o644)
    return files


def build_image(out: Path, *, name: str, base: Path, repo: Path = REPO) -> str:
    """Write the image ``name`` to ``out`` over the base layer ``base``; its manifest digest."""
    if not base.exists():
        raise FileNotFoundError(f"{base} is missing: build it with release/image-base.sh {base}")
    with tempfile.TemporaryDirectory() as work:
        entry = Path(work) / "gpuweave-entry-point"
        entry.write_text(ENTRY_POINT)
        files = {**package_files(repo), "usr/local/bin/gpuweave": ImageFile(entry, 0o755)}
        return write_image_archive(
            out,
            name=name,
            files=files,
            entrypoint=["/usr/local/bin/gpuweave"],
            cmd=["--help"],
            env=("PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
            base_layers=[base],
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.image", description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the image's name, REGISTRY/REPO:TAG")
    parser.add_argument("--base", type=Path, required=True, help="the base layer (release/image-base.sh)")
    parser.add_argument("--out", type=Path, required=True, help="the OCI archive to write")
    args = parser.parse_args(argv)
    try:
        digest = build_image(args.out, name=args.name, base=args.base)
    except FileNotFoundError as exc:
        print(f"release.image: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {args.name} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
