package server

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// batchHello is a Hello that announces CAPABILITY_BATCH.
func batchHello() *protocol.Hello {
	return &protocol.Hello{ClientId: "batch", ProtocolVersion: protocol.Version,
		Capabilities: []protocol.Capability{protocol.Capability_CAPABILITY_MEMBERS, protocol.Capability_CAPABILITY_BATCH}}
}

// protoDeliver is the Deliver frame the pump makes of d.
func protoDeliver(d dispatch.Delivery) *protocol.Deliver {
	m := d.Msg
	out := &protocol.Deliver{DeliveryId: d.ID, Attempt: d.Attempt, Partition: m.Partition, Offset: m.Offset,
		Key: m.Key, Value: m.Value, TimestampMs: m.Timestamp.UnixMilli()}
	for _, h := range m.Headers {
		out.Headers = append(out.Headers, &protocol.Header{Key: h.Key, Value: h.Value})
	}
	return out
}

// expectBatch reads a DeliverBatch frame and checks it against ds.
func (c *client) expectBatch(ds ...dispatch.Delivery) {
	c.t.Helper()
	f := c.expect()
	got := f.GetDeliverBatch().GetDeliveries()
	if f.GetDeliverBatch() == nil || len(got) != len(ds) {
		c.t.Fatalf("got %v, want a DeliverBatch of %d", f, len(ds))
	}
	for i, d := range ds {
		if !proto.Equal(got[i], protoDeliver(d)) {
			c.t.Fatalf("delivery %d: %v, want %v", i, got[i], protoDeliver(d))
		}
	}
}

func TestBatchClientGetsDeliverBatchFrames(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	w := c.hello(batchHello())
	if !slices.Equal(w.GetCapabilities(), []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}) {
		t.Fatalf("Welcome.capabilities = %v, want CAPABILITY_BATCH", w.GetCapabilities())
	}
	sink := s.b.sink(t, w.GetSessionId())
	var ds []dispatch.Delivery
	for i := range 50 {
		ds = append(ds, dispatch.Delivery{ID: uint64(1000 + i), Attempt: 1, Msg: testMessage(int32(i%4), int64(i), 100+i)})
	}
	sink.Send(ds)
	c.expectBatch(ds...)
}

// Consecutive entries of the outbox share a frame; a control frame between
// them ends it, in order.
func TestPumpMergesQueuedDeliveries(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := &pumpState{w: protocol.NewWriter(&buf, 0), batch: true, pong: protocol.PongFrame(0)}
	d := func(id uint64) dispatch.Delivery {
		return dispatch.Delivery{ID: id, Attempt: 1, Msg: testMessage(0, int64(id), 10)}
	}
	batch := []outItem{
		{ds: []dispatch.Delivery{d(1), d(2)}}, {ds: []dispatch.Delivery{d(3)}},
		{isPong: true, nonce: 7},
		{ds: []dispatch.Delivery{d(4)}},
	}
	if _, err := p.writeBatch(batch); err != nil {
		t.Fatal(err)
	}
	if err := p.w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(
		wire(t, protocol.DeliverBatchFrame([]*protocol.Deliver{protoDeliver(d(1)), protoDeliver(d(2)), protoDeliver(d(3))})),
		wire(t, protocol.PongFrame(7)),
		wire(t, protocol.DeliverBatchFrame([]*protocol.Deliver{protoDeliver(d(4))})))
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("pump wrote\n%x\nwant\n%x", buf.Bytes(), want)
	}
	if p.used != 0 || len(p.pending) != 0 || p.msgs[0].Value != nil {
		t.Fatal("the pump keeps references to written messages")
	}
}

// Frames are at most batchBytes; a message that does not fit a DeliverBatch
// frame of the client's limit alone goes as a Deliver frame.
func TestBatchFramesBounded(t *testing.T) {
	t.Parallel()
	const limit = 3 * batchBytes
	s := startServer(t)
	c := dial(t, s)
	h := batchHello()
	h.MaxFrameSize = limit
	id := c.hello(h).GetSessionId()
	sink := s.b.sink(t, id)
	var ds []dispatch.Delivery
	for i := range 1000 {
		ds = append(ds, dispatch.Delivery{ID: uint64(i + 1), Attempt: 1, Msg: testMessage(0, int64(i), 1000)})
	}
	// The largest message whose Deliver frame fits the client: its
	// DeliverBatch frame does not.
	big := dispatch.Delivery{ID: 5000, Attempt: 1, Msg: testMessage(1, 1, 10)}
	for n := 10; ; n++ {
		big.Msg = testMessage(1, 1, limit-n)
		if len(wire(t, protocol.DeliverFrame(protoDeliver(big))))-protocol.HeaderSize <= limit {
			break
		}
	}
	if len(wire(t, protocol.DeliverBatchFrame([]*protocol.Deliver{protoDeliver(big)})))-protocol.HeaderSize <= limit {
		t.Fatal("test setup: the big message fits a DeliverBatch frame")
	}
	small := dispatch.Delivery{ID: 5001, Attempt: 1, Msg: testMessage(1, 2, 10)}
	sink.Send(append(ds, big, small))
	var got []uint64
	for len(got) < len(ds) {
		raw := c.readRaw()
		if size := len(raw) - protocol.HeaderSize; size > batchBytes {
			t.Fatalf("a DeliverBatch frame of %d bytes, above %d", size, batchBytes)
		}
		var f protocol.Frame
		if err := proto.Unmarshal(raw[protocol.HeaderSize:], &f); err != nil || f.GetDeliverBatch() == nil {
			t.Fatalf("frame %v, %v; want a DeliverBatch", &f, err)
		}
		for _, d := range f.GetDeliverBatch().GetDeliveries() {
			got = append(got, d.GetDeliveryId())
		}
	}
	if len(got) != len(ds) || got[0] != 1 || !slices.IsSorted(got) {
		t.Fatalf("ids %v...", got[:10])
	}
	var f protocol.Frame
	if err := proto.Unmarshal(c.readRaw()[protocol.HeaderSize:], &f); err != nil || !proto.Equal(f.GetDeliver(), protoDeliver(big)) {
		t.Fatalf("the big message came as %v, %v; want a Deliver", f.GetDeliverBatch() != nil, err)
	}
	c.expectBatch(small)
}

