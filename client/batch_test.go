package client

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// batchWelcome is testWelcome listing CAPABILITY_BATCH: the daemon reads
// id ranges.
func batchWelcome() *protocol.Welcome {
	w := testWelcome()
	w.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	return w
}

// connectBatch dials d with cfg and welcomes the client with w.
func connectBatch(t *testing.T, d *fakeDaemon, cfg Config, w *protocol.Welcome) (*Client, *fakeConn) {
	t.Helper()
	cfg.Addrs = append(cfg.Addrs, d.addr())
	ch := dialAsync(t, cfg)
	fc := d.accept(t)
	h := fc.expectHello(t)
	if !h.HasCapability(protocol.Capability_CAPABILITY_BATCH) {
		t.Fatalf("Hello without CAPABILITY_BATCH: %v", h)
	}
	fc.send(t, protocol.WelcomeFrame(w))
	c := connected(t, ch)
	t.Cleanup(func() { _ = fc.nc.Close() })
	return c, fc
}

// deliverBatch sends one DeliverBatch frame of n deliveries with ids from
// first, values "v<id>" and a header each.
func (fc *fakeConn) deliverBatch(tb testing.TB, first uint64, n int) []*protocol.Deliver {
	tb.Helper()
	ds := make([]*protocol.Deliver, n)
	for i := range ds {
		id := first + uint64(i)
		ds[i] = &protocol.Deliver{DeliveryId: id, Partition: 2, Offset: int64(id), Key: []byte("k"),
			Value: []byte(fmt.Sprint("v", id)), Headers: []*protocol.Header{{Key: "trace", Value: []byte{byte(i)}}},
			TimestampMs: 1700000000000 + int64(i), Attempt: 1}
	}
	if k, err := fc.w.WriteDeliverBatch(ds, 0); err != nil || k != n {
		tb.Fatalf("WriteDeliverBatch: %d, %v", k, err)
	}
	if err := fc.w.Flush(); err != nil {
		tb.Fatal(err)
	}
	return ds
}

// settled reads frames until n ids of the kind picked by get have been
// named, by id or by range, and returns them and the frames' ranges.
func (fc *fakeConn) settled(tb testing.TB, n int, get func(*protocol.Frame) (ids, ranges []uint64)) (all []uint64, ranges [][]uint64) {
	tb.Helper()
	for len(all) < n {
		f := fc.next(tb)
		ids, rs := get(f)
		all = append(all, ids...)
		if len(rs) > 0 {
			ranges = append(ranges, rs)
		}
		if len(rs)%2 != 0 {
			tb.Fatalf("ranges %v are not pairs", rs)
		}
		for i := 0; i < len(rs); i += 2 {
			for k := range rs[i+1] {
				all = append(all, rs[i]+k)
			}
		}
	}
	return all, ranges
}

func ackAll(f *protocol.Frame) ([]uint64, []uint64) {
	return f.GetAck().GetDeliveryIds(), f.GetAck().GetRanges()
}
func nackAll(f *protocol.Frame) ([]uint64, []uint64) {
	return f.GetNack().GetDeliveryIds(), f.GetNack().GetRanges()
}
func touchAll(f *protocol.Frame) ([]uint64, []uint64) {
	return f.GetTouch().GetDeliveryIds(), f.GetTouch().GetRanges()
}

// receiveBatch waits for the next Batch.
func receiveBatch(tb testing.TB, c *Client) *Batch {
	tb.Helper()
	select {
	case b, ok := <-c.Batches():
		if !ok {
			tb.Fatalf("Batches closed: %v", c.Err())
		}
		return b
	case <-time.After(testTimeout):
		tb.Fatal("no batch")
		return nil
	}
}

