package kafka

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// Lookups asked while one is under way wait, then go together: one request
// per leader and per partition asked twice, each answer right.
func TestOffsetLookupsGoTogether(t *testing.T) {
	t.Parallel()
	const topic, partitions = "t", 32
	cluster := newCluster(t, topic, partitions)
	prod := newProducer(t, cluster)
	all := make([]int32, partitions)
	for p := range all {
		all[p] = int32(p)
	}
	prod.produce(topic, 2, all...)

	var requests atomic.Int32
	var sizes sync.Map // request number: partitions asked
	first, release := make(chan struct{}), make(chan struct{})
	cluster.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		n := requests.Add(1)
		asked := 0
		for _, rt := range req.(*kmsg.ListOffsetsRequest).Topics {
			asked += len(rt.Partitions)
		}
		sizes.Store(n, asked)
		if n == 1 {
			close(first)
			cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})

	client := newClient(t, cluster)
	if err := client.RefreshMetadata(topic); err != nil {
		t.Fatal(err)
	}
	l := &offsetLookups{client: client, topic: topic}
	ctx := t.Context()
	type answer struct {
		p      int32
		time   int64
		offset int64
		err    error
	}
	answers := make(chan answer, 2*partitions)
	ask := func(p int32, at int64) {
		go func() {
			o, err := l.get(ctx, p, at, false)
			answers <- answer{p, at, o, err}
		}()
	}
	ask(0, sarama.OffsetNewest)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no ListOffsets request within 30s")
	}
	for p := range int32(partitions) {
		if p > 0 {
			ask(p, sarama.OffsetNewest)
		}
		ask(p, sarama.OffsetOldest)
	}
	testutil.WaitFor(t, 30*time.Second, "the lookups queued behind the first", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.queued) == 2*partitions-1
	})
	close(release)
	for range 2 * partitions {
		a := <-answers
		want := int64(2)
		if a.time == sarama.OffsetOldest {
			want = 0
		}
		if a.err != nil || a.offset != want {
			t.Errorf("partition %d at %d: %d, %v; want %d", a.p, a.time, a.offset, a.err, want)
		}
	}
	// The first alone; then partition 0's oldest with every newest, and the
	// other oldest in a request of their own.
	if n := requests.Load(); n != 3 {
		t.Errorf("%d ListOffsets requests, want 3", n)
	}
	for n, want := range map[int32]int{1: 1, 2: partitions, 3: partitions - 1} {
		if got, _ := sizes.Load(n); got != want {
			t.Errorf("request %d asked %v partitions, want %d", n, got, want)
		}
	}
}

// A lookup that fails is tried again after a metadata refresh, as sarama's
// GetOffset does; one that fails again returns the error.
func TestOffsetLookupsRetryOnce(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 1)
	prod := newProducer(t, cluster)
	prod.produce(topic, 3, 0)
	client := newClient(t, cluster)
	l := &offsetLookups{client: client, topic: topic}

	failed := failOldestLookups(cluster, 3) // the first is answered, then 3 fail
	if o, err := l.get(t.Context(), 0, sarama.OffsetOldest, false); err != nil || o != 0 {
		t.Fatalf("first lookup: %d, %v", o, err)
	}
	if _, err := l.get(t.Context(), 0, sarama.OffsetOldest, false); err == nil {
		t.Fatal("a lookup failed twice returned no error")
	}
	if n := failed.Load(); n != 2 {
		t.Errorf("%d lookups failed, want 2 (one lookup and its retry)", n)
	}
	if o, err := l.get(t.Context(), 0, sarama.OffsetOldest, false); err != nil || o != 0 {
		t.Errorf("failed once, retried: %d, %v; want 0", o, err)
	}
	if o, err := LastStableOffset(client, topic, 0); err != nil || o != 3 {
		t.Errorf("LastStableOffset: %d, %v; want 3", o, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l.mu.Lock()
	l.busy = true // another caller sends: this one waits, and gives up with ctx
	l.mu.Unlock()
	if _, err := l.get(ctx, 0, sarama.OffsetNewest, false); err == nil {
		t.Error("a lookup whose context ended returned no error")
	}
}
