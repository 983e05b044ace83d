package promcheck

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TargetLabels are the labels Prometheus attaches to every series it
// scrapes: they exist in queries without being in /metrics.
var TargetLabels = []string{"job", "instance"}

// Exposition is what /metrics pages expose: the metric families, their
// types, and the label names and values of their series.
type Exposition struct {
	families map[string]*family
}

type family struct {
	typ    dto.MetricType
	labels map[string]map[string]bool // label name -> values seen
}

// NewExposition returns an empty Exposition; Add pages to it.
func NewExposition() *Exposition { return &Exposition{families: map[string]*family{}} }

// Add adds a /metrics page in the Prometheus text format: its families,
// and for each the label names and values of its series. Adding the pages
// of several daemons (a leader and a spread member) gives their union.
func (e *Exposition) Add(page []byte) error {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return fmt.Errorf("parse /metrics: %w", err)
	}
	for name, mf := range fams {
		f := e.families[name]
		if f == nil {
			f = &family{typ: mf.GetType(), labels: map[string]map[string]bool{}}
			e.families[name] = f
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if f.labels[lp.GetName()] == nil {
					f.labels[lp.GetName()] = map[string]bool{}
				}
				f.labels[lp.GetName()][lp.GetValue()] = true
			}
		}
	}
	return nil
}

// Has reports whether the family name was exposed.
func (e *Exposition) Has(name string) bool { return e.families[name] != nil }

// series returns the labels (name -> values seen) of the series name of a
// query: a family's own name, or a histogram's _bucket (with le), _sum or
// _count, or a summary's _sum or _count; nil when no family exposes it.
func (e *Exposition) series(name string) (map[string]map[string]bool, error) {
	if f := e.families[name]; f != nil {
		switch f.typ {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return nil, fmt.Errorf("%s is a histogram: query %s_bucket, %s_sum or %s_count", name, name, name, name)
		case dto.MetricType_SUMMARY:
			out := cloneLabels(f.labels)
			out["quantile"] = nil
			return out, nil
		}
		return f.labels, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f := e.families[base]
		switch {
		case f == nil:
		case f.typ == dto.MetricType_HISTOGRAM || f.typ == dto.MetricType_GAUGE_HISTOGRAM:
			out := cloneLabels(f.labels)
			if suffix == "_bucket" {
				out["le"] = nil
			}
			return out, nil
		case f.typ == dto.MetricType_SUMMARY && suffix != "_bucket":
			return f.labels, nil
		}
	}
	return nil, fmt.Errorf("metric %s is not exposed", name)
}

func cloneLabels(m map[string]map[string]bool) map[string]map[string]bool {
	out := make(map[string]map[string]bool, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Query is a PromQL expression to check, with where it comes from and the
// labels its surroundings refer to (a legend's {{label}}, an alert's
// {{ $labels.label }}).
type Query struct {
	Where     string
	Expr      string
	LabelRefs []string
}

// Check returns the problems of q against e: a metric no family exposes, a
// matcher's label that no series of its metric has, an equality matcher's
// value that no series has (unless it holds a Grafana variable), a clause
// label or label reference that none of the query's metrics has, a label
// reference that the result cannot have (it aggregates the label away: see
// Use.Result). Labels in TargetLabels are taken as present on every metric.
func (e *Exposition) Check(q Query) []string {
	use, err := Parse(q.Expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", q.Where, err)}
	}
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, q.Where+": "+fmt.Sprintf(format, args...))
	}
	known := map[string]bool{}
	for _, l := range TargetLabels {
		known[l] = true
	}
	for _, sel := range use.Selectors {
		labels, err := e.series(sel.Metric)
		if err != nil {
			bad("%v", err)
			continue
		}
		for l := range labels {
			known[l] = true
		}
		for _, m := range sel.Matchers {
			values, ok := labels[m.Label]
			switch {
			case slices.Contains(TargetLabels, m.Label):
			case !ok:
				bad("%s has no label %s (matcher %s%s%q)", sel.Metric, m.Label, m.Label, m.Op, m.Value)
			case m.Op == "=" && values != nil && !values[m.Value] && !strings.Contains(m.Value, "$"):
				bad("no series of %s has %s=%q (seen: %s)", sel.Metric, m.Label, m.Value, strings.Join(sortedKeys(values), ", "))
			}
		}
	}
	for _, l := range append(slices.Clone(use.Labels), q.LabelRefs...) {
		if !known[l] {
			bad("label %s is on none of the query's metrics", l)
		}
	}
	if use.Result != nil {
		for _, l := range q.LabelRefs {
			if known[l] && !slices.Contains(use.Result, l) {
				bad("label %s is not on the result, which has only %v", l, use.Result)
			}
		}
	}
	return problems
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
