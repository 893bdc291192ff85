// Command cdicheck resolves CDI device names the way a container runtime does, with the CDI
// project's own library: it loads every spec in one directory, reports each spec's errors, and
// injects each container's devices into an empty OCI spec.
//
// Input (stdin, JSON): {"specDir": DIR, "containers": [{"devices": ["nvidia.com/gpu=GPU-...", ...],
// "annotations": {"cdi.k8s.io/...": "..."}}, ...]}: the names a container gets through the CRI's
// CDI device list and through CDI annotations (parsed with the library's ParseAnnotations).
// Output (stdout, JSON): the devices the specs define, spec errors, and per container the device
// nodes, env and mounts injected or the names that did not resolve. Exit status 1 when any spec
// has an error or any name is unresolved, 2 on bad input.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

type container struct {
	Devices     []string          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
}

type request struct {
	SpecDir    string      `json:"specDir"`
	Containers []container `json:"containers"`
}

type node struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

type injected struct {
	Unresolved  []string `json:"unresolved,omitempty"`
	Error       string   `json:"error,omitempty"`
	DeviceNodes []node   `json:"deviceNodes"`
	Env         []string `json:"env"`
	Mounts      []string `json:"mounts"`
	Hooks       int      `json:"hooks"`
}

// specVersion is a spec file's cdiVersion next to the lowest version its content needs.
type specVersion struct {
	Kind    string `json:"kind"`
	Version string `json:"version"`
	Minimum string `json:"minimum"`
}

type report struct {
	Devices    []string               `json:"devices"`
	Specs      map[string]specVersion `json:"specs"`
	SpecErrors map[string][]string    `json:"specErrors"`
	Containers []injected             `json:"containers"`
}

func inject(cache *cdi.Cache, request container) injected {
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	out := injected{DeviceNodes: []node{}, Env: []string{}, Mounts: []string{}}
	_, annotated, err := cdi.ParseAnnotations(request.Annotations)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	names := append(append([]string{}, request.Devices...), annotated...)
	unresolved, err := cache.InjectDevices(spec, names...)
	out.Unresolved = unresolved
	if err != nil {
		out.Error = err.Error()
		return out
	}
	for _, d := range spec.Linux.Devices {
		out.DeviceNodes = append(out.DeviceNodes, node{d.Path, d.Type, d.Major, d.Minor})
	}
	out.Env = append(out.Env, spec.Process.Env...)
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, m.Source+":"+m.Destination)
	}
	if spec.Hooks != nil {
		out.Hooks = len(spec.Hooks.CreateContainer) + len(spec.Hooks.Prestart) + len(spec.Hooks.StartContainer)
	}
	return out
}

func versions(cache *cdi.Cache) map[string]specVersion {
	out := map[string]specVersion{}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			minimum, _ := cdispec.MinimumRequiredVersion(spec.Spec)
			out[spec.GetPath()] = specVersion{Kind: spec.Kind, Version: spec.Version, Minimum: minimum}
		}
	}
	return out
}

func run() (int, error) {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		return 2, fmt.Errorf("cdicheck: stdin is not a request: %w", err)
	}
	if req.SpecDir == "" {
		return 2, fmt.Errorf("cdicheck: specDir is empty; name the directory the node agent writes")
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(req.SpecDir), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return 2, fmt.Errorf("cdicheck: %w", err)
	}
	rep := report{Devices: cache.ListDevices(), Specs: versions(cache), SpecErrors: map[string][]string{}}
	status := 0
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			rep.SpecErrors[path] = append(rep.SpecErrors[path], e.Error())
		}
		status = 1
	}
	if rep.Devices == nil {
		rep.Devices = []string{}
	}
	sort.Strings(rep.Devices)
	for _, c := range req.Containers {
		result := inject(cache, c)
		if result.Error != "" {
			status = 1
		}
		rep.Containers = append(rep.Containers, result)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return status, enc.Encode(rep)
}

func main() {
	status, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(status)
}
