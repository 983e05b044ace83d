//go:build integration

package integration

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// procPO names a Kafka record: partition and offset.
type procPO struct {
	P int32
	O int64
}

func (po procPO) String() string { return fmt.Sprintf("p%d@%d", po.P, po.O) }

// procLogHook records the daemon's log entries, for tests that check what
// the daemon says.
type procLogHook struct {
	mu      sync.Mutex
	entries []*logrus.Entry
}

func (h *procLogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *procLogHook) Fire(e *logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = append(h.entries, &logrus.Entry{Level: e.Level, Message: e.Message, Data: maps.Clone(e.Data)})
	return nil
}

// find returns the first entry at level whose message and formatted fields
// (error included) contain every one of substrs, or nil.
func (h *procLogHook) find(level logrus.Level, substrs ...string) *logrus.Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
next:
	for _, e := range h.entries {
		if e.Level != level {
			continue
		}
		line := e.Message
		for k, v := range e.Data {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		for _, s := range substrs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return e
	}
	return nil
}

// procHookLogs adds a recording hook to the logger of opts (daemonOptions
// gives every daemon a logger of its own).
func procHookLogs(logger *logrus.Entry) *procLogHook {
	h := &procLogHook{}
	logger.Logger.AddHook(h)
	return h
}

// procProduceTo produces values to one partition of topic and returns their
// offsets.
func procProduceTo(t testing.TB, topic string, partition int32, values ...string) []int64 {
	t.Helper()
	producer := manualProducer(t)
	defer producer.Close()
	offs := make([]int64, len(values))
	for i, v := range values {
		_, off, err := producer.SendMessage(&sarama.ProducerMessage{
			Topic: topic, Partition: partition, Value: sarama.StringEncoder(v),
		})
		if err != nil {
			t.Fatalf("produce %q to %s/%d: %v", v, topic, partition, err)
		}
		offs[i] = off
	}
	return offs
}

// The committed offset is the end of the contiguous acked prefix: with
// offset 4 unacked it stays at 4 however many commit intervals pass and
// however many later offsets are acked; acking 4 moves it to 10.
func TestCommittedOffsetIsContiguousAckedPrefix(t *testing.T) {
	t.Parallel()
	testCommittedOffsetIsContiguousAckedPrefix(t, daemonOptions)
}

