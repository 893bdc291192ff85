#!/usr/bin/env bash
# Builds the realnode tier's node software into bin/ from the pinned Go modules in go.mod:
# containerd, its runc shim and ctr, runc and the workload program seer (static, the only file of
# the e2e images). A cold build takes ~6 min on 2 cores
# (docs/e2e.md); later ones are incremental.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build the realnode tier" >&2; exit 1; }
export GOMAXPROCS=${GOMAXPROCS:-2}
P=${GO_BUILD_P:-2}
# btrfs and devmapper snapshotters need C headers this tier does not use (overlayfs only).
go build -p "$P" -buildvcs=false -tags "no_btrfs no_devmapper" -o bin/ \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
# runc with seccomp: the kubelet runs every pod sandbox with the RuntimeDefault profile. It links
# libseccomp; where its headers are not installed, Debian's libseccomp-dev and libseccomp2 packages
# are downloaded (not installed) and unpacked under .seccomp/, and the build points there.
if ! pkg-config --exists libseccomp 2>/dev/null; then
    if [[ ! -f .seccomp/usr/include/seccomp.h ]]; then
        rm -rf .seccomp && mkdir -p .seccomp/debs
        (cd .seccomp/debs && apt-get download libseccomp-dev libseccomp2 2>/dev/null)
        for deb in .seccomp/debs/*.deb; do dpkg-deb -x "$deb" .seccomp; done
    fi
    export PKG_CONFIG_PATH="$PWD/.seccomp/usr/lib/x86_64-linux-gnu/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$PWD/.seccomp"
    # The same paths in CGO_* as well: Go's build cache keys on these variables, not on what
    # pkg-config prints, so a checkout elsewhere must not reuse a link line naming another one's.
    export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -I$PWD/.seccomp/usr/include"
    export CGO_LDFLAGS="${CGO_LDFLAGS:--O2 -g} -L$PWD/.seccomp/usr/lib/x86_64-linux-gnu"
fi
go build -p "$P" -buildvcs=false -tags seccomp -o bin/ github.com/opencontainers/runc
../../../release/image-base.sh bin/agent-base.tar  # the gpuweave image's Python base layer (Debian packages + pip), ~25 s when inputs change
CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "-s -w" -o bin/seer ./seer
echo "built $(pwd)/bin (containerd $(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2), runc $(go list -m -f '{{.Version}}' github.com/opencontainers/runc))"
