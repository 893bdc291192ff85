// Command opscheck checks gpuweave's operator files with the libraries the tools themselves use:
// it renders the Helm chart with Helm's own chart loader and template engine, and parses PromQL
// with Prometheus' own parser. It is a module of its own, apart from the e2e harness, so its
// dependencies add a few minutes to a cold build and never touch the harness's module graph.
//
//	opscheck render CHART_DIR [--values FILE]... [--set KEY=VALUE]... [--release NAME] [--namespace NS]
//
// prints the chart's objects as `helm template --include-crds` does: the crds/ files, then every
// rendered template (NOTES.txt and partials left out), one YAML document each, in file order.
// Values merge as Helm merges them: the chart's values.yaml, then each --values file, then each
// --set; values.schema.json is enforced.
//
//	opscheck promql < {"expressions": [{"name": "...", "expr": "..."}, ...]}
//
// parses each expression and prints, per expression, the parser's error or the vector selectors it
// found (metric name and label matchers).
//
//	opscheck rules < RULE_FILE
//
// loads a Prometheus rule file (`groups:`) as Prometheus does and prints its group and rule counts
// and every error. Exit status 1 when an expression does not parse or the rule file has an error,
// 2 on bad input or a chart that does not render.
package main

import (
	"encoding/json"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fail(2, "usage: opscheck render CHART_DIR [flags] | opscheck promql < request.json | opscheck rules < rules.yaml")
	}
	switch os.Args[1] {
	case "render":
		if err := runRender(os.Args[2:]); err != nil {
			fail(2, "opscheck render: %v", err)
		}
	case "promql":
		ok, err := runPromQL(os.Stdin, os.Stdout)
		if err != nil {
			fail(2, "opscheck promql: %v", err)
		}
		if !ok {
			os.Exit(1)
		}
	case "rules":
		ok, err := runRules(os.Stdin, os.Stdout)
		if err != nil {
			fail(2, "opscheck rules: %v", err)
		}
		if !ok {
			os.Exit(1)
		}
	default:
		fail(2, "opscheck: unknown command %q (want render, promql or rules)", os.Args[1])
	}
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

func writeJSON(out *os.File, value any) error {
	encoder := json.NewEncoder(out)
	encoder.SetIndent("", "  ")
	return encoder.Encode(value)
}