func TestBatchesOneBatchPerFrame(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc := connectBatch(t, d, Config{Batches: true, MaxInFlight: 100}, batchWelcome())
	if c.Messages() == nil || cap(c.Messages()) != 0 {
		t.Fatal("Messages of a client with Batches: want an unbuffered channel that only closes")
	}
	sent := fc.deliverBatch(t, 1000, 5)
	b := receiveBatch(t, c)
	if len(b.Messages) != 5 || b.Member() != d.addr() {
		t.Fatalf("batch of %d from %s", len(b.Messages), b.Member())
	}
	for i, m := range b.Messages {
		s := sent[i]
		if m.DeliveryID != s.DeliveryId || m.Partition != 2 || m.Offset != s.Offset || string(m.Key) != "k" ||
			string(m.Value) != string(s.Value) || !m.Timestamp.Equal(time.UnixMilli(s.TimestampMs)) || m.Attempt != 1 ||
			len(m.Headers) != 1 || m.Headers[0].Key != "trace" || m.Headers[0].Value[0] != byte(i) {
			t.Fatalf("message %d = %+v, sent %v", i, m, s)
		}
		if cap(m.Value) != len(m.Value) {
			t.Fatalf("message %d: value of cap %d, len %d: appending would overwrite the next field", i, cap(m.Value), len(m.Value))
		}
	}
	if !sameBuffer(b) {
		t.Fatal("values are not slices of the frame's buffer")
	}
	// One call acks the batch: one range on the wire.
	if err := b.Ack(); err != nil {
		t.Fatal(err)
	}
	ids, ranges := fc.settled(t, 5, ackAll)
	if !slices.Equal(ids, []uint64{1000, 1001, 1002, 1003, 1004}) || len(ranges) != 1 || !slices.Equal(ranges[0], []uint64{1000, 5}) {
		t.Fatalf("acks %v in ranges %v, want one range [1000 5]", ids, ranges)
	}
	if err := b.Ack(); !errors.Is(err, ErrAlreadyAcked) {
		t.Fatalf("second Ack of the batch: %v", err)
	}
	// A Deliver frame is a batch of one.
	fc.deliver(t, 7, "single")
	if b := receiveBatch(t, c); len(b.Messages) != 1 || string(b.Messages[0].Value) != "single" {
		t.Fatalf("batch %+v", b.Messages)
	}
}

// sameBuffer reports whether the batch's values lie in one buffer, in
// order: each a few bytes (the next delivery's fields) after the previous.
// Delivery frames that arrived together, read with one system call, make
// one Batch, settled with one frame and one range.
func TestBatchesFramesArrivedTogether(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc := connectBatch(t, d, Config{Batches: true, MaxInFlight: 100}, batchWelcome())
	var sent []*protocol.Deliver
	for _, frame := range []struct{ first, n uint64 }{{1000, 5}, {1005, 3}, {1008, 4}} {
		var ds []*protocol.Deliver
		for id := frame.first; id < frame.first+frame.n; id++ {
			ds = append(ds, &protocol.Deliver{DeliveryId: id, Offset: int64(id), Value: []byte(fmt.Sprint("v", id)), Attempt: 1})
		}
		if _, err := fc.w.WriteDeliverBatch(ds, 0); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, ds...)
	}
	fc.send(t, protocol.PingFrame(9)) // one flush: every frame in one write
	b := receiveBatch(t, c)
	if len(b.Messages) != len(sent) {
		t.Fatalf("a batch of %d messages; the %d of the three frames written together want one", len(b.Messages), len(sent))
	}
	for i, m := range b.Messages {
		if m.DeliveryID != sent[i].DeliveryId || string(m.Value) != string(sent[i].Value) {
			t.Fatalf("message %d = %+v, sent %v", i, m, sent[i])
		}
	}
	if err := b.Ack(); err != nil {
		t.Fatal(err)
	}
	var f *protocol.Frame
	for f = fc.next(t); f.GetPong() != nil; f = fc.next(t) {
	}
	if f.GetAck() == nil || !slices.Equal(f.GetAck().GetRanges(), []uint64{1000, uint64(len(sent))}) {
		t.Fatalf("frame %v, want one Ack of the range [1000 %d]", f, len(sent))
	}
}

func sameBuffer(b *Batch) bool {
	addr := func(v []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(v))) }
	for i := 1; i < len(b.Messages); i++ {
		prev, v := b.Messages[i-1].Value, b.Messages[i].Value
		end := addr(prev) + uintptr(len(prev))
		if addr(v) < end || addr(v)-end > 64 {
			return false
		}
	}
	return true
}

