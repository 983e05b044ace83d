package fanout

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"

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
	if r.Value != nil || h[HeaderDeadLetterTopic] != "jobs" || h[HeaderDeadLetterPartition] != "0" ||
		h[HeaderDeadLetterOffset] != "0" || h[HeaderDeadLetterNackReason] != "cannot parse" || h[HeaderDeadLetterOmitted] == "" {
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
	if h := consumerHeaders(r); !bytes.Equal(r.Value, big) || h[HeaderDeadLetterOffset] != "0" ||
		h[HeaderDeadLetterLastFailure] != "too_large" || h[HeaderDeadLetterAttempts] != "0" {
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
