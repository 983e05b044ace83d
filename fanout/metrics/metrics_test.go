package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// scrapedAt is when the tests' collectors scrape.
var scrapedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// leaderSnapshot is a serving leader with two partitions.
func leaderSnapshot() Snapshot {
	return Snapshot{
		Serving: true,
		Stats: dispatch.Stats{
			Consumed: 10, Delivered: 12, Acked: 7, Nacked: 1,
			Redelivered: [3]uint64{2, 0, 1}, UnknownAcks: 3,
			InFlight: 2, Buffered: 4, BufferBytes: 400, Clients: 2, Paused: true, TooLarge: 1,
			Committed:    map[int32]int64{0: 5, 1: 9},
			Outstanding:  map[int32]int{0: 60001, 1: 2},
			PendingSince: map[int32]time.Time{0: scrapedAt.Add(-90 * time.Second)},
			Held:         []int32{0},
			Stalled:      []int32{0, 1},
			DeadLettered: 2, DeadLetterPending: 1, Delayed: 3, KeyWaiting: 4, Observers: 1, Skipped: 9, NotCounted: 6,
			Attempts: [7]uint64{5, 1, 1, 0, 0, 0, 1}, AttemptsSum: 5 + 2 + 3 + 40,
		},
		DeadLetterTopic:   "orders.dlq",
		HighWaterMarks:    map[int32]int64{0: 8, 1: 9, 2: 4},
		Clients:           2,
		Handshaking:       5,
		ConnectionsClosed: map[string]uint64{"slow consumer": 2, "handshake evicted": 4, "observer behind": 1},
		ClientsByIdentity: map[string]int{"CN=billing": 1, "": 1},
		Clustered:         true, Leader: true, LeaderKnown: true, LeaderID: "a", Epoch: 7,
		Failovers: 1, Members: 3, UnauthenticatedHeartbeats: 6,
	}
}

