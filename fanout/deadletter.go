package fanout

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// Headers a dead-letter record carries besides the original ones.
const (
	HeaderDeadLetterTopic       = "fanout.dlq.topic"        // the topic the message was consumed from
	HeaderDeadLetterPartition   = "fanout.dlq.partition"    // its partition, decimal
	HeaderDeadLetterOffset      = "fanout.dlq.offset"       // its offset, decimal
	HeaderDeadLetterAttempts    = "fanout.dlq.attempts"     // the failed deliveries, decimal
	HeaderDeadLetterLastFailure = "fanout.dlq.last_failure" // timeout, nack or disconnect
	HeaderDeadLetterNackReason  = "fanout.dlq.nack_reason"  // the last nack's reason, when one gave it
)

// deadLetters is a term's dispatch.DeadLetter: one sarama producer, owned by
// the term, and one goroutine that produces the queued records to the
// dead-letter topic, in batches, retrying failed ones with backoff for as
// long as it takes (the dispatcher holds their partitions' offsets
// meanwhile), and reports the stored ones to the dispatcher.
type deadLetters struct {
	topic    string // the dead-letter topic
	source   string // the topic consumed
	producer sarama.SyncProducer
	log      *logrus.Entry
	retryMax time.Duration

	mu    sync.Mutex // guards queue
	queue []dispatch.DeadLetterRecord
	kick  chan struct{} // capacity 1: queue became non-empty

	stored chan []*dispatch.Message
	// failingSince is when producing started failing (Unix ns), 0 while it
	// works: for metrics and /readyz.
	failingSince atomic.Int64
}

var _ dispatch.DeadLetter = (*deadLetters)(nil)

func newDeadLetters(producer sarama.SyncProducer, topic, source string, retryMax time.Duration, log *logrus.Entry) *deadLetters {
	return &deadLetters{
		topic:    topic,
		source:   source,
		producer: producer,
		log:      log.WithField("dead_letter_topic", topic),
		retryMax: retryMax,
		kick:     make(chan struct{}, 1),
		stored:   make(chan []*dispatch.Message, 1),
	}
}

// Send implements dispatch.DeadLetter: it queues r and never blocks.
func (d *deadLetters) Send(r dispatch.DeadLetterRecord) {
	d.mu.Lock()
	d.queue = append(d.queue, r)
	first := len(d.queue) == 1
	d.mu.Unlock()
	if first {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// close closes the producer; call it once run has returned.
func (d *deadLetters) close() { _ = d.producer.Close() }

// Stored implements dispatch.DeadLetter.
func (d *deadLetters) Stored() <-chan []*dispatch.Message { return d.stored }

// FailingSince returns since when producing has failed, zero while it works.
func (d *deadLetters) FailingSince() time.Time {
	if ns := d.failingSince.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// run produces until ctx ends. Records still queued then are dropped: their
// messages are not committed, so the next term delivers them again (and,
// their attempts being stored, dead-letters them again).
func (d *deadLetters) run(ctx context.Context) {
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: d.retryMax, Jitter: true}
	var pending []dispatch.DeadLetterRecord
	failures := 0
	for {
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-d.kick:
			}
		}
		d.mu.Lock()
		pending = append(pending, d.queue...)
		clear(d.queue)
		d.queue = d.queue[:0]
		d.mu.Unlock()
		if len(pending) == 0 {
			continue
		}
		done, failed, err := d.produce(pending)
		pending = failed
		// The state is updated before the stored messages are reported, so
		// that whoever sees them stored sees it too.
		if err == nil {
			if failures > 0 {
				d.log.WithField("failures", failures).Info("dead-letter topic: producing works again")
			}
			failures = 0
			b.Reset()
			d.failingSince.Store(0)
		} else {
			failures++
			d.failingSince.CompareAndSwap(0, time.Now().UnixNano())
		}
		if len(done) > 0 {
			select {
			case d.stored <- done:
			case <-ctx.Done():
				return
			}
		}
		if err == nil {
			continue
		}
		wait := b.Next()
		d.log.WithError(err).WithFields(logrus.Fields{"waiting": len(pending), "attempt": failures, "retry_in": wait.Round(time.Millisecond)}).
			Warn("dead-letter topic: producing failed; the messages wait, and hold their partitions' committed offsets")
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// produce sends the records in one batch and returns the messages stored,
// the records that failed and why.
func (d *deadLetters) produce(rs []dispatch.DeadLetterRecord) (done []*dispatch.Message, failed []dispatch.DeadLetterRecord, err error) {
	msgs := make([]*sarama.ProducerMessage, len(rs))
	for i := range rs {
		msgs[i] = d.record(&rs[i])
		msgs[i].Metadata = i
	}
	err = d.producer.SendMessages(msgs)
	if err == nil {
		done = make([]*dispatch.Message, len(rs))
		for i := range rs {
			done[i] = rs[i].Msg
		}
		return done, nil, nil
	}
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		return nil, rs, fmt.Errorf("produce %d dead letters to %s: %w", len(rs), d.topic, err)
	}
	bad := make(map[int]bool, len(perrs))
	for _, pe := range perrs {
		if i, ok := pe.Msg.Metadata.(int); ok {
			bad[i] = true
		}
	}
	for i := range rs {
		if bad[i] {
			failed = append(failed, rs[i])
		} else {
			done = append(done, rs[i].Msg)
		}
	}
	return done, failed, fmt.Errorf("produce %d of %d dead letters to %s: %w", len(failed), len(rs), d.topic, perrs[0].Err)
}

// record is the dead-letter record of r: the message's key, value,
// timestamp and headers, plus the fanout.dlq.* headers.
func (d *deadLetters) record(r *dispatch.DeadLetterRecord) *sarama.ProducerMessage {
	m := r.Msg
	hs := make([]sarama.RecordHeader, 0, len(m.Headers)+6)
	for _, h := range m.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	add := func(k, v string) { hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)}) }
	add(HeaderDeadLetterTopic, d.source)
	add(HeaderDeadLetterPartition, strconv.FormatInt(int64(m.Partition), 10))
	add(HeaderDeadLetterOffset, strconv.FormatInt(m.Offset, 10))
	add(HeaderDeadLetterAttempts, strconv.FormatUint(uint64(r.Attempts), 10))
	add(HeaderDeadLetterLastFailure, r.LastFailure)
	if r.Reason != "" {
		add(HeaderDeadLetterNackReason, r.Reason)
	}
	pm := &sarama.ProducerMessage{Topic: d.topic, Headers: hs, Timestamp: m.Timestamp}
	if m.Key != nil {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	if m.Value != nil {
		pm.Value = sarama.ByteEncoder(m.Value)
	}
	return pm
}

