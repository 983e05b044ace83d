package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	HeaderDeadLetterLastFailure = "fanout.dlq.last_failure" // timeout, nack, disconnect or too_large (it fitted no client)
	HeaderDeadLetterNackReason  = "fanout.dlq.nack_reason"  // the last nack's reason, when one gave it
	// HeaderDeadLetterOmitted is on a dead letter too large for the
	// dead-letter topic: it was written without the message's value (and,
	// when even that was too large, without its key and headers), and this
	// says what was left out and why. The message itself stays at its
	// source (topic, partition, offset above) until retention removes it.
	HeaderDeadLetterOmitted = "fanout.dlq.omitted"
)

// DeadLetters is a term's dispatch.DeadLetter: one sarama producer, owned by
// the term, and one goroutine that produces the queued records to the
// dead-letter topic, in batches, and reports the stored ones to the
// dispatcher. A failed record is handled by what retrying can do
// (classifyProduceError): one the topic refuses as too large goes again at
// once without its value (letter.omit); a transient failure (a broker away,
// a leader election) is retried with backoff for as long as it takes; a
// refusal retrying cannot fix (no authorization, a compacted topic given a
// record without a key) is retried too, slowly, since only an operator can
// fix it, and raises an alert: Refused (metrics, /readyz) and one log line
// a minute. The dispatcher holds the records' partitions' offsets
// meanwhile: nothing is dropped.
type DeadLetters struct {
	topic    string // the dead-letter topic
	source   string // the topic consumed
	producer sarama.SyncProducer
	log      *logrus.Entry
	retryMin time.Duration // the first wait after a failure
	retryMax time.Duration
	// limit is the largest record (sarama's size estimate) the producer
	// sends, from the topic's max.message.bytes; 0 when unknown. A record
	// above it goes without its value at once.
	limit int
	now   func() time.Time // for the refusals' log lines, once a minute

	mu         sync.Mutex // guards queue and refusedErr
	queue      []dispatch.DeadLetterRecord
	refusedErr string        // the last refusal while refused > 0
	kick       chan struct{} // capacity 1: queue became non-empty

	stored chan []*dispatch.Message
	// failingSince is when producing started failing (Unix ns), 0 while it
	// works: for metrics and /readyz.
	failingSince atomic.Int64
	refused      atomic.Int64  // records held by a refusal retrying cannot fix
	omitted      atomic.Uint64 // dead letters written without the message's value
}

var _ dispatch.DeadLetter = (*DeadLetters)(nil)

// NewDeadLetters returns the producer of dead letters to topic, of messages
// consumed from source; limit is the largest record the producer sends (0:
// unknown), retryMax the longest wait between retries.
func NewDeadLetters(producer sarama.SyncProducer, topic, source string, limit int, retryMax time.Duration, log *logrus.Entry) *DeadLetters {
	return &DeadLetters{
		topic:    topic,
		source:   source,
		producer: producer,
		log:      log.WithField("dead_letter_topic", topic),
		retryMin: 100 * time.Millisecond,
		retryMax: retryMax,
		limit:    limit,
		now:      time.Now,
		kick:     make(chan struct{}, 1),
		stored:   make(chan []*dispatch.Message, 1),
	}
}

// letter is a dead-letter record on its way, with what it leaves out.
type letter struct {
	dispatch.DeadLetterRecord
	omit omission // what of the message the record leaves out
	why  string   // why, for HeaderDeadLetterOmitted
	err  error    // why the last attempt failed
}

// omission is how much of a message a dead letter leaves out.
type omission uint8

const (
	omitNothing omission = iota
	omitValue            // the value
	omitAll              // the value, the key and the message's headers
)

// String names what is left out, for HeaderDeadLetterOmitted.
func (o omission) String() string {
	return [...]string{"", "value", "value, key, headers"}[o]
}

// produceFailure is what retrying can do for a record that failed.
type produceFailure int

const (
	failRetriable produceFailure = iota // it may work next time: retry with backoff
	failTooLarge                        // the topic takes no record this large: leave out more
	failRefused                         // the topic refuses it until an operator acts: alert and hold
)

