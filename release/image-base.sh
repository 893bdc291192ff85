#!/usr/bin/env bash
# Usage: release/image-base.sh OUT.tar
# The gpuweave image's base layer, without a container engine or registry: OUT.tar (a layer tar),
# a root filesystem of Debian's python3.11 (the packages and everything they depend on, downloaded
# with apt-get against an empty package database and unpacked, nothing installed on this machine)
# plus the project's runtime dependencies (pyproject.toml [project.dependencies], installed with
# pip --target into /usr/local/lib/python3.11/dist-packages, as `pip install .` in the Dockerfile
# installs them). The project's own packages go in a layer of their own (release/image.py), so a
# code change does not rebuild this. Rebuilt only when its inputs change (OUT.tar.stamp).
# Needs apt-get with Debian 12's archive configured (python3.11), dpkg-deb and pip for python3.11.
# scripts/build-image and the realnode e2e tier (tests/e2e/realnode/build.sh) run it.
set -euo pipefail
[[ $# == 1 && "$1" == *.tar ]] || { echo "usage: $0 OUT.tar" >&2; exit 2; }
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$(dirname "$1")"
tar_out="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
PYTHON=${PYTHON:-python3}
PACKAGES="python3.11-minimal libpython3.11-stdlib libstdc++6"  # grpcio's wheel links libstdc++
deps=$("$PYTHON" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1],"rb"))["project"]["dependencies"]))' "$repo/pyproject.toml")
stamp=$(printf '%s\n%s\n%s\n' "$PACKAGES" "$deps" "$(cat "$self")" | sha256sum | cut -d' ' -f1)
if [[ -f "$tar_out" && -f "$tar_out.stamp" && "$(cat "$tar_out.stamp")" == "$stamp" ]]; then
    echo "image base up to date: $tar_out"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial"
touch "$work/state/status"  # an empty package database: apt resolves the whole closure
apt-get -q -o Dir::State::status="$work/state/status" -o Dir::Cache="$work/cache" \
    -o Debug::NoLocking=1 -o APT::Install-Recommends=false -o APT::Sandbox::User=root \
    install --download-only -y $PACKAGES >/dev/null
rm -f "$tar_out" "$tar_out.stamp"
root="$work/root"
mkdir -p "$root"
for deb in "$work"/cache/archives/*.deb; do dpkg-deb -x "$deb" "$root"; done
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/locale"
# shellcheck disable=SC2086
PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --no-compile --disable-pip-version-check --no-warn-conflicts \
    --target "$root/usr/local/lib/python3.11/dist-packages" $deps
rm -rf "$root/usr/local/lib/python3.11/dist-packages/bin"
(cd "$repo" && "$PYTHON" -c 'import sys; from pathlib import Path; from release.oci_image import layer_from_dir
layer_from_dir(Path(sys.argv[1]), Path(sys.argv[2]))' "$root" "$tar_out")
echo "$stamp" > "$tar_out.stamp"
echo "built $tar_out ($(du -sh "$tar_out" | cut -f1))"
