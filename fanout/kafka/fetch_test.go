package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A partition whose leader moves to another broker goes on from where it
// was on the new leader: no record skipped or repeated, and no restart.
func TestSourceLeaderMoves(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	prod := newProducer(t, cluster)
	prod.produce(topic, 20, 0, 1)
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, BatchSize: 7,
		Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(7)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "the first 40 messages", func() bool { return rec.count() == 40 })

	for p := range int32(2) {
		to := 1 - cluster.LeaderFor(topic, p) // the other of nodes 0 and 1
		if err := cluster.MoveTopicPartition(topic, p, to); err != nil {
			t.Fatalf("move partition %d: %v", p, err)
		}
	}
	prod.produce(topic, 20, 0, 1)
	testutil.WaitFor(t, testWait, "every message after the moves", func() bool { return rec.count() == 80 })
	checkOnceEachNoRestart(t, rec, 2, 40)
}

// Fetches that fail (the broker closes the connection, as one that
// restarts does) are retried after a backoff from where the partitions
// were: nothing skipped or repeated, no restart.
func TestSourceBrokerFailure(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	prod := newProducer(t, cluster)
	prod.produce(topic, 10, 0, 1)
	var fail atomic.Int32
	var failed atomic.Int32
	cluster.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if fail.Load() <= 0 {
			return nil, nil, false
		}
		fail.Add(-1)
		failed.Add(1)
		return nil, errors.New("broker going down"), true // closes the connection
	})
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "the first 20 messages", func() bool { return rec.count() == 20 })
	fail.Store(3)
	prod.produce(topic, 10, 0, 1)
	testutil.WaitFor(t, testWait, "3 failed fetches", func() bool { return failed.Load() == 3 })
	testutil.WaitFor(t, testWait, "every message after the failures", func() bool { return rec.count() == 40 })
	checkOnceEachNoRestart(t, rec, 2, 20)
}

// checkOnceEachNoRestart checks that each of the first partitions
// delivered offsets 0..n-1 once each, in order, from one start at 0: a
// leader move or a failed fetch is no restart.
func checkOnceEachNoRestart(t *testing.T, rec *recorder, partitions int32, n int64) {
	t.Helper()
	for p := range partitions {
		if got := rec.offsetsOf(p); !slices.Equal(got, offsetsFrom(0, n)) {
			t.Errorf("partition %d: offsets %v, want 0..%d once each", p, got, n-1)
		}
		if got := rec.startsOf(p); !slices.Equal(got, []int64{0}) {
			t.Errorf("partition %d: start batches %v, want [0]: no restart", p, got)
		}
	}
}

// A broker whose fetches keep failing (one that restarts, or is down) is
// asked again after a backoff that grows, not in a loop: the gaps between
// the failed fetches are at least the backoff's delays.
func TestSourceBrokerFailureBacksOff(t *testing.T) {
	t.Parallel()
	const topic, failures = "t", 4
	cluster := newCluster(t, topic, 1)
	var mu sync.Mutex
	var at []time.Time // when each fetch failed
	cluster.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		return nil, errors.New("broker down"), true // closes the connection
	})
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, src, newRecorder(DefaultBatchSize))
	testutil.WaitFor(t, testWait, "failed fetches", func() bool { mu.Lock(); defer mu.Unlock(); return len(at) >= failures })
	mu.Lock()
	defer mu.Unlock()
	wait := retryMin
	for i := 1; i < failures; i++ {
		if gap := at[i].Sub(at[i-1]); gap < wait {
			t.Errorf("fetch %d failed %v after the one before, want at least the backoff's %v", i+1, gap, wait)
		}
		wait = min(2*wait, retryMax)
	}
}

// Records of every codec arrive whole; those of a compressed batch alias
// the bytes it was decompressed to, a buffer of their own, and every batch
// lists the buffers its messages alias.
func TestSourceCodecs(t *testing.T) {
	t.Parallel()
	codecs := []sarama.CompressionCodec{sarama.CompressionNone, sarama.CompressionGZIP, sarama.CompressionSnappy,
		sarama.CompressionLZ4, sarama.CompressionZSTD}
	for _, codec := range codecs {
		t.Run(codec.String(), func(t *testing.T) {
			t.Parallel()
			const topic, n = "t", 50
			cluster := newCluster(t, topic, 1)
			cfg := NewConfig("fanout-test")
			cfg.Producer.Return.Successes = true
			cfg.Producer.Compression = codec
			cfg.Producer.Flush.Messages = n // one batch
			sp, err := sarama.NewSyncProducer(cluster.ListenAddrs(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			var msgs []*sarama.ProducerMessage
			for i := range n {
				msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(fmt.Sprintf("value-%03d", i)),
					Headers: []sarama.RecordHeader{{Key: []byte("i"), Value: []byte(fmt.Sprint(i))}}})
			}
			if err := sp.SendMessages(msgs); err != nil {
				t.Fatalf("produce: %v", err)
			}
			src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got []*dispatch.Message
			var bad []string
			c := &collector{add: func(b dispatch.Batch) {
				mu.Lock()
				defer mu.Unlock()
				for _, m := range b.Messages {
					if m.Buffer == nil || !slices.Contains(b.Buffers, m.Buffer) {
						bad = append(bad, fmt.Sprintf("offset %d: buffer %p not among its batch's %v", m.Offset, m.Buffer, b.Buffers))
					} else if m.Buffer.Size < len(m.Value) {
						bad = append(bad, fmt.Sprintf("offset %d: buffer of %d bytes for a value of %d", m.Offset, m.Buffer.Size, len(m.Value)))
					}
					got = append(got, m)
				}
			}}
			runCollector(t, src, c)
			testutil.WaitFor(t, testWait, "every record", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == n })
			mu.Lock()
			defer mu.Unlock()
			for _, b := range bad {
				t.Error(b)
			}
			for i, m := range got {
				if m.Offset != int64(i) || string(m.Value) != fmt.Sprintf("value-%03d", i) ||
					len(m.Headers) != 1 || string(m.Headers[0].Value) != fmt.Sprint(i) {
					t.Fatalf("record %d: offset %d value %q headers %+v", i, m.Offset, m.Value, m.Headers)
				}
			}
			// The response's buffer holds at least every record; a
			// decompressed batch's, at most its own records' bytes and
			// their framing.
			if size := got[0].Buffer.Size; codec == sarama.CompressionNone && size < n*len("value-000") {
				t.Errorf("uncompressed: the response's buffer is %d bytes", size)
			} else if codec != sarama.CompressionNone && size > n*64 {
				t.Errorf("%s: the decompressed batch's buffer is %d bytes, more than its records", codec, size)
			}
		})
	}
}

// collector is a reader of a Source's batches: it closes anchors and hands
// the batches of messages to add.
type collector struct{ add func(dispatch.Batch) }

// runCollector runs src until cleanup, handing its batches to c; at
// cleanup it cancels and checks that Run returned nil.
func runCollector(t *testing.T, src *Source, c *collector) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- src.Run(ctx) }()
	go func() {
		for b := range src.Batches() {
			if b.Anchor != nil {
				close(b.Anchor)
			}
			if len(b.Messages) > 0 {
				c.add(b)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