// checkDeadLetterTopic checks at start that the dead-letter topic exists and
// has partitions this client may see: a missing or forbidden topic is an
// error for the operator (returned, wrapping errDeadLetterTopic); a cluster
// out of reach or electing leaders is retried by the caller.
func checkDeadLetterTopic(client sarama.Client, topic string) error {
	err := client.RefreshMetadata(topic)
	var parts []int32
	if err == nil {
		parts, err = client.WritablePartitions(topic)
	}
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return fmt.Errorf("%w: topic %q %w: create it (kafka-topics.sh --create --topic %s, or give the daemon "+
			"--create-dead-letter-topic), or fix --dead-letter-topic",
			errDeadLetterTopic, topic, errDeadLetterTopicMissing, topic)
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
		return fmt.Errorf("%w: not authorized to use topic %q: grant the daemon's Kafka user Describe and Write on it: %w",
			errDeadLetterTopic, topic, err)
	case err != nil:
		return fmt.Errorf("dead-letter topic %q: %w", topic, err)
	case len(parts) == 0:
		return fmt.Errorf("dead-letter topic %q: no partition has a leader yet", topic)
	}
	return nil
}

// errDeadLetterTopic is wrapped by the errors of a dead-letter topic that
// cannot be used: retrying will not help. errDeadLetterTopicMissing is
// wrapped too when the topic does not exist.
var (
	errDeadLetterTopic        = errors.New("--dead-letter-topic cannot be used")
	errDeadLetterTopicMissing = errors.New("does not exist")
)

// createDeadLetterTopic creates the dead-letter topic topic with as many
// partitions as the topic source and the cluster's default replication
// factor and settings (-1: the brokers' default.replication.factor, Kafka
// 2.4 or later). It returns the partitions created; a topic that exists
// meanwhile is no error (0 partitions). A refusal (no permission, a
// replication factor or setting the cluster does not allow) wraps
// errDeadLetterTopic; other errors, a source topic not found among them
// (its partition count is needed), are worth retrying.
func createDeadLetterTopic(client sarama.Client, topic, source string) (int32, error) {
	if err := client.RefreshMetadata(source); err != nil {
		return 0, fmt.Errorf("create the dead-letter topic %q: topic %q: %w", topic, source, err)
	}
	parts, err := client.Partitions(source)
	if err != nil {
		return 0, fmt.Errorf("create the dead-letter topic %q: partitions of %q: %w", topic, source, err)
	}
	// Not closed: closing an admin made from a client closes the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, fmt.Errorf("create the dead-letter topic %q: cluster admin: %w", topic, err)
	}
	n := int32(len(parts))
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: -1}, false)
	switch {
	case errors.Is(err, sarama.ErrTopicAlreadyExists):
		return 0, nil
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed), errors.Is(err, sarama.ErrClusterAuthorizationFailed):
		return 0, fmt.Errorf("%w: not authorized to create topic %q: grant the daemon's Kafka user Create on it, or create it yourself: %w",
			errDeadLetterTopic, topic, err)
	case errors.Is(err, sarama.ErrInvalidReplicationFactor), errors.Is(err, sarama.ErrPolicyViolation),
		errors.Is(err, sarama.ErrInvalidPartitions), errors.Is(err, sarama.ErrInvalidConfig):
		return 0, fmt.Errorf("%w: the cluster refused to create topic %q (%d partitions, its default replication factor): create it yourself: %w",
			errDeadLetterTopic, topic, n, err)
	case err != nil:
		return 0, fmt.Errorf("create the dead-letter topic %q (%d partitions, the cluster's default replication factor): %w", topic, n, err)
	}
	return n, nil
}
