//go:build integration

package integration

// Delivery semantics of the daemon against real Kafka and ZooKeeper: fair
// share, redelivery on ack timeout, disconnect, dead and slow clients and
// nack, buffering and backpressure, and what the port does with bad input.
// Misbehaving clients speak the wire protocol by hand (semRaw); well-behaved
// ones are the Go client.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// semRaw is a client connection driven frame by frame through the protocol
// package, for clients that misbehave on purpose.
type semRaw struct {
	t  testing.TB
	nc net.Conn
	r  *protocol.Reader
	w  *protocol.Writer
}

// semDialRaw opens a TCP connection to addr (closed at cleanup). A positive
// rcvbuf sets SO_RCVBUF before connecting, so that the TCP window is small
// from the start.
func semDialRaw(t testing.TB, addr string, rcvbuf int) *semRaw {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &semRaw{t: t, nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0)}
}

// sendRaw writes b as is.
func (c *semRaw) sendRaw(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write %d raw bytes: %v", len(b), err)
	}
}

// send writes and flushes one frame.
func (c *semRaw) send(f *protocol.Frame) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.w.WriteFrame(f); err != nil {
		return err
	}
	return c.w.Flush()
}

// mustSend is send failing the test on error.
func (c *semRaw) mustSend(f *protocol.Frame) {
	c.t.Helper()
	if err := c.send(f); err != nil {
		c.t.Fatalf("send %v: %v", f, err)
	}
}

// read reads one frame, waiting at most timeout.
func (c *semRaw) read(timeout time.Duration) (*protocol.Frame, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	f := new(protocol.Frame)
	if err := c.r.ReadFrame(f); err != nil {
		return nil, err
	}
	return f, nil
}

// hello sends Hello asking for maxInFlight and returns the Welcome.
func (c *semRaw) hello(maxInFlight uint32) *protocol.Welcome {
	c.t.Helper()
	c.mustSend(protocol.HelloFrame(&protocol.Hello{
		ClientId: "raw-" + c.t.Name(), ProtocolVersion: protocol.Version, MaxInFlight: maxInFlight,
	}))
	f, err := c.read(30 * time.Second)
	if err != nil {
		c.t.Fatalf("read welcome: %v", err)
	}
	w := f.GetWelcome()
	if w == nil {
		c.t.Fatalf("got %v, want a Welcome", f)
	}
	return w
}

// deliveries reads frames until n Deliver frames have come, answering Pings,
// and returns them.
func (c *semRaw) deliveries(n int, timeout time.Duration) []*protocol.Deliver {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var out []*protocol.Deliver
	for len(out) < n {
		f, err := c.read(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("raw client: %d of %d deliveries, then: %v", len(out), n, err)
		}
		switch {
		case f.GetDeliver() != nil:
			out = append(out, f.GetDeliver())
		case f.GetPing() != nil:
			c.mustSend(protocol.PongFrame(f.GetPing().GetNonce()))
		default:
			c.t.Fatalf("raw client: unexpected frame %v", f)
		}
	}
	return out
}

// expectFatal reads the daemon's answer to bad input: an Error frame with
// code and fatal set, then the end of the stream.
func (c *semRaw) expectFatal(code protocol.ErrorCode) {
	c.t.Helper()
	f, err := c.read(10 * time.Second)
	if err != nil {
		c.t.Fatalf("want an Error frame %v, got read error %v", code, err)
	}
	e := f.GetError()
	if e == nil {
		c.t.Fatalf("want an Error frame %v, got %v", code, f)
	}
	if e.GetCode() != code || !e.GetFatal() {
		c.t.Fatalf("got Error %v fatal=%v (%q), want %v fatal=true", e.GetCode(), e.GetFatal(), e.GetMessage(), code)
	}
	if f, err := c.read(10 * time.Second); !errors.Is(err, io.EOF) {
		c.t.Fatalf("after the fatal error: frame %v, err %v; want the connection closed (EOF)", f, err)
	}
}

// semKey names a Kafka record.
type semKey struct {
	p int32
	o int64
}

func (k semKey) String() string { return fmt.Sprintf("p%d@%d", k.p, k.o) }

// semStats describes s for failure messages.
func semStats(s dispatch.Stats) string { return fmt.Sprintf("%+v", s) }

