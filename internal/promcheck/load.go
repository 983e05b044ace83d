package promcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// RuleFile is the part of a Prometheus rule file the checks read.
type RuleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	} `yaml:"groups"`
}

// Rule is one alerting or recording rule.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// LoadRules reads a Prometheus rule file.
func LoadRules(path string) (RuleFile, error) {
	var f RuleFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// alertLabelRef is a template's reference to a label of the alert.
var alertLabelRef = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// Queries returns the rules' expressions, each with the labels its labels
// and annotations refer to ({{ $labels.name }}).
func (f RuleFile) Queries(file string) []Query {
	var out []Query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			q := Query{Where: fmt.Sprintf("%s: group %s: %s", file, g.Name, name), Expr: r.Expr}
			for _, texts := range []map[string]string{r.Labels, r.Annotations} {
				for _, text := range texts {
					for _, m := range alertLabelRef.FindAllStringSubmatch(text, -1) {
						q.LabelRefs = append(q.LabelRefs, m[1])
					}
				}
			}
			out = append(out, q)
		}
	}
	return out
}

// Dashboard is the part of a Grafana dashboard the checks read.
type Dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"` // a string, or {"query": "..."}
		} `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; a row holds its panels when collapsed.
type Panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []Panel `json:"panels"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// LoadDashboard reads a Grafana dashboard (JSON).
func LoadDashboard(path string) (Dashboard, error) {
	var d Dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// legendLabelRef is a legend's reference to a label of the series.
var legendLabelRef = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// labelValues is a Grafana variable query label_values(selector, label).
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// Queries returns the dashboard's expressions: every panel target's, with
// the labels its legend names, and every variable's label_values query as
// the selector with the label it lists. A variable query of another form
// is returned as it is, and fails the check.
func (d Dashboard) Queries(file string) []Query {
	var out []Query
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			for i, t := range p.Targets {
				q := Query{Where: fmt.Sprintf("%s: panel %q target %d", file, p.Title, i), Expr: t.Expr}
				for _, m := range legendLabelRef.FindAllStringSubmatch(t.LegendFormat, -1) {
					q.LabelRefs = append(q.LabelRefs, m[1])
				}
				out = append(out, q)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		text, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			text, _ = m["query"].(string)
		}
		q := Query{Where: fmt.Sprintf("%s: variable %s", file, v.Name), Expr: text}
		if m := labelValues.FindStringSubmatch(text); m != nil {
			q.Expr, q.LabelRefs = m[1], []string{m[2]}
		}
		out = append(out, q)
	}
	return out
}

// grafanaVar is a Grafana variable: built in ($__rate_interval) or the
// dashboard's ($job, ${job}).
var grafanaVar = regexp.MustCompile(`\$(__[a-zA-Z_]+|\{[a-zA-Z0-9_]+\}|[a-zA-Z_][a-zA-Z0-9_]*)`)

// RecordingRules returns a Prometheus rule file with one recording rule per
// query, Grafana's variables replaced by values of their kind (a duration
// for the built-in intervals, a regular expression matching anything for
// the others, which stand in label values): promtool check rules on it
// parses the queries with Prometheus' own parser.
func RecordingRules(qs []Query) ([]byte, error) {
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, q := range qs {
		expr := grafanaVar.ReplaceAllStringFunc(q.Expr, func(v string) string {
			if strings.HasPrefix(v, "$__") {
				return "5m"
			}
			return ".*"
		})
		rules = append(rules, rule{Record: fmt.Sprintf("check:query_%d", i), Expr: expr})
	}
	return yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "queries", "rules": rules}}})
}
