package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Every performance target is a line with its ratio, met or not met, and by
// how much when not.
func TestTargets(t *testing.T) {
	r := &report{
		Throughput: []Row{
			{Size: 1024, Consumer: "B sarama", K: 1, MsgPerS: 1000, ClientCPUPerM: 1.0},
			{Size: 1024, Consumer: "C fanout", K: 1, MsgPerS: 500, DaemonCPUPerM: 1.2, ClientCPUPerM: 0.6},
			{Size: 1024, Consumer: "C fanout", K: 4, MsgPerS: 700, DaemonCPUPerM: 2.6, ClientCPUPerM: 0.2},
			{Size: 1024, Consumer: "C fanout", K: 16, MsgPerS: 700, DaemonCPUPerM: 2.6, ClientCPUPerM: 0.2},
			{Size: 1024, Consumer: "P python threads", K: 1, MsgPerS: 100, DaemonCPUPerM: 2.6, ClientCPUPerM: 5},
			{Size: 1024, Consumer: "D ShareConsumerPerformance", K: 1, MsgPerS: 200},
			{Size: 1024, Consumer: "D ShareConsumerPerformance", K: 4, MsgPerS: 500},
			{Size: 1024, Consumer: "D ShareConsumerPerformance", K: 16, MsgPerS: 500},
		},
		Latency: []Latency{
			{Rate: 10000, Consumer: "B sarama", P99: 3},
			{Rate: 10000, Consumer: "C fanout", P99: 3.5},
		},
		Idle: &Idle{Clients: 10000, PeakRSSMB: 360},
		Scaling: &Scaling{Partitions: []PartitionsRun{
			{Partitions: 8, DaemonCPUPerM: 1, SteadyCPUPerM: 1}, {Partitions: 128, DaemonCPUPerM: 1.1, SteadyCPUPerM: 1.1},
			{Partitions: 1024, DaemonCPUPerM: 2, SteadyCPUPerM: 1.3}, // the start costs apart: the steady figures count
		}},
	}
	want := map[string]string{
		"daemon CPU / 10^6 msg <= 1.25 x plain sarama's (B), 1 KiB, K=1":        "met",
		"daemon CPU / 10^6 msg <= 1.25 x plain sarama's (B), 1 KiB, K=4":        "not met: 1.35 over the limit 1.25 (108% above)",
		"Go client CPU / 10^6 msg <= 0.5 x plain sarama's (B), 1 KiB, K=1":      "not met: 0.10 over the limit 0.50 (20% above)",
		"Go client CPU / 10^6 msg <= 0.5 x plain sarama's (B), 1 KiB, K=4":      "met",
		"msg/s >= 0.6 x plain sarama's (C/B), 1 KiB, K=4":                       "met",
		"msg/s >= 2 x a share group's (C/D), 1 KiB, K=1":                        "met",
		"msg/s >= 2 x a share group's (C/D), 1 KiB, K=4":                        "not met: 0.60 under the limit 2.00 (30% short)",
		"daemon CPU / 10^6 msg, steady, 1024 partitions <= 1.2 x 8 partitions'": "not met: 0.10 over the limit 1.20 (8% above)",
		"added p99 latency < 1 ms at 10,000 msg/s":                              "met",
		"10000 idle clients: daemon RSS < 300 MB":                               "not met: 0.20 over the limit 1.00 (20% above)",
	}
	got := r.targets()
	if len(got) != len(want) {
		t.Errorf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for _, g := range got {
		w, ok := want[g.Name]
		switch {
		case !ok:
			t.Errorf("unexpected target %q", g.Name)
		case g.result() != w:
			t.Errorf("%s: %q, want %q", g.Name, g.result(), w)
		}
	}
	if missing := r.unmeasured(got); len(missing) != 0 {
		t.Errorf("a full run's goals not measured: %q", missing)
	}
	r.Targets = got
	md := r.markdown()
	if !strings.Contains(md, "| msg/s >= 2 x a share group's (C/D), 1 KiB, K=4 | 700 msg/s (D 500) | 1.40 | not met: 0.60 under the limit 2.00 (30% short) |") {
		t.Errorf("the report's table lacks the C/D line:\n%s", md)
	}
}

// A quick run (no B, no 10k msg/s, 500 idle clients, topics of 8 and 64
// partitions) reports the targets it measured (the partitions' with the
// largest topic it drained) and names the others as not measured.
func TestTargetsOfAQuickRun(t *testing.T) {
	r := &report{
		Throughput: []Row{{Size: 100, Consumer: "C fanout", K: 1, MsgPerS: 500, DaemonCPUPerM: 1}},
		Latency:    []Latency{{Rate: 1000, Consumer: "C fanout", P99: 1}},
		Idle:       &Idle{Clients: 500, PeakRSSMB: 30},
		Scaling: &Scaling{Partitions: []PartitionsRun{{Partitions: 8, DaemonCPUPerM: 1, SteadyCPUPerM: 1},
			{Partitions: 64, DaemonCPUPerM: 1.1, SteadyCPUPerM: 1.1}}},
	}
	got := r.targets()
	if len(got) != 1 || got[0].Name != "daemon CPU / 10^6 msg, steady, 64 partitions <= 1.2 x 8 partitions'" || got[0].result() != "met" {
		t.Fatalf("targets of a quick run: %+v", got)
	}
	missing := r.unmeasured(got)
	if len(missing) != len(goals)-1 || slices.Contains(missing, goals[4]) {
		t.Fatalf("not measured: %q", missing)
	}
	r.Targets = got
	md := r.markdown()
	for _, g := range missing {
		if !strings.Contains(md, "| "+g+" | not measured in this run | | |") {
			t.Errorf("the report does not say %q was not measured:\n%s", g, md)
		}
	}
	r.Scaling = nil
	if got := r.targets(); len(got) != 0 {
		t.Fatalf("targets without their references: %+v", got)
	}
	if missing := r.unmeasured(nil); !slices.Equal(missing, goals) {
		t.Fatalf("not measured: %q, want every goal", missing)
	}
}

// fanout-bench targets puts the targets of two runs side by side, a target
// measured in one run only marked "-" in the other.
func TestPrintTargetsBeforeAndAfter(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r report) string {
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	b := Row{Size: 100, Consumer: "B sarama", K: 1, MsgPerS: 1000, ClientCPUPerM: 1}
	before := write("before.json", report{Throughput: []Row{b,
		{Size: 100, Consumer: "C fanout", K: 1, DaemonCPUPerM: 2}}})
	after := write("after.json", report{Throughput: []Row{b,
		{Size: 100, Consumer: "C fanout", K: 1, DaemonCPUPerM: 1.2},
		{Size: 100, Consumer: "C fanout", K: 4, DaemonCPUPerM: 1.5}}})
	var out strings.Builder
	if err := printTargets(&out, []string{before, after}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"daemon CPU / 10^6 msg <= 1.25 x plain sarama's (B), 100 B, K=1   2.00 (not met) -> 1.20 (met)",
		"daemon CPU / 10^6 msg <= 1.25 x plain sarama's (B), 100 B, K=4   - -> 1.50 (not met)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
}