func TestCollectorReportsSnapshot(t *testing.T) {
	snap := leaderSnapshot()
	snap.DeadLetterFailingSince = time.Unix(1700000000, 500000000)
	snap.DeadLetterRefused, snap.DeadLetterValuesOmitted, snap.Stats.TooLargeDeadLettered = 2, 3, 4
	snap.DeliveryPaused = true
	c := NewCollector(func(context.Context) Snapshot { return snap })
	c.now = func() time.Time { return scrapedAt }
	c.ObserveCommit(3*time.Millisecond, nil)
	c.ObserveCommit(20*time.Millisecond, errors.New("zookeeper down"))

	const want = `
# HELP fanout_messages_consumed_total Messages taken from Kafka by the current dispatcher.
# TYPE fanout_messages_consumed_total counter
fanout_messages_consumed_total 10
# HELP fanout_messages_delivered_total Deliveries sent to clients, first attempts and redeliveries.
# TYPE fanout_messages_delivered_total counter
fanout_messages_delivered_total 12
# HELP fanout_messages_acked_total Deliveries acked by clients.
# TYPE fanout_messages_acked_total counter
fanout_messages_acked_total 7
# HELP fanout_messages_nacked_total Deliveries given back by clients (nack).
# TYPE fanout_messages_nacked_total counter
fanout_messages_nacked_total 1
# HELP fanout_messages_redelivered_total Messages queued for another delivery, by reason.
# TYPE fanout_messages_redelivered_total counter
fanout_messages_redelivered_total{reason="disconnect"} 0
fanout_messages_redelivered_total{reason="nack"} 1
fanout_messages_redelivered_total{reason="timeout"} 2
# HELP fanout_unknown_acks_total Acks, nacks and touches naming no outstanding delivery of the client.
# TYPE fanout_unknown_acks_total counter
fanout_unknown_acks_total 3
# HELP fanout_messages_in_flight Deliveries waiting for an ack.
# TYPE fanout_messages_in_flight gauge
fanout_messages_in_flight 2
# HELP fanout_buffered_messages Messages waiting for a client.
# TYPE fanout_buffered_messages gauge
fanout_buffered_messages 4
# HELP fanout_buffered_bytes Payload bytes of the messages waiting for a client.
# TYPE fanout_buffered_bytes gauge
fanout_buffered_bytes 400
# HELP fanout_messages_too_large Buffered messages larger than any connected client accepts: they wait for one that does.
# TYPE fanout_messages_too_large gauge
fanout_messages_too_large 1
# HELP fanout_fetching_paused 1 while fetching from Kafka is paused (backpressure or no clients).
# TYPE fanout_fetching_paused gauge
fanout_fetching_paused 1
# HELP fanout_delivery_paused 1 while an operator has paused the cluster's deliveries (fanout pause, or the console): no message is handed out until they resume.
# TYPE fanout_delivery_paused gauge
fanout_delivery_paused 1
# HELP fanout_clients_connected Connected clients.
# TYPE fanout_clients_connected gauge
fanout_clients_connected 2
# HELP fanout_clients_connected_by_identity Connected clients by identity: the client certificate's subject (mutual TLS) and the named token's name; none for neither.
# TYPE fanout_clients_connected_by_identity gauge
fanout_clients_connected_by_identity{identity="CN=billing"} 1
fanout_clients_connected_by_identity{identity="none"} 1
# HELP fanout_client_handshakes_waiting Client connections that have not sent their Hello yet.
# TYPE fanout_client_handshakes_waiting gauge
fanout_client_handshakes_waiting 5
# HELP fanout_client_connections_closed_total Client connections closed since the daemon started, by reason.
# TYPE fanout_client_connections_closed_total counter
fanout_client_connections_closed_total{reason="handshake evicted"} 4
fanout_client_connections_closed_total{reason="observer behind"} 1
fanout_client_connections_closed_total{reason="slow consumer"} 2
# HELP fanout_consumer_lag High watermark minus committed offset.
# TYPE fanout_consumer_lag gauge
fanout_consumer_lag{partition="0"} 3
fanout_consumer_lag{partition="1"} 0
# HELP fanout_committed_offset Next offset to consume as committed to the store.
# TYPE fanout_committed_offset gauge
fanout_committed_offset{partition="0"} 5
fanout_committed_offset{partition="1"} 9
# HELP fanout_high_watermark Offset the next message produced to the partition gets.
# TYPE fanout_high_watermark gauge
fanout_high_watermark{partition="0"} 8
fanout_high_watermark{partition="1"} 9
fanout_high_watermark{partition="2"} 4
# HELP fanout_outstanding_offsets Offsets of the partition received and not yet committable: an unacked message holds every later one.
# TYPE fanout_outstanding_offsets gauge
fanout_outstanding_offsets{partition="0"} 60001
fanout_outstanding_offsets{partition="1"} 2
# HELP fanout_partition_oldest_pending_age_seconds Age of the partition's oldest message received from Kafka and not yet acked (in flight, buffered, delayed or going to the dead-letter topic), since it arrived; 0 when none is.
# TYPE fanout_partition_oldest_pending_age_seconds gauge
fanout_partition_oldest_pending_age_seconds{partition="0"} 90
fanout_partition_oldest_pending_age_seconds{partition="1"} 0
# HELP fanout_oldest_pending_age_seconds Age of the oldest message received from Kafka and not yet acked, over the partitions this daemon serves; 0 when none is.
# TYPE fanout_oldest_pending_age_seconds gauge
fanout_oldest_pending_age_seconds 90
# HELP fanout_partitions_held Partitions whose fetching is paused because they hold more than --max-outstanding offsets behind an unacked message.
# TYPE fanout_partitions_held gauge
fanout_partitions_held 1
# HELP fanout_partitions_commit_stalled Partitions whose committed offset has not moved for 3 ack timeouts (at least 30s) while they hold unacked messages; each is logged with where its oldest unacked message is.
# TYPE fanout_partitions_commit_stalled gauge
fanout_partitions_commit_stalled 2
# HELP fanout_leader 1 while this node leads the cluster.
# TYPE fanout_leader gauge
fanout_leader 1
# HELP fanout_leader_epoch Epoch of the leader this node knows (0: none).
# TYPE fanout_leader_epoch gauge
fanout_leader_epoch 7
# HELP fanout_failovers_total Leader changes this node has seen after the first leader.
# TYPE fanout_failovers_total counter
fanout_failovers_total 1
# HELP fanout_cluster_members Cluster members heard from recently, this node included.
# TYPE fanout_cluster_members gauge
fanout_cluster_members 3
# HELP fanout_messages_dead_lettered_total Messages stored in the dead-letter topic after --max-attempts failed deliveries.
# TYPE fanout_messages_dead_lettered_total counter
fanout_messages_dead_lettered_total 2
# HELP fanout_dead_letter_pending Messages waiting to be stored in the dead-letter topic; they hold their partitions' committed offsets.
# TYPE fanout_dead_letter_pending gauge
fanout_dead_letter_pending 1
# HELP fanout_dead_letter_failing_since_seconds Since when (Unix time) producing to the dead-letter topic has been failing; 0 while it works.
# TYPE fanout_dead_letter_failing_since_seconds gauge
fanout_dead_letter_failing_since_seconds 1.7000000005e+09
# HELP fanout_dead_letter_refused Dead letters the dead-letter topic refuses for a reason retrying cannot fix (authorization, a compacted topic given a record without a key, ...): they wait, holding their partitions' committed offsets, until it takes them.
# TYPE fanout_dead_letter_refused gauge
fanout_dead_letter_refused 2
# HELP fanout_dead_letter_values_omitted_total Dead letters written without the message's value, too large for the dead-letter topic: the message stays at its source offset.
# TYPE fanout_dead_letter_values_omitted_total counter
fanout_dead_letter_values_omitted_total 3
# HELP fanout_messages_too_large_dead_lettered_total Messages handed to the dead-letter topic because they fitted no connected client's frame limit for --max-attempts ack timeouts.
# TYPE fanout_messages_too_large_dead_lettered_total counter
fanout_messages_too_large_dead_lettered_total 4
# HELP fanout_messages_delayed Redeliveries waiting out a retry delay (a nack's delay, or --retry-backoff).
# TYPE fanout_messages_delayed gauge
fanout_messages_delayed 3
# HELP fanout_messages_key_waiting Messages waiting for the previous message of their key (--ordering key).
# TYPE fanout_messages_key_waiting gauge
fanout_messages_key_waiting 4
# HELP fanout_observers_connected Connected observers.
# TYPE fanout_observers_connected gauge
fanout_observers_connected 1
# HELP fanout_observers_dropped_total Observers dropped for falling behind (--max-observer-bytes), since the daemon started.
# TYPE fanout_observers_dropped_total counter
fanout_observers_dropped_total 1
# HELP fanout_messages_skipped_total Messages received again after a restart or failover that the stored progress shows acked: not delivered again.
# TYPE fanout_messages_skipped_total counter
fanout_messages_skipped_total 9
# HELP fanout_failures_not_counted_total Failed deliveries not counted toward --max-attempts: give-backs of deliveries a client never processed, deliveries unanswered at a client's goodbye or when the daemon closed its connection, and disconnects of clients dropping together (one per liveness window).
# TYPE fanout_failures_not_counted_total counter
fanout_failures_not_counted_total 6
# HELP fanout_message_attempts Deliveries a message took until it was acked or dead-lettered.
# TYPE fanout_message_attempts histogram
fanout_message_attempts_bucket{le="1"} 5
fanout_message_attempts_bucket{le="2"} 6
fanout_message_attempts_bucket{le="3"} 7
fanout_message_attempts_bucket{le="5"} 7
fanout_message_attempts_bucket{le="10"} 7
fanout_message_attempts_bucket{le="25"} 7
fanout_message_attempts_bucket{le="+Inf"} 8
fanout_message_attempts_sum 50
fanout_message_attempts_count 8
# HELP fanout_heartbeats_unauthenticated_total Heartbeat records ignored because they carry no valid MAC (--cluster-secret): someone writes unauthenticated records.
# TYPE fanout_heartbeats_unauthenticated_total counter
fanout_heartbeats_unauthenticated_total 6
# HELP fanout_commit_failures_total Offset commits that failed (they are retried).
# TYPE fanout_commit_failures_total counter
fanout_commit_failures_total 1
# HELP fanout_commit_duration_seconds Duration of offset commits to the store, failed ones included.
# TYPE fanout_commit_duration_seconds histogram
fanout_commit_duration_seconds_bucket{le="0.001"} 0
fanout_commit_duration_seconds_bucket{le="0.0025"} 0
fanout_commit_duration_seconds_bucket{le="0.005"} 1
fanout_commit_duration_seconds_bucket{le="0.01"} 1
fanout_commit_duration_seconds_bucket{le="0.025"} 2
fanout_commit_duration_seconds_bucket{le="0.05"} 2
fanout_commit_duration_seconds_bucket{le="0.1"} 2
fanout_commit_duration_seconds_bucket{le="0.25"} 2
fanout_commit_duration_seconds_bucket{le="0.5"} 2
fanout_commit_duration_seconds_bucket{le="1"} 2
fanout_commit_duration_seconds_bucket{le="2.5"} 2
fanout_commit_duration_seconds_bucket{le="5"} 2
fanout_commit_duration_seconds_bucket{le="10"} 2
fanout_commit_duration_seconds_bucket{le="+Inf"} 2
fanout_commit_duration_seconds_sum 0.023
fanout_commit_duration_seconds_count 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestCollectorLint(t *testing.T) {
	c := NewCollector(func(context.Context) Snapshot { return leaderSnapshot() })
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// with returns s changed by f.
func with(s Snapshot, f func(*Snapshot)) Snapshot {
	f(&s)
	return s
}

func TestReady(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	failing := func(d time.Duration) Snapshot {
		s := leaderSnapshot()
		s.Stats.CommitFailingSince = now.Add(-d)
		return s
	}
	deadFailing := func(d time.Duration) Snapshot {
		s := leaderSnapshot()
		s.DeadLetterFailingSince = now.Add(-d)
		return s
	}
	refused := leaderSnapshot()
	refused.DeadLetterFailingSince = now // at once, not after a while
	refused.DeadLetterRefused, refused.DeadLetterRefusedError = 2, "kafka server: The client is not authorized to access this topic"
	tests := []struct {
		name   string
		snap   Snapshot
		want   bool
		reason string
	}{
		{"leader serving", leaderSnapshot(), true, "leader: serving"},
		{"leader commits failing briefly", failing(2 * time.Second), true, "leader: serving"},
		{"leader commits failing too long", failing(11 * time.Second), false, "leader: offset commits failing for 11s"},
		{"dead-letter topic failing briefly", deadFailing(2 * time.Second), true, "leader: serving"},
		{"dead-letter topic failing too long", deadFailing(12 * time.Second), false,
			"leader: producing to dead-letter topic orders.dlq failing for 12s (1 messages waiting, holding their partitions' offsets)"},
		{"dead letters refused", refused, false, "leader: dead letters failing: orders.dlq refuses 2 " +
			"(kafka server: The client is not authorized to access this topic); they hold their partitions' offsets"},
		{"elected, not serving", Snapshot{Clustered: true, Leader: true, LeaderKnown: true, LeaderID: "a"}, false, "leader: elected, not serving yet"},
		{"follower knows leader", Snapshot{Clustered: true, LeaderKnown: true, LeaderID: "b", Epoch: 4}, true, "follower: leader b (epoch 4)"},
		{"follower without leader", Snapshot{Clustered: true}, false, "follower: no leader known"},
		{"starting", Snapshot{}, false, "starting: Kafka not reached yet"},
		{"starting, Kafka refuses", Snapshot{KafkaError: "dial tcp 127.0.0.1:9092: connection refused"}, false,
			"starting: Kafka not reached yet (dial tcp 127.0.0.1:9092: connection refused)"},
		{"starting, topic missing", Snapshot{Topic: "jobs", TopicMissing: true, KafkaAnswered: now}, false,
			"starting: topic jobs not found in Kafka"},
		{"starting, topic found", Snapshot{Topic: "jobs", KafkaAnswered: now}, false, "starting: offset store not reached yet"},
		{"follower, topic deleted", with(Snapshot{Clustered: true, LeaderKnown: true, LeaderID: "b", Epoch: 4},
			func(s *Snapshot) { s.Topic, s.TopicMissing = "jobs", true }), false, "follower: topic jobs not found in Kafka"},
		{"leader, topic deleted", with(leaderSnapshot(), func(s *Snapshot) {
			s.Topic, s.TopicMissing, s.HighWaterMarks, s.Partitions = "jobs", true, nil, 3
		}), false, "leader: topic jobs not found in Kafka; no partition of topic jobs consumed: 0 of 3 open (the log says why)"},
		{"leader consuming no partition", with(leaderSnapshot(), func(s *Snapshot) {
			s.Topic, s.HighWaterMarks, s.Partitions = "jobs", nil, 3
		}), false, "leader: no partition of topic jobs consumed: 0 of 3 open (the log says why)"},
		{"leader whose source has not started", with(leaderSnapshot(), func(s *Snapshot) {
			s.Topic, s.HighWaterMarks, s.Partitions = "jobs", map[int32]int64{}, 0
		}), false, "leader: no partition of topic jobs consumed: the source has not started (the log says why)"},
		{"leader consuming one partition of three", with(leaderSnapshot(), func(s *Snapshot) {
			s.HighWaterMarks, s.Partitions = map[int32]int64{1: 4}, 3
		}), true, "leader: serving"},
		{"Kafka silent within the grace", with(leaderSnapshot(), func(s *Snapshot) { s.KafkaAnswered = now.Add(-KafkaGrace) }),
			true, "leader: serving"},
		{"Kafka silent past the grace", with(leaderSnapshot(), func(s *Snapshot) {
			s.KafkaAnswered, s.KafkaError = now.Add(-KafkaGrace-time.Second), "kafka: client has run out of available brokers"
		}), false, "leader: Kafka not answering for 31s (kafka: client has run out of available brokers)"},
		{"follower, Kafka silent past the grace", with(Snapshot{Clustered: true}, func(s *Snapshot) {
			s.KafkaAnswered = now.Add(-time.Minute)
		}), false, "follower: Kafka not answering for 1m0s; no leader known"},
		{"every failing condition", with(failing(11*time.Second), func(s *Snapshot) {
			s.Topic, s.TopicMissing, s.DeadLetterFailingSince = "jobs", true, now.Add(-12*time.Second)
		}), false, "leader: topic jobs not found in Kafka; offset commits failing for 11s; " +
			"producing to dead-letter topic orders.dlq failing for 12s (1 messages waiting, holding their partitions' offsets)"},
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

func TestHandlerEndpoints(t *testing.T) {
	snap := Snapshot{Clustered: true}
	h := Handler(HandlerConfig{
		Collector: NewCollector(func(context.Context) Snapshot { return leaderSnapshot() }),
		Snapshot:  func(context.Context) Snapshot { return snap },
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		path     string
		wantCode int
		contains string
	}{
		{"/healthz", 200, "ok\n"},
		{"/readyz", 503, "follower: no leader known\n"},
		{"/metrics", 200, "fanout_messages_acked_total 7\n"},
		{"/metrics", 200, "go_goroutines "},
		{"/nope", 404, ""},
	}
	for _, tt := range tests {
		code, body := get(tt.path)
		if code != tt.wantCode || !strings.Contains(body, tt.contains) {
			t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.wantCode, tt.contains)
		}
	}
}

func TestListenServesAndShutsDown(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Handler(HandlerConfig{
		Collector: NewCollector(func(context.Context) Snapshot { return Snapshot{} }),
		Snapshot:  func(context.Context) Snapshot { return Snapshot{} },
	}))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	resp, err := http.Get("http://" + s.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/healthz = %d", resp.StatusCode)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v, want nil after Shutdown", err)
	}
}

// The overall age is the largest partition's; a partition with nothing
// pending reports 0, one dated after the scrape (the clock stepped back)
// reports 0 too, and a daemon that tracks no partition (a follower) reports
// an overall 0 and no partition.
func TestOldestPendingAge(t *testing.T) {
	t.Parallel()
	snap := Snapshot{Serving: true, Stats: dispatch.Stats{
		Outstanding:  map[int32]int{0: 3, 1: 1, 2: 0, 3: 1},
		PendingSince: map[int32]time.Time{0: scrapedAt.Add(-2 * time.Second), 1: scrapedAt.Add(-61500 * time.Millisecond), 3: scrapedAt.Add(time.Second)},
	}}
	c := NewCollector(func(context.Context) Snapshot { return snap })
	c.now = func() time.Time { return scrapedAt }
	const want = `
# HELP fanout_partition_oldest_pending_age_seconds Age of the partition's oldest message received from Kafka and not yet acked (in flight, buffered, delayed or going to the dead-letter topic), since it arrived; 0 when none is.
# TYPE fanout_partition_oldest_pending_age_seconds gauge
fanout_partition_oldest_pending_age_seconds{partition="0"} 2
fanout_partition_oldest_pending_age_seconds{partition="1"} 61.5
fanout_partition_oldest_pending_age_seconds{partition="2"} 0
fanout_partition_oldest_pending_age_seconds{partition="3"} 0
# HELP fanout_oldest_pending_age_seconds Age of the oldest message received from Kafka and not yet acked, over the partitions this daemon serves; 0 when none is.
# TYPE fanout_oldest_pending_age_seconds gauge
fanout_oldest_pending_age_seconds 61.5
`
	names := []string{"fanout_partition_oldest_pending_age_seconds", "fanout_oldest_pending_age_seconds"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	snap = Snapshot{Clustered: true, LeaderKnown: true}
	const follower = `
# HELP fanout_oldest_pending_age_seconds Age of the oldest message received from Kafka and not yet acked, over the partitions this daemon serves; 0 when none is.
# TYPE fanout_oldest_pending_age_seconds gauge
fanout_oldest_pending_age_seconds 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(follower), names...); err != nil {
		t.Fatal(err)
	}
}

