// Package metrics exposes a fanout daemon to Prometheus and to Kubernetes
// probes. The Collector reads a Snapshot of the daemon on every scrape, so
// the hot path increments nothing: the dispatcher already keeps its
// counters, the source its high watermarks, the elector its view of the
// cluster. The one exception is the commit latency, which the committer
// observes once per commit (ObserveCommit), never per message.
//
// Counters taken from the dispatcher start again at zero when a new
// dispatcher starts (a new leadership term); Prometheus treats that as a
// counter reset.
package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// Snapshot is the daemon's state at one moment, as the Collector and the
// readiness check see it.
type Snapshot struct {
	// Serving: a dispatcher runs and Stats holds its counters.
	Serving bool
	Stats   dispatch.Stats
	// HighWaterMarks is, per partition, the offset the next produced
	// message gets (the source's view as of its last fetch; while it
	// fetches nothing, the topic check's, when newer).
	HighWaterMarks map[int32]int64
	// Clients is the number of connected, welcomed clients.
	Clients int
	// Handshaking is the number of connections that have not sent their
	// Hello yet.
	Handshaking int
	// ConnectionsClosed counts the client connections closed since the
	// daemon started, by reason ("slow consumer", "handshake evicted", ...).
	ConnectionsClosed map[string]uint64
	// ClientsByIdentity counts the connected clients by identity: the
	// client certificate's subject and the named token's name ("" for
	// neither, reported as "none").
	ClientsByIdentity map[string]int

	// DeadLetterTopic is the serving term's dead-letter topic ("" without
	// --max-attempts); DeadLetterFailingSince is since when producing to it
	// has failed, zero while it works.
	DeadLetterTopic        string
	DeadLetterFailingSince time.Time
	// DeadLetterRefused is the number of dead letters the topic refuses
	// for a reason retrying cannot fix, DeadLetterRefusedError the last
	// such refusal: they wait, holding their partitions' offsets.
	DeadLetterRefused      int
	DeadLetterRefusedError string
	// DeadLetterValuesOmitted counts the dead letters written without the
	// message's value, too large for the dead-letter topic.
	DeadLetterValuesOmitted uint64

	// Topic is the topic the daemon consumes. TopicMissing: Kafka's last
	// answer to the daemon's check of it said it does not exist.
	Topic        string
	TopicMissing bool
	// KafkaAnswered is when Kafka last answered the daemon (its check of
	// the topic, or a new connection); zero before it first did.
	// KafkaError is the last failure to reach Kafka since, "" when none.
	KafkaAnswered time.Time
	KafkaError    string
	// Partitions is how many partitions the serving source consumes or is
	// opening (HighWaterMarks has those it consumes).
	Partitions int

	// Clustered: the daemon takes part in an election (not the dev mode).
	// Before the election starts, Clustered is false and so is Serving.
	Clustered bool
	// Leader: this node leads (it may not serve yet).
	Leader bool
	// LeaderKnown: this node knows who leads; LeaderID and Epoch name it.
	LeaderKnown bool
	LeaderID    string
	Epoch       uint64
	Failovers   uint64 // leader changes seen after the first leader
	Members     int    // cluster members heard from recently, this node included
	// UnauthenticatedHeartbeats counts the heartbeat records ignored for
	// want of a valid MAC (--cluster-secret).
	UnauthenticatedHeartbeats uint64

	// Spread: the member serves the partitions the leader assigns it
	// (--assignment spread); the fields below describe them.
	Spread bool
	// Generation is the generation of the assignment in force; 0 when
	// none is.
	Generation uint64
	// Assigned, Owned and HandingOff are the partitions the assignment
	// gives this member, those it serves, and those it is handing over.
	Assigned, Owned, HandingOff []int32

	// DeliveryPaused: an operator paused the cluster's deliveries, as this
	// daemon knows (it hands nothing out while it serves); PausedBy says
	// who asked, where and when.
	DeliveryPaused bool
	PausedBy       string
}

// ObserverBehind is the reason, among Snapshot.ConnectionsClosed, of an
// observer dropped for falling behind (server.CloseReasons).
const ObserverBehind = "observer behind"

// Namespace prefixes every metric name.
const Namespace = "fanout"

// DefaultScrapeTimeout bounds how long a scrape waits for a snapshot.
const DefaultScrapeTimeout = 5 * time.Second

