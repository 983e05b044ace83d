//go:build integration

package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/internal/kube"
	"github.com/nanoservice/core-fanout/internal/promcheck"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The monitoring files fanout ships, relative to the repository's root.
const (
	monAlerts    = "docs/monitoring/alerts.yml"
	monDashboard = "docs/monitoring/dashboard.json"
	monKEDA      = "deploy/kubernetes/keda.yaml"
)

// monQueries returns every PromQL query the shipped files hold: the alerting
// rules', the dashboard's (panels and variables) and the KEDA triggers'.
func monQueries(t *testing.T) []promcheck.Query {
	t.Helper()
	root := ".."
	rules, err := promcheck.LoadRules(filepath.Join(root, monAlerts))
	if err != nil {
		t.Fatal(err)
	}
	dash, err := promcheck.LoadDashboard(filepath.Join(root, monDashboard))
	if err != nil {
		t.Fatal(err)
	}
	alerts, panels := rules.Queries(monAlerts), dash.Queries(monDashboard)
	if len(alerts) < 6 || len(panels) < 20 {
		t.Fatalf("%d alert and %d dashboard queries: the files did not load as expected", len(alerts), len(panels))
	}
	qs := append(alerts, panels...)
	return append(qs, monKEDAQueries(t)...)
}

// monKEDAQueries returns the queries of the KEDA ScaledObject's triggers.
func monKEDAQueries(t *testing.T) []promcheck.Query {
	t.Helper()
	objs, err := kube.Load(filepath.Join("..", monKEDA))
	if err != nil {
		t.Fatal(err)
	}
	var qs []promcheck.Query
	for _, o := range kube.OfKind(objs, "ScaledObject") {
		var spec kube.ScaledObjectSpec
		if err := o.Decode(&spec); err != nil {
			t.Fatal(err)
		}
		for i, tr := range spec.Triggers {
			qs = append(qs, promcheck.Query{Where: fmt.Sprintf("%s: trigger %d", monKEDA, i), Expr: tr.Metadata["query"]})
		}
	}
	if len(qs) == 0 {
		t.Fatalf("%s: no trigger query", monKEDA)
	}
	return qs
}

// monScrape returns a daemon's /metrics page.
func monScrape(t *testing.T, d *testDaemon) string {
	t.Helper()
	code, body, _ := testutil.HTTPGet(t, "http://"+d.MetricsAddr().String()+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", code, body)
	}
	return body
}

