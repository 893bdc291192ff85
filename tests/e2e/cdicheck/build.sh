#!/usr/bin/env bash
# Builds bin/cdicheck: CDI device resolution with the CDI project's Go library (tags.cncf.io/
# container-device-interface), kept apart from the e2e harness so its small module graph adds
# seconds, not minutes, to a cold build.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build cdicheck" >&2; exit 1; }
GOMAXPROCS=${GOMAXPROCS:-2} go build -p "${GO_BUILD_P:-2}" -buildvcs=false -o bin/cdicheck .
echo "built $(pwd)/bin/cdicheck"
