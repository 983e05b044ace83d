package kafka

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
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
	t.Parallel()
	synctest.Test(t, testDeadLettersProduceAndRetry)
}

func testDeadLettersProduceAndRetry(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	p := &fakeProducer{fail: map[string]bool{"bad-day": true}, failing: true}
	dl := NewDeadLetters(p, "orders.dlq", "orders", 0, 50*time.Millisecond, logrus.NewEntry(logger))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dl.Run(ctx) }()
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

// brokerProducer is a sarama.SyncProducer that refuses records as a broker
// would: larger than max (sarama's size estimate) with MESSAGE_TOO_LARGE,
// without a key with refuse (INVALID_RECORD, as a compacted topic does)
// while refusing is on.
type brokerProducer struct {
	sarama.SyncProducer

	mu       sync.Mutex
	max      int
	refuse   sarama.KError
	refusing bool
	calls    int
	sent     []*sarama.ProducerMessage
}

func (b *brokerProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	var errs sarama.ProducerErrors
	for _, m := range msgs {
		switch {
		case b.max > 0 && m.ByteSize(2) > b.max:
			errs = append(errs, &sarama.ProducerError{Msg: m, Err: sarama.ErrMessageSizeTooLarge})
		case b.refusing && m.Key == nil:
			errs = append(errs, &sarama.ProducerError{Msg: m, Err: b.refuse})
		default:
			b.sent = append(b.sent, m)
		}
	}
	if errs != nil {
		return errs
	}
	return nil
}

func (b *brokerProducer) stored() []*sarama.ProducerMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*sarama.ProducerMessage(nil), b.sent...)
}

// runDeadLetters runs dl until the test ends.
func runDeadLetters(t *testing.T, dl *DeadLetters) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitStored returns the next messages dl reports stored.
func waitStored(t *testing.T, dl *DeadLetters) []*dispatch.Message {
	t.Helper()
	select {
	case ms := <-dl.Stored():
		return ms
	case <-time.After(testWait):
		t.Fatal("no dead letter stored")
		return nil
	}
}

// A record too large for the dead-letter topic is written without its
// value, with the headers that find it at its source and one that says
// what was left out and why, whether the producer's limit (the topic's
// max.message.bytes) refuses it before sending or the broker does; the
// message is then reported stored, so its partition moves on.
func TestDeadLetterTooLargeWrittenWithoutValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		limit int // what the producer knows of the topic's limit; 0: nothing
	}{{"known limit", 4 << 10}, {"broker refuses", 0}} {
		t.Run(tc.name, testutil.InBubble(func(t *testing.T) {
			logger, _ := logtest.NewNullLogger()
			p := &brokerProducer{max: 4 << 10}
			dl := NewDeadLetters(p, "orders.dlq", "orders", tc.limit, 20*time.Millisecond, logrus.NewEntry(logger))
			runDeadLetters(t, dl)
			big := &dispatch.Message{Partition: 3, Offset: 77, Key: []byte("k"), Value: make([]byte, 64<<10),
				Headers: []dispatch.Header{{Key: "trace", Value: []byte("t1")}}}
			small := &dispatch.Message{Partition: 3, Offset: 78, Key: []byte("k2"), Value: []byte("fits")}
			dl.Send(dispatch.DeadLetterRecord{Msg: big, Attempts: 5, LastFailure: "nack"})
			dl.Send(dispatch.DeadLetterRecord{Msg: small, Attempts: 5, LastFailure: "timeout"})
			stored := map[*dispatch.Message]bool{}
			for len(stored) < 2 {
				for _, m := range waitStored(t, dl) {
					stored[m] = true
				}
			}
			var letter, whole *sarama.ProducerMessage
			for _, m := range p.stored() {
				if h := headerMap(m); h[HeaderDeadLetterOffset] == "77" {
					letter = m
				} else {
					whole = m
				}
			}
			if letter == nil || whole == nil {
				t.Fatalf("records written: %v", p.stored())
			}
			if letter.Value != nil {
				t.Fatalf("the dead letter of the 64 KiB message carries a value of %d bytes", letter.Value.Length())
			}
			if key, _ := letter.Key.Encode(); string(key) != "k" {
				t.Errorf("key %q, want the message's key", key)
			}
			h := headerMap(letter)
			for k, v := range map[string]string{HeaderDeadLetterTopic: "orders", HeaderDeadLetterPartition: "3",
				HeaderDeadLetterOffset: "77", HeaderDeadLetterAttempts: "5", HeaderDeadLetterLastFailure: "nack", "trace": "t1"} {
				if h[k] != v {
					t.Errorf("header %s = %q, want %q", k, h[k], v)
				}
			}
			if why := h[HeaderDeadLetterOmitted]; !strings.HasPrefix(why, "value: ") || !strings.Contains(why, "too large") {
				t.Errorf("header %s = %q, want what was omitted and why", HeaderDeadLetterOmitted, why)
			}
			if v, _ := whole.Value.Encode(); string(v) != "fits" || headerMap(whole)[HeaderDeadLetterOmitted] != "" {
				t.Errorf("the record that fits: value %q, headers %v", v, headerMap(whole))
			}
			if n := dl.ValuesOmitted(); n != 1 {
				t.Errorf("ValuesOmitted = %d, want 1", n)
			}
			if tc.limit > 0 && p.calls != 1 {
				t.Errorf("%d produce calls with the limit known, want 1: the record goes without its value at once", p.calls)
			}
		}))
	}
}

