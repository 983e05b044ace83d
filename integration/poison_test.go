//go:build integration

package integration

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// poisonConsumer acks every message except the first of partition 0, whose
// latest delivery it keeps.
type poisonConsumer struct {
	mu     sync.Mutex // guards the fields below
	poison *client.Message
	acked  map[int32]int // acked messages per partition
	err    error
}

func consumeAllButPoison(t *testing.T, c *client.Client) *poisonConsumer {
	pc := &poisonConsumer{acked: map[int32]int{}}
	go func() {
		for m := range c.Messages() {
			pc.mu.Lock()
			if m.Partition == 0 && m.Offset == 0 {
				pc.poison = m
			} else if err := m.Ack(); err != nil && pc.err == nil {
				pc.err = err
			} else {
				pc.acked[m.Partition]++
			}
			pc.mu.Unlock()
		}
	}()
	return pc
}

func (pc *poisonConsumer) ackedOf(p int32) int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.acked[p]
}

// One message never acked (a poison record) while everything else is acked:
// the tracker keeps every later offset of its partition, so past
// --max-outstanding fetching that partition pauses. It then holds about the
// bound plus what was already fetched, not the 20,000 records behind, while
// the other partition keeps delivering; once the poison message is acked the
// partition resumes and is committed to its end.
func TestPoisonMessageHoldsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	const (
		maxOutstanding = 2000
		n0             = 20000 // records of partition 0, 1 KiB each: about 20 fetches of sarama's 1 MiB
		// What arrives after the pause: sarama's channel (256), the
		// source's batch (256), one fetch in flight (1 MiB, about 1,000
		// records here, a little more as a record batch is never split).
		slack = 2500
	)
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	value := strings.Repeat("x", 1024)
	producer := manualProducer(t)
	defer producer.Close()
	for i := 0; i < n0; i += 1000 {
		msgs := make([]*sarama.ProducerMessage, 1000)
		for j := range msgs {
			msgs[j] = &sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder(value)}
		}
		if err := producer.SendMessages(msgs); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	opts := daemonOptions(t, topic)
	opts.MaxOutstanding = maxOutstanding
	d := startDaemon(t, opts)
	c := dial(t, client.Config{MaxInFlight: 1000}, d.addr)
	pc := consumeAllButPoison(t, c)

	testutil.WaitFor(t, 60*time.Second, "partition 0 past the bound", func() bool {
		return d.stats(t).Outstanding[0] > maxOutstanding
	})
	// Partition 1 flows; two rounds of it take at least two fetches, after
	// which nothing of partition 0 is still coming.
	for round := 1; round <= 2; round++ {
		produceTo(t, producer, topic, 1, 100)
		testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("round %d of partition 1 acked", round), func() bool {
			return pc.ackedOf(1) == 100*round
		})
	}
	st := d.stats(t)
	held := st.Outstanding[0]
	t.Logf("partition 0 has %d outstanding offsets (bound %d), %d of its messages acked", held, maxOutstanding, pc.ackedOf(0))
	if held <= maxOutstanding || held > maxOutstanding+slack {
		t.Fatalf("partition 0 holds %d offsets, want above %d and at most %d", held, maxOutstanding, maxOutstanding+slack)
	}
	if !slices.Equal(st.Held, []int32{0}) {
		t.Fatalf("held partitions %v, want [0]", st.Held)
	}
	// Still paused: the 20,000 records behind do not come.
	produceTo(t, producer, topic, 1, 100)
	testutil.WaitFor(t, 30*time.Second, "round 3 of partition 1 acked", func() bool { return pc.ackedOf(1) == 300 })
	if now := d.stats(t).Outstanding[0]; now > maxOutstanding+slack {
		t.Fatalf("partition 0 went from %d to %d outstanding offsets while held", held, now)
	}

	pc.mu.Lock()
	if pc.err != nil {
		t.Fatalf("ack: %v", pc.err)
	}
	if err := pc.poison.Ack(); err != nil {
		t.Fatalf("ack the poison message: %v", err)
	}
	pc.mu.Unlock()
	testutil.WaitFor(t, 60*time.Second, "partition 0 committed to its end", func() bool {
		return zkOffsets(t, opts.ID, topic)[0] == n0
	})
	if st := d.stats(t); len(st.Held) != 0 {
		t.Fatalf("held partitions %v after the ack", st.Held)
	}
}

// produceTo sends n small messages to one partition of topic.
func produceTo(t *testing.T, producer sarama.SyncProducer, topic string, partition int32, n int) {
	t.Helper()
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Partition: partition, Value: sarama.StringEncoder(fmt.Sprint("m-", i))}
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatalf("produce to %s/%d: %v", topic, partition, err)
	}
}
