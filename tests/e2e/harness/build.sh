#!/usr/bin/env bash
# Builds bin/harness (the e2e control plane) from the pinned upstream modules in go.mod.
# Go's module and build caches stay where Go keeps them; a cold build takes ~15 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build the e2e harness" >&2; exit 1; }
K8S_VERSION=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
PKG=k8s.io/component-base/version
LDFLAGS="-X $PKG.gitVersion=$K8S_VERSION -X $PKG.gitMajor=1 -X $PKG.gitMinor=$MINOR -X $PKG.gitTreeState=clean"
GOMAXPROCS=${GOMAXPROCS:-2} go build -p "${GO_BUILD_P:-2}" -buildvcs=false -ldflags "$LDFLAGS" -o bin/harness .
echo "built $(pwd)/bin/harness (k8s.io/kubernetes $K8S_VERSION)"
../cdicheck/build.sh  # the CDI check binary (tests/e2e/cdicheck), seconds on a cold cache
../opscheck/build.sh  # Helm chart rendering + PromQL parsing (tests/e2e/opscheck), ~2-4 min on a cold cache
../realnode/build.sh  # containerd, runc, CNI plugins, the workload program (tests/e2e/realnode)
../queueing/build.sh  # the Kueue and JobSet controller managers (tests/e2e/queueing), ~5 min on a cold cache
../karpenter/build.sh  # the Karpenter controllers with the kwok provider (tests/e2e/karpenter), ~8 min on a cold cache
