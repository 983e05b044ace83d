package promcheck

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	sel := func(metric string, ms ...Matcher) Selector { return Selector{Metric: metric, Matchers: ms} }
	tests := []struct {
		expr      string
		selectors []Selector
		labels    []string
		result    []string
	}{
		{`fanout_leader`, []Selector{sel("fanout_leader")}, nil, nil},
		{`max by (job) (fanout_leader_epoch) == 0`, []Selector{sel("fanout_leader_epoch")}, []string{"job"}, nil},
		{`sum(rate(fanout_messages_acked_total{job=~"$job"}[$__rate_interval])) without (instance, "partition")`,
			[]Selector{sel("fanout_messages_acked_total", Matcher{"job", "=~", "$job"})}, []string{"instance", "partition"}, nil},
		{`increase(fanout_client_connections_closed_total{reason="slow consumer", job!="x",}[10m]) > 0`,
			[]Selector{sel("fanout_client_connections_closed_total", Matcher{"reason", "=", "slow consumer"}, Matcher{"job", "!=", "x"})}, nil, nil},
		{`histogram_quantile(0.99, sum by (le, job) (rate(fanout_commit_duration_seconds_bucket[5m])))`,
			[]Selector{sel("fanout_commit_duration_seconds_bucket")}, []string{"le", "job"}, []string{"job"}},
		{`deriv(sum by (job) (fanout_consumer_lag)[15m:1m]) > 0 and on (job) sum by (job) (fanout_consumer_lag) > 1e3`,
			[]Selector{sel("fanout_consumer_lag"), sel("fanout_consumer_lag")}, []string{"job"}, nil},
		{`a / ignoring(partition) group_left b offset -5m`, []Selector{sel("a"), sel("b")}, []string{"partition"}, nil},
		{`x * on(instance) group_left(node) y @ start()`, []Selector{sel("x"), sel("y")}, []string{"instance", "node"}, nil},
		{`{__name__="fanout_leader", job="a"} unless bool topk(3, 'q' != fanout_x) # comment fanout_not_a_metric`,
			[]Selector{sel("fanout_leader", Matcher{"job", "=", "a"}), sel("fanout_x")}, nil, nil},
		{`(time() - fanout_dead_letter_failing_since_seconds) > 120 and fanout_dead_letter_failing_since_seconds > 0x10`,
			[]Selector{sel("fanout_dead_letter_failing_since_seconds"), sel("fanout_dead_letter_failing_since_seconds")}, nil, nil},
		{`sum(fanout_x) by (job) > Inf or vector(1.5e-3)`, []Selector{sel("fanout_x")}, []string{"job"}, nil},
		{`sum(fanout_x) by (job, "partition")`, []Selector{sel("fanout_x")}, []string{"job", "partition"}, []string{"job", "partition"}},
		{`max(rate(fanout_x[5m]))`, []Selector{sel("fanout_x")}, nil, []string{}},
		{`sum by (job) (fanout_x) / sum by (job) (fanout_y)`, []Selector{sel("fanout_x"), sel("fanout_y")}, []string{"job"}, nil},
	}
	for _, tt := range tests {
		use, err := Parse(tt.expr)
		if err != nil {
			t.Errorf("Parse(%s): %v", tt.expr, err)
			continue
		}
		if !reflect.DeepEqual(use.Selectors, tt.selectors) || !reflect.DeepEqual(use.Labels, tt.labels) || !reflect.DeepEqual(use.Result, tt.result) {
			t.Errorf("Parse(%s):\n got %+v %v %v\nwant %+v %v %v", tt.expr, use.Selectors, use.Labels, use.Result, tt.selectors, tt.labels, tt.result)
		}
	}
}

// What the extractor cannot read is refused, not half checked.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]string{
		`label_replace(fanout_x, "a", "$1", "b", "(.*)")`: "label_replace names labels",
		`count_values("v", fanout_x)`:                     "count_values names its output label",
		`rat(fanout_x[5m])`:                               "unknown function rat",
		`{job="a"}`:                                       "without a metric name",
		`fanout_x{job}`:                                   "want label op",
		`fanout_x{job="a}`:                                "unterminated string",
		`sum by job (fanout_x)`:                           "by without a label list",
		`fanout_x[5m`:                                     "unterminated [",
		`vector(1)`:                                       "no metric",
		`fanout_x ; y`:                                    "unexpected",
	} {
		if _, err := Parse(expr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v, want an error with %q", expr, err, want)
		}
	}
}

const page = `# HELP fanout_consumer_lag Lag.
# TYPE fanout_consumer_lag gauge
fanout_consumer_lag{partition="0"} 3
fanout_consumer_lag{partition="1"} 0
# HELP fanout_client_connections_closed_total Closed.
# TYPE fanout_client_connections_closed_total counter
fanout_client_connections_closed_total{reason="goodbye"} 2
fanout_client_connections_closed_total{reason="slow consumer"} 0
# HELP fanout_leader Leader.
# TYPE fanout_leader gauge
fanout_leader 1
# HELP fanout_commit_duration_seconds Commits.
# TYPE fanout_commit_duration_seconds histogram
fanout_commit_duration_seconds_bucket{le="0.1"} 1
fanout_commit_duration_seconds_bucket{le="+Inf"} 1
fanout_commit_duration_seconds_sum 0.01
fanout_commit_duration_seconds_count 1
`

