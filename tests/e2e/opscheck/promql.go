package main

// `opscheck promql`: Prometheus' own PromQL parser (the one Prometheus evaluates rules with and
// Grafana's Prometheus data source sends queries to) over the expressions of the dashboard and the
// alerting rules.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type expression struct {
	Name string `json:"name"`
	Expr string `json:"expr"`
}

type promqlRequest struct {
	Expressions []expression `json:"expressions"`
}

type matcher struct {
	Label string `json:"label"`
	Op    string `json:"op"`
	Value string `json:"value"`
}

type selector struct {
	Metric   string    `json:"metric"`
	Matchers []matcher `json:"matchers"`
}

type parsed struct {
	Name      string     `json:"name"`
	Error     string     `json:"error,omitempty"`
	Type      string     `json:"type,omitempty"`
	Selectors []selector `json:"selectors"`
}

func runPromQL(in io.Reader, out *os.File) (bool, error) {
	var request promqlRequest
	decoder := json.NewDecoder(in)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&request); err != nil {
		return false, fmt.Errorf("request: %w", err)
	}
	promql := parser.NewParser(parser.Options{})
	results := make([]parsed, 0, len(request.Expressions))
	ok := true
	for _, e := range request.Expressions {
		result := parseOne(promql, e)
		ok = ok && result.Error == ""
		results = append(results, result)
	}
	return ok, writeJSON(out, map[string]any{"results": results})
}

func parseOne(promql parser.Parser, e expression) parsed {
	result := parsed{Name: e.Name, Selectors: []selector{}}
	expr, err := promql.ParseExpr(e.Expr)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	result.Type = string(expr.Type())
	for _, matchers := range parser.ExtractSelectors(expr) {
		result.Selectors = append(result.Selectors, selectorOf(matchers))
	}
	return result
}

// selectorOf names the metric a selector reads: its __name__ equality matcher ("" when it selects
// by a regular expression or by labels alone, which the caller reports as unchecked).
func selectorOf(matchers []*labels.Matcher) selector {
	s := selector{Matchers: []matcher{}}
	for _, m := range matchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			s.Metric = m.Value
			continue
		}
		s.Matchers = append(s.Matchers, matcher{Label: m.Name, Op: m.Type.String(), Value: m.Value})
	}
	return s
}
