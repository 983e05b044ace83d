//go:build integration

package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// Batched delivery against the real Kafka: a Go client with the batch API receives
// DeliverBatch frames (whole batches, acked in one call, by ranges) while a
// client of today's protocol (no CAPABILITY_BATCH) connected to the same
// daemon keeps receiving single Deliver frames and acking by id; together
// they receive every message, and the acks of both commit every offset.
func TestBatchAndSingleDeliverClientsTogether(t *testing.T) {
	t.Parallel()
	const partitions, n = 4, 4000
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	d := startDaemon(t, opts)

	// The old client first, with a small credit, so that it is served too.
	raw := procRawDial(t, d.addr, 20)
	if w := raw.next(t, 30*time.Second).GetWelcome(); w == nil || len(w.GetCapabilities()) != 0 {
		t.Fatalf("the client without capabilities was welcomed by %v", w)
	}
	var mu sync.Mutex // guards got
	got := map[string]int{}
	rawGot := 0 // guarded by mu
	rawDone := make(chan error, 1)
	go func() {
		for f := range raw.frames {
			if f.GetDeliverBatch() != nil {
				rawDone <- fmt.Errorf("a client without CAPABILITY_BATCH got a DeliverBatch frame")
				return
			}
			del := f.GetDeliver()
			if del == nil {
				continue
			}
			mu.Lock()
			got[string(del.GetValue())]++
			rawGot++
			mu.Unlock()
			if err := raw.send(protocol.AckFrame([]uint64{del.GetDeliveryId()})); err != nil {
				rawDone <- err
				return
			}
		}
		rawDone <- nil
	}()

	c := dial(t, client.Config{MaxInFlight: 1000, Batches: true}, d.addr)
	produceSeq(t, topic, "m", n, partitions)
	largest := 0
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		mu.Lock()
		all := len(got)
		mu.Unlock()
		if all == n {
			break
		}
		select {
		case b, ok := <-c.Batches():
			if !ok {
				t.Fatalf("client closed: %v", c.Err())
			}
			largest = max(largest, len(b.Messages))
			mu.Lock()
			for _, m := range b.Messages {
				got[string(m.Value)]++
			}
			mu.Unlock()
			if err := b.Ack(); err != nil {
				t.Fatalf("Batch.Ack: %v", err)
			}
		case err := <-rawDone:
			t.Fatalf("the single-Deliver client stopped: %v", err)
		case <-time.After(100 * time.Millisecond): // the raw client may be the one receiving
		case <-ctx.Done():
			t.Fatalf("%d of %d messages received within 60s", all, n)
		}
	}
	mu.Lock()
	single := rawGot
	mu.Unlock()
	if single == 0 {
		t.Error("the client without CAPABILITY_BATCH received nothing")
	}
	if largest < 2 {
		t.Errorf("the batch client's largest batch held %d message(s): no batching", largest)
	}
	for i := range n {
		if v := fmt.Sprintf("m-%d", i); got[v] == 0 {
			t.Fatalf("%s never received", v)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool {
		offs := zkOffsets(t, opts.ID, topic)
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
	st := d.stats(t)
	if st.UnknownAcks != 0 {
		t.Errorf("%d unknown acks", st.UnknownAcks)
	}
	t.Logf("%d messages in single Deliver frames, the rest in batches of up to %d; stats %+v", single, largest, st)
}

// Batches and range acks in spread mode: one Go client with the batch API,
// given one member's address, keeps a session with each of three members;
// every batch comes from one member and holds only partitions that member
// owns, one Batch.Ack (ranges) settles it at that member, and the acks of
// all commit every partition's offset.
func TestSpreadBatchClient(t *testing.T) {
	t.Parallel()
	const partitions, n = 12, 2400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := spNewCluster(t, topic, 3)
	c.startAll()
	conn := spZK(t)
	owned := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	owner := spOwnerAt(owned)
	addrOf := map[string]string{}
	for _, nd := range c.nodes {
		addrOf[nd.addr] = nd.id
	}
	watch := clWatchOffsets(t, c.id, topic)

	hook := &clHook{}
	cfg := clClientConfig("sp-batches", hook)
	cfg.MaxInFlight, cfg.Batches = 300, true
	cl := dial(t, cfg, c.nodes[0].addr)
	produceSeq(t, topic, "m", n, partitions)
	seen, members := map[string]bool{}, map[string]bool{}
	largest := 0
	deadline := time.After(60 * time.Second)
	for len(seen) < n {
		select {
		case b, ok := <-cl.Batches():
			if !ok {
				t.Fatalf("client closed: %v", cl.Err())
			}
			member := addrOf[b.Member()]
			members[member] = true
			largest = max(largest, len(b.Messages))
			for _, m := range b.Messages {
				if m.Member() != b.Member() || owner[m.Partition] != member {
					t.Fatalf("a batch from %s (%s) holds %s of partition %d, owned by %s, from %s",
						member, b.Member(), m.Value, m.Partition, owner[m.Partition], m.Member())
				}
				seen[string(m.Value)] = true
			}
			if err := b.Ack(); err != nil {
				t.Fatalf("Batch.Ack of %d messages from %s: %v", len(b.Messages), member, err)
			}
		case <-deadline:
			t.Fatalf("%d of %d messages within 60s", len(seen), n)
		}
	}
	if len(members) != 3 {
		t.Fatalf("batches came from %v, want all 3 members", slices.Sorted(maps.Keys(members)))
	}
	if largest < 2 {
		t.Errorf("the largest batch held %d message(s): no batching", largest)
	}
	testutil.WaitFor(t, 30*time.Second, "every partition's acks committed", func() bool {
		offs := watch.latest()
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
	t.Logf("%d messages in batches of up to %d from %v, every offset committed", n, largest, slices.Sorted(maps.Keys(members)))
}