// testCommittedOffsetIsContiguousAckedPrefix is the test, with daemons of
// the options options makes (and their offset store).
func testCommittedOffsetIsContiguousAckedPrefix(t *testing.T, options func(testing.TB, string) fanout.Options) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	produceSeq(t, topic, "m", 10, 1)

	d := startDaemon(t, options(t, topic))
	c := dial(t, client.Config{MaxInFlight: 20}, d.addr)
	got := map[int64]*client.Message{}
	for len(got) < 10 {
		m := recv(t, c, 30*time.Second)
		if m.Partition != 0 || m.Offset < 0 || m.Offset > 9 || got[m.Offset] != nil {
			t.Fatalf("unexpected delivery p%d@%d (attempt %d); have %d", m.Partition, m.Offset, m.Attempt, len(got))
		}
		if want := fmt.Sprintf("m-%d", m.Offset); string(m.Value) != want {
			t.Fatalf("offset %d has value %q, want %q", m.Offset, m.Value, want)
		}
		got[m.Offset] = m
	}
	for o := int64(0); o < 10; o++ {
		if o == 4 {
			continue
		}
		if err := got[o].Ack(); err != nil {
			t.Fatalf("ack offset %d: %v", o, err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the daemon to count 9 acks", func() bool { return d.stats(t).Acked == 9 })
	testutil.WaitFor(t, 10*time.Second, "offset 4 committed", func() bool { return storeOffsets(t, d.opts)[0] == 4 })
	// Ten commit intervals later it is still 4: acks beyond the gap are
	// never committed.
	for deadline := time.Now().Add(10 * d.opts.CommitInterval); time.Now().Before(deadline); {
		if o := storeOffsets(t, d.opts)[0]; o != 4 {
			t.Fatalf("committed offset %d with offset 4 unacked, want 4", o)
		}
		time.Sleep(d.opts.CommitInterval / 2) // sampling an absence, not synchronising
	}

	if err := got[4].Ack(); err != nil {
		t.Fatalf("ack offset 4: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "offset 10 committed once 4 is acked", func() bool {
		return storeOffsets(t, d.opts)[0] == 10
	})
}

// After a graceful stop, a daemon with the same id delivers exactly the
// unacked messages at or after the committed offset of each partition:
// nothing below it (acked), and none of the messages acked beyond a gap
// (stored as acked ranges with the offset: Delivery policies).
func TestCleanRestartRedeliversFromCommittedOffsets(t *testing.T) {
	t.Parallel()
	testCleanRestartRedeliversFromCommittedOffsets(t, daemonOptions)
}

// testCleanRestartRedeliversFromCommittedOffsets is the test, with daemons
// of the options options makes (and their offset store).
func testCleanRestartRedeliversFromCommittedOffsets(t *testing.T, options func(testing.TB, string) fanout.Options) {
	const partitions, n = 4, 40 // 10 per partition; message i is p i%4 at offset i/4
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	produceSeq(t, topic, "m", n, partitions)

	// What the client acks, per partition: a prefix, then some offsets
	// beyond a gap. The committed offset is the prefix's length.
	prefix := map[int32]int64{0: 10, 1: 3, 2: 0, 3: 6}
	beyondGap := map[int32][]int64{1: {5, 9}, 2: {2}, 3: {8}}
	acks := map[procPO]bool{}
	for p, k := range prefix {
		for o := range k {
			acks[procPO{p, o}] = true
		}
		for _, o := range beyondGap[p] {
			acks[procPO{p, o}] = true
		}
	}

	d1 := startDaemon(t, options(t, topic))
	c1 := dial(t, client.Config{MaxInFlight: n}, d1.addr)
	delivered := map[procPO]*client.Message{}
	for len(delivered) < n {
		m := recv(t, c1, 30*time.Second)
		po := procPO{m.Partition, m.Offset}
		if delivered[po] != nil {
			t.Fatalf("%v delivered twice by the first daemon", po)
		}
		if want := fmt.Sprintf("m-%d", int64(m.Partition)+m.Offset*partitions); string(m.Value) != want {
			t.Fatalf("%v has value %q, want %q", po, m.Value, want)
		}
		delivered[po] = m
	}
	for po := range acks {
		if err := delivered[po].Ack(); err != nil {
			t.Fatalf("ack %v: %v", po, err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("the daemon to count %d acks", len(acks)), func() bool {
		return d1.stats(t).Acked == uint64(len(acks))
	})
	if err := c1.Close(); err != nil {
		t.Fatalf("close client: %v", err)
	}
	if err := d1.stop(t); err != nil {
		t.Fatalf("first daemon stopped with %v", err)
	}
	committed := storeOffsets(t, d1.opts)
	for p := range int32(partitions) {
		if committed[p] != prefix[p] {
			t.Fatalf("after a graceful stop, committed offsets %v, want %v", committed, prefix)
		}
	}

	d2 := startDaemon(t, d1.opts)
	c2 := dial(t, client.Config{MaxInFlight: n}, d2.addr)
	want := map[procPO]bool{}
	for p := range int32(partitions) {
		for o := prefix[p]; o < n/partitions; o++ {
			if !acks[procPO{p, o}] {
				want[procPO{p, o}] = true
			}
		}
	}
	again := map[procPO]*client.Message{}
	for len(again) < len(want) {
		m := recv(t, c2, 30*time.Second)
		po := procPO{m.Partition, m.Offset}
		switch {
		case acks[po]:
			t.Fatalf("%v redelivered after restart, acked before (committed offset %d)", po, committed[po.P])
		case !want[po]:
			t.Fatalf("%v redelivered after restart, below the committed offset %d", po, committed[po.P])
		case again[po] != nil:
			t.Fatalf("%v delivered twice by the second daemon", po)
		}
		again[po] = m
	}
	noMessage(t, c2, 2*time.Second)
	for _, m := range again {
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every partition committed to its end", func() bool {
		offs := storeOffsets(t, d1.opts)
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
}

// A daemon of a topic that does not exist keeps running, says so naming the
// topic, does not serve (it waits for the topic before it joins the
// cluster), and consumes the topic once it is created.
func TestMissingTopicIsWaitedFor(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	opts := daemonOptions(t, topic)
	opts.ConnectBackoffMax = time.Second
	logs := procHookLogs(opts.Logger)
	d := runDaemon(t, opts)
	testutil.WaitFor(t, 30*time.Second, "a warning naming the missing topic", func() bool {
		return logs.find(logrus.WarnLevel, topic, "not found") != nil
	})
	time.Sleep(2 * time.Second) // two leader timeouts: nobody is elected for a missing topic
	select {
	case <-d.Ready():
		t.Fatal("the daemon serves a topic that does not exist")
	case err := <-d.done:
		t.Fatalf("the daemon stopped: %v", err)
	default:
	}

	createTopic(t, topic, 1)
	d.waitServing(t)
	c := dial(t, client.Config{}, d.addr)
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("first")})
	m := recv(t, c, 30*time.Second)
	if string(m.Value) != "first" || m.Partition != 0 || m.Offset != 0 {
		t.Fatalf("got %q at p%d@%d, want \"first\" at p0@0", m.Value, m.Partition, m.Offset)
	}
	if err := m.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "offset 1 committed", func() bool { return zkOffsets(t, opts.ID, topic)[0] == 1 })
}

// Partitions added to the topic while the daemon runs are found (within the
// source's 10 s refresh) and consumed from their oldest offset.
func TestPartitionsAddedWhileRunning(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	d := startDaemon(t, daemonOptions(t, topic))
	c := dial(t, client.Config{}, d.addr)
	produceSeq(t, topic, "old", 2, 2)
	for range 2 {
		if err := recv(t, c, 30*time.Second).Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}

	addPartitions(t, topic, 4)
	procProduceTo(t, topic, 2, "new-2")
	procProduceTo(t, topic, 3, "new-3")

	got := map[string]procPO{}
	for len(got) < 2 {
		m := recv(t, c, 45*time.Second)
		got[string(m.Value)] = procPO{m.Partition, m.Offset}
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	if want := map[string]procPO{"new-2": {2, 0}, "new-3": {3, 0}}; !maps.Equal(got, want) {
		t.Fatalf("from the new partitions got %v, want %v", got, want)
	}
	testutil.WaitFor(t, 10*time.Second, "the new partitions committed", func() bool {
		offs := zkOffsets(t, d.opts.ID, topic)
		return offs[2] == 1 && offs[3] == 1
	})
}

// A stored offset beyond the end of the partition is reported and replaced
// by the initial-offset policy (oldest): every message is delivered and the
// commit replaces the bogus offset.
func TestStoredOffsetOutOfRangeResetsToOldest(t *testing.T) {
	t.Parallel()
	const bogus = 1_000_000
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	produceSeq(t, topic, "m", 3, 1)

	opts := daemonOptions(t, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	defer conn.Close()
	node := zkstore.OffsetsPath("", opts.ID, topic) + "/0"
	for i := 1; i < len(node); i++ { // every parent, then the node
		if node[i] == '/' {
			if _, err := conn.Create(node[:i], nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
				t.Fatalf("create %s: %v", node[:i], err)
			}
		}
	}
	if _, err := conn.Create(node, []byte(fmt.Sprint(bogus)), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create %s: %v", node, err)
	}
	if got := zkOffsets(t, opts.ID, topic); got[0] != bogus {
		t.Fatalf("stored offsets %v, want partition 0 at %d", got, bogus)
	}

	logs := procHookLogs(opts.Logger)
	d := startDaemon(t, opts)
	c := dial(t, client.Config{}, d.addr)
	seen := map[int64]bool{}
	for len(seen) < 3 {
		m := recv(t, c, 30*time.Second)
		if m.Offset < 0 || m.Offset > 2 || seen[m.Offset] || string(m.Value) != fmt.Sprintf("m-%d", m.Offset) {
			t.Fatalf("unexpected delivery %q at p%d@%d (seen %v)", m.Value, m.Partition, m.Offset, seen)
		}
		seen[m.Offset] = true
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	if logs.find(logrus.WarnLevel, "out of range", fmt.Sprint(bogus), "oldest") == nil {
		t.Errorf("no warning naming the out-of-range offset %d and the policy oldest", bogus)
	}
	testutil.WaitFor(t, 10*time.Second, "offset 3 committed over the bogus one", func() bool {
		return zkOffsets(t, opts.ID, topic)[0] == 3
	})
}
