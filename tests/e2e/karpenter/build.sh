#!/usr/bin/env bash
# Builds bin/karpenter: the Karpenter controllers with the kwok cloud provider
# (sigs.k8s.io/karpenter/kwok, the main package kwok/main.go), at the version go.mod pins, and records
# in bin/modules.json where Go's module cache holds its sources (the e2e tests read the CRDs from
# there). A module of its own: Karpenter needs k8s.io/* v0.35 and controller-runtime v0.23 (the
# harness is on k8s.io/kubernetes v1.37); those are pinned to Kueue's versions
# (tests/e2e/queueing/kueue), so the two builds share compiled packages. Times: docs/e2e.md.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26.6 is needed to build Karpenter" >&2; exit 1; }
mkdir -p bin
VERSION=$(go list -m -f '{{.Version}}' sigs.k8s.io/karpenter)
GOMAXPROCS=${GOMAXPROCS:-2} go build -p "${GO_BUILD_P:-2}" -buildvcs=false \
	-ldflags "-X sigs.k8s.io/karpenter/pkg/operator.Version=$VERSION" -o bin/karpenter sigs.k8s.io/karpenter/kwok
echo "built $(pwd)/bin/karpenter (sigs.k8s.io/karpenter $VERSION)"
DIR=$(go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
printf '{"sigs.k8s.io/karpenter": "%s"}\n' "$DIR" > bin/modules.json
