//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rcrowley/go-metrics"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// batchLog records what a Source delivers, per partition, and the batches
// that break the dispatch.Batch contract.
type batchLog struct {
	mu      sync.Mutex // guards the fields below
	starts  map[int32][]int64
	offsets map[int32][]int64
	bad     []string
}

func (l *batchLog) add(b dispatch.Batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b.Anchor != nil {
		close(b.Anchor) // the dispatcher's part: the start is stored
	}
	if b.Start >= 0 {
		l.starts[b.Partition] = append(l.starts[b.Partition], b.Start)
		if len(b.Messages) > 0 {
			l.bad = append(l.bad, fmt.Sprintf("start batch of partition %d has messages", b.Partition))
		}
		return
	}
	for _, m := range b.Messages {
		if m.Partition != b.Partition {
			l.bad = append(l.bad, fmt.Sprintf("batch of partition %d holds partition %d", b.Partition, m.Partition))
		}
		l.offsets[b.Partition] = append(l.offsets[b.Partition], m.Offset)
	}
}

func (l *batchLog) get(p int32) (starts, offsets []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.starts[p]), slices.Clone(l.offsets[p])
}

// runSource runs src until cleanup, which checks that Run returned nil and
// closed Batches.
func runSource(t *testing.T, src *kafka.Source) *batchLog {
	t.Helper()
	l := &batchLog{starts: map[int32][]int64{}, offsets: map[int32][]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- src.Run(ctx) }()
	read := make(chan struct{})
	go func() {
		defer close(read)
		for b := range src.Batches() {
			l.add(b)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
		select {
		case <-read:
		case <-time.After(30 * time.Second):
			t.Errorf("Batches not closed")
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, b := range l.bad {
			t.Error(b)
		}
	})
	return l
}

// highWaterMarks returns the newest offset of each partition of topic.
func highWaterMarks(t *testing.T, client sarama.Client, topic string, partitions int32) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	for p := range partitions {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("GetOffset(%s/%d): %v", topic, p, err)
		}
		out[p] = hw
	}
	return out
}

func TestSourceRealKafka(t *testing.T) {
	t.Parallel()
	const partitions = 4
	tests := []struct {
		name      string
		initial   int64
		stored    func(hw map[int32]int64) map[int32]int64
		wantStart func(hw map[int32]int64, p int32) int64
	}{
		{"oldest", sarama.OffsetOldest,
			func(map[int32]int64) map[int32]int64 { return nil },
			func(map[int32]int64, int32) int64 { return 0 }},
		{"stored per partition", sarama.OffsetNewest,
			func(hw map[int32]int64) map[int32]int64 {
				s := map[int32]int64{}
				for p, o := range hw {
					s[p] = o / 2
				}
				return s
			},
			func(hw map[int32]int64, p int32) int64 { return hw[p] / 2 }},
		{"stored beyond the end resets to oldest", sarama.OffsetOldest,
			func(hw map[int32]int64) map[int32]int64 { return map[int32]int64{0: hw[0] + 100, 1: hw[1] + 100} },
			func(map[int32]int64, int32) int64 { return 0 }},
		// Partitions without a stored offset start at the oldest: the group
		// has stored offsets, so --initial-offset no longer applies.
		{"stored beyond the end resets to newest", sarama.OffsetNewest,
			func(hw map[int32]int64) map[int32]int64 { return map[int32]int64{0: hw[0] + 100} },
			func(hw map[int32]int64, p int32) int64 {
				if p == 0 {
					return hw[p]
				}
				return 0
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := uniqueName(t, "source")
			createTopic(t, topic, partitions)
			var msgs []*sarama.ProducerMessage
			for i := range 40 {
				msgs = append(msgs, &sarama.ProducerMessage{Key: sarama.StringEncoder(fmt.Sprint("key-", i)),
					Value: sarama.StringEncoder(fmt.Sprint("value-", i))})
			}
			produce(t, topic, msgs...)
			client := newClient(t)
			hw := highWaterMarks(t, client, topic, partitions)
			for p, o := range hw {
				if o < 2 {
					t.Fatalf("partition %d got %d of the 40 keyed messages; the test needs 2 per partition", p, o)
				}
			}

			src, err := kafka.NewSource(client, kafka.SourceConfig{Topic: topic, Initial: tt.initial,
				Stored: tt.stored(hw), BatchSize: 4, Logger: logrus.NewEntry(logrus.StandardLogger())})
			if err != nil {
				t.Fatal(err)
			}
			log := runSource(t, src)
			// Every partition has resolved where it starts (newest is a
			// moment in time) before one more message is produced.
			testutil.WaitFor(t, 30*time.Second, "a start batch of every partition", func() bool {
				for p := range int32(partitions) {
					if starts, _ := log.get(p); len(starts) == 0 {
						return false
					}
				}
				return true
			})
			produce(t, topic, &sarama.ProducerMessage{Key: sarama.StringEncoder("key-0"), Value: sarama.StringEncoder("late")})
			end := highWaterMarks(t, client, topic, partitions)
			for p := range int32(partitions) {
				start := tt.wantStart(hw, p)
				var want []int64
				for o := start; o < end[p]; o++ {
					want = append(want, o)
				}
				testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("partition %d to deliver %d messages", p, len(want)), func() bool {
					starts, _ := log.get(p)
					_, got := log.get(p)
					return len(starts) > 0 && len(got) >= len(want)
				})
				starts, got := log.get(p)
				if !slices.Equal(starts, []int64{start}) {
					t.Errorf("partition %d: start batches %v, want [%d]", p, starts, start)
				}
				if !slices.Equal(got, want) {
					t.Errorf("partition %d: offsets %v, want %v", p, got, want)
				}
			}
			if got := src.Partitions(); !slices.Equal(got, []int32{0, 1, 2, 3}) {
				t.Errorf("Partitions() = %v", got)
			}
		})
	}
}