func TestBatchPartlySettled(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc := connectBatch(t, d, Config{Batches: true}, batchWelcome())
	fc.deliverBatch(t, 10, 6)
	b := receiveBatch(t, c)
	if err := b.Messages[2].Ack(); err != nil {
		t.Fatal(err)
	}
	if err := b.Messages[4].Nack(); err != nil {
		t.Fatal(err)
	}
	acked, _ := fc.settled(t, 1, ackAll)
	nacked, _ := fc.settled(t, 1, nackAll)
	if !slices.Equal(acked, []uint64{12}) || !slices.Equal(nacked, []uint64{14}) {
		t.Fatalf("acked %v, nacked %v", acked, nacked)
	}
	// Touch names those not done; Nack gives them back.
	if err := b.Touch(); err != nil {
		t.Fatal(err)
	}
	touched, _ := fc.settled(t, 4, touchAll)
	if !slices.Equal(touched, []uint64{13, 15, 10, 11}) { // the list, then the ranges
		t.Fatalf("touched %v", touched)
	}
	if err := b.Nack(); err != nil {
		t.Fatal(err)
	}
	nacked, ranges := fc.settled(t, 4, nackAll)
	if !slices.Equal(nacked, []uint64{13, 15, 10, 11}) || len(ranges) != 1 {
		t.Fatalf("nacked %v (ranges %v), want 10 and 11 as a range, 13 and 15 alone", nacked, ranges)
	}
	for _, call := range []func() error{b.Ack, b.Nack, b.Touch} {
		if err := call(); !errors.Is(err, ErrAlreadyAcked) {
			t.Fatalf("on a settled batch: %v, want ErrAlreadyAcked", err)
		}
	}
	if err := b.Messages[0].Ack(); !errors.Is(err, ErrAlreadyAcked) {
		t.Fatalf("Ack of a message of a nacked batch: %v", err)
	}
}

// Without Config.Batches the messages of a DeliverBatch come one by one on
// Messages; their acks still go as ranges to a daemon that reads them.
func TestMessagesFromDeliverBatch(t *testing.T) {
	t.Parallel()
	const n = 300
	d := startFake(t)
	c, fc := connectBatch(t, d, Config{MaxInFlight: n}, batchWelcome())
	if c.Batches() != nil {
		t.Fatal("Batches without Config.Batches: want nil")
	}
	fc.deliverBatch(t, 1, n)
	msgs := make([]*Message, n)
	for i := range msgs {
		msgs[i] = receive(t, c)
		if msgs[i].DeliveryID != uint64(i+1) {
			t.Fatalf("message %d has id %d", i, msgs[i].DeliveryID)
		}
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	ids, ranges := fc.settled(t, n, ackAll)
	slices.Sort(ids)
	if len(ids) != n || ids[0] != 1 || ids[n-1] != n || len(slices.Compact(ids)) != n {
		t.Fatalf("acked %d ids", len(ids))
	}
	if len(ranges) == 0 {
		t.Fatal("no ranges: consecutive acks went as ids")
	}
}

// Batch.NackWith gives back the messages not yet settled with one delay
// and reason: one Nack frame naming the batch's consecutive ids as a range,
// by ids to a daemon without CAPABILITY_BATCH.
func TestBatchNackWith(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		welcome *protocol.Welcome
		ids     []uint64
		ranges  []uint64
	}{
		{"ranges", batchWelcome(), nil, []uint64{2, 4}},
		{"ids", testWelcome(), []uint64{2, 3, 4, 5}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startFake(t)
			c, fc := connectBatch(t, d, Config{Batches: true}, tc.welcome)
			fc.deliverBatch(t, 1, 5)
			b := receiveBatch(t, c)
			if err := b.Messages[0].Ack(); err != nil {
				t.Fatal(err)
			}
			if err := b.NackWith(1500*time.Millisecond, "db down"); err != nil {
				t.Fatal(err)
			}
			if err := b.NackWith(time.Second, ""); !errors.Is(err, ErrAlreadyAcked) {
				t.Fatalf("second NackWith: %v, want ErrAlreadyAcked", err)
			}
			var n *protocol.Nack
			for n == nil {
				n = fc.next(t).GetNack()
			}
			if !slices.Equal(n.GetDeliveryIds(), tc.ids) || !slices.Equal(n.GetRanges(), tc.ranges) ||
				n.GetDelayMs() != 1500 || n.GetReason() != "db down" {
				t.Fatalf("nack %v, want ids %v, ranges %v, 1500 ms, \"db down\"", n, tc.ids, tc.ranges)
			}
		})
	}
}

