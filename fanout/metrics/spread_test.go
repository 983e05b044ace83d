package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// spreadSnapshot is a spread-mode member serving its partitions 0 and 2 of
// 0, 2 and 4 assigned, handing 5 over.
func spreadSnapshot() Snapshot {
	s := leaderSnapshot()
	s.Leader = false
	s.Spread, s.Generation = true, 12
	s.Assigned, s.Owned, s.HandingOff = []int32{0, 2, 4}, []int32{0, 2}, []int32{5}
	return s
}

func TestCollectorReportsSpread(t *testing.T) {
	c := NewCollector(func(context.Context) Snapshot { return spreadSnapshot() })
	c.ObserveHandoff(30 * time.Millisecond)
	c.ObserveHandoff(4 * time.Second)
	const want = `
# HELP fanout_partitions_owned Spread mode: partitions this member serves.
# TYPE fanout_partitions_owned gauge
fanout_partitions_owned 2
# HELP fanout_partitions_assigned Spread mode: partitions the assignment gives this member.
# TYPE fanout_partitions_assigned gauge
fanout_partitions_assigned 3
# HELP fanout_handoffs_in_progress Spread mode: partitions this member is handing over.
# TYPE fanout_handoffs_in_progress gauge
fanout_handoffs_in_progress 1
# HELP fanout_assignment_generation Spread mode: generation of the assignment in force (0: none).
# TYPE fanout_assignment_generation gauge
fanout_assignment_generation 12
# HELP fanout_handoff_duration_seconds Spread mode: handoffs of a partition to another member, from the decision to the release (count: handoffs done).
# TYPE fanout_handoff_duration_seconds histogram
fanout_handoff_duration_seconds_bucket{le="0.005"} 0
fanout_handoff_duration_seconds_bucket{le="0.01"} 0
fanout_handoff_duration_seconds_bucket{le="0.025"} 0
fanout_handoff_duration_seconds_bucket{le="0.05"} 1
fanout_handoff_duration_seconds_bucket{le="0.1"} 1
fanout_handoff_duration_seconds_bucket{le="0.25"} 1
fanout_handoff_duration_seconds_bucket{le="0.5"} 1
fanout_handoff_duration_seconds_bucket{le="1"} 1
fanout_handoff_duration_seconds_bucket{le="2.5"} 1
fanout_handoff_duration_seconds_bucket{le="5"} 2
fanout_handoff_duration_seconds_bucket{le="10"} 2
fanout_handoff_duration_seconds_bucket{le="30"} 2
fanout_handoff_duration_seconds_bucket{le="+Inf"} 2
fanout_handoff_duration_seconds_sum 4.03
fanout_handoff_duration_seconds_count 2
`
	names := []string{"fanout_partitions_owned", "fanout_partitions_assigned", "fanout_handoffs_in_progress",
		"fanout_assignment_generation", "fanout_handoff_duration_seconds"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// Leader mode has none of them.
	leader := NewCollector(func(context.Context) Snapshot { return leaderSnapshot() })
	if n := testutil.CollectAndCount(leader, names...); n != 0 {
		t.Fatalf("leader mode reports %d spread metrics", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestReadySpread(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	all := spreadSnapshot()
	all.Owned = all.Assigned
	failing := all
	failing.Stats.CommitFailingSince = now.Add(-11 * time.Second)
	noAssignment := all
	noAssignment.Generation, noAssignment.Assigned, noAssignment.Owned = 0, nil, nil
	none := all
	none.Assigned, none.Owned = []int32{}, []int32{}
	refused := all
	refused.DeadLetterTopic, refused.DeadLetterRefused = "orders.dlq", 1
	refused.DeadLetterRefusedError = "kafka server: Client sent an invalid record"
	tests := []struct {
		name   string
		snap   Snapshot
		want   bool
		reason string
	}{
		{"owns every partition assigned", all, true, "member: serving partitions [0 2 4] (generation 12)"},
		{"owns some", spreadSnapshot(), false, "member: owns partitions [0 2] of [0 2 4] assigned (generation 12)"},
		{"assigned none", none, true, "member: serving partitions [] (generation 12)"},
		{"commits failing", failing, false, "member: offset commits failing for 11s"},
		{"dead letters refused", refused, false, "member: dead letters failing: orders.dlq refuses 1 " +
			"(kafka server: Client sent an invalid record); they hold their partitions' offsets"},
		{"no assignment", noAssignment, false, "member: no assignment in force (none received yet, cut off, or the cluster runs another --assignment)"},
		{"not serving", Snapshot{Spread: true, Clustered: true}, false, "member: not serving yet"},
		{"topic missing", Snapshot{Spread: true, Topic: "jobs", TopicMissing: true, KafkaAnswered: now}, false,
			"member: topic jobs not found in Kafka"},
		{"owns partitions, consumes none", with(all, func(s *Snapshot) { s.Topic, s.HighWaterMarks, s.Partitions = "jobs", nil, 3 }),
			false, "member: no partition of topic jobs consumed: 0 of 3 open (the log says why)"},
		{"owns none, consumes none", with(none, func(s *Snapshot) { s.HighWaterMarks = nil }), true,
			"member: serving partitions [] (generation 12)"},
		{"dead letters failing", with(all, func(s *Snapshot) { s.DeadLetterFailingSince = now.Add(-11 * time.Second) }), false,
			"member: producing to dead-letter topic orders.dlq failing for 11s (1 messages waiting, holding their partitions' offsets)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason := Ready(tt.snap, now, 10*time.Second)
			if ok != tt.want || reason != tt.reason {
				t.Errorf("Ready = %v %q, want %v %q", ok, reason, tt.want, tt.reason)
			}
		})
	}
}
