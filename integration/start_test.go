//go:build integration

package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"

	"github.com/nanoservice/core-fanout/internal/backoff"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// Where partitions start: --initial-offset applies only to a group that has
// never committed; a partition without a stored offset in a group that has
// is one whose start nobody committed, and starts at its oldest offset. And
// a start resolved by a policy is stored before its first delivery.

// withInitialOffset returns args with --initial-offset set to policy.
func withInitialOffset(args []string, policy string) []string {
	args = slices.Clone(args)
	args[slices.Index(args, "--initial-offset")+1] = policy
	return args
}

// recvValues receives messages of c until it has every one of want (other
// messages are ignored), failing after timeout; it acks them when ack is
// set, and returns where each was delivered.
func recvValues(t *testing.T, c *client.Client, want []string, ack bool, timeout time.Duration) map[string]procPO {
	t.Helper()
	got := map[string]procPO{}
	deadline := time.Now().Add(timeout)
	for len(got) < len(want) {
		m := recv(t, c, time.Until(deadline))
		if slices.Contains(want, string(m.Value)) {
			got[string(m.Value)] = procPO{m.Partition, m.Offset}
		}
		if ack {
			if err := m.Ack(); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
	}
	return got
}

// A leader that starts on a topic whose partitions were added (and written
// to) while no daemon ran delivers their messages, although --initial-offset
// is newest: the group has stored offsets, so partitions without one start
// at their oldest offset.
func TestLeaderStartsPartitionsAddedWhileDown(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	procProduceTo(t, topic, 0, "before-0")
	procProduceTo(t, topic, 1, "before-1")

	// The first daemon reads from the oldest offset to have something to
	// commit for partitions 0 and 1.
	opts := daemonOptions(t, topic)
	d1 := startDaemon(t, opts)
	c1 := dial(t, client.Config{}, d1.addr)
	recvValues(t, c1, []string{"before-0", "before-1"}, true, 30*time.Second)
	testutil.WaitFor(t, 10*time.Second, "partitions 0 and 1 committed", func() bool {
		return maps.Equal(zkOffsets(t, opts.ID, topic), map[int32]int64{0: 1, 1: 1})
	})
	_ = c1.Close()
	if err := d1.stop(t); err != nil {
		t.Fatalf("first daemon: %v", err)
	}

	addPartitions(t, topic, 4)
	want := []string{"after-0", "after-1", "after-2", "after-3"}
	for p, v := range want {
		procProduceTo(t, topic, int32(p), v)
	}

	opts.InitialOffset = "newest"
	d2 := startDaemon(t, opts)
	c2 := dial(t, client.Config{}, d2.addr)
	got := recvValues(t, c2, want, true, 30*time.Second)
	wantAt := map[string]procPO{"after-0": {0, 1}, "after-1": {1, 1}, "after-2": {2, 0}, "after-3": {3, 0}}
	if !maps.Equal(got, wantAt) {
		t.Fatalf("delivered %v, want %v", got, wantAt)
	}
	testutil.WaitFor(t, 10*time.Second, "every partition committed", func() bool {
		return maps.Equal(zkOffsets(t, opts.ID, topic), map[int32]int64{0: 2, 1: 2, 2: 1, 3: 1})
	})
}

// kill -9 right after partitions were added and written to loses nothing:
// the next daemon (--initial-offset newest) starts them at their oldest
// offset, whether the killed one had found them or not.
func TestKillNineAfterPartitionsAddedLosesNothing(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 2)
	produceSeq(t, topic, "first", 4, 2)

	addr1 := procFreeAddr(t)
	p1 := procStart(t, procDaemonArgs(t, id, topic, addr1)...) // oldest: commits 0 and 1 for the test to build on
	c1 := procDial(t, client.Config{}, addr1)
	recvValues(t, c1, []string{"first-0", "first-1", "first-2", "first-3"}, true, 30*time.Second)
	testutil.WaitFor(t, 15*time.Second, "partitions 0 and 1 committed", func() bool {
		return maps.Equal(zkOffsets(t, id, topic), map[int32]int64{0: 2, 1: 2})
	})

	addPartitions(t, topic, 4)
	want := produceSeq(t, topic, "late", 8, 4) // two per partition
	p1.signal(t, syscall.SIGKILL)
	p1.wait(t, 10*time.Second)
	_ = c1.Close()
	t.Logf("killed; committed offsets %v", zkOffsets(t, id, topic))

	addr2 := procFreeAddr(t)
	procStart(t, withInitialOffset(procDaemonArgs(t, id, topic, addr2), "newest")...)
	c2 := procDial(t, client.Config{}, addr2)
	got := recvValues(t, c2, want, true, 60*time.Second)
	for i, v := range want {
		if po, p := got[v], int32(i%4); po.P != p {
			t.Fatalf("%s delivered from partition %d, want %d", v, po.P, p)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "every partition committed to its end", func() bool {
		return maps.Equal(zkOffsets(t, id, topic), map[int32]int64{0: 4, 1: 4, 2: 2, 3: 2})
	})
}

// A partition started at newest is anchored: its start offset is stored
// before its first delivery, so kill -9 right after deliveries that were
// never acked nor committed (the commit interval is an hour) loses none of
// them. Without the anchor the next daemon, finding no stored offset at
// all, would resolve newest again, after them.
func TestKillNineAfterFirstDeliveriesOfANewestStartLosesNothing(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	args := func(addr string) []string {
		return withInitialOffset(procDaemonArgs(t, id, topic, addr,
			"--commit-interval", "1h", "--zookeeper-session-timeout", "2h"), "newest")
	}

	addr1 := procFreeAddr(t)
	p1 := procStart(t, args(addr1)...)
	c1 := procDial(t, client.Config{}, addr1)
	// Newest is where the partition is when the daemon looks: produce until
	// a message comes through, then a few more.
	ctx, stop := context.WithCancel(context.Background())
	warm := make(chan error, 1)
	go func() {
		producer := manualProducer(t)
		defer producer.Close()
		for i := 0; ; i++ {
			_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(fmt.Sprint("warm-", i))})
			if err != nil || !backoff.Sleep(ctx, 100*time.Millisecond) {
				warm <- err
				return
			}
		}
	}()
	first := recv(t, c1, 60*time.Second)
	stop()
	if err := <-warm; err != nil {
		t.Fatalf("produce: %v", err)
	}
	delivered := map[int64]string{first.Offset: string(first.Value)}
	more := produceSeq(t, topic, "more", 3, 1)
	for !slices.Contains(slices.Collect(maps.Values(delivered)), more[len(more)-1]) {
		m := recv(t, c1, 30*time.Second)
		delivered[m.Offset] = string(m.Value) // not acked
	}
	p1.signal(t, syscall.SIGKILL)
	p1.wait(t, 10*time.Second)
	_ = c1.Close()
	stored := zkOffsets(t, id, topic)
	t.Logf("killed after %d deliveries from offset %d; stored offsets %v", len(delivered), first.Offset, stored)
	if o, ok := stored[0]; !ok || o > first.Offset {
		t.Errorf("stored offsets %v at the kill: want partition 0 at or below %d, the first delivery", stored, first.Offset)
	}

	addr2 := procFreeAddr(t)
	procStart(t, args(addr2)...)
	c2 := procDial(t, client.Config{}, addr2)
	again := map[int64]string{}
	for len(again) < len(delivered) {
		m := recv(t, c2, 30*time.Second)
		if v, ok := delivered[m.Offset]; ok {
			if v != string(m.Value) {
				t.Fatalf("offset %d redelivered as %q, was %q", m.Offset, m.Value, v)
			}
			again[m.Offset] = v
		}
	}
}