// commitBuckets are the commit latency buckets, in seconds: ZooKeeper
// multi-ops take milliseconds; seconds mean trouble.
var commitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Collector is a prometheus.Collector of a fanout daemon. Create it with
// NewCollector and register it; it is safe for concurrent use.
type Collector struct {
	snapshot func(context.Context) Snapshot
	timeout  time.Duration
	now      func() time.Time // the ages' clock

	commitLatency  prometheus.Histogram
	commitFailures prometheus.Counter
	handoffLatency prometheus.Histogram

	consumed, delivered, acked, nacked, redelivered, unknownAcks *prometheus.Desc
	inFlight, buffered, bufferedBytes, paused, clients           *prometheus.Desc
	deliveryPaused                                               *prometheus.Desc
	handshaking, connsClosed, tooLarge                           *prometheus.Desc
	lag, committed, highWater                                    *prometheus.Desc
	oldestPending, oldestPendingAll                              *prometheus.Desc
	outstanding, held, stalled                                   *prometheus.Desc
	leader, epoch, failovers, members                            *prometheus.Desc
	unauthHeartbeats, clientsByIdentity                          *prometheus.Desc
	owned, assigned, handingOff, generation                      *prometheus.Desc

	deadLettered, deadLetterPending, deadLetterFailing *prometheus.Desc
	delayed, keyWaiting, observers, observersDropped   *prometheus.Desc
	skipped, notCounted, attempts                      *prometheus.Desc
	deadLetterRefused, valuesOmitted, tooLargeDead     *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector that calls snapshot on every scrape,
// with a context that ends after DefaultScrapeTimeout.
func NewCollector(snapshot func(context.Context) Snapshot) *Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(Namespace+"_"+name, help, labels, nil)
	}
	return &Collector{
		snapshot: snapshot,
		timeout:  DefaultScrapeTimeout,
		now:      time.Now,
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "commit_duration_seconds",
			Help:    "Duration of offset commits to the store, failed ones included.",
			Buckets: commitBuckets,
		}),
		commitFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "commit_failures_total",
			Help: "Offset commits that failed (they are retried).",
		}),
		handoffLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "handoff_duration_seconds",
			Help:    "Spread mode: handoffs of a partition to another member, from the decision to the release (count: handoffs done).",
			Buckets: handoffBuckets,
		}),
		consumed:      desc("messages_consumed_total", "Messages taken from Kafka by the current dispatcher."),
		delivered:     desc("messages_delivered_total", "Deliveries sent to clients, first attempts and redeliveries."),
		acked:         desc("messages_acked_total", "Deliveries acked by clients."),
		nacked:        desc("messages_nacked_total", "Deliveries given back by clients (nack)."),
		redelivered:   desc("messages_redelivered_total", "Messages queued for another delivery, by reason.", "reason"),
		unknownAcks:   desc("unknown_acks_total", "Acks, nacks and touches naming no outstanding delivery of the client."),
		inFlight:      desc("messages_in_flight", "Deliveries waiting for an ack."),
		buffered:      desc("buffered_messages", "Messages waiting for a client."),
		bufferedBytes: desc("buffered_bytes", "Payload bytes of the messages waiting for a client."),
		paused:        desc("fetching_paused", "1 while fetching from Kafka is paused (backpressure or no clients)."),
		clients:       desc("clients_connected", "Connected clients."),
		deliveryPaused: desc("delivery_paused", "1 while an operator has paused the cluster's deliveries (fanout pause, or the console): "+
			"no message is handed out until they resume."),
		handshaking: desc("client_handshakes_waiting", "Client connections that have not sent their Hello yet."),
		connsClosed: desc("client_connections_closed_total", "Client connections closed since the daemon started, by reason.", "reason"),
		tooLarge:    desc("messages_too_large", "Buffered messages larger than any connected client accepts: they wait for one that does."),
		lag:         desc("consumer_lag", "High watermark minus committed offset.", "partition"),
		committed:   desc("committed_offset", "Next offset to consume as committed to the store.", "partition"),
		highWater:   desc("high_watermark", "Offset the next message produced to the partition gets.", "partition"),
		oldestPending: desc("partition_oldest_pending_age_seconds",
			"Age of the partition's oldest message received from Kafka and not yet acked (in flight, buffered, delayed or going to the dead-letter topic), since it arrived; 0 when none is.", "partition"),
		oldestPendingAll: desc("oldest_pending_age_seconds",
			"Age of the oldest message received from Kafka and not yet acked, over the partitions this daemon serves; 0 when none is."),
		outstanding: desc("outstanding_offsets", "Offsets of the partition received and not yet committable: an unacked message holds every later one.", "partition"),
		held:        desc("partitions_held", "Partitions whose fetching is paused because they hold more than --max-outstanding offsets behind an unacked message."),
		stalled:     desc("partitions_commit_stalled", "Partitions whose committed offset has not moved for 3 ack timeouts (at least 30s) while they hold unacked messages; each is logged with where its oldest unacked message is."),
		leader:      desc("leader", "1 while this node leads the cluster."),
		epoch:       desc("leader_epoch", "Epoch of the leader this node knows (0: none)."),
		failovers:   desc("failovers_total", "Leader changes this node has seen after the first leader."),
		members:     desc("cluster_members", "Cluster members heard from recently, this node included."),
		unauthHeartbeats: desc("heartbeats_unauthenticated_total",
			"Heartbeat records ignored because they carry no valid MAC (--cluster-secret): someone writes unauthenticated records."),
		clientsByIdentity: desc("clients_connected_by_identity",
			"Connected clients by identity: the client certificate's subject (mutual TLS) and the named token's name; none for neither.", "identity"),
		owned:      desc("partitions_owned", "Spread mode: partitions this member serves."),
		assigned:   desc("partitions_assigned", "Spread mode: partitions the assignment gives this member."),
		handingOff: desc("handoffs_in_progress", "Spread mode: partitions this member is handing over."),
		generation: desc("assignment_generation", "Spread mode: generation of the assignment in force (0: none)."),

		deadLettered:      desc("messages_dead_lettered_total", "Messages stored in the dead-letter topic after --max-attempts failed deliveries."),
		deadLetterPending: desc("dead_letter_pending", "Messages waiting to be stored in the dead-letter topic; they hold their partitions' committed offsets."),
		deadLetterFailing: desc("dead_letter_failing_since_seconds", "Since when (Unix time) producing to the dead-letter topic has been failing; 0 while it works."),
		delayed:           desc("messages_delayed", "Redeliveries waiting out a retry delay (a nack's delay, or --retry-backoff)."),
		keyWaiting:        desc("messages_key_waiting", "Messages waiting for the previous message of their key (--ordering key)."),
		observers:         desc("observers_connected", "Connected observers."),
		observersDropped:  desc("observers_dropped_total", "Observers dropped for falling behind (--max-observer-bytes), since the daemon started."),
		skipped:           desc("messages_skipped_total", "Messages received again after a restart or failover that the stored progress shows acked: not delivered again."),
		notCounted:        desc("failures_not_counted_total", "Failed deliveries not counted toward --max-attempts: give-backs of deliveries a client never processed, deliveries unanswered at a client's goodbye or when the daemon closed its connection, and disconnects of clients dropping together (one per liveness window)."),
		attempts:          desc("message_attempts", "Deliveries a message took until it was acked or dead-lettered."),
		deadLetterRefused: desc("dead_letter_refused", "Dead letters the dead-letter topic refuses for a reason retrying cannot fix "+
			"(authorization, a compacted topic given a record without a key, ...): they wait, holding their partitions' committed offsets, until it takes them."),
		valuesOmitted: desc("dead_letter_values_omitted_total", "Dead letters written without the message's value, too large for the dead-letter topic: "+
			"the message stays at its source offset."),
		tooLargeDead: desc("messages_too_large_dead_lettered_total", "Messages handed to the dead-letter topic because they fitted no connected "+
			"client's frame limit for --max-attempts ack timeouts."),
	}
}