// Every metric and label that the dashboard, the alerting rules and the
// KEDA triggers use is on the /metrics of running daemons against the real
// Kafka and ZooKeeper: a leader-mode daemon that has consumed, delivered,
// acked and dead-lettered (the labelled series exist once a partition is
// consumed and a client is connected), and a spread-mode member that owns
// its partition (the spread-only metrics). A metric renamed in the daemon
// and not in the files (or the reverse) fails here, naming the file, the
// rule or panel, and what is missing.
func TestMonitoringQueriesMatchDaemonMetrics(t *testing.T) {
	t.Parallel()
	const n = 10
	topic, dlq := uniqueName(t, "mon"), uniqueName(t, "mon-dlq")
	createTopic(t, topic, 2)
	createTopic(t, dlq, 1)
	opts := daemonOptions(t, topic)
	opts.MetricsListen = "127.0.0.1:0"
	opts.MaxAttempts, opts.DeadLetterTopic = 1, dlq
	leader := startDaemon(t, opts)
	c := dial(t, client.Config{ClientID: "monitoring"}, leader.addr)
	produceSeq(t, topic, "mon", n, 2)
	for range n {
		m := recv(t, c, 30*time.Second)
		var err error
		if string(m.Value) == "mon-3" {
			err = m.NackWith(0, "poison")
		} else {
			err = m.Ack()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "the poison message dead-lettered and every partition committed", func() bool {
		s := scrape(t, "http://"+leader.MetricsAddr().String()+"/metrics")
		return s["fanout_messages_dead_lettered_total"] == 1 && s[`fanout_committed_offset{partition="0"}`] == n/2 &&
			s[`fanout_committed_offset{partition="1"}`] == n/2
	})

	spreadTopic := uniqueName(t, "mon-spread")
	createTopic(t, spreadTopic, 1)
	sopts := daemonOptions(t, spreadTopic)
	sopts.MetricsListen = "127.0.0.1:0"
	sopts.Assignment = fanout.AssignmentSpread
	sopts.ZooKeeperSessionTimeout = 4 * time.Second
	member := startDaemon(t, sopts)
	testutil.WaitFor(t, 60*time.Second, "the spread member to own its partition", func() bool {
		return scrape(t, "http://"+member.MetricsAddr().String()+"/metrics")["fanout_partitions_owned"] == 1
	})

	expo := promcheck.NewExposition()
	for _, page := range []string{monScrape(t, leader), monScrape(t, member)} {
		if err := expo.Add([]byte(page)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fanout_partition_oldest_pending_age_seconds", "fanout_oldest_pending_age_seconds",
		"fanout_partitions_owned", "fanout_messages_dead_lettered_total"} {
		if !expo.Has(name) {
			t.Fatalf("the daemons do not expose %s: the scrape is not what this test needs", name)
		}
	}
	qs := monQueries(t)
	for _, q := range qs {
		for _, p := range expo.Check(q) {
			t.Error(p)
		}
	}
	// The check is not vacuous: a query of a metric the daemons do not
	// expose, or with a label they do not put on it, is reported.
	for _, q := range []promcheck.Query{
		{Where: "control", Expr: `sum(fanout_consumer_lag_total)`},
		{Where: "control", Expr: `fanout_leader{partition="0"}`},
	} {
		if len(expo.Check(q)) == 0 {
			t.Errorf("the checker finds nothing wrong with %s", q.Expr)
		}
	}
	t.Logf("%d queries checked against %s and %s", len(qs), leader.MetricsAddr(), member.MetricsAddr())
}

// shBlocks returns the ```sh blocks of a markdown file.
func shBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// promtool returns the path of promtool (Debian's prometheus package, which
// bin/deps installs).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (bin/deps installs it with Debian's prometheus package): %v", err)
	}
	return p
}

// The command blocks of the monitoring and Kubernetes pages run as
// written from the repository's root (promtool checks the Prometheus
// configurations, the rule files they load, and the rules' unit tests),
// and Prometheus' own parser takes every query of the dashboard and the
// KEDA triggers (as recording rules, Grafana's variables replaced).
func TestMonitoringPromtool(t *testing.T) {
	t.Parallel()
	promtool(t)
	for _, doc := range []string{"docs/monitoring/README.md", "deploy/kubernetes/README.md"} {
		blocks := shBlocks(t, filepath.Join("..", doc))
		if len(blocks) == 0 {
			t.Errorf("%s has no command block", doc)
		}
		for _, block := range blocks {
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", block)
			cmd.Dir = ".."
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "SUCCESS") {
				t.Errorf("%s: the block\n%s\nfailed: %v\n%s", doc, block, err, out)
			}
		}
	}

	var qs []promcheck.Query
	for _, q := range monQueries(t) {
		if !strings.HasPrefix(q.Where, monAlerts) { // the rules are checked as they are, above
			qs = append(qs, q)
		}
	}
	check := func(qs []promcheck.Query) (string, error) {
		rules, err := promcheck.RecordingRules(qs)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "queries.yml")
		if err := os.WriteFile(file, rules, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput()
		return string(out), err
	}
	if out, err := check(qs); err != nil {
		t.Errorf("promtool check rules on the dashboard's and KEDA's queries: %v\n%s", err, out)
	}
	// And promtool does refuse a query that does not parse.
	if out, err := check([]promcheck.Query{{Expr: `sum(rate(fanout_messages_acked_total[5m])`}}); err == nil {
		t.Errorf("promtool check rules took an unbalanced query:\n%s", out)
	}
}
