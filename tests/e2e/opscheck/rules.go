package main

// `opscheck rules`: a Prometheus rule file (groups: ...) loaded as Prometheus loads it (model/rulefmt:
// the YAML structure, unknown fields, durations, label and annotation names, every expression
// through the PromQL parser, every annotation and label template through Go's text/template with
// Prometheus' functions), which is what `promtool check rules` runs.

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type rulesResult struct {
	Groups int      `json:"groups"`
	Rules  int      `json:"rules"`
	Errors []string `json:"errors"`
}

func runRules(in io.Reader, out *os.File) (bool, error) {
	content, err := io.ReadAll(in)
	if err != nil {
		return false, fmt.Errorf("reading the rule file: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	groups, errs := rulefmt.Parse(content, false, model.LegacyValidation, parser.NewParser(parser.Options{}), logger)
	result := rulesResult{Errors: []string{}}
	for _, e := range errs {
		result.Errors = append(result.Errors, e.Error())
	}
	if groups != nil {
		result.Groups = len(groups.Groups)
		for _, g := range groups.Groups {
			result.Rules += len(g.Rules)
		}
	}
	return len(result.Errors) == 0, writeJSON(out, result)
}
