#!/usr/bin/env bash
# Builds bin/opscheck: the Helm chart rendered with Helm's own Go engine and PromQL parsed with
# Prometheus' own parser (helm.sh/helm/v3, github.com/prometheus/prometheus), kept apart from the
# e2e harness so the harness's module graph stays as it is; a cold build takes a few minutes on
# 2 cores, later ones seconds.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build opscheck" >&2; exit 1; }
GOMAXPROCS=${GOMAXPROCS:-2} go build -p "${GO_BUILD_P:-2}" -buildvcs=false -o bin/opscheck .
echo "built $(pwd)/bin/opscheck"
