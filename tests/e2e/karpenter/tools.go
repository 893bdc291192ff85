//go:build tools

// Package karpenter pins the Karpenter controllers with the kwok cloud provider that the e2e tests
// run (docs/e2e.md, "Karpenter"); ../build.sh builds its main package from this module's graph.
package karpenter

import _ "sigs.k8s.io/karpenter/kwok"