// A daemon whose Welcome does not list CAPABILITY_BATCH (one that predates
// it) gets ids only, never ranges it would ignore.
func TestNoRangesWithoutTheCapability(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc := connectBatch(t, d, Config{Batches: true}, testWelcome())
	fc.deliverBatch(t, 1, 20)
	b := receiveBatch(t, c)
	if err := b.Ack(); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for len(got) < 20 {
		f := fc.next(t)
		if rs := f.GetAck().GetRanges(); len(rs) > 0 {
			t.Fatalf("ranges %v sent to a daemon without CAPABILITY_BATCH", rs)
		}
		got = append(got, f.GetAck().GetDeliveryIds()...)
	}
	if !slices.Equal(got, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}) {
		t.Fatalf("acked %v", got)
	}
}

// A frame names at most the Welcome's max_in_flight ids, counting the
// ranges' ids: a long run is split over frames.
func TestCutNamesAtMostMaxIDs(t *testing.T) {
	t.Parallel()
	b := newBatch()
	q := []idRange{{100, 1}, {200, 10}, {300, 1}, {400, 2}, {1<<64 - 2, 2}}
	type frame struct{ ids, ranges []uint64 }
	var got []frame
	for len(q) > 0 {
		q = b.cut(q, 4, true)
		got = append(got, frame{slices.Clone(b.ids), slices.Clone(b.ranges)})
	}
	want := []frame{
		{[]uint64{100}, []uint64{200, 3}},
		{nil, []uint64{203, 4}},
		{[]uint64{300}, []uint64{207, 3}},
		{nil, []uint64{400, 2, 1<<64 - 2, 2}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("frames %v, want %v", got, want)
	}
	// Without ranges, the same ids as a list.
	q = []idRange{{100, 1}, {200, 3}, {1<<64 - 2, 2}}
	q = b.cut(q, 10, false)
	if len(q) != 0 || len(b.ranges) != 0 || !slices.Equal(b.ids, []uint64{100, 200, 201, 202, 1<<64 - 2, 1<<64 - 1}) {
		t.Fatalf("ids %v ranges %v rest %v", b.ids, b.ranges, q)
	}
	// Runs end where ids are not consecutive, and never wrap.
	var r []idRange
	for _, id := range []uint64{5, 6, 7, 9, 8, 1<<64 - 1, 0, 1} {
		r = appendID(r, id)
	}
	if fmt.Sprint(r) != "[{5 3} {9 1} {8 1} {18446744073709551615 1} {0 2}]" {
		t.Fatalf("runs %v", r)
	}
}

// A retiring session holds its Goodbye until the batches it passed on are
// acked, like messages.
func TestRetiringSessionWaitsForItsBatch(t *testing.T) {
	t.Parallel()
	a, b := startFake(t), startFake(t)
	members := memberAddrs(a, b)
	ch := dialAsync(t, Config{Addrs: []string{a.addr()}, MaxInFlight: 30, Batches: true})
	boot := a.join(t, 30, members...)
	c := connected(t, ch)
	boot.expectGoodbye(t)
	ac := a.joinWith(t, 15, withBatch(welcomeMembers(members...)))
	bc := b.joinWith(t, 15, withBatch(welcomeMembers(members...)))
	ac.sync(t)
	bc.sync(t)
	bc.deliverBatch(t, 50, 3)
	held := receiveBatch(t, c)

	ac.send(t, protocol.MembersFrame([]string{a.addr()}, nil))
	ac.expectGoodbye(t)
	a.join(t, 30, a.addr())
	bc.sync(t) // the retiring session answers, and has not said goodbye
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
	var acked []uint64
	for {
		f := bc.next(t)
		if f.GetGoodbye() != nil {
			break
		}
		ids, rs := ackAll(f)
		acked = append(acked, ids...)
		if len(rs) == 2 {
			for k := range rs[1] {
				acked = append(acked, rs[0]+k)
			}
		}
	}
	if !slices.Equal(acked, []uint64{50, 51, 52}) {
		t.Fatalf("acked %v before the Goodbye, want 50..52", acked)
	}
}

// withBatch lists CAPABILITY_BATCH in w.
func withBatch(w *protocol.Welcome) *protocol.Welcome {
	w.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	return w
}
