package main

// `opscheck render`: the chart as `helm install` / `helm template --include-crds` renders it, with
// Helm's chart loader, values coalescing, schema validation and template engine.

import (
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"
)

// kubeVersion is what .Capabilities.KubeVersion reports: the Kubernetes the e2e harness runs
// (tests/e2e/harness/go.mod, k8s.io/kubernetes).
const kubeVersion = "v1.37.2"

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func runRender(args []string) error {
	flags := flag.NewFlagSet("render", flag.ContinueOnError)
	var valueFiles, sets repeated
	flags.Var(&valueFiles, "values", "a values file (repeatable; later files win)")
	flags.Var(&sets, "set", "KEY=VALUE as helm --set (repeatable; after the files)")
	release := flags.String("release", "gpuweave", "release name")
	namespace := flags.String("namespace", "gpuweave-system", "release namespace")
	if len(args) < 1 {
		return fmt.Errorf("want CHART_DIR first")
	}
	if err := flags.Parse(args[1:]); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %v", flags.Args())
	}
	values, err := userValues(valueFiles, sets)
	if err != nil {
		return err
	}
	docs, err := render(args[0], values, chartutil.ReleaseOptions{
		Name: *release, Namespace: *namespace, Revision: 1, IsInstall: true,
	})
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(strings.Join(docs, ""))
	return err
}

// userValues merges values files and --set flags the way helm's CLI does (pkg/cli/values).
func userValues(files, sets []string) (map[string]any, error) {
	base := map[string]any{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		current := map[string]any{}
		if err := yaml.Unmarshal(data, &current); err != nil {
			return nil, fmt.Errorf("values file %s: %w", file, err)
		}
		base = mergeMaps(base, current)
	}
	for _, set := range sets {
		if err := strvals.ParseInto(set, base); err != nil {
			return nil, fmt.Errorf("--set %s: %w", set, err)
		}
	}
	return base, nil
}

func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if inner, ok := v.(map[string]any); ok {
			if existing, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(existing, inner)
				continue
			}
		}
		out[k] = v
	}
	return out
}

func render(dir string, values map[string]any, release chartutil.ReleaseOptions) ([]string, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "37"}
	if constraint := chrt.Metadata.KubeVersion; constraint != "" && !chartutil.IsCompatibleRange(constraint, kubeVersion) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, not %s", constraint, kubeVersion)
	}
	renderValues, err := chartutil.ToRenderValues(chrt, values, release, caps)
	if err != nil {
		return nil, err
	}
	rendered, err := engine.Render(chrt, renderValues)
	if err != nil {
		return nil, err
	}
	var docs []string
	for _, crd := range chrt.CRDObjects() {
		docs = append(docs, source(crd.Filename, string(crd.File.Data)))
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if path.Base(name) == "NOTES.txt" || strings.TrimSpace(rendered[name]) == "" {
			continue
		}
		docs = append(docs, source(name, rendered[name]))
	}
	return docs, nil
}

func source(name, body string) string {
	return "---\n# Source: " + name + "\n" + strings.TrimRight(body, "\n") + "\n"
}
