package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rcrowley/go-metrics"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

const testWait = 15 * time.Second

// newCluster starts an in-process Kafka with topic seeded with partitions.
func newCluster(t *testing.T, topic string, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newClient returns a sarama client on NewConfig with short waits, closed at
// cleanup.
func newClient(t *testing.T, c *kfake.Cluster) sarama.Client {
	t.Helper()
	cfg := NewConfig("fanout-test")
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	cfg.Metadata.Retry.Max, cfg.Metadata.Retry.Backoff, cfg.Metadata.Retry.BackoffFunc = 1, 10*time.Millisecond, nil
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	client, err := sarama.NewClient(c.ListenAddrs(), cfg)
	if err != nil {
		t.Fatalf("sarama client: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// producer produces to a kfake cluster from its own client.
type producer struct {
	t      *testing.T
	client sarama.Client
	sp     sarama.SyncProducer
	admin  sarama.ClusterAdmin
}

func newProducer(t *testing.T, c *kfake.Cluster) *producer {
	t.Helper()
	client := newClient(t, c)
	sp, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	t.Cleanup(func() { _ = sp.Close() }) // runs before the client's Close
	return &producer{t: t, client: client, sp: sp, admin: admin}
}

// produce sends n messages to each given partition.
func (p *producer) produce(topic string, n int, partitions ...int32) {
	p.t.Helper()
	if err := p.client.RefreshMetadata(topic); err != nil {
		p.t.Fatalf("refresh metadata: %v", err)
	}
	for _, part := range partitions {
		for i := range n {
			msg := &sarama.ProducerMessage{
				Topic: topic, Partition: part,
				Key:     sarama.StringEncoder(fmt.Sprintf("k%d", i)),
				Value:   sarama.StringEncoder(fmt.Sprintf("p%d-%d", part, i)),
				Headers: []sarama.RecordHeader{{Key: []byte("h"), Value: []byte("v")}},
			}
			if _, _, err := p.sp.SendMessage(msg); err != nil {
				p.t.Fatalf("produce to %s/%d: %v", topic, part, err)
			}
		}
	}
}

// recorder collects batches and the contract violations it sees in them.
// It plays the dispatcher's part of anchors: it closes a Start batch's
// Anchor at once, unless told to hold the partition's anchors.
type recorder struct {
	batchSize int

	mu         sync.Mutex // guards the fields below
	starts     map[int32][]int64
	anchored   map[int32][]int64 // the starts that came with an Anchor
	held       map[int32][]chan struct{}
	hold       map[int32]bool // partitions whose anchors are held, not closed
	offsets    map[int32][]int64
	next       map[int32]int64 // expected offset of the next message
	open       map[int32]bool  // an anchor of the partition is not closed yet
	violations []string
}

func newRecorder(batchSize int) *recorder {
	return &recorder{batchSize: batchSize, starts: map[int32][]int64{}, anchored: map[int32][]int64{},
		held: map[int32][]chan struct{}{}, hold: map[int32]bool{}, offsets: map[int32][]int64{},
		next: map[int32]int64{}, open: map[int32]bool{}}
}

// holdAnchors keeps the anchors of partition p open until release.
func (r *recorder) holdAnchors(p int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold[p] = true
}

// release closes the held anchors of partition p and stops holding them.
func (r *recorder) release(p int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.held[p] {
		close(a)
	}
	delete(r.held, p)
	r.hold[p], r.open[p] = false, false
}

func (r *recorder) anchoredOf(p int32) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.anchored[p])
}

func (r *recorder) add(b dispatch.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	bad := func(format string, args ...any) { r.violations = append(r.violations, fmt.Sprintf(format, args...)) }
	if b.Start >= 0 {
		if len(b.Messages) > 0 {
			bad("start batch of partition %d carries %d messages", b.Partition, len(b.Messages))
		}
		r.starts[b.Partition] = append(r.starts[b.Partition], b.Start)
		r.next[b.Partition] = b.Start
		if b.Anchor != nil {
			r.anchored[b.Partition] = append(r.anchored[b.Partition], b.Start)
			if r.hold[b.Partition] {
				r.held[b.Partition] = append(r.held[b.Partition], b.Anchor)
				r.open[b.Partition] = true
			} else {
				close(b.Anchor)
			}
		}
		return
	}
	if r.open[b.Partition] {
		bad("partition %d: messages before its start was anchored", b.Partition)
	}
	if b.Start != -1 || len(b.Messages) == 0 || len(b.Messages) > r.batchSize {
		bad("partition %d: batch with Start %d and %d messages", b.Partition, b.Start, len(b.Messages))
	}
	want, started := r.next[b.Partition]
	if !started {
		bad("partition %d: messages before a start batch", b.Partition)
	}
	for _, m := range b.Messages {
		if m.Partition != b.Partition {
			bad("batch of partition %d holds a message of partition %d", b.Partition, m.Partition)
		}
		if m.Offset != want {
			bad("partition %d: offset %d where %d was expected", b.Partition, m.Offset, want)
		}
		if wantValue := fmt.Sprintf("p%d-", m.Partition); !strings.HasPrefix(string(m.Value), wantValue) {
			bad("partition %d offset %d: value %q", m.Partition, m.Offset, m.Value)
		}
		want = m.Offset + 1
		r.offsets[b.Partition] = append(r.offsets[b.Partition], m.Offset)
	}
	r.next[b.Partition] = want
}

func (r *recorder) startsOf(p int32) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts[p])
}