// Warnings are the failing readiness conditions, unready, then the
// advisories: what an operator should look at on a ready daemon.
func TestWarnings(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	kinds := func(ws []Warning) []string {
		var out []string
		for _, w := range ws {
			k := w.Kind
			if w.Unready {
				k += "!"
			}
			out = append(out, k)
		}
		return out
	}
	flowing := with(leaderSnapshot(), func(s *Snapshot) { s.Stats.Held, s.Stats.Stalled = nil, nil })
	tests := []struct {
		name string
		snap Snapshot
		want []string
		text string // in the first warning
	}{
		{"a ready leader, nothing wrong", flowing, nil, ""},
		{"held and stalled partitions", leaderSnapshot(), []string{"partitions-held", "partitions-stalled"},
			"partitions 0 held: more than --max-outstanding offsets behind an unacked message"},
		{"paused", with(flowing, func(s *Snapshot) { s.DeliveryPaused, s.PausedBy = true, "ops from 10.0.0.1:5 at 2026-01-02T03:00:00Z" }),
			[]string{"delivery-paused"}, "deliveries paused by ops from 10.0.0.1:5 at 2026-01-02T03:00:00Z"},
		{"no clients while messages wait", with(flowing, func(s *Snapshot) { s.Stats.Clients = 0 }),
			[]string{"no-clients"}, "no clients connected while messages wait (lag 3, 4 fetched)"},
		{"no clients, nothing waits", with(flowing, func(s *Snapshot) {
			s.Stats.Clients, s.Stats.Buffered, s.HighWaterMarks = 0, 0, map[int32]int64{0: 5, 1: 9}
		}), nil, ""},
		{"commits failing briefly", with(flowing, func(s *Snapshot) { s.Stats.CommitFailingSince, s.Stats.CommitFailures = now.Add(-2*time.Second), 3 }),
			[]string{"commits-failing"}, "offset commits failing for 2s (3 failures so far)"},
		{"commits failing too long", with(flowing, func(s *Snapshot) { s.Stats.CommitFailingSince = now.Add(-11 * time.Second) }),
			[]string{"commits-failing!"}, "offset commits failing for 11s"},
		{"dead letters failing briefly", with(flowing, func(s *Snapshot) { s.DeadLetterFailingSince = now.Add(-time.Second) }),
			[]string{"dead-letters-failing"}, "producing to dead-letter topic orders.dlq failing for 1s (1 messages waiting)"},
		{"topic missing", with(flowing, func(s *Snapshot) { s.Topic, s.TopicMissing = "jobs", true }),
			[]string{"topic-missing!"}, "topic jobs not found in Kafka"},
		{"a follower", Snapshot{Clustered: true, LeaderKnown: true, LeaderID: "b"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := Warnings(tt.snap, now, 10*time.Second)
			if got := kinds(ws); !slices.Equal(got, tt.want) {
				t.Fatalf("warnings %q, want %q (%+v)", got, tt.want, ws)
			}
			if len(ws) > 0 && ws[0].Message != tt.text && !strings.HasPrefix(ws[0].Message, tt.text) {
				t.Errorf("first warning %q, want %q", ws[0].Message, tt.text)
			}
			ready, _ := Ready(tt.snap, now, 10*time.Second)
			if unready := slices.ContainsFunc(ws, func(w Warning) bool { return w.Unready }); unready == ready {
				t.Errorf("ready %v with unready warnings %v", ready, unready)
			}
		})
	}
}
