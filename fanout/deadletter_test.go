package fanout

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// fakeProducer is a sarama.SyncProducer whose SendMessages fails the
// messages whose value is in fail, while failing is on.
type fakeProducer struct {
	sarama.SyncProducer // unused methods

	mu      sync.Mutex
	failing bool
	fail    map[string]bool
	sent    []*sarama.ProducerMessage
}

func (f *fakeProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs sarama.ProducerErrors
	for _, m := range msgs {
		v, _ := m.Value.Encode()
		if f.failing && f.fail[string(v)] {
			errs = append(errs, &sarama.ProducerError{Msg: m, Err: sarama.ErrNotLeaderForPartition})
			continue
		}
		f.sent = append(f.sent, m)
	}
	if errs != nil {
		return errs
	}
	return nil
}

func (f *fakeProducer) setFailing(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = on
}

func headerMap(m *sarama.ProducerMessage) map[string]string {
	out := map[string]string{}
	for _, h := range m.Headers {
		out[string(h.Key)] = string(h.Value)
	}
	return out
}

// Records carry the message and the fanout.dlq.* headers; a failed record
// is retried (the others are reported stored at once) until it is stored;
// FailingSince tells how long it has failed.
func TestDeadLettersProduceAndRetry(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	p := &fakeProducer{fail: map[string]bool{"bad-day": true}, failing: true}
	dl := newDeadLetters(p, "orders.dlq", "orders", 50*time.Millisecond, logrus.NewEntry(logger))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dl.run(ctx) }()
	defer func() { cancel(); <-done }()

	ts := time.UnixMilli(1700000000123)
	ok := &dispatch.Message{Partition: 2, Offset: 41, Key: []byte("k"), Value: []byte("v"), Timestamp: ts,
		Headers: []dispatch.Header{{Key: "trace", Value: []byte("t1")}}}
	late := &dispatch.Message{Partition: 2, Offset: 42, Value: []byte("bad-day")}
	before := time.Now()
	dl.Send(dispatch.DeadLetterRecord{Msg: ok, Attempts: 3, LastFailure: "nack", Reason: "cannot parse"})
	dl.Send(dispatch.DeadLetterRecord{Msg: late, Attempts: 5, LastFailure: "timeout"})

	stored := map[*dispatch.Message]bool{}
	next := func() {
		t.Helper()
		select {
		case ms := <-dl.Stored():
			for _, m := range ms {
				stored[m] = true
			}
		case <-time.After(5 * time.Second):
			t.Fatal("nothing stored within 5s")
		}
	}
	next()
	if !stored[ok] || stored[late] {
		t.Fatalf("stored %v: want the first record alone while the second fails", stored)
	}
	// The two records may go in one batch or two: either way the second
	// fails until producing works.
	testutil.WaitFor(t, 5*time.Second, "FailingSince set while producing fails", func() bool {
		return !dl.FailingSince().Before(before)
	})
	if stored[late] {
		t.Fatal("the failing record was reported stored")
	}
	p.setFailing(false)
	next()
	if !stored[late] || !dl.FailingSince().IsZero() {
		t.Fatalf("stored %v, failing since %v: want the retried record stored and failing over", stored, dl.FailingSince())
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	rec := p.sent[0]
	key, _ := rec.Key.Encode()
	value, _ := rec.Value.Encode()
	if rec.Topic != "orders.dlq" || string(key) != "k" || string(value) != "v" || !rec.Timestamp.Equal(ts) {
		t.Fatalf("record %+v", rec)
	}
	want := map[string]string{"trace": "t1", HeaderDeadLetterTopic: "orders", HeaderDeadLetterPartition: "2",
		HeaderDeadLetterOffset: "41", HeaderDeadLetterAttempts: "3", HeaderDeadLetterLastFailure: "nack",
		HeaderDeadLetterNackReason: "cannot parse"}
	if got := headerMap(rec); len(got) != len(want) || func() bool {
		for k, v := range want {
			if got[k] != v {
				return true
			}
		}
		return false
	}() {
		t.Fatalf("headers %v, want %v", got, want)
	}
	if h := headerMap(p.sent[1]); h[HeaderDeadLetterAttempts] != "5" || h[HeaderDeadLetterLastFailure] != "timeout" {
		t.Fatalf("second record's headers %v", h)
	} else if _, ok := h[HeaderDeadLetterNackReason]; ok {
		t.Fatal("a nack reason header without a reason")
	}
	if p.sent[1].Key != nil {
		t.Fatal("a record without a key got one")
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
