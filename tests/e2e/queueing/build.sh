#!/usr/bin/env bash
# Builds bin/kueue (the Kueue controller manager, sigs.k8s.io/kueue/cmd/kueue) and bin/jobset (the
# JobSet controller manager, sigs.k8s.io/jobset's main package) at the versions their modules pin,
# and records in bin/modules.json where Go's module cache holds their sources (the e2e tests read
# the CRDs from there). kueue/ and jobset/ are modules of their own: both need k8s.io/* v0.35 (the
# harness is on k8s.io/kubernetes v1.37), and JobSet's controllers need controller-runtime v0.22
# while Kueue needs v0.23 (JobSet's other modules are raised to Kueue's versions, so the two builds
# share compiled packages). Cold: ~5 min on 2 cores, module downloads included (docs/e2e.md).
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build Kueue and JobSet" >&2; exit 1; }
mkdir -p bin
build() {  # build MODULE_DIR PACKAGE VERSION_PACKAGE OUTPUT
	local version
	version=$(cd "$1" && go list -m -f '{{.Version}}' "$2")
	(cd "$1" && GOMAXPROCS=${GOMAXPROCS:-2} go build -p "${GO_BUILD_P:-2}" -buildvcs=false \
		-ldflags "-X $3.GitVersion=$version" -o "../bin/$4" "$5")
	echo "built $(pwd)/bin/$4 ($2 $version)"
}
build kueue sigs.k8s.io/kueue sigs.k8s.io/kueue/pkg/version kueue sigs.k8s.io/kueue/cmd/kueue
build jobset sigs.k8s.io/jobset sigs.k8s.io/jobset/pkg/version jobset sigs.k8s.io/jobset
KUEUE_DIR=$(cd kueue && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
JOBSET_DIR=$(cd jobset && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
printf '{"sigs.k8s.io/kueue": "%s", "sigs.k8s.io/jobset": "%s"}\n' "$KUEUE_DIR" "$JOBSET_DIR" > bin/modules.json
