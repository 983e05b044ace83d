package fanout

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
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