// A client that announces CAPABILITY_MEMBERS and not CAPABILITY_BATCH gets
// today's Welcome (no capabilities listed) and Deliver frames.
func TestClientWithoutBatchSeesTodaysFrames(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.Heartbeat = time.Hour })
	c := dial(t, s)
	c.send(protocol.HelloFrame(capableHello()))
	id := c.expectTodaysWelcome(t, 100)
	ds := []dispatch.Delivery{{ID: 5, Attempt: 1, Msg: testMessage(2, 7, 10)}, {ID: 6, Attempt: 2, Msg: testMessage(2, 8, 10)}}
	s.b.sink(t, id).Send(ds)
	for _, d := range ds {
		if got, want := c.readRaw(), wire(t, protocol.DeliverFrame(protoDeliver(d))); !bytes.Equal(got, want) {
			t.Fatalf("frame\n%x\nwant the Deliver\n%x", got, want)
		}
	}
}

// Ranges of Ack, Nack and Touch reach the backend's Settle, ids beside
// them its Ack, Nack and Touch; a Nack's delay and reason go with its
// ranges.
func TestRangesReachBackend(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	id := c.hello(batchHello()).GetSessionId()
	c.send(
		&protocol.Frame{Body: &protocol.Frame_Ack{Ack: &protocol.Ack{DeliveryIds: []uint64{7}, Ranges: []uint64{10, 5, 100, 2}}}},
		&protocol.Frame{Body: &protocol.Frame_Nack{Nack: &protocol.Nack{Ranges: []uint64{20, 1}, DelayMs: 250, Reason: "db down"}}},
		&protocol.Frame{Body: &protocol.Frame_Touch{Touch: &protocol.Touch{Ranges: []uint64{30, 3}}}},
	)
	// The reader makes the calls in the order of the frames: once the last
	// is recorded, so are the others.
	s.b.waitCall(t, "touch", id)
	acks := s.b.find("ack", id)
	if len(acks) != 2 || !slices.Equal(acks[0].ids, []uint64{7}) ||
		!slices.Equal(acks[1].ranges, []dispatch.Range{{First: 10, Count: 5}, {First: 100, Count: 2}}) {
		t.Fatalf("ack calls %+v", acks)
	}
	if n := s.b.find("nack", id); len(n) != 1 || !slices.Equal(n[0].ranges, []dispatch.Range{{First: 20, Count: 1}}) ||
		n[0].nack != (dispatch.NackInfo{Delay: 250 * time.Millisecond, Reason: "db down"}) {
		t.Fatalf("nack calls %+v", n)
	}
	if n := s.b.find("touch", id); len(n) != 1 || !slices.Equal(n[0].ranges, []dispatch.Range{{First: 30, Count: 3}}) {
		t.Fatalf("touch calls %+v", n)
	}
}

// Ranges that are not pairs of an id and a count of at least one are a bad
// frame; ranges naming more ids than the client's credit, too many.
func TestBadRangesCloseTheConnection(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaxInFlight = 10 })
	for _, tc := range []struct {
		ranges []uint64
		code   protocol.ErrorCode
	}{
		{[]uint64{10}, protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{[]uint64{10, 0}, protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{[]uint64{1<<64 - 1, 2}, protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{[]uint64{10, 5, 20, 6}, protocol.ErrorCode_ERROR_CODE_TOO_MANY_IDS},
	} {
		c := dial(t, s)
		id := c.hello(batchHello()).GetSessionId()
		c.send(&protocol.Frame{Body: &protocol.Frame_Ack{Ack: &protocol.Ack{Ranges: tc.ranges}}})
		c.expectError(tc.code)
		c.expectClosed()
		if acks := s.b.find("ack", id); len(acks) != 0 {
			t.Fatalf("ranges %v reached the backend: %+v", tc.ranges, acks)
		}
	}
}