// A record whose key and headers alone are too large for the dead-letter
// topic goes without them too, still naming its source.
func TestDeadLetterTooLargeEvenWithoutValue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testDeadLetterTooLargeEvenWithoutValue)
}

func testDeadLetterTooLargeEvenWithoutValue(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	p := &brokerProducer{max: 1 << 10}
	dl := NewDeadLetters(p, "orders.dlq", "orders", 1<<10, 20*time.Millisecond, logrus.NewEntry(logger))
	runDeadLetters(t, dl)
	m := &dispatch.Message{Partition: 0, Offset: 5, Key: make([]byte, 4<<10), Value: []byte("v"),
		Headers: []dispatch.Header{{Key: "big", Value: make([]byte, 4<<10)}}}
	dl.Send(dispatch.DeadLetterRecord{Msg: m, Attempts: 1, LastFailure: "nack"})
	waitStored(t, dl)
	rec := p.stored()[0]
	h := headerMap(rec)
	if rec.Key != nil || rec.Value != nil || h["big"] != "" || h[HeaderDeadLetterOffset] != "5" ||
		!strings.HasPrefix(h[HeaderDeadLetterOmitted], "value, key, headers: ") {
		t.Fatalf("record key %v value %v headers %v", rec.Key, rec.Value, h)
	}
}

// A refusal that retrying cannot fix (a compacted dead-letter topic given a
// record without a key, a missing authorization) keeps the record, and so
// its partition's offset: it is retried, counted as refused with the error
// for metrics and /readyz, and logged once a minute, not once per retry;
// once the topic takes it, it is stored and the alert ends.
func TestDeadLetterRefusedAlertsAndHolds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testDeadLetterRefusedAlertsAndHolds)
}