// classifyProduceError tells what retrying can do after err.
func classifyProduceError(err error) produceFailure {
	var cfgErr sarama.ConfigurationError
	switch {
	case errors.Is(err, sarama.ErrMessageSizeTooLarge), errors.Is(err, sarama.ErrMessageSetSizeTooLarge):
		return failTooLarge
	case errors.As(err, &cfgErr):
		// sarama's own check of Producer.MaxMessageBytes; any other
		// configuration error stays until the daemon is reconfigured.
		if strings.Contains(string(cfgErr), "MaxMessageBytes") {
			return failTooLarge
		}
		return failRefused
	case errors.Is(err, sarama.ErrInvalidRecord), // a compacted topic given a null key, among others
		errors.Is(err, sarama.ErrTopicAuthorizationFailed),
		errors.Is(err, sarama.ErrClusterAuthorizationFailed),
		errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed),
		errors.Is(err, sarama.ErrInvalidTopic),
		errors.Is(err, sarama.ErrInvalidTimestamp), // out of the topic's message.timestamp.*.max.ms
		errors.Is(err, sarama.ErrPolicyViolation),
		errors.Is(err, sarama.ErrUnsupportedForMessageFormat),
		errors.Is(err, sarama.ErrInvalidRequiredAcks):
		return failRefused
	}
	return failRetriable
}

// refusedLogEvery is how often a refusal that holds records is logged.
const refusedLogEvery = time.Minute