// semWaitStats waits until cond holds for the daemon's stats.
func semWaitStats(t testing.TB, d *testDaemon, timeout time.Duration, what string, cond func(dispatch.Stats) bool) dispatch.Stats {
	t.Helper()
	var last dispatch.Stats
	deadline := time.Now().Add(timeout)
	for {
		last = d.stats(t)
		if cond(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; stats %s", timeout, what, semStats(last))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// semWaitOffsets waits until the committed offsets of d equal want.
func semWaitOffsets(t testing.TB, d *testDaemon, want map[int32]int64) {
	t.Helper()
	var got map[int32]int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		got = zkOffsets(t, d.opts.ID, d.opts.Topic)
		ok := true
		for p, o := range want {
			if got[p] != o {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offsets %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// semProduceSized produces n messages of size bytes each, message i to
// partition i % partitions, each starting with "<prefix>-<i>|", and returns
// those prefixes.
func semProduceSized(t testing.TB, topic, prefix string, n, partitions, size int) []string {
	t.Helper()
	producer := manualProducer(t)
	defer producer.Close()
	names := make([]string, n)
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		v := make([]byte, size)
		copy(v, names[i]+"|")
		msgs[i] = &sarama.ProducerMessage{
			Topic:     topic,
			Partition: int32(i % partitions),
			Key:       sarama.StringEncoder(strconv.Itoa(i)),
			Value:     sarama.ByteEncoder(v),
		}
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatalf("produce %d messages of %d bytes to %q: %v", n, size, topic, err)
	}
	return names
}

// semName returns the "<prefix>-<i>" part of a value made by
// semProduceSized (or the whole value of one made by produceSeq).
func semName(v []byte) string {
	if i := bytes.IndexByte(v, '|'); i >= 0 {
		return string(v[:i])
	}
	return string(v)
}

// semEnd returns the committed offsets that mean "everything acked" for n
// messages spread by produceSeq over partitions (n divisible by partitions).
func semEnd(n, partitions int) map[int32]int64 {
	want := map[int32]int64{}
	for p := range partitions {
		want[int32(p)] = int64(n / partitions)
	}
	return want
}

// Three equally fast clients share the messages evenly.
func TestSemanticsFairShare(t *testing.T) {
	t.Parallel()
	const partitions, n, nClients = 4, 3000, 3
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.MaxInFlight = n
	d := startDaemon(t, opts)

	// All clients are connected before anything is produced, so that none
	// gets a head start.
	type got struct {
		client int
		m      *client.Message
	}
	results := make(chan got, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for i := range nClients {
		c := dial(t, client.Config{MaxInFlight: n}, d.addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case m, ok := <-c.Messages():
					if !ok {
						return
					}
					_ = m.Ack()
					select {
					case results <- got{i, m}:
					case <-stop:
						return
					}
				case <-stop:
					return
				}
			}
		}()
	}
	semWaitStats(t, d, 10*time.Second, "3 clients joined", func(s dispatch.Stats) bool { return s.Clients == nClients })

	want := produceSeq(t, topic, "m", n, partitions)
	seen := map[string]int{}
	share := make([]int, nClients)
	timeout := time.After(60 * time.Second)
	for len(seen) < n {
		select {
		case g := <-results:
			v := string(g.m.Value)
			if prev, dup := seen[v]; dup {
				t.Fatalf("%s delivered twice (clients %d and %d, attempt %d)", v, prev, g.client, g.m.Attempt)
			}
			seen[v] = g.client
			share[g.client]++
		case <-timeout:
			t.Fatalf("%d of %d messages after 60s; shares %v; stats %s", len(seen), n, share, semStats(d.stats(t)))
		}
	}
	for _, v := range want {
		if _, ok := seen[v]; !ok {
			t.Fatalf("%s never delivered", v)
		}
	}
	// The daemon deals messages round-robin to the clients with room. Each
	// client may hold all n messages, so none is ever full and the turns
	// alone decide, whatever the scheduling of the clients on a loaded
	// machine: exactly 1000 each today. (A limit of n/3 would not do: any
	// policy that fills one client before the next also ends at n/3 each.
	// With a small limit every client is full most of the time and gets
	// one message per ack; the shares then follow each client's ack
	// throughput, which on 2 cores under -race varied from 26% to 38%: that
	// measures the scheduler, not the daemon.) 31%..36% allows a dispatcher
	// that balances by load rather than strict turns, and fails if a client
	// is favoured or skipped: one taking two turns (50/25/25), the first to
	// join keeping its turn while it has room (100/0/0).
	t.Logf("shares of %d: %v", n, share)
	for i, k := range share {
		if pct := 100 * float64(k) / n; pct < 31 || pct > 36 {
			t.Errorf("client %d got %d of %d (%.1f%%), want 31%%..36%%; shares %v", i, k, n, pct, share)
		}
	}
	s := d.stats(t)
	if s.Delivered != n || s.Redelivered != [3]uint64{} {
		t.Errorf("stats %s: want %d deliveries and no redelivery", semStats(s), n)
	}
	semWaitOffsets(t, d, semEnd(n, partitions))
}

// semFirst returns the first message to reach either client and the index
// (0 or 1) of the client that got it.
func semFirst(t testing.TB, cs [2]*client.Client, timeout time.Duration) (*client.Message, int) {
	t.Helper()
	select {
	case m, ok := <-cs[0].Messages():
		if !ok {
			t.Fatalf("client 0 closed: %v", cs[0].Err())
		}
		return m, 0
	case m, ok := <-cs[1].Messages():
		if !ok {
			t.Fatalf("client 1 closed: %v", cs[1].Err())
		}
		return m, 1
	case <-time.After(timeout):
		t.Fatalf("no message within %v", timeout)
	}
	return nil, 0
}

// A message not acked within the ack timeout goes to the other client with
// attempt 2 and a new delivery id; the late ack of the first client is
// ignored.
func TestSemanticsAckTimeoutRedeliversToAnotherClient(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	opts.AckTimeout = time.Second
	d := startDaemon(t, opts)
	cs := [2]*client.Client{
		dial(t, client.Config{MaxInFlight: 4, ClientID: "c0"}, d.addr),
		dial(t, client.Config{MaxInFlight: 4, ClientID: "c1"}, d.addr),
	}
	semWaitStats(t, d, 10*time.Second, "2 clients joined", func(s dispatch.Stats) bool { return s.Clients == 2 })

	// Taken before producing: the first delivery, and so its ack deadline,
	// cannot be earlier.
	sent := time.Now()
	produceSeq(t, topic, "m", 1, 1)
	first, a := semFirst(t, cs, 30*time.Second) // a holds it and does not ack
	if first.Attempt != 1 {
		t.Fatalf("first delivery has attempt %d, want 1", first.Attempt)
	}
	b := 1 - a
	second := recv(t, cs[b], 30*time.Second)
	if elapsed := time.Since(sent); elapsed < opts.AckTimeout {
		t.Errorf("redelivered %v after production, before the ack timeout %v", elapsed, opts.AckTimeout)
	}
	if second.Partition != first.Partition || second.Offset != first.Offset || string(second.Value) != "m-0" {
		t.Fatalf("client %d got p%d@%d %q, want the record p%d@%d redelivered",
			b, second.Partition, second.Offset, second.Value, first.Partition, first.Offset)
	}
	if second.Attempt != 2 || second.DeliveryID == first.DeliveryID {
		t.Fatalf("redelivery attempt %d id %d, want attempt 2 and an id other than %d",
			second.Attempt, second.DeliveryID, first.DeliveryID)
	}
	if err := second.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	semWaitOffsets(t, d, map[int32]int64{0: 1})

	// The late ack names a delivery that expired: counted and ignored.
	if err := first.Ack(); err != nil {
		t.Fatalf("late ack: %v", err)
	}
	s := semWaitStats(t, d, 10*time.Second, "the late ack counted as unknown",
		func(s dispatch.Stats) bool { return s.UnknownAcks == 1 })
	if s.Acked != 1 || s.Redelivered[dispatch.RedeliverTimeout] != 1 || s.InFlight != 0 || s.Clients != 2 {
		t.Fatalf("stats %s: want 1 ack, 1 timeout redelivery, nothing in flight, both clients connected", semStats(s))
	}
	noMessage(t, cs[a], 200*time.Millisecond) // nothing more came to a meanwhile

	// Both clients still work.
	produceSeq(t, topic, "n", 2, 1)
	for range 2 {
		m, _ := semFirst(t, cs, 30*time.Second)
		if m.Attempt != 1 {
			t.Fatalf("%s: attempt %d, want 1", m.Value, m.Attempt)
		}
		if err := m.Ack(); err != nil {
			t.Fatalf("ack %s: %v", m.Value, err)
		}
	}
	semWaitOffsets(t, d, map[int32]int64{0: 3})
	if s := d.stats(t); s.UnknownAcks != 1 || s.Acked != 3 {
		t.Fatalf("stats %s: want 3 acks and 1 unknown ack", semStats(s))
	}
}

// A client that drops its connection without Goodbye loses its unacked
// messages to the other client, each with attempt 2.
func TestSemanticsDisconnectRedeliversEverything(t *testing.T) {
	t.Parallel()
	const partitions, n = 2, 10
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic) // ack timeout 30s: only the disconnect can redeliver
	d := startDaemon(t, opts)

	raw := semDialRaw(t, d.addr, 0)
	raw.hello(n)
	semWaitStats(t, d, 10*time.Second, "the raw client joined", func(s dispatch.Stats) bool { return s.Clients == 1 })
	produceSeq(t, topic, "m", n, partitions)
	held := map[semKey]uint64{}
	for _, dv := range raw.deliveries(n, 30*time.Second) {
		if dv.GetAttempt() != 1 {
			t.Fatalf("raw client got attempt %d, want 1", dv.GetAttempt())
		}
		held[semKey{dv.GetPartition(), dv.GetOffset()}] = dv.GetDeliveryId()
	}
	if len(held) != n {
		t.Fatalf("raw client got %d distinct records, want %d", len(held), n)
	}

	b := dial(t, client.Config{MaxInFlight: 64}, d.addr)
	semWaitStats(t, d, 10*time.Second, "2 clients joined", func(s dispatch.Stats) bool { return s.Clients == 2 })
	if err := raw.nc.Close(); err != nil { // no Goodbye: the TCP connection just ends
		t.Fatalf("close: %v", err)
	}
	got := map[semKey]bool{}
	for len(got) < n {
		m := recv(t, b, 10*time.Second)
		k := semKey{m.Partition, m.Offset}
		id, ok := held[k]
		if !ok || got[k] {
			t.Fatalf("client B got %v (%s), not one of the raw client's records or twice", k, m.Value)
		}
		if m.Attempt != 2 || m.DeliveryID == id {
			t.Fatalf("%v: attempt %d id %d, want attempt 2 and a new id (was %d)", k, m.Attempt, m.DeliveryID, id)
		}
		got[k] = true
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	s := semWaitStats(t, d, 10*time.Second, "all acked", func(s dispatch.Stats) bool { return s.Acked == n })
	if s.Redelivered != [3]uint64{dispatch.RedeliverDisconnect: n} || s.Clients != 1 || s.InFlight != 0 {
		t.Fatalf("stats %s: want exactly %d disconnect redeliveries, 1 client, nothing in flight", semStats(s), n)
	}
	semWaitOffsets(t, d, semEnd(n, partitions))
}

// With no client the daemon does not fetch; messages a leaving client held
// stay buffered; nothing is lost, and the next client gets everything.
func TestSemanticsNoClientsBuffersAndPauses(t *testing.T) {
	t.Parallel()
	const partitions, k, m = 4, 20, 200
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	d := startDaemon(t, daemonOptions(t, topic))

	// Never a client: fetching is paused from the start ("fetch only while
	// someone can take messages", dispatch.Dispatcher.Run), so messages
	// produced now stay in Kafka, not even taken into the buffer.
	before := produceSeq(t, topic, "before", k, partitions)
	semWaitStats(t, d, 10*time.Second, "fetching paused", func(s dispatch.Stats) bool { return s.Paused })
	quiet := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(quiet) {
		if s := d.stats(t); !s.Paused || s.Consumed != 0 || s.Clients != 0 {
			t.Fatalf("no client ever connected, yet stats %s: want paused, nothing consumed", semStats(s))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A client takes the k messages, does not ack, and leaves: they are
	// buffered for the next client and fetching pauses again.
	a := dial(t, client.Config{MaxInFlight: k, ClientID: "a"}, d.addr)
	for range k {
		recv(t, a, 30*time.Second)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close a: %v", err)
	}
	s := semWaitStats(t, d, 10*time.Second, "a's messages buffered and fetching paused", func(s dispatch.Stats) bool {
		return s.Clients == 0 && s.Buffered == k && s.Paused
	})
	if s.Consumed != k || s.Redelivered[dispatch.RedeliverDisconnect] != k || s.Acked != 0 || s.InFlight != 0 {
		t.Fatalf("stats %s: want %d consumed, all given back by the leaving client", semStats(s), k)
	}

	// More messages with no client: fetching stays paused. A fetch already
	// in flight when a left may still bring some in: whatever is consumed
	// is buffered, nothing is delivered or dropped.
	after := produceSeq(t, topic, "after", m, partitions)
	quiet = time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(quiet) {
		s := d.stats(t)
		if !s.Paused || s.Clients != 0 || s.Delivered != k || uint64(s.Buffered) != s.Consumed {
			t.Fatalf("no client, yet stats %s: want paused, every consumed message buffered, no delivery", semStats(s))
		}
		time.Sleep(50 * time.Millisecond)
	}

	b := dial(t, client.Config{MaxInFlight: 64, ClientID: "b"}, d.addr)
	seen := map[string]int{}
	for len(seen) < k+m {
		msg := recv(t, b, 30*time.Second)
		v := string(msg.Value)
		if _, dup := seen[v]; dup {
			t.Fatalf("%s delivered twice to b", v)
		}
		seen[v] = msg.Attempt
		if err := msg.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	// a held them and said goodbye (Close): a delivery left unanswered at
	// a goodbye is not a failed attempt, so b gets them as attempt 1.
	for _, v := range before {
		if seen[v] != 1 {
			t.Errorf("%s: attempt %d at b, want 1 (a said goodbye holding it: not a failure)", v, seen[v])
		}
	}
	for _, v := range after {
		if seen[v] != 1 {
			t.Errorf("%s: attempt %d at b, want 1", v, seen[v])
		}
	}
	semWaitOffsets(t, d, semEnd(k+m, partitions))
}

// A full buffer pauses fetching and bounds memory; nothing is lost.
func TestSemanticsFullBufferPausesFetching(t *testing.T) {
	t.Parallel()
	const partitions, n, maxBuffered = 4, 2000, 50
	// The dispatcher takes a source batch whole whenever the buffer is
	// below MaxBuffered, and a batch holds at most kafka.DefaultBatchSize
	// messages: the buffer never exceeds MaxBuffered-1+DefaultBatchSize.
	const bound = maxBuffered - 1 + kafka.DefaultBatchSize
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.MaxBuffered = maxBuffered
	d := startDaemon(t, opts)

	// The daemon fetches only while a client is connected (see
	// TestSemanticsNoClientsBuffersAndPauses). This client takes one message
	// and then nothing: it is connected but full, so the buffer fills.
	c := dial(t, client.Config{MaxInFlight: 1}, d.addr)
	semWaitStats(t, d, 10*time.Second, "the client joined", func(s dispatch.Stats) bool { return s.Clients == 1 })
	want := produceSeq(t, topic, "m", n, partitions)
	semWaitStats(t, d, 30*time.Second, "the buffer full and fetching paused", func(s dispatch.Stats) bool {
		return s.Paused && s.Buffered >= maxBuffered
	})
	var maxSeen int
	quiet := time.Now().Add(2 * time.Second)
	for time.Now().Before(quiet) {
		s := d.stats(t)
		maxSeen = max(maxSeen, s.Buffered)
		if !s.Paused || s.Buffered > bound || s.Consumed >= n || s.InFlight != 1 {
			t.Fatalf("with a full buffer, stats %s: want paused, at most %d buffered, fewer than %d consumed, 1 in flight",
				semStats(s), bound, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("buffered at most %d while paused (bound %d)", maxSeen, bound)

	// Now the client consumes and acks everything.
	seen := map[string]bool{}
	for len(seen) < n {
		m := recv(t, c, 30*time.Second)
		if seen[string(m.Value)] {
			t.Fatalf("%s delivered twice", m.Value)
		}
		seen[string(m.Value)] = true
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	for _, v := range want {
		if !seen[v] {
			t.Fatalf("%s never delivered", v)
		}
	}
	semWaitOffsets(t, d, semEnd(n, partitions))
	if s := d.stats(t); s.Consumed != n || s.Acked != n || s.Buffered != 0 {
		t.Fatalf("stats %s: want %d consumed and acked, nothing buffered", semStats(s), n)
	}
}

// semSilent is a raw client whose reader goroutine keeps reading everything
// the daemon sends; it answers Pings until silence is set, then sends
// nothing at all.
type semSilent struct {
	*semRaw
	silent  atomic.Bool
	delivs  chan *protocol.Deliver
	stopped chan struct{} // closed when reading fails (the daemon closed the connection)
	err     error         // the read error, set before stopped is closed
}

func semStartSilent(t testing.TB, addr string, maxInFlight uint32) *semSilent {
	t.Helper()
	c := &semSilent{semRaw: semDialRaw(t, addr, 0), delivs: make(chan *protocol.Deliver, 1024), stopped: make(chan struct{})}
	c.hello(maxInFlight)
	go func() {
		defer close(c.stopped)
		for {
			f, err := c.read(time.Hour)
			if err != nil {
				c.err = err
				return
			}
			switch {
			case f.GetDeliver() != nil:
				c.delivs <- f.GetDeliver()
			case f.GetPing() != nil && !c.silent.Load():
				_ = c.send(protocol.PongFrame(f.GetPing().GetNonce()))
			}
		}
	}()
	return c
}

// A client that stops answering heartbeats, while still reading, is dropped
// and its messages go to the other client long before the ack timeout.
func TestSemanticsDeadClientFoundByHeartbeat(t *testing.T) {
	t.Parallel()
	const n = 5
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	opts.Heartbeat = 200 * time.Millisecond
	opts.Liveness = 2
	opts.AckTimeout = time.Hour // the heartbeat, not the ack timeout, must find it
	d := startDaemon(t, opts)

	a := semStartSilent(t, d.addr, n)
	semWaitStats(t, d, 10*time.Second, "the raw client joined", func(s dispatch.Stats) bool { return s.Clients == 1 })
	produceSeq(t, topic, "m", n, 1)
	held := map[int64]uint64{}
	for range n {
		select {
		case dv := <-a.delivs:
			held[dv.GetOffset()] = dv.GetDeliveryId()
		case <-a.stopped:
			t.Fatalf("raw client cut off while answering pings: %v", a.err)
		case <-time.After(30 * time.Second):
			t.Fatalf("raw client got %d of %d deliveries", len(held), n)
		}
	}
	b := dial(t, client.Config{MaxInFlight: 64}, d.addr)
	semWaitStats(t, d, 10*time.Second, "2 clients joined", func(s dispatch.Stats) bool { return s.Clients == 2 })

	a.silent.Store(true)
	silentSince := time.Now()
	select {
	case <-a.stopped:
		t.Logf("the daemon closed the silent client's connection %v after it went silent: %v",
			time.Since(silentSince).Round(time.Millisecond), a.err)
	case <-time.After(60 * time.Second):
		t.Fatal("the silent client's connection is still open a minute later")
	}
	for range n {
		m := recv(t, b, 60*time.Second)
		id, ok := held[m.Offset]
		if !ok || m.Attempt != 2 || m.DeliveryID == id {
			t.Fatalf("client B got p%d@%d attempt %d id %d; want one of the silent client's %v with attempt 2 and a new id",
				m.Partition, m.Offset, m.Attempt, m.DeliveryID, held)
		}
		delete(held, m.Offset)
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	t.Logf("redelivered %v after the client went silent", time.Since(silentSince).Round(time.Millisecond))
	s := semWaitStats(t, d, 10*time.Second, "all acked", func(s dispatch.Stats) bool { return s.Acked == n })
	if s.Clients != 1 || s.Redelivered != [3]uint64{dispatch.RedeliverDisconnect: n} {
		t.Fatalf("stats %s: want 1 client and exactly %d redeliveries for the dropped client", semStats(s), n)
	}
	semWaitOffsets(t, d, map[int32]int64{0: n})
}

// A client that stops reading does not hold the others up: they are served
// while it is stuck, and its messages are theirs once it is dropped as slow.
func TestSemanticsSlowClientDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	const partitions, big, small, size = 4, 160, 20, 64 << 10
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	// Writes to the stuck client fail after WriteTimeout. It must cover
	// connecting B and producing and delivering the small messages on a
	// loaded machine; heartbeats are slow so that only the write timeout can
	// drop the stuck client.
	opts.WriteTimeout = 4 * time.Second
	opts.Heartbeat = 30 * time.Second
	d := startDaemon(t, opts)

	// The slow client asks for everything and never reads: a 4 KiB receive
	// buffer plus the daemon's send buffer (at most 4 MiB here,
	// net.ipv4.tcp_wmem) hold far less than 160 x 64 KiB = 10 MiB.
	slow := semDialRaw(t, d.addr, 4096)
	slow.mustSend(protocol.HelloFrame(&protocol.Hello{ClientId: "slow", ProtocolVersion: protocol.Version, MaxInFlight: 1000}))
	semWaitStats(t, d, 10*time.Second, "the slow client joined", func(s dispatch.Stats) bool { return s.Clients == 1 })
	bigNames := semProduceSized(t, topic, "big", big, partitions, size)
	semWaitStats(t, d, 30*time.Second, "every big message handed to the slow client",
		func(s dispatch.Stats) bool { return s.Delivered == big })

	// The slow client's connection is stuck now. B connects; new messages
	// go round-robin to B and to the slow client (which still has room:
	// the daemon cannot know it is stuck before a write times out), and B
	// gets its share while the slow client is still connected.
	b := dial(t, client.Config{MaxInFlight: 64}, d.addr)
	semWaitStats(t, d, 10*time.Second, "B joined", func(s dispatch.Stats) bool { return s.Clients == 2 })
	smallNames := produceSeq(t, topic, "small", small, partitions)
	seen := map[string]int{}
	take := func() {
		t.Helper()
		m := recv(t, b, 30*time.Second)
		name := semName(m.Value)
		if _, dup := seen[name]; dup {
			t.Fatalf("%s delivered twice to B", name)
		}
		seen[name] = m.Attempt
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	for len(seen) < small/4 {
		take()
	}
	s := d.stats(t)
	if s.Clients != 2 {
		t.Fatalf("stats %s: B got only %d messages before the slow client was dropped: "+
			"it was not served while the slow client was stuck (or WriteTimeout is too short for this machine)",
			semStats(s), len(seen))
	}
	for name, attempt := range seen {
		if !strings.HasPrefix(name, "small-") || attempt != 1 {
			t.Fatalf("B got %s attempt %d while the slow client was connected, want only new messages", name, attempt)
		}
	}

	// The slow client is dropped as slow (long before the liveness window of
	// 2 x 30s) and B gets its messages too.
	semWaitStats(t, d, opts.WriteTimeout+10*time.Second, "the slow client dropped",
		func(s dispatch.Stats) bool { return s.Clients == 1 })
	for len(seen) < big+small {
		take()
	}
	var second uint64
	for _, v := range bigNames {
		if seen[v] != 2 {
			t.Errorf("%s: attempt %d at B, want 2 (redelivered from the slow client)", v, seen[v])
		}
	}
	for name, attempt := range seen {
		if attempt == 2 {
			second++
		}
		if attempt != 1 && attempt != 2 {
			t.Errorf("%s: attempt %d at B, want 1 or 2", name, attempt)
		}
	}
	for _, v := range smallNames {
		if seen[v] == 0 {
			t.Errorf("%s never delivered", v)
		}
	}
	s = d.stats(t)
	if s.Redelivered != [3]uint64{dispatch.RedeliverDisconnect: second} || second < big {
		t.Errorf("stats %s: want the %d messages B got a second time (at least the %d big ones) redelivered "+
			"for the dropped client, and no other redelivery", semStats(s), second, big)
	}
	semWaitOffsets(t, d, semEnd(big+small, partitions))
}

// Bad input on the port gets the right fatal Error and a closed connection;
// a connected client keeps being served and the daemon stays up.
func TestSemanticsBadInput(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	d := startDaemon(t, daemonOptions(t, topic))
	b := dial(t, client.Config{MaxInFlight: 8}, d.addr)
	semWaitStats(t, d, 10*time.Second, "B joined", func(s dispatch.Stats) bool { return s.Clients == 1 })

	frame := func(body []byte) []byte {
		out := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		return append(out, body...)
	}
	var ack bytes.Buffer
	aw := protocol.NewWriter(&ack, 0)
	if err := aw.WriteFrame(protocol.AckFrame([]uint64{1, 2})); err != nil {
		t.Fatal(err)
	}
	if err := aw.Flush(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		bytes []byte
		code  protocol.ErrorCode
	}{
		// "GET " read as a length prefix is 0x47455420, about 1.1 GiB: no
		// first frame is that large, so the server answers in HTTP (a 400
		// naming the console's port) before reading anything more.
		{"http", []byte("GET / HTTP/1.1\r\nHost: fanout\r\n\r\n"), protocol.ErrorCode_ERROR_CODE_UNSPECIFIED},
		{"1GiB", binary.BigEndian.AppendUint32(nil, 1<<30), protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"just over the limit", binary.BigEndian.AppendUint32(nil, protocol.DefaultMaxFrameSize+1), protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		// A varint tag that never ends.
		{"undecodable", frame([]byte{0xff, 0xff, 0xff, 0xff}), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{"empty frame", frame(nil), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{"ack before hello", ack.Bytes(), protocol.ErrorCode_ERROR_CODE_UNEXPECTED_FRAME},
	}
	for i, tc := range cases {
		raw := semDialRaw(t, d.addr, 0)
		raw.sendRaw(tc.bytes)
		if tc.code == protocol.ErrorCode_ERROR_CODE_UNSPECIFIED {
			_ = raw.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if answer, _ := io.ReadAll(raw.nc); !bytes.HasPrefix(answer, []byte("HTTP/1.1 400 Bad Request\r\n")) {
				t.Errorf("answer %q, want an HTTP 400", answer)
			}
		} else {
			raw.expectFatal(tc.code)
		}
		if t.Failed() {
			t.Fatalf("case %q", tc.name)
		}

		// B is still served.
		v := fmt.Sprintf("after-%d", i)
		produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder(v)})
		m := recv(t, b, 30*time.Second)
		if string(m.Value) != v || m.Attempt != 1 {
			t.Fatalf("after %q: B got %q attempt %d, want %q attempt 1", tc.name, m.Value, m.Attempt, v)
		}
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	s := semWaitStats(t, d, 10*time.Second, "every message acked",
		func(s dispatch.Stats) bool { return s.Acked == uint64(len(cases)) })
	// No bad client ever joined, and the early ack never reached the dispatcher.
	if s.Clients != 1 || s.UnknownAcks != 0 || s.Delivered != uint64(len(cases)) {
		t.Fatalf("stats %s: want only B joined, no unknown ack, one delivery per message", semStats(s))
	}
	semWaitOffsets(t, d, map[int32]int64{0: int64(len(cases))})
}

// A nack sends the message to the other client at once, with attempt 2.
func TestSemanticsNackRedeliversAtOnce(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	opts.AckTimeout = time.Hour // only the nack can redeliver within the test
	d := startDaemon(t, opts)
	cs := [2]*client.Client{
		dial(t, client.Config{MaxInFlight: 4, ClientID: "c0"}, d.addr),
		dial(t, client.Config{MaxInFlight: 4, ClientID: "c1"}, d.addr),
	}
	semWaitStats(t, d, 10*time.Second, "2 clients joined", func(s dispatch.Stats) bool { return s.Clients == 2 })

	produceSeq(t, topic, "m", 1, 1)
	first, a := semFirst(t, cs, 30*time.Second)
	nacked := time.Now()
	if err := first.Nack(); err != nil {
		t.Fatalf("nack: %v", err)
	}
	second := recv(t, cs[1-a], 60*time.Second)
	t.Logf("redelivered %v after the nack", time.Since(nacked).Round(time.Millisecond))
	if second.Offset != first.Offset || second.Attempt != 2 || second.DeliveryID == first.DeliveryID {
		t.Fatalf("other client got p%d@%d attempt %d id %d; want p%d@%d attempt 2 with a new id",
			second.Partition, second.Offset, second.Attempt, second.DeliveryID, first.Partition, first.Offset)
	}
	s := d.stats(t)
	if s.Nacked != 1 || s.Redelivered != [3]uint64{dispatch.RedeliverNack: 1} || s.Acked != 0 {
		t.Fatalf("stats %s: want 1 nack, 1 nack redelivery, nothing else", semStats(s))
	}
	noMessage(t, cs[a], 200*time.Millisecond)
	if err := second.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	semWaitOffsets(t, d, map[int32]int64{0: 1})
}

// Acks naming deliveries that do not exist, belong to another client, or
// were already acked are counted and ignored.
func TestSemanticsUnknownAcks(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	d := startDaemon(t, daemonOptions(t, topic))

	// One message each: a raw client and a Go client, each with room for one.
	raw := semDialRaw(t, d.addr, 0)
	raw.hello(1)
	b := dial(t, client.Config{MaxInFlight: 1}, d.addr)
	semWaitStats(t, d, 10*time.Second, "2 clients joined", func(s dispatch.Stats) bool { return s.Clients == 2 })
	produceSeq(t, topic, "m", 2, 1)
	mine := raw.deliveries(1, 30*time.Second)[0]
	theirs := recv(t, b, 30*time.Second)
	never := mine.GetDeliveryId() + theirs.DeliveryID + 1000

	// Ids never delivered, and B's delivery: none is the raw client's. A
	// frame names at most the client's in-flight limit of ids: one here.
	for _, id := range []uint64{never, never + 1, theirs.DeliveryID} {
		raw.mustSend(protocol.AckFrame([]uint64{id}))
	}
	raw.mustSend(protocol.NackFrame([]uint64{theirs.DeliveryID}))
	s := semWaitStats(t, d, 10*time.Second, "4 unknown acks", func(s dispatch.Stats) bool { return s.UnknownAcks == 4 })
	if s.Acked != 0 || s.Nacked != 0 || s.InFlight != 2 || s.Redelivered != [3]uint64{} {
		t.Fatalf("stats %s: the foreign and unknown ids changed something", semStats(s))
	}
	noMessage(t, b, 300*time.Millisecond) // B's message was not nacked away from it
	// Several commit intervals pass: nothing is committed past offset 0.
	quiet := time.Now().Add(5 * d.opts.CommitInterval)
	for time.Now().Before(quiet) {
		if o := zkOffsets(t, d.opts.ID, topic)[0]; o != 0 {
			t.Fatalf("committed offset %d after only unknown acks, want 0", o)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The real acks count; a second ack of an acked id does not.
	raw.mustSend(protocol.AckFrame([]uint64{mine.GetDeliveryId()}))
	if err := theirs.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	semWaitStats(t, d, 10*time.Second, "both acked", func(s dispatch.Stats) bool { return s.Acked == 2 })
	semWaitOffsets(t, d, map[int32]int64{0: 2})
	raw.mustSend(protocol.AckFrame([]uint64{mine.GetDeliveryId()}))
	raw.mustSend(protocol.AckFrame([]uint64{theirs.DeliveryID}))
	s = semWaitStats(t, d, 10*time.Second, "6 unknown acks", func(s dispatch.Stats) bool { return s.UnknownAcks == 6 })
	if s.Acked != 2 || s.Clients != 2 || s.InFlight != 0 {
		t.Fatalf("stats %s: want 2 acks, both clients connected, nothing in flight", semStats(s))
	}

	// The raw client is still served.
	produceSeq(t, topic, "n", 2, 1)
	next := raw.deliveries(1, 30*time.Second)[0]
	if next.GetAttempt() != 1 || next.GetOffset() < 2 {
		t.Fatalf("raw client got p%d@%d attempt %d, want a new record", next.GetPartition(), next.GetOffset(), next.GetAttempt())
	}
	raw.mustSend(protocol.AckFrame([]uint64{next.GetDeliveryId()}))
	m := recv(t, b, 30*time.Second)
	if err := m.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	semWaitOffsets(t, d, map[int32]int64{0: 4})
	if s := d.stats(t); s.UnknownAcks != 6 || s.Acked != 4 {
		t.Fatalf("stats %s: want 4 acks and 6 unknown", semStats(s))
	}
}