func testDeadLetterRefusedAlertsAndHolds(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	p := &brokerProducer{refuse: sarama.ErrInvalidRecord, refusing: true}
	dl := NewDeadLetters(p, "orders.dlq", "orders", 0, 2*time.Millisecond, logrus.NewEntry(logger))
	dl.retryMin = time.Millisecond
	var mu sync.Mutex
	now := time.Unix(1700000000, 0)
	dl.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	runDeadLetters(t, dl)
	nokey := &dispatch.Message{Partition: 1, Offset: 9, Value: []byte("no key")}
	dl.Send(dispatch.DeadLetterRecord{Msg: nokey, Attempts: 3, LastFailure: "nack"})

	refusedLines := func() int {
		n := 0
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, "refuses") {
				n++
			}
		}
		return n
	}
	testutil.WaitFor(t, testWait, "the refusal counted", func() bool {
		n, err := dl.Refused()
		return n == 1 && strings.Contains(err, sarama.ErrInvalidRecord.Error())
	})
	testutil.WaitFor(t, testWait, "twenty retries", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.calls >= 20
	})
	if n := refusedLines(); n != 1 {
		t.Fatalf("%d log lines about the refusal after 20 retries within a minute, want 1", n)
	}
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "producing failed") {
			t.Fatalf("a warning per retry for a refusal: %q", e.Message)
		}
	}
	select {
	case ms := <-dl.Stored():
		t.Fatalf("reported stored while refused: %v", ms)
	default:
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	testutil.WaitFor(t, testWait, "the second line, a minute later", func() bool { return refusedLines() == 2 })

	p.mu.Lock()
	p.refusing = false
	p.mu.Unlock()
	if ms := waitStored(t, dl); len(ms) != 1 || ms[0] != nokey {
		t.Fatalf("stored %v, want the refused message", ms)
	}
	if n, err := dl.Refused(); n != 0 || err != "" {
		t.Fatalf("Refused = %d, %q after it was stored", n, err)
	}
}

// Errors are classified by what retrying can do.
func TestDeadLetterErrorClasses(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]produceFailure{
		sarama.ErrNotLeaderForPartition:   failRetriable,
		sarama.ErrUnknownTopicOrPartition: failRetriable,
		sarama.ErrOutOfBrokers:            failRetriable,
		sarama.ErrMessageSizeTooLarge:     failTooLarge,
		sarama.ErrMessageSetSizeTooLarge:  failTooLarge,
		sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2 > 1"): failTooLarge,
		sarama.ErrInvalidRecord:              failRefused,
		sarama.ErrTopicAuthorizationFailed:   failRefused,
		sarama.ErrClusterAuthorizationFailed: failRefused,
		sarama.ErrPolicyViolation:            failRefused,
		sarama.ErrInvalidTimestamp:           failRefused,
	} {
		if got := classifyProduceError(err); got != want {
			t.Errorf("%v: class %d, want %d", err, got, want)
		}
	}
}

// A record held by a refusal does not hold up the dead letters that come
// after it: they are produced as they come, not after the refused record's
// next retry.
func TestDeadLetterRefusedDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testDeadLetterRefusedDoesNotDelayOthers)
}

func testDeadLetterRefusedDoesNotDelayOthers(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	p := &brokerProducer{refuse: sarama.ErrInvalidRecord, refusing: true}
	dl := NewDeadLetters(p, "orders.dlq", "orders", 0, time.Hour, logrus.NewEntry(logger))
	dl.retryMin = time.Hour // the refused record's next retry is an hour away
	runDeadLetters(t, dl)
	dl.Send(dispatch.DeadLetterRecord{Msg: &dispatch.Message{Partition: 1, Offset: 9, Value: []byte("no key")}, Attempts: 3, LastFailure: "nack"})
	testutil.WaitFor(t, testWait, "the refusal counted", func() bool { n, _ := dl.Refused(); return n == 1 })
	keyed := &dispatch.Message{Partition: 2, Offset: 4, Key: []byte("k"), Value: []byte("v")}
	dl.Send(dispatch.DeadLetterRecord{Msg: keyed, Attempts: 3, LastFailure: "nack"})
	if ms := waitStored(t, dl); len(ms) != 1 || ms[0] != keyed {
		t.Fatalf("stored %v, want the keyed record", ms)
	}
	if n, _ := dl.Refused(); n != 1 {
		t.Fatalf("Refused = %d, want the record without a key still held", n)
	}
}