// Send implements dispatch.DeadLetter: it queues r and never blocks.
func (d *DeadLetters) Send(r dispatch.DeadLetterRecord) {
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

// Close closes the producer; call it once Run has returned.
func (d *DeadLetters) Close() { _ = d.producer.Close() }

// Topic is the dead-letter topic.
func (d *DeadLetters) Topic() string { return d.topic }

// Stored implements dispatch.DeadLetter.
func (d *DeadLetters) Stored() <-chan []*dispatch.Message { return d.stored }

// Refused returns the number of records held by a refusal retrying cannot
// fix, and the last such refusal; 0 and "" while there is none.
func (d *DeadLetters) Refused() (int, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := int(d.refused.Load())
	if n == 0 {
		return 0, ""
	}
	return n, d.refusedErr
}

// ValuesOmitted returns the number of dead letters written without the
// message's value, too large for the dead-letter topic.
func (d *DeadLetters) ValuesOmitted() uint64 { return d.omitted.Load() }

// FailingSince returns since when producing has failed, zero while it works.
func (d *DeadLetters) FailingSince() time.Time {
	if ns := d.failingSince.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Run produces until ctx ends. Records still queued then are dropped: their
// messages are not committed, so the next term delivers them again (and,
// their attempts being stored, dead-letters them again).
func (d *DeadLetters) Run(ctx context.Context) {
	b := backoff.Backoff{Min: d.retryMin, Max: max(d.retryMax, d.retryMin), Jitter: true}
	var pending []letter
	var refusedLogged time.Time // when a refusal was last logged
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
		for _, r := range d.queue {
			pending = append(pending, letter{DeadLetterRecord: r})
		}
		clear(d.queue)
		d.queue = d.queue[:0]
		d.mu.Unlock()
		if len(pending) == 0 {
			continue
		}
		done, failed := d.produce(pending)
		pending = failed
		var transient, refusal error
		refused, again := 0, 0
		for i := range pending {
			l := &pending[i]
			switch classifyProduceError(l.err) {
			case failTooLarge:
				if l.omit < omitAll {
					l.omit++
					l.why = fmt.Sprintf("the dead-letter topic refused the record as too large (%v)", l.err)
					d.logOmission(l)
					again++
					continue
				}
				l.err = fmt.Errorf("too large even without the message's value, key and headers: %w", l.err)
				refused++
				refusal = l.err
			case failRefused:
				refused++
				refusal = l.err
			default:
				transient = l.err
			}
		}
		// The state is updated before the stored messages are reported, so
		// that whoever sees them stored sees it too.
		d.mu.Lock()
		if refusal != nil {
			d.refusedErr = refusal.Error()
		}
		d.refused.Store(int64(refused))
		d.mu.Unlock()
		if len(pending) == 0 {
			if failures > 0 {
				d.log.WithField("failures", failures).Info("dead-letter topic: producing works again")
			}
			failures = 0
			b.Reset()
			d.failingSince.Store(0)
			refusedLogged = time.Time{}
		} else if again < len(pending) {
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
		if len(pending) == 0 || again == len(pending) {
			continue // the too large ones go again at once, with less in them
		}
		wait := b.Next()
		if transient != nil {
			d.log.WithError(transient).WithFields(logrus.Fields{"waiting": len(pending), "attempt": failures, "retry_in": wait.Round(time.Millisecond)}).
				Warn("dead-letter topic: producing failed; the messages wait, and hold their partitions' committed offsets")
		}
		if now := d.now(); refusal != nil && (refusedLogged.IsZero() || now.Sub(refusedLogged) >= refusedLogEvery) {
			refusedLogged = now
			d.log.WithError(refusal).WithFields(logrus.Fields{"refused": refused, "waiting": len(pending), "attempt": failures}).
				Error("dead-letter topic refuses records, and retrying cannot fix it: they wait, holding their partitions' committed offsets, " +
					"until the topic takes them (check its ACLs, its cleanup.policy, its configuration); logged once a minute")
		}
		// Refusals alone: a record that comes meanwhile goes at once (with
		// the refused ones) rather than after their retry. A transient
		// failure (Kafka away) makes it wait like the others.
		var wake <-chan struct{}
		if transient == nil {
			wake = d.kick
		}
		if !backoff.Wait(ctx, wait, wake) {
			return
		}
	}
}

// produce sends the letters in one batch and returns the messages stored
// and the letters that failed, each with its error.
func (d *DeadLetters) produce(ls []letter) (done []*dispatch.Message, failed []letter) {
	msgs := make([]*sarama.ProducerMessage, len(ls))
	for i := range ls {
		msgs[i] = d.record(&ls[i])
		msgs[i].Metadata = i
	}
	err := d.producer.SendMessages(msgs)
	if err == nil {
		done = make([]*dispatch.Message, len(ls))
		for i := range ls {
			done[i] = ls[i].Msg
			if ls[i].omit > omitNothing {
				d.omitted.Add(1)
			}
		}
		return done, nil
	}
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		err = fmt.Errorf("produce %d dead letters to %s: %w", len(ls), d.topic, err)
		for i := range ls {
			ls[i].err = err
		}
		return nil, ls
	}
	bad := make(map[int]error, len(perrs))
	for _, pe := range perrs {
		if i, ok := pe.Msg.Metadata.(int); ok {
			bad[i] = fmt.Errorf("produce a dead letter to %s: %w", d.topic, pe.Err)
		}
	}
	for i := range ls {
		if e := bad[i]; e != nil {
			ls[i].err = e
			failed = append(failed, ls[i])
		} else {
			done = append(done, ls[i].Msg)
			if ls[i].omit > omitNothing {
				d.omitted.Add(1)
			}
		}
	}
	return done, failed
}

// record is the dead-letter record of l: the message's key, value,
// timestamp and headers, plus the fanout.dlq.* headers; without what l
// omits, and, when the producer's limit is known, without as much as it
// takes to fit it.
func (d *DeadLetters) record(l *letter) *sarama.ProducerMessage {
	pm := d.build(l)
	for d.limit > 0 && l.omit < omitAll {
		size := pm.ByteSize(2)
		if size <= d.limit {
			break
		}
		l.omit++
		l.why = fmt.Sprintf("the record (about %d bytes) is too large for the dead-letter topic (at most %d)", size, d.limit)
		d.logOmission(l)
		pm = d.build(l)
	}
	return pm
}

// logOmission logs that l will leave out more of its message.
func (d *DeadLetters) logOmission(l *letter) {
	d.log.WithFields(logrus.Fields{"partition": l.Msg.Partition, "offset": l.Msg.Offset, "why": l.why}).
		Warn("dead letter too large for the dead-letter topic: written without the message's " + l.omit.String() +
			"; the message stays at its source offset")
}

// build makes the record of l, leaving out what l.omit says.
func (d *DeadLetters) build(l *letter) *sarama.ProducerMessage {
	m := l.Msg
	hs := make([]sarama.RecordHeader, 0, len(m.Headers)+7)
	if l.omit < omitAll {
		for _, h := range m.Headers {
			hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
	}
	add := func(k, v string) { hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)}) }
	add(HeaderDeadLetterTopic, d.source)
	add(HeaderDeadLetterPartition, strconv.FormatInt(int64(m.Partition), 10))
	add(HeaderDeadLetterOffset, strconv.FormatInt(m.Offset, 10))
	add(HeaderDeadLetterAttempts, strconv.FormatUint(uint64(l.Attempts), 10))
	add(HeaderDeadLetterLastFailure, l.LastFailure)
	if l.Reason != "" {
		add(HeaderDeadLetterNackReason, l.Reason)
	}
	if l.omit > omitNothing {
		add(HeaderDeadLetterOmitted, l.omit.String()+": "+l.why)
	}
	pm := &sarama.ProducerMessage{Topic: d.topic, Headers: hs, Timestamp: m.Timestamp}
	if m.Key != nil && l.omit < omitAll {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	if m.Value != nil && l.omit < omitValue {
		pm.Value = sarama.ByteEncoder(m.Value)
	}
	return pm
}

