package main

// How the DRA feature gates of features_k1xx.go reach each component.

import (
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

func draFeatureGateFlag() string { return "--feature-gates=" + draFeatureGates }

func enableDRAFeatureGates() error {
	return utilfeature.DefaultMutableFeatureGate.Set(draFeatureGates)
}

// draFeatureGateMap is the gates as a kubelet configuration's featureGates.
func draFeatureGateMap() map[string]bool {
	gates := map[string]bool{}
	for _, kv := range strings.Split(draFeatureGates, ",") {
		name, value, _ := strings.Cut(kv, "=")
		gates[name] = value == "true"
	}
	return gates
}
