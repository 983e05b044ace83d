package main

import (
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/nanoservice/core-fanout/internal/promcheck"
)

// These tests check docs/monitoring without Prometheus or a daemon: every
// alert has its runbook section, every query is one the checker reads, and
// the example Prometheus configuration scrapes the daemons of
// docker-compose.yml. Whether the metrics exist and the files parse for
// Prometheus is checked in integration/monitoring_test.go (running
// daemons, promtool).

// Each alert of alerts.yml has a section of the same name in the monitoring
// page, and each section there is an alert's, so that an operator paged by
// one finds what it means and what to do.
func TestMonitoringRunbookPerAlert(t *testing.T) {
	t.Parallel()
	rules, err := promcheck.LoadRules(filepath.Join("..", "..", "docs", "monitoring", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if r.Annotations["summary"] == "" || r.Annotations["runbook"] != "docs/monitoring/README.md, "+r.Alert {
				t.Errorf("alert %s: annotations %v, want a summary and the runbook's section", r.Alert, r.Annotations)
			}
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
				t.Errorf("alert %s: severity %q", r.Alert, sev)
			}
		}
	}
	want := []string{"FanoutLagGrowing", "FanoutOldestPendingTooOld", "FanoutPartitionStalled", "FanoutDeadLettersFailing",
		"FanoutNoLeader", "FanoutClientsDroppedAsSlow"}
	if !slices.Equal(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}
	page := string(repoFile(t, "docs/monitoring/README.md"))
	var sections []string
	for _, m := range regexp.MustCompile(`(?m)^### (\S+)\s*$`).FindAllStringSubmatch(page, -1) {
		sections = append(sections, m[1])
	}
	if !slices.Equal(sections, alerts) {
		t.Errorf("runbook sections %v, want one per alert, in order: %v", sections, alerts)
	}
	for _, section := range strings.Split(page, "\n### ")[1:] {
		name, _, _ := strings.Cut(section, "\n")
		for _, part := range []string{"**What it means.**", "**What to do.**"} {
			if !strings.Contains(section, part) {
				t.Errorf("section %s does not say %s", name, part)
			}
		}
	}
}

// Every query of the rules and the dashboard is one the checker reads
// (names only; the integration tests check them against daemons).
func TestMonitoringQueriesParse(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "docs", "monitoring")
	rules, err := promcheck.LoadRules(filepath.Join(dir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dash, err := promcheck.LoadDashboard(filepath.Join(dir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard without uid or title")
	}
	for _, q := range append(rules.Queries("alerts.yml"), dash.Queries("dashboard.json")...) {
		if _, err := promcheck.Parse(q.Expr); err != nil {
			t.Errorf("%s: %v", q.Where, err)
		}
	}
}

// The example Prometheus configuration scrapes every daemon of
// docker-compose.yml on its metrics port, as one job.
func TestMonitoringScrapesComposeDaemons(t *testing.T) {
	t.Parallel()
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(repoFile(t, "docs/monitoring/prometheus.yml"), &prom); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(prom.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("rule_files %v, want the alerts beside it", prom.RuleFiles)
	}
	if len(prom.ScrapeConfigs) != 1 || len(prom.ScrapeConfigs[0].StaticConfigs) != 1 {
		t.Fatalf("want one job with one static config, have %+v", prom.ScrapeConfigs)
	}
	var want []string
	for _, name := range []string{"fanout1", "fanout2", "fanout3"} {
		opts := daemonOptions(t, loadCompose(t, "docker-compose.yml").Services[name].Command)
		_, port, err := net.SplitHostPort(opts.MetricsListen)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, net.JoinHostPort(name, port))
	}
	if got := prom.ScrapeConfigs[0].StaticConfigs[0].Targets; !slices.Equal(got, want) {
		t.Errorf("targets %v, want the compose daemons' metrics addresses %v", got, want)
	}
}
