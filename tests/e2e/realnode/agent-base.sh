#!/usr/bin/env bash
# The node agent image's base for the realnode tier, without a container engine or registry:
# bin/agent-base/ is a root filesystem of Debian's python3.11 (the packages and everything they
# depend on, downloaded with apt-get and unpacked, nothing installed on this machine) plus the
# project's runtime dependencies (pyproject.toml [project.dependencies], installed with pip
# --target into /usr/local/lib/python3.11/dist-packages, as `pip install .` in the Dockerfile
# installs them). The project's own packages are added per test run (tests/e2e/realnode.py), so a
# code change does not rebuild this. Rebuilt only when its inputs change (bin/agent-base.stamp).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
PACKAGES="python3.11-minimal libpython3.11-stdlib libstdc++6"  # grpcio's wheel links libstdc++
deps=$("$PYTHON" -c 'import tomllib; print(" ".join(tomllib.load(open("../../../pyproject.toml","rb"))["project"]["dependencies"]))')
stamp=$(printf '%s\n%s\n%s\n' "$PACKAGES" "$deps" "$(cat "$self")" | sha256sum | cut -d' ' -f1)
if [[ -f bin/agent-base.tar && -f bin/agent-base.stamp && "$(cat bin/agent-base.stamp)" == "$stamp" ]]; then
    echo "agent base up to date: $(pwd)/bin/agent-base.tar"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial"
touch "$work/state/status"  # an empty package database: apt resolves the whole closure
apt-get -q -o Dir::State::status="$work/state/status" -o Dir::Cache="$work/cache" \
    -o Debug::NoLocking=1 -o APT::Install-Recommends=false -o APT::Sandbox::User=root \
    install --download-only -y $PACKAGES >/dev/null
rm -rf bin/agent-base bin/agent-base.tar bin/agent-base.stamp
mkdir -p bin/agent-base
for deb in "$work"/cache/archives/*.deb; do dpkg-deb -x "$deb" bin/agent-base; done
rm -rf bin/agent-base/usr/share/doc bin/agent-base/usr/share/man bin/agent-base/usr/share/locale
# shellcheck disable=SC2086
PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --no-compile --disable-pip-version-check --no-warn-conflicts \
    --target bin/agent-base/usr/local/lib/python3.11/dist-packages $deps
rm -rf bin/agent-base/usr/local/lib/python3.11/dist-packages/bin
(cd ../../.. && "$PYTHON" -c 'import sys; from pathlib import Path; from tests.support.oci_image import layer_from_dir
layer_from_dir(Path(sys.argv[1]), Path(sys.argv[2]))' "$OLDPWD/bin/agent-base" "$OLDPWD/bin/agent-base.tar")
rm -rf bin/agent-base
echo "$stamp" > bin/agent-base.stamp
echo "built $(pwd)/bin/agent-base.tar ($(du -sh bin/agent-base.tar | cut -f1))"
