package kafka

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// tap is a dispatch.Source that passes a Source's batches on and records
// their Start offsets.
type tap struct {
	*Source
	out chan dispatch.Batch

	mu     sync.Mutex // guards starts
	starts map[int32][]int64
}

func newTap(src *Source) *tap {
	t := &tap{Source: src, out: make(chan dispatch.Batch), starts: map[int32][]int64{}}
	go func() {
		defer close(t.out)
		for b := range src.Batches() {
			if b.Start >= 0 {
				t.mu.Lock()
				t.starts[b.Partition] = append(t.starts[b.Partition], b.Start)
				t.mu.Unlock()
			}
			t.out <- b
		}
	}()
	return t
}

func (t *tap) Batches() <-chan dispatch.Batch { return t.out }

func (t *tap) startsOf(p int32) []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.starts[p])
}

// deliveries is a dispatch.ClientSink that hands deliveries to the test.
type deliveries chan dispatch.Delivery

func (d deliveries) Send(ds []dispatch.Delivery) {
	for _, x := range ds {
		d <- x
	}
}
func (deliveries) Goodbye(string) {}

func (d deliveries) next(t *testing.T) dispatch.Delivery {
	t.Helper()
	select {
	case x := <-d:
		return x
	case <-time.After(testWait):
		t.Fatal("no delivery")
		return dispatch.Delivery{}
	}
}

// commitLog is a MemoryStore that records every committed offset of
// partition 0. It overrides both ways to commit: the dispatcher commits
// with CommitProgress to a store that keeps progress.
type commitLog struct {
	*offsets.MemoryStore
	mu   sync.Mutex // guards p0
	p0   []int64
	last map[int32]int64
}

func (c *commitLog) Commit(ctx context.Context, fence offsets.Fence, m map[int32]int64) error {
	return c.CommitProgress(ctx, fence, m, nil)
}

func (c *commitLog) CommitProgress(ctx context.Context, fence offsets.Fence, m map[int32]int64, pr map[int32]offsets.Progress) error {
	err := c.MemoryStore.CommitProgress(ctx, fence, m, pr)
	if err == nil {
		c.mu.Lock()
		if o, ok := m[0]; ok {
			c.p0 = append(c.p0, o)
		}
		for p, o := range m {
			c.last[p] = o
		}
		c.mu.Unlock()
	}
	return err
}

func (c *commitLog) stored(p int32) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.last[p]
	return o, ok
}

// truncation answers, while on, every fetch of partition 0 with
// OFFSET_OUT_OF_RANGE (other partitions get no records) and every lookup of
// partition 0's newest offset with end: as if an unclean leader election
// had truncated its log to end.
func truncation(cluster *kfake.Cluster, end int64) *atomic.Bool {
	var on atomic.Bool
	cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		fr := req.(*kmsg.FetchRequest)
		resp := fr.ResponseKind().(*kmsg.FetchResponse)
		resp.Version = fr.Version
		for _, rt := range fr.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = rp.FetchOffset, rp.FetchOffset, 0
				if rp.Partition == 0 {
					sp.ErrorCode = kerr.OffsetOutOfRange.Code
					sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	cluster.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		lr := req.(*kmsg.ListOffsetsRequest)
		if !on.Load() || len(lr.Topics) != 1 || len(lr.Topics[0].Partitions) != 1 {
			return nil, nil, false
		}
		if rp := lr.Topics[0].Partitions[0]; rp.Partition != 0 || rp.Timestamp != sarama.OffsetNewest {
			return nil, nil, false
		}
		resp := lr.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = lr.Version
		st := kmsg.NewListOffsetsResponseTopic()
		st.Topic = lr.Topics[0].Topic
		sp := kmsg.NewListOffsetsResponseTopicPartition()
		sp.Partition, sp.Timestamp, sp.Offset, sp.OldStyleOffsets = 0, -1, end, []int64{end}
		st.Partitions = append(st.Partitions, sp)
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	return &on
}

// A partition restarted forward by an out-of-range fetch (the log was
// truncated to 3 while 0-9 were delivered and 0-2 not acked) keeps 0-2
// outstanding: the committed offset stays at 0 although the records
// re-fetched from 3 are acked, and the acks of 0-2, made after the restart,
// count.
func TestSourceForwardRestartKeepsUnackedBelow(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 2)
	truncated := truncation(cluster, 3)
	prod := newProducer(t, cluster)
	prod.produce(topic, 10, 0)
	prod.produce(topic, 1, 1) // partition 1's one message: a barrier for commits

	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: topic, Initial: sarama.OffsetNewest,
		Stored: map[int32]int64{0: 0, 1: 0}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srcCtx, stopSource := context.WithCancel(context.Background())
	srcDone := make(chan struct{})
	go func() { defer close(srcDone); _ = src.Run(srcCtx) }()
	t.Cleanup(func() { stopSource(); <-srcDone })

	mem := offsets.NewMemoryStore()
	store := &commitLog{MemoryStore: mem, last: map[int32]int64{}}
	tp := newTap(src)
	disp, err := dispatch.New(dispatch.Config{Store: store, Scope: dispatch.WholeTopic(mem.NewTerm()), CommitInterval: 10 * time.Millisecond,
		Logger: quietLogger()}, tp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- disp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	client := make(deliveries, 100)
	disp.Join(1, "c", 100, client)
	first := map[int64]dispatch.Delivery{} // partition 0's deliveries from before the restart
	var barrier dispatch.Delivery
	for len(first) < 10 || barrier.Msg == nil {
		d := client.next(t)
		if d.Msg.Partition == 1 {
			barrier = d
			continue
		}
		first[d.Msg.Offset] = d
	}
	for o := int64(3); o < 10; o++ {
		disp.Ack(1, []uint64{first[o].ID})
	}

	truncated.Store(true)
	testutil.WaitFor(t, testWait, "partition 0 to restart at 3", func() bool { return slices.Contains(tp.startsOf(0), 3) })
	truncated.Store(false)
	// The records from 3 are fetched again and delivered as new ones.
	for o := int64(3); o < 10; {
		d := client.next(t)
		if d.Msg.Partition != 0 || d.Msg.Offset < 3 {
			t.Fatalf("unexpected delivery p%d@%d after the restart", d.Msg.Partition, d.Msg.Offset)
		}
		if d.Msg.Offset != o {
			continue // a late copy from before the restart cannot be told apart here; wait for o
		}
		disp.Ack(1, []uint64{d.ID})
		o++
	}
	// Commits are offered for every partition that changed at once: once
	// partition 1's ack is committed, partition 0's value reflects every
	// ack above.
	disp.Ack(1, []uint64{barrier.ID})
	testutil.WaitFor(t, testWait, "partition 1 committed", func() bool { o, _ := store.stored(1); return o == 1 })
	if o, _ := store.stored(0); o != 0 {
		t.Fatalf("partition 0 committed at %d with 0-2 unacked, want 0", o)
	}

	disp.Ack(1, []uint64{first[0].ID, first[1].ID, first[2].ID}) // one request: 0 to 10 at once
	testutil.WaitFor(t, testWait, "partition 0 committed at 10 once 0-2 are acked", func() bool {
		o, _ := store.stored(0)
		return o == 10
	})
	store.mu.Lock()
	defer store.mu.Unlock()
	for _, o := range store.p0 {
		if o != 0 && o != 10 {
			t.Errorf("partition 0 commits %v: %d passes the unacked 0-2", store.p0, o)
		}
	}
}
