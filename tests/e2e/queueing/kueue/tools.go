//go:build tools

// Package kueue pins the Kueue controller manager the e2e tests run (docs/e2e.md, "Kueue and
// JobSet"); ../build.sh builds its main package from this module's graph.
package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
