package fanout

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// readTopic returns the first n records of partition 0 of topic, failing
// the test after testWait.
func readTopic(t *testing.T, addrs []string, topic string, n int) []*sarama.ConsumerMessage {
	t.Helper()
	consumer, err := sarama.NewConsumer(addrs, kafka.NewConfig("daemon-test-consumer"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			t.Fatalf("read %s: %v", topic, err)
		case <-time.After(testWait):
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
	}
	return out
}

func consumerHeaders(m *sarama.ConsumerMessage) map[string]string {
	out := map[string]string{}
	for _, h := range m.Headers {
		out[string(h.Key)] = string(h.Value)
	}
	return out
}

// A poison record larger than the dead-letter topic takes (its
// max.message.bytes, read at start) is dead-lettered without its value, with
// the headers that find it at its source, and its partition's offset moves
// on. Before, the producer refused it forever and the offset stayed below it.
func TestDaemonDeadLetterTooLargeForTheTopicGoesWithoutValue(t *testing.T) {
	t.Parallel()
	kc := newJobsCluster(t)
	if err := kc.CreateTopic("jobs.dlq", 1, map[string]string{"max.message.bytes": "4096"}); err != nil {
		t.Fatal(err)
	}
	store := offsets.NewMemoryStore()
	d, addrs, _ := soloDaemonOn(t, kc, store, func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = 1, "jobs.dlq" })
	poison := bytes.Repeat([]byte("p"), 16<<10)
	produceValues(t, addrs, "jobs", poison, []byte("ok"))
	c := dialClient(t, d, 0)
	for acked := false; !acked; {
		m := next(t, c)
		if bytes.Equal(m.Value, poison) {
			if err := m.NackWith(0, "cannot parse"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		acked = true
	}
	r := readTopic(t, addrs, "jobs.dlq", 1)[0]
	h := consumerHeaders(r)
	if r.Value != nil || h[kafka.HeaderDeadLetterTopic] != "jobs" || h[kafka.HeaderDeadLetterPartition] != "0" ||
		h[kafka.HeaderDeadLetterOffset] != "0" || h[kafka.HeaderDeadLetterNackReason] != "cannot parse" || h[kafka.HeaderDeadLetterOmitted] == "" {
		t.Fatalf("dead letter of %d bytes, headers %v", len(r.Value), h)
	}
	testutil.WaitFor(t, testWait, "the offset committed past the dead letter", func() bool {
		got, _ := store.Load(context.Background())
		return got[0] == 2
	})
}

// With a dead-letter topic, a record that fits no connected client's frame
// limit waits for a bigger client for --max-attempts ack timeouts, then
// goes to the dead-letter topic (last failure too_large) and its
// partition's offset moves on. Before, it waited forever.
func TestDaemonDeadLettersARecordThatFitsNoClient(t *testing.T) {
	t.Parallel()
	kc := newJobsCluster(t)
	if err := kc.CreateTopic("jobs.dlq", 1, nil); err != nil {
		t.Fatal(err)
	}
	store := offsets.NewMemoryStore()
	d, addrs, _ := soloDaemonOn(t, kc, store, func(o *Options) {
		o.MaxAttempts, o.DeadLetterTopic, o.AckTimeout = 2, "jobs.dlq", 100*time.Millisecond
	})
	big := bytes.Repeat([]byte("B"), 20<<10)
	produceValues(t, addrs, "jobs", big, []byte("small"))
	small := dialClient(t, d, 8<<10)
	m := next(t, small)
	if string(m.Value) != "small" {
		t.Fatalf("small client got %.10q, want the small record", m.Value)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	r := readTopic(t, addrs, "jobs.dlq", 1)[0]
	if h := consumerHeaders(r); !bytes.Equal(r.Value, big) || h[kafka.HeaderDeadLetterOffset] != "0" ||
		h[kafka.HeaderDeadLetterLastFailure] != "too_large" || h[kafka.HeaderDeadLetterAttempts] != "0" {
		t.Fatalf("dead letter of %d bytes, headers %v", len(r.Value), h)
	}
	testutil.WaitFor(t, testWait, "the offset committed past the dead letter", func() bool {
		got, _ := store.Load(context.Background())
		return got[0] == 2
	})
	if st, _ := d.Stats(context.Background()); st.TooLargeDeadLettered != 1 || st.TooLarge != 0 {
		t.Fatalf("stats: too large dead-lettered %d, waiting %d; want 1, 0", st.TooLargeDeadLettered, st.TooLarge)
	}
}

// TestDaemonCreatesTheDeadLetterTopicWhenAsked: a missing dead-letter topic
// stops the daemon with an error that names --create-dead-letter-topic;
// with it the daemon creates the topic, with as many partitions as the
// topic it consumes, and serves.
func TestDaemonCreatesTheDeadLetterTopicWhenAsked(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	log := logrus.New()
	log.SetOutput(io.Discard)
	opts := Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), Store: offsets.NewMemoryStore(),
		Listen: "127.0.0.1:0", MaxAttempts: 2, DeadLetterTopic: "jobs.dlq", Logger: logrus.NewEntry(log),
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), "--create-dead-letter-topic") {
		t.Fatalf("Run with a missing dead-letter topic: %v; want an error naming --create-dead-letter-topic", err)
	}

	opts.CreateDeadLetterTopic = true
	d, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		stop()
		t.Fatalf("Run stopped before serving: %v", err)
	case <-ctx.Done():
		stop()
		<-done
		t.Fatal("not serving with --create-dead-letter-topic")
	}
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	kc, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("dlq-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if parts, err := kc.Partitions("jobs.dlq"); err != nil || len(parts) != 3 {
		t.Fatalf("partitions of the dead-letter topic: %v, %v; want 3, as the topic consumed", parts, err)
	}
}

// TestDaemonStopsWhenTheDeadLetterTopicCannotBeCreated: a cluster that
// refuses the creation (here, the daemon's user may not create topics)
// stops the daemon at start with an error that says what to do, rather
// than retrying forever.
func TestDaemonStopsWhenTheDeadLetterTopicCannotBeCreated(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	c.ControlKey(int16(kmsg.CreateTopics), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := r.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic, st.ErrorCode = rt.Topic, kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	log := logrus.New()
	log.SetOutput(io.Discard)
	d, err := New(Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), Store: offsets.NewMemoryStore(), Listen: "127.0.0.1:0",
		MaxAttempts: 2, DeadLetterTopic: "jobs.dlq", CreateDeadLetterTopic: true, Logger: logrus.NewEntry(log),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), `not authorized to create topic "jobs.dlq"`) {
		t.Fatalf("Run: %v; want an error saying the creation was not authorized", err)
	}
}
