//go:build tools

// Package jobset pins the JobSet controller manager the e2e tests run (docs/e2e.md, "Kueue and
// JobSet"); ../build.sh builds its main package from this module's graph. It is a module apart
// from ../kueue because JobSet's controllers need controller-runtime v0.22, Kueue's v0.23.
package jobset

import _ "sigs.k8s.io/jobset"