func (r *recorder) offsetsOf(p int32) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.offsets[p])
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.offsets {
		n += len(o)
	}
	return n
}

// run starts src.Run and a reader of its batches; at cleanup it cancels,
// checks that Run returned nil and closed Batches, and reports violations.
func run(t *testing.T, src *Source, rec *recorder) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- src.Run(ctx) }()
	read := make(chan struct{})
	go func() {
		defer close(read)
		for b := range src.Batches() {
			rec.add(b)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(testWait):
			t.Errorf("Run did not return after cancel")
		}
		select {
		case <-read:
		case <-time.After(testWait):
			t.Errorf("Batches not closed after Run returned")
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, v := range rec.violations {
			t.Error(v)
		}
	})
}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return logrus.NewEntry(l)
}

func offsetsFrom(from, to int64) []int64 {
	var out []int64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

func TestSourceStartOffsets(t *testing.T) {
	t.Parallel()
	const before, after = 5, 2 // messages per partition produced before and after the start
	tests := []struct {
		name         string
		initial      int64
		stored       map[int32]int64
		deleteBefore map[int32]int64 // records deleted before the start (retention)
		wantStart    map[int32]int64
		wantAnchored []int32 // partitions whose start was resolved by the source: anchored
	}{
		{"oldest", sarama.OffsetOldest, nil, nil, map[int32]int64{0: 0, 1: 0, 2: 0}, []int32{0, 1, 2}},
		{"newest", sarama.OffsetNewest, nil, nil, map[int32]int64{0: 5, 1: 5, 2: 5}, []int32{0, 1, 2}},
		{"stored", sarama.OffsetNewest, map[int32]int64{0: 2, 1: 5, 2: 0}, nil, map[int32]int64{0: 2, 1: 5, 2: 0}, nil},
		// A group that has stored offsets: --initial-offset no longer
		// applies, partitions without one (added, or started and never
		// committed before a crash) start at the oldest offset.
		{"newest applies only to a group that never committed", sarama.OffsetNewest, map[int32]int64{0: 5}, nil,
			map[int32]int64{0: 5, 1: 0, 2: 0}, []int32{1, 2}},
		{"stored beyond end resets to oldest", sarama.OffsetOldest, map[int32]int64{0: 100, 1: 3}, nil,
			map[int32]int64{0: 0, 1: 3, 2: 0}, []int32{0, 2}},
		{"stored beyond end resets to newest", sarama.OffsetNewest, map[int32]int64{0: 100}, nil,
			map[int32]int64{0: 5, 1: 0, 2: 0}, []int32{0, 1, 2}},
		{"stored below log start resets to oldest", sarama.OffsetOldest, map[int32]int64{0: 1, 1: 1},
			map[int32]int64{0: 3}, map[int32]int64{0: 3, 1: 1, 2: 0}, []int32{0, 2}},
		// Retention removed records the daemon never delivered: it goes on
		// from the oldest left, even with the newest policy.
		{"stored below log start resets to oldest whatever the policy", sarama.OffsetNewest, map[int32]int64{0: 1, 1: 1},
			map[int32]int64{0: 3}, map[int32]int64{0: 3, 1: 1, 2: 0}, []int32{0, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const topic = "t"
			cluster := newCluster(t, topic, 3)
			prod := newProducer(t, cluster)
			prod.produce(topic, before, 0, 1, 2)
			if len(tt.deleteBefore) > 0 {
				if err := prod.admin.DeleteRecords(topic, tt.deleteBefore); err != nil {
					t.Fatalf("delete records: %v", err)
				}
			}
			client := newClient(t, cluster)
			src, err := NewSource(client, SourceConfig{Topic: topic, Initial: tt.initial, Stored: tt.stored,
				BatchSize: 3, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder(3)
			run(t, src, rec)

			testutil.WaitFor(t, testWait, "a start batch per partition", func() bool {
				for p := range tt.wantStart {
					if len(rec.startsOf(p)) == 0 {
						return false
					}
				}
				return true
			})
			prod.produce(topic, after, 0, 1, 2)
			for p, start := range tt.wantStart {
				want := offsetsFrom(start, before+after)
				testutil.WaitFor(t, testWait, fmt.Sprintf("offsets %v of partition %d", want, p), func() bool {
					return len(rec.offsetsOf(p)) >= len(want)
				})
				if got := rec.startsOf(p); !slices.Equal(got, []int64{start}) {
					t.Errorf("partition %d: start batches %v, want [%d]", p, got, start)
				}
				var wantAnchored []int64
				if slices.Contains(tt.wantAnchored, p) {
					wantAnchored = []int64{start}
				}
				if got := rec.anchoredOf(p); !slices.Equal(got, wantAnchored) {
					t.Errorf("partition %d: anchored starts %v, want %v", p, got, wantAnchored)
				}
				if got := rec.offsetsOf(p); !slices.Equal(got, want) {
					t.Errorf("partition %d: offsets %v, want %v", p, got, want)
				}
			}
			if got := src.Partitions(); !slices.Equal(got, []int32{0, 1, 2}) {
				t.Errorf("Partitions() = %v, want [0 1 2]", got)
			}
			testutil.WaitFor(t, testWait, "high water marks at 7", func() bool {
				hw := src.HighWaterMarks()
				return len(hw) == 3 && hw[0] == 7 && hw[1] == 7 && hw[2] == 7
			})
		})
	}
}

// TestSourceOutOfRangeWhileRunning makes the broker answer fetches with
// OFFSET_OUT_OF_RANGE (sarama then stops the partition consumer), deletes
// the records under the consumer meanwhile, and expects a restart by policy
// announced with a Start batch.
func TestSourceOutOfRangeWhileRunning(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 1)
	prod := newProducer(t, cluster)
	prod.produce(topic, 10, 0)

	var inject atomic.Bool
	var injected atomic.Int32
	inject.Store(true)
	cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !inject.Load() {
			return nil, nil, false
		}
		injected.Add(1)
		fr := req.(*kmsg.FetchRequest)
		resp := fr.ResponseKind().(*kmsg.FetchResponse)
		resp.Version = fr.Version
		for _, rt := range fr.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.OffsetOutOfRange.Code
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	client := newClient(t, cluster)
	src, err := NewSource(client, SourceConfig{Topic: topic, Initial: sarama.OffsetOldest,
		Stored: map[int32]int64{0: 0}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)

	testutil.WaitFor(t, testWait, "an injected out-of-range fetch", func() bool { return injected.Load() > 0 })
	if err := prod.admin.DeleteRecords(topic, map[int32]int64{0: 6}); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	inject.Store(false)

	testutil.WaitFor(t, testWait, "offsets 6..9", func() bool { return len(rec.offsetsOf(0)) >= 4 })
	if got, want := rec.startsOf(0), []int64{0, 6}; !slices.Equal(got, want) {
		t.Errorf("start batches %v, want %v", got, want)
	}
	if got, want := rec.anchoredOf(0), []int64{6}; !slices.Equal(got, want) {
		t.Errorf("anchored starts %v, want %v (the reset, not the stored offset)", got, want)
	}
	if got, want := rec.offsetsOf(0), offsetsFrom(6, 10); !slices.Equal(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
}

// failOldestLookups fails, after the first lookup of partition 0's oldest
// offset, the next n such lookups (ListOffsets, timestamp -2) with a
// retriable error, as a broker in a leader change would. It returns the
// number of lookups failed so far.
func failOldestLookups(cluster *kfake.Cluster, n int32) *atomic.Int32 {
	var seen, failed atomic.Int32
	cluster.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		lr := req.(*kmsg.ListOffsetsRequest)
		if len(lr.Topics) != 1 || len(lr.Topics[0].Partitions) != 1 {
			return nil, nil, false
		}
		if rp := lr.Topics[0].Partitions[0]; rp.Partition != 0 || rp.Timestamp != sarama.OffsetOldest {
			return nil, nil, false
		}
		if seen.Add(1) == 1 || failed.Load() >= n {
			return nil, nil, false
		}
		failed.Add(1)
		resp := lr.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = lr.Version
		st := kmsg.NewListOffsetsResponseTopic()
		st.Topic = lr.Topics[0].Topic
		sp := kmsg.NewListOffsetsResponseTopicPartition()
		sp.Partition, sp.ErrorCode = 0, kerr.LeaderNotAvailable.Code
		st.Partitions = append(st.Partitions, sp)
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	return &failed
}

// A stored offset below the log start resets to the oldest offset even when
// the lookups that tell where the log starts fail for a while: they are
// retried, never answered by the policy (newest would skip 3 and 4).
func TestSourceResetRetriesFailedLookup(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 1)
	prod := newProducer(t, cluster)
	prod.produce(topic, 5, 0)
	if err := prod.admin.DeleteRecords(topic, map[int32]int64{0: 3}); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	// The first lookup is the consumer's range check, which finds 1 out of
	// range; the next ones are the source's, to tell where to reset.
	failed := failOldestLookups(cluster, 3)
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetNewest,
		Stored: map[int32]int64{0: 1}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "partition 0 to start", func() bool { return len(rec.startsOf(0)) > 0 })
	if got := rec.startsOf(0); !slices.Equal(got, []int64{3}) {
		t.Fatalf("start batches %v, want [3]: the oldest offset, not the policy's newest", got)
	}
	if failed.Load() != 3 {
		t.Fatalf("%d lookups failed, want 3", failed.Load())
	}
	testutil.WaitFor(t, testWait, "offsets 3 and 4", func() bool { return len(rec.offsetsOf(0)) == 2 })
	if got := rec.offsetsOf(0); !slices.Equal(got, []int64{3, 4}) {
		t.Fatalf("offsets %v, want [3 4]", got)
	}
}

// requestsInFlight is the number of requests of client awaiting a response.
func requestsInFlight(client sarama.Client) int64 {
	c, ok := client.Config().MetricRegistry.Get("requests-in-flight").(metrics.Counter)
	if !ok {
		return -1
	}
	return c.Count()
}

func TestSourcePauseResume(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		pauseBefore bool // Pause before Run: partitions must start paused
	}{
		{"pause while running", false},
		{"pause before run", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const topic = "t"
			cluster := newCluster(t, topic, 2)
			prod := newProducer(t, cluster)
			client := newClient(t, cluster)
			src, err := NewSource(client, SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder(DefaultBatchSize)
			seen := 0
			if tt.pauseBefore {
				src.Pause()
				prod.produce(topic, 3, 0, 1)
				run(t, src, rec)
				testutil.WaitFor(t, testWait, "start batches", func() bool {
					return len(rec.startsOf(0)) == 1 && len(rec.startsOf(1)) == 1
				})
			} else {
				run(t, src, rec)
				prod.produce(topic, 3, 0, 1)
				testutil.WaitFor(t, testWait, "the first 6 messages", func() bool { return rec.count() == 6 })
				seen = 6
				src.Pause()
				src.Pause() // idempotent
			}
			// With every partition paused sarama sends no fetch; wait for
			// the one that may have been in flight to come back.
			testutil.WaitFor(t, testWait, "no request in flight", func() bool { return requestsInFlight(client) == 0 })
			prod.produce(topic, 1, 0, 1)
			time.Sleep(time.Second) // the one bounded wait: nothing may arrive while paused
			if got := rec.count(); got != seen {
				t.Fatalf("%d messages delivered while paused, want %d", got, seen)
			}
			src.Resume()
			src.Resume() // idempotent
			total := 2 * 4
			testutil.WaitFor(t, testWait, "every message after Resume", func() bool { return rec.count() == total })
		})
	}
}

// PausePartition stops fetching one partition while the others flow, and
// holds across a Pause and Resume of the whole source, until
// ResumePartition.
func TestSourcePausePartition(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	prod := newProducer(t, cluster)
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	prod.produce(topic, 1, 0, 1)
	testutil.WaitFor(t, testWait, "the first messages", func() bool { return rec.count() == 2 })

	src.PausePartition(0)
	src.PausePartition(0) // idempotent
	// Fetches go one at a time per broker: once a message of partition 1
	// produced after the pause has come, every later fetch was built
	// without partition 0.
	for want := 2; want <= 3; want++ {
		prod.produce(topic, 1, 1)
		testutil.WaitFor(t, testWait, "partition 1 flowing", func() bool { return len(rec.offsetsOf(1)) == want })
	}
	check := func(what string, want1 int) {
		t.Helper()
		prod.produce(topic, 1, 0)
		prod.produce(topic, 1, 1)
		testutil.WaitFor(t, testWait, "partition 1 "+what, func() bool { return len(rec.offsetsOf(1)) == want1 })
		time.Sleep(300 * time.Millisecond) // sampling an absence: partition 0's message was produced first
		if got := rec.offsetsOf(0); len(got) != 1 {
			t.Fatalf("%s: partition 0 delivered %v while paused", what, got)
		}
	}
	check("while partition 0 is paused", 4)
	src.Pause()
	src.Resume()
	check("after Pause and Resume of the source", 5)

	src.ResumePartition(0)
	testutil.WaitFor(t, testWait, "partition 0 after ResumePartition", func() bool { return len(rec.offsetsOf(0)) == 3 })
}

func TestSourceTopicNotFound(t *testing.T) {
	t.Parallel()
	cluster := newCluster(t, "other", 1)
	client := newClient(t, cluster)
	src, err := NewSource(client, SourceConfig{Topic: "missing", Initial: sarama.OffsetOldest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	err = src.Run(context.Background())
	if !errors.Is(err, ErrTopicNotFound) || !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("Run = %v, want ErrTopicNotFound naming the topic", err)
	}
	select {
	case b, open := <-src.Batches():
		t.Fatalf("Batches after a failed Run: %+v, open %v", b, open)
	default:
	}

	// The topic appears: the same Source runs.
	prod := newProducer(t, cluster)
	if err := prod.admin.CreateTopic("missing", &sarama.TopicDetail{NumPartitions: 2, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "start batches after the topic appeared", func() bool {
		return slices.Equal(rec.startsOf(0), []int64{0}) && slices.Equal(rec.startsOf(1), []int64{0})
	})
}

func TestSourceNewPartition(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 1)
	prod := newProducer(t, cluster)
	prod.produce(topic, 2, 0)
	client := newClient(t, cluster)
	src, err := NewSource(client, SourceConfig{Topic: topic, Initial: sarama.OffsetNewest,
		RefreshInterval: 50 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "the start of partition 0", func() bool { return len(rec.startsOf(0)) == 1 })
	if got := rec.startsOf(0); got[0] != 2 {
		t.Fatalf("partition 0 starts at %d, want 2 (newest)", got[0])
	}

	if err := prod.admin.CreatePartitions(topic, 3, nil, false); err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	prod.produce(topic, 2, 1, 2) // possibly before the source notices: must not be skipped
	for _, p := range []int32{1, 2} {
		testutil.WaitFor(t, testWait, fmt.Sprintf("messages of new partition %d", p), func() bool { return len(rec.offsetsOf(p)) == 2 })
		if got := rec.startsOf(p); !slices.Equal(got, []int64{0}) {
			t.Errorf("partition %d: start batches %v, want [0] (oldest)", p, got)
		}
		if got := rec.anchoredOf(p); !slices.Equal(got, []int64{0}) {
			t.Errorf("partition %d: anchored starts %v, want [0]", p, got)
		}
	}
	if got := src.Partitions(); !slices.Equal(got, []int32{0, 1, 2}) {
		t.Errorf("Partitions() = %v, want [0 1 2]", got)
	}
}

// A partition whose start the source resolved (newest here) sends no
// message until the dispatcher has anchored that start; the other
// partitions flow meanwhile.
func TestSourceSendsNoMessageBeforeItsStartIsAnchored(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	prod := newProducer(t, cluster)
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetNewest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(DefaultBatchSize)
	rec.holdAnchors(0)
	run(t, src, rec)
	testutil.WaitFor(t, testWait, "both partitions to start", func() bool {
		return len(rec.anchoredOf(0)) == 1 && len(rec.anchoredOf(1)) == 1
	})
	prod.produce(topic, 3, 0)
	prod.produce(topic, 3, 1)
	testutil.WaitFor(t, testWait, "partition 1's messages", func() bool { return len(rec.offsetsOf(1)) == 3 })
	time.Sleep(500 * time.Millisecond) // sampling an absence: partition 0 is fetched as partition 1 was
	if got := rec.offsetsOf(0); len(got) != 0 {
		t.Fatalf("partition 0 sent %v before its start was anchored", got)
	}
	rec.release(0)
	testutil.WaitFor(t, testWait, "partition 0's messages once anchored", func() bool { return len(rec.offsetsOf(0)) == 3 })
}

func TestParseInitialOffset(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"newest", sarama.OffsetNewest, false},
		{"oldest", sarama.OffsetOldest, false},
		{" Oldest ", sarama.OffsetOldest, false},
		{"latest", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseInitialOffset(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseInitialOffset(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestNewSourceValidates(t *testing.T) {
	t.Parallel()
	cluster := newCluster(t, "t", 1)
	client := newClient(t, cluster)
	tests := []struct {
		name string
		cfg  SourceConfig
		ok   bool
	}{
		{"defaults", SourceConfig{Topic: "t", Initial: sarama.OffsetNewest}, true},
		{"no topic", SourceConfig{Initial: sarama.OffsetNewest}, false},
		{"numeric initial", SourceConfig{Topic: "t", Initial: 5}, false},
		{"negative stored", SourceConfig{Topic: "t", Initial: sarama.OffsetOldest, Stored: map[int32]int64{0: -1}}, false},
		{"negative batch", SourceConfig{Topic: "t", Initial: sarama.OffsetOldest, BatchSize: -1}, false},
	}
	for _, tt := range tests {
		src, err := NewSource(client, tt.cfg)
		if (err == nil) != tt.ok {
			t.Errorf("%s: NewSource error %v, want ok %v", tt.name, err, tt.ok)
			continue
		}
		if tt.ok && (src.cfg.BatchSize != DefaultBatchSize || src.cfg.RefreshInterval != DefaultRefreshInterval) {
			t.Errorf("%s: defaults not applied: %+v", tt.name, src.cfg)
		}
	}
}