func TestSourceRealKafkaTopicNotFound(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "missing")
	client := newClient(t)
	src, err := kafka.NewSource(client, kafka.SourceConfig{Topic: topic, Initial: sarama.OffsetOldest})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = src.Run(ctx)
	if !errors.Is(err, kafka.ErrTopicNotFound) || !strings.Contains(err.Error(), topic) {
		t.Errorf("Run = %v, want ErrTopicNotFound naming %s", err, topic)
	}
	// The metadata requests must not have created it (the broker allows
	// auto-creation: kafka.NewConfig must not ask for it).
	if err := client.RefreshMetadata(); err != nil {
		t.Fatalf("RefreshMetadata: %v", err)
	}
	topics, err := client.Topics()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(topics, topic) {
		t.Errorf("topic %s was auto-created by the source's metadata requests", topic)
	}
}

// TestSourceRealKafkaRetentionWhilePaused deletes records under a paused
// source (as retention would): on Resume the broker answers
// OFFSET_OUT_OF_RANGE and the partition restarts by policy with a Start batch.
func TestSourceRealKafkaRetentionWhilePaused(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "retention")
	createTopic(t, topic, 1)
	client := newClient(t)
	admin, err := sarama.NewClusterAdminFromClient(newClient(t))
	if err != nil {
		t.Fatal(err)
	}
	value := func(i int) *sarama.ProducerMessage {
		return &sarama.ProducerMessage{Value: sarama.StringEncoder(fmt.Sprint("v", i))}
	}
	produce(t, topic, value(0), value(1), value(2), value(3), value(4))
	src, err := kafka.NewSource(client, kafka.SourceConfig{Topic: topic, Initial: sarama.OffsetOldest})
	if err != nil {
		t.Fatal(err)
	}
	log := runSource(t, src)
	testutil.WaitFor(t, 30*time.Second, "offsets 0..4", func() bool { _, got := log.get(0); return len(got) == 5 })

	src.Pause()
	// Let the fetch that may be in flight come back: while every partition
	// is paused sarama sends none.
	inFlight, ok := client.Config().MetricRegistry.Get("requests-in-flight").(metrics.Counter)
	if !ok {
		t.Fatal("sarama metric requests-in-flight not found")
	}
	testutil.WaitFor(t, 30*time.Second, "no request in flight", func() bool { return inFlight.Count() == 0 })
	produce(t, topic, value(5), value(6), value(7), value(8), value(9))
	if err := admin.DeleteRecords(topic, map[int32]int64{0: 8}); err != nil {
		t.Fatalf("DeleteRecords: %v", err)
	}
	src.Resume()

	testutil.WaitFor(t, 30*time.Second, "offsets 8 and 9", func() bool { _, got := log.get(0); return len(got) == 7 })
	starts, got := log.get(0)
	if want := []int64{0, 8}; !slices.Equal(starts, want) {
		t.Errorf("start batches %v, want %v", starts, want)
	}
	if want := []int64{0, 1, 2, 3, 4, 8, 9}; !slices.Equal(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
}
