"""A release has one version: pyproject.toml's. The package, the chart (version and appVersion, and
through appVersion the image tag it deploys), the kustomize base's image tags and the install
commands in docs/deploy.md say the same (scripts/set-version writes them all). The release image is
the Dockerfile's packages over a base layer, and the release workflow runs as it is in a fork."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

import gpuweave
from release.image import build_image, dockerfile_sources, project_version
from release.oci_image import layer_from_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "helm" / "gpuweave"
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
VERSIONED = (
    "pyproject.toml",
    "gpuweave/__init__.py",
    "manifests/helm/gpuweave/Chart.yaml",
    "manifests/node-agent-daemonset.yaml",
    "manifests/scheduler/deployment.yaml",
    "docs/deploy.md",
    "README.md",
)


def _images(path: Path) -> set[str]:
    return set(re.findall(r"image: (ghcr\.io/gpuweave/gpuweave:\S+)", path.read_text()))


def versions_written(root: Path) -> set[str]:
    """Every version written under ``root`` (a checkout, or a copy of its versioned files)."""
    chart = yaml.safe_load((root / "manifests/helm/gpuweave/Chart.yaml").read_text())
    package = re.findall(r'__version__ = "([^"]+)"', (root / "gpuweave/__init__.py").read_text())
    images = _images(root / "manifests/node-agent-daemonset.yaml") | _images(
        root / "manifests/scheduler/deployment.yaml"
    )
    deploy = (root / "docs/deploy.md").read_text() + (root / "README.md").read_text()
    found = {project_version(root), chart["version"], chart["appVersion"], *package}
    found |= {i.rsplit(":", 1)[1] for i in images}
    found |= set(re.findall(r"charts/gpuweave --version ([0-9]\S*)", deploy))
    return found | set(re.findall(r"gpuweave/gpuweave/v([0-9]\S*?)/manifests", deploy))


def test_every_place_of_the_version_says_pyprojects() -> None:
    assert versions_written(REPO) == {project_version()} == {gpuweave.__version__}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the chart's appVersion (templates/_helpers.tpl)


def test_set_version_writes_every_place(tmp_path: Path) -> None:
    for name in VERSIONED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "set-version"), "7.8.9-rc1", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert versions_written(tmp_path) == {"7.8.9-rc1"}


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_release_image_holds_the_dockerfiles_packages_and_the_entry_point(tmp_path: Path) -> None:
    root = tmp_path / "base"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.11").write_text("")
    base = tmp_path / "base.tar"
    layer_from_dir(root, base)
    out = tmp_path / "image.tar"
    build_image(out, name="registry.example/gpuweave:9.9.9", base=base)
    with tarfile.open(out) as archive:
        index = archive.extractfile("index.json").read().decode()  # type: ignore[union-attr]
        blobs = [m for m in archive.getmembers() if m.name.startswith("blobs/sha256/") and m.isfile()]
        layers = [archive.extractfile(m) for m in blobs]
        names: set[str] = set()
        for blob in layers:
            try:
                with tarfile.open(fileobj=blob) as layer:
                    names |= set(layer.getnames())
            except tarfile.ReadError:
                continue  # a JSON blob
    assert '"io.containerd.image.name":"registry.example/gpuweave:9.9.9"' in index
    assert "usr/bin/python3.11" in names and "usr/local/bin/gpuweave" in names
    site = "usr/local/lib/python3.11/dist-packages"
    assert {f"{site}/{d}/__init__.py" for d in dockerfile_sources() if d != "proto"} <= names
    assert "gpuweave" in dockerfile_sources() and "scheduler_ext" in dockerfile_sources()


def _workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def test_the_release_workflow_publishes_to_the_owners_registry_and_checks_the_tag() -> None:
    workflow = _workflow()
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    assert workflow["permissions"]["packages"] == "write"
    steps = workflow["jobs"]["release"]["steps"]
    script = "\n".join(str(s.get("run", "")) for s in steps)
    assert "scripts/build-image" in script and "helm push" in script and "skopeo copy" in script
    assert "$GITHUB_REF_NAME" in script and "project_version" in script
    assert "$OWNER" in script and "ghcr.io/gpuweave/" not in script.replace(
        "repository: ghcr.io/gpuweave/gpuweave|", ""
    )