func TestCheck(t *testing.T) {
	t.Parallel()
	e := NewExposition()
	if err := e.Add([]byte(page)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		q    Query
		want []string // substrings of the problems, in order; none: no problem
	}{
		{Query{Expr: `max by (job, partition) (fanout_consumer_lag{job="$job"}) > 0`, LabelRefs: []string{"partition", "instance"}}, nil},
		{Query{Expr: `increase(fanout_client_connections_closed_total{reason="slow consumer"}[5m])`}, nil},
		{Query{Expr: `histogram_quantile(0.9, sum by (le) (rate(fanout_commit_duration_seconds_bucket[5m])))`}, nil},
		{Query{Expr: `rate(fanout_commit_duration_seconds_count[5m]) / rate(fanout_commit_duration_seconds_sum[5m])`}, nil},
		{Query{Expr: `fanout_consumer_lags`}, []string{"metric fanout_consumer_lags is not exposed"}},
		{Query{Expr: `fanout_leader{partition="0"}`}, []string{"fanout_leader has no label partition"}},
		{Query{Expr: `fanout_client_connections_closed_total{reason="slow"}`},
			[]string{`no series of fanout_client_connections_closed_total has reason="slow" (seen: goodbye, slow consumer)`}},
		{Query{Expr: `sum by (reason) (fanout_consumer_lag)`}, []string{"label reason is on none of the query's metrics"}},
		{Query{Expr: `fanout_leader`, LabelRefs: []string{"partition"}}, []string{"label partition is on none"}},
		{Query{Expr: `rate(fanout_commit_duration_seconds[5m])`}, []string{"is a histogram"}},
		{Query{Expr: `fanout_commit_duration_seconds_count{le="1"}`}, []string{"has no label le"}},
		{Query{Expr: `label_replace(fanout_leader, "a", "", "b", "")`}, []string{"label_replace"}},
		{Query{Expr: `sum by (partition) (fanout_consumer_lag)`, LabelRefs: []string{"instance"}},
			[]string{"label instance is not on the result, which has only [partition]"}},
		{Query{Expr: `sum(fanout_consumer_lag) by (job)`, LabelRefs: []string{"job"}}, nil},
		{Query{Expr: `histogram_quantile(0.9, sum by (le, instance) (rate(fanout_commit_duration_seconds_bucket[5m])))`,
			LabelRefs: []string{"le"}}, []string{"label le is not on the result, which has only [instance]"}},
		{Query{Expr: `max(fanout_consumer_lag)`, LabelRefs: []string{"partition"}}, []string{"label partition is not on the result, which has only []"}},
		{Query{Expr: `max by (job) (fanout_consumer_lag) > 0`, LabelRefs: []string{"partition"}}, nil}, // not one aggregation: not told
	}
	for _, tt := range tests {
		tt.q.Where = "q"
		got := e.Check(tt.q)
		if len(got) != len(tt.want) {
			t.Errorf("Check(%s) = %q, want %d problems %q", tt.q.Expr, got, len(tt.want), tt.want)
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tt.want[i]) {
				t.Errorf("Check(%s) problem %d = %q, want %q", tt.q.Expr, i, got[i], tt.want[i])
			}
		}
	}
}

func TestLoaders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, []byte(`groups:
- name: g
  rules:
  - alert: A
    expr: fanout_consumer_lag > 1
    labels: {severity: page}
    annotations:
      summary: "lag {{ $value }} on {{ $labels.partition }} of {{$labels.instance}}"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	rf, err := LoadRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	qs := rf.Queries("rules.yml")
	if len(qs) != 1 || qs[0].Expr != "fanout_consumer_lag > 1" || !reflect.DeepEqual(qs[0].LabelRefs, []string{"partition", "instance"}) ||
		!strings.Contains(qs[0].Where, "A") {
		t.Fatalf("rule queries %+v", qs)
	}

	dash := filepath.Join(dir, "d.json")
	if err := os.WriteFile(dash, []byte(`{"title": "d", "panels": [
  {"title": "p", "targets": [{"expr": "fanout_consumer_lag{job=~\"$job\"}", "legendFormat": "{{instance}} {{ partition }}"}]},
  {"title": "row", "type": "row", "panels": [{"title": "inner", "targets": [{"expr": "fanout_leader"}]}]}],
 "templating": {"list": [
  {"name": "job", "type": "query", "query": {"query": "label_values(fanout_leader, job)"}},
  {"name": "ds", "type": "datasource", "query": "prometheus"}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := LoadDashboard(dash)
	if err != nil {
		t.Fatal(err)
	}
	qs = d.Queries("d.json")
	want := []Query{
		{Where: `d.json: panel "p" target 0`, Expr: `fanout_consumer_lag{job=~"$job"}`, LabelRefs: []string{"instance", "partition"}},
		{Where: `d.json: panel "inner" target 0`, Expr: `fanout_leader`},
		{Where: `d.json: variable job`, Expr: `fanout_leader`, LabelRefs: []string{"job"}},
	}
	if !reflect.DeepEqual(qs, want) {
		t.Fatalf("dashboard queries\n got %+v\nwant %+v", qs, want)
	}
	out, err := RecordingRules(qs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `record: check:query_0`) || !strings.Contains(string(out), `fanout_consumer_lag{job=~".*"}`) {
		t.Fatalf("recording rules:\n%s", out)
	}
}