// handoffBuckets are the handoff duration buckets, in seconds: a handoff
// waits for in-flight acks, up to --handoff-timeout (10 s by default).
var handoffBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// ObserveHandoff records one handoff of a partition to another member and
// its duration.
func (c *Collector) ObserveHandoff(took time.Duration) { c.handoffLatency.Observe(took.Seconds()) }

// ObserveCommit records one commit attempt: its duration and, when err is
// not nil, a failure. It is dispatch.Config.OnCommit.
func (c *Collector) ObserveCommit(took time.Duration, err error) {
	c.commitLatency.Observe(took.Seconds())
	if err != nil {
		c.commitFailures.Inc()
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.commitLatency.Describe(ch)
	c.commitFailures.Describe(ch)
	c.handoffLatency.Describe(ch)
	for _, d := range []*prometheus.Desc{
		c.consumed, c.delivered, c.acked, c.nacked, c.redelivered, c.unknownAcks,
		c.inFlight, c.buffered, c.bufferedBytes, c.paused, c.deliveryPaused, c.clients, c.handshaking, c.connsClosed, c.tooLarge,
		c.lag, c.committed, c.highWater, c.oldestPending, c.oldestPendingAll, c.outstanding, c.held, c.stalled, c.leader, c.epoch, c.failovers, c.members,
		c.owned, c.assigned, c.handingOff, c.generation, c.unauthHeartbeats, c.clientsByIdentity,
		c.deadLettered, c.deadLetterPending, c.deadLetterFailing, c.delayed, c.keyWaiting, c.observers,
		c.observersDropped, c.skipped, c.notCounted, c.attempts,
		c.deadLetterRefused, c.valuesOmitted, c.tooLargeDead,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it takes one snapshot.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s := c.snapshot(ctx)
	st := s.Stats

	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.consumed, st.Consumed)
	counter(c.delivered, st.Delivered)
	counter(c.acked, st.Acked)
	counter(c.nacked, st.Nacked)
	for i, reason := range dispatch.RedeliverReasons {
		counter(c.redelivered, st.Redelivered[i], reason)
	}
	counter(c.unknownAcks, st.UnknownAcks)
	gauge(c.inFlight, float64(st.InFlight))
	gauge(c.buffered, float64(st.Buffered))
	gauge(c.bufferedBytes, float64(st.BufferBytes))
	gauge(c.tooLarge, float64(st.TooLarge))
	gauge(c.paused, bool01(st.Paused))
	gauge(c.deliveryPaused, bool01(s.DeliveryPaused))
	gauge(c.clients, float64(s.Clients))
	gauge(c.handshaking, float64(s.Handshaking))
	for reason, n := range s.ConnectionsClosed {
		counter(c.connsClosed, n, reason)
	}
	for identity, n := range s.ClientsByIdentity {
		if identity == "" {
			identity = "none"
		}
		gauge(c.clientsByIdentity, float64(n), identity)
	}

	for p, hw := range s.HighWaterMarks {
		gauge(c.highWater, float64(hw), partition(p))
		if off, ok := st.Committed[p]; ok {
			gauge(c.lag, float64(Lag(hw, off)), partition(p))
		}
	}
	for p, off := range st.Committed {
		gauge(c.committed, float64(off), partition(p))
	}
	for p, n := range st.Outstanding {
		gauge(c.outstanding, float64(n), partition(p))
	}
	// The ages are computed now, from when the oldest pending message of
	// each partition arrived: every tracked partition has one, 0 when
	// nothing is pending.
	now, oldest := c.now(), 0.0
	for p := range st.Outstanding {
		age := 0.0
		if since, ok := st.PendingSince[p]; ok {
			age = max(0, now.Sub(since).Seconds())
		}
		gauge(c.oldestPending, age, partition(p))
		oldest = max(oldest, age)
	}
	gauge(c.oldestPendingAll, oldest)
	gauge(c.held, float64(len(st.Held)))
	gauge(c.stalled, float64(len(st.Stalled)))

	counter(c.deadLettered, st.DeadLettered)
	gauge(c.deadLetterPending, float64(st.DeadLetterPending))
	failing := 0.0
	if !s.DeadLetterFailingSince.IsZero() {
		failing = float64(s.DeadLetterFailingSince.UnixNano()) / 1e9
	}
	gauge(c.deadLetterFailing, failing)
	gauge(c.deadLetterRefused, float64(s.DeadLetterRefused))
	counter(c.valuesOmitted, s.DeadLetterValuesOmitted)
	counter(c.tooLargeDead, st.TooLargeDeadLettered)
	gauge(c.delayed, float64(st.Delayed))
	gauge(c.keyWaiting, float64(st.KeyWaiting))
	gauge(c.observers, float64(st.Observers))
	counter(c.observersDropped, s.ConnectionsClosed[ObserverBehind])
	counter(c.skipped, st.Skipped)
	counter(c.notCounted, st.NotCounted)
	buckets := make(map[float64]uint64, len(dispatch.AttemptBuckets))
	var cum, total uint64
	for i, le := range dispatch.AttemptBuckets {
		cum += st.Attempts[i]
		buckets[float64(le)] = cum
	}
	total = cum + st.Attempts[len(dispatch.AttemptBuckets)]
	ch <- prometheus.MustNewConstHistogram(c.attempts, total, float64(st.AttemptsSum), buckets)

	gauge(c.leader, bool01(s.Leader))
	gauge(c.epoch, float64(s.Epoch))
	counter(c.failovers, s.Failovers)
	gauge(c.members, float64(s.Members))
	counter(c.unauthHeartbeats, s.UnauthenticatedHeartbeats)

	if s.Spread {
		gauge(c.owned, float64(len(s.Owned)))
		gauge(c.assigned, float64(len(s.Assigned)))
		gauge(c.handingOff, float64(len(s.HandingOff)))
		gauge(c.generation, float64(s.Generation))
		ch <- c.handoffLatency
	}

	ch <- c.commitLatency
	ch <- c.commitFailures
}

// Lag is the number of messages of a partition not yet committed: the high
// watermark minus the committed offset, never negative (the high watermark
// seen by the source may lag behind a commit).
func Lag(highWatermark, committed int64) int64 { return max(0, highWatermark-committed) }

func partition(p int32) string { return strconv.FormatInt(int64(p), 10) }

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
