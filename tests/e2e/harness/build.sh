#!/usr/bin/env bash
# Builds bin/harness (the e2e control plane) from the pinned upstream modules in go.mod, and
# bin/harness-k134, the same sources at Kubernetes 1.34 (go.k134.mod, build tag k134).
# Go's module and build caches stay where Go keeps them; a cold build takes ~15 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build the e2e harness" >&2; exit 1; }
# build_harness MODFILE TAGS OUTPUT: one harness build against the module file's k8s.io/kubernetes.
build_harness() {
  local version minor pkg=k8s.io/component-base/version
  version=$(go list -modfile="$1" -m -f '{{.Version}}' k8s.io/kubernetes)
  minor=$(echo "$version" | cut -d. -f2)
  local ldflags="-X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  GOMAXPROCS=${GOMAXPROCS:-2} go build -modfile="$1" -tags "$2" -p "${GO_BUILD_P:-2}" -buildvcs=false \
    -ldflags "$ldflags" -o "$3" .
  echo "built $(pwd)/$3 (k8s.io/kubernetes $version)"
}
build_harness go.mod "" bin/harness  # the newest supported minor
# The oldest supported minor, for the version-skew tests (go.k134.mod, the files tagged k134); its
# own dependency versions, so a cold build compiles most of its packages again.
build_harness go.k134.mod k134 bin/harness-k134
../cdicheck/build.sh  # the CDI check binary (tests/e2e/cdicheck), seconds on a cold cache
../opscheck/build.sh  # Helm chart rendering + PromQL parsing (tests/e2e/opscheck), ~2-4 min on a cold cache
../realnode/build.sh  # containerd, runc, CNI plugins, the workload program (tests/e2e/realnode)
../queueing/build.sh  # the Kueue and JobSet controller managers (tests/e2e/queueing), ~5 min on a cold cache
../karpenter/build.sh  # the Karpenter controllers with the kwok provider (tests/e2e/karpenter), ~8 min on a cold cache