// CheckDeadLetterTopic checks at start that the dead-letter topic exists and
// has partitions this client may see: a missing or forbidden topic is an
// error for the operator (returned, wrapping ErrDeadLetterTopic); a cluster
// out of reach or electing leaders is retried by the caller.
func CheckDeadLetterTopic(client sarama.Client, topic string) error {
	err := client.RefreshMetadata(topic)
	var parts []int32
	if err == nil {
		parts, err = client.WritablePartitions(topic)
	}
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return fmt.Errorf("%w: topic %q %w: create it (kafka-topics.sh --create --topic %s, or give the daemon "+
			"--create-dead-letter-topic), or fix --dead-letter-topic",
			ErrDeadLetterTopic, topic, ErrDeadLetterTopicMissing, topic)
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
		return fmt.Errorf("%w: not authorized to use topic %q: grant the daemon's Kafka user Describe and Write on it: %w",
			ErrDeadLetterTopic, topic, err)
	case err != nil:
		return fmt.Errorf("dead-letter topic %q: %w", topic, err)
	case len(parts) == 0:
		return fmt.Errorf("dead-letter topic %q: no partition has a leader yet", topic)
	}
	return nil
}

// Record limits of the dead-letter topic (DeadLetterLimit).
const (
	// kafkaDefaultMaxMessageBytes is Kafka's default message.max.bytes,
	// assumed when the topic's max.message.bytes cannot be read.
	kafkaDefaultMaxMessageBytes = 1048588
	// recordBatchOverhead is the size of a record batch's header: the
	// brokers' limit bounds whole batches, sarama's Producer.MaxMessageBytes
	// (and DeadLetters.limit) the records in them (sarama's estimate, never
	// below their size in the batch).
	recordBatchOverhead = 61
)

// DeadLetterLimit returns the largest record the dead-letter producer
// should send to topic: the topic's max.message.bytes (its own, or the
// brokers' default, as DescribeConfigs reports it) less a batch's header,
// so that what it sends is never refused as too large; capped below
// sarama's request limit. When the configuration cannot be read (no
// DescribeConfigs permission), Kafka's default is assumed and that is
// logged: a record the brokers refuse as too large still goes without its
// value.
func DeadLetterLimit(client sarama.Client, topic string, log *logrus.Entry) int {
	limit, err := topicMaxMessageBytes(client, topic)
	if err != nil {
		log.WithError(err).WithFields(logrus.Fields{"dead_letter_topic": topic, "assumed": kafkaDefaultMaxMessageBytes}).
			Warn("cannot read the dead-letter topic's max.message.bytes: Kafka's default assumed " +
				"(grant the daemon's Kafka user DescribeConfigs on the topic)")
		limit = kafkaDefaultMaxMessageBytes
	}
	return max(min(limit, int(sarama.MaxRequestSize)-1<<20)-recordBatchOverhead, 1)
}

// topicMaxMessageBytes reads topic's max.message.bytes.
func topicMaxMessageBytes(client sarama.Client, topic string) (int, error) {
	// Not closed: closing an admin made from a client closes the client.
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic,
		ConfigNames: []string{"max.message.bytes"}})
	if err != nil {
		return 0, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	for _, e := range entries {
		if e.Name == "max.message.bytes" {
			n, err := strconv.Atoi(e.Value)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("topic %s: max.message.bytes %q is not a size", topic, e.Value)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("topic %s: no max.message.bytes in its configuration", topic)
}

// ErrDeadLetterTopic is wrapped by the errors of a dead-letter topic that
// cannot be used: retrying will not help. ErrDeadLetterTopicMissing is
// wrapped too when the topic does not exist.
var (
	ErrDeadLetterTopic        = errors.New("--dead-letter-topic cannot be used")
	ErrDeadLetterTopicMissing = errors.New("does not exist")
)

// CreateDeadLetterTopic creates the dead-letter topic topic with as many
// partitions as the topic source and the cluster's default replication
// factor and settings (-1: the brokers' default.replication.factor, Kafka
// 2.4 or later). It returns the partitions created; a topic that exists
// meanwhile is no error (0 partitions). A refusal (no permission, a
// replication factor or setting the cluster does not allow) wraps
// ErrDeadLetterTopic; other errors, a source topic not found among them
// (its partition count is needed), are worth retrying.
func CreateDeadLetterTopic(client sarama.Client, topic, source string) (int32, error) {
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
			ErrDeadLetterTopic, topic, err)
	case errors.Is(err, sarama.ErrInvalidReplicationFactor), errors.Is(err, sarama.ErrPolicyViolation),
		errors.Is(err, sarama.ErrInvalidPartitions), errors.Is(err, sarama.ErrInvalidConfig):
		return 0, fmt.Errorf("%w: the cluster refused to create topic %q (%d partitions, its default replication factor): create it yourself: %w",
			ErrDeadLetterTopic, topic, n, err)
	case err != nil:
		return 0, fmt.Errorf("create the dead-letter topic %q (%d partitions, the cluster's default replication factor): %w", topic, n, err)
	}
	return n, nil
}
