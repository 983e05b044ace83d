package dispatch

import (
	"cmp"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// recSink records what the dispatcher sends to one client.
type recSink struct {
	got     []Delivery
	goodbye string
}

func (r *recSink) Send(ds []Delivery)    { r.got = append(r.got, ds...) }
func (r *recSink) Goodbye(reason string) { r.goodbye = reason }

// offsetsOf lists the offsets of deliveries, in order.
func offsetsOf(ds []Delivery) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.Msg.Offset
	}
	return out
}

func ids(ds []Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func batch(p int32, from, to int64) Batch {
	b := Batch{Partition: p, Start: -1}
	for o := from; o < to; o++ {
		b.Messages = append(b.Messages, &Message{Partition: p, Offset: o, Value: []byte(fmt.Sprint(o))})
	}
	return b
}

var t0 = time.Unix(1_700_000_000, 0)

const timeout = 30 * time.Second

func setup(maxes ...int) (*state, []*recSink) {
	s := newState(timeout)
	sinks := make([]*recSink, len(maxes))
	for i, m := range maxes {
		sinks[i] = &recSink{}
		s.join(uint64(i+1), fmt.Sprint("c", i+1), m, sinks[i])
	}
	return s, sinks
}

func TestRoundRobin(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10, 10)
	s.addBatch(batch(0, 0, 9), t0)
	s.dispatch(t0)
	want := [][]int64{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}
	for i, k := range sinks {
		if got := offsetsOf(k.got); !slices.Equal(got, want[i]) {
			t.Errorf("client %d got %v, want %v", i+1, got, want[i])
		}
		for _, d := range k.got {
			if d.Attempt != 1 {
				t.Errorf("first delivery has attempt %d", d.Attempt)
			}
		}
	}
}

// With Config.Turn, a client takes up to that many messages in its turn,
// bounded by its room, before the next client's turn; across rounds too.
func TestTurns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		turn  int
		rooms []int
		n     int64
		want  [][]int64
	}{
		{"one each (the default)", 1, []int{10, 10}, 5, [][]int64{{0, 2, 4}, {1, 3}}},
		{"three each", 3, []int{10, 10}, 7, [][]int64{{0, 1, 2, 6}, {3, 4, 5}}},
		{"room bounds the turn", 5, []int{2, 10, 10}, 9, [][]int64{{0, 1}, {2, 3, 4, 5, 6}, {7, 8}}},
		{"a turn larger than what is at hand", 8, []int{10, 10}, 3, [][]int64{{0, 1, 2}, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, sinks := setup(tc.rooms...)
			s.turn = tc.turn
			s.addBatch(batch(0, 0, tc.n), t0)
			s.dispatch(t0)
			for i, k := range sinks {
				if got := offsetsOf(k.got); !slices.Equal(got, tc.want[i]) {
					t.Errorf("client %d got %v, want %v", i+1, got, tc.want[i])
				}
			}
		})
	}
}

// A turn that ran out of messages goes on in the next round, then passes.
func TestTurnGoesOnInTheNextRound(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10)
	s.turn = 3
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(t0)
	s.addBatch(batch(0, 2, 5), t0)
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Errorf("client 1 got %v, want [0 1 2]", got)
	}
	if got := offsetsOf(sinks[1].got); !slices.Equal(got, []int64{3, 4}) {
		t.Errorf("client 2 got %v, want [3 4]", got)
	}
}

func TestFullClientSkipped(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 10)
	s.addBatch(batch(0, 0, 5), t0)
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0}) {
		t.Fatalf("full client got %v", got)
	}
	if got := offsetsOf(sinks[1].got); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("other client got %v", got)
	}
	// An ack gives the full client room again: it rejoins the rotation
	// behind the client that kept it.
	s.addBatch(batch(0, 5, 7), t0)
	s.ack(1, ids(sinks[0].got))
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 6}) {
		t.Fatalf("after ack the client got %v", got)
	}
}

func TestNothingWithoutRoom(t *testing.T) {
	t.Parallel()
	s, sinks := setup(2)
	s.addBatch(batch(0, 0, 5), t0)
	s.dispatch(t0)
	if len(sinks[0].got) != 2 || s.buffered() != 3 {
		t.Fatalf("delivered %d, buffered %d; want 2 and 3", len(sinks[0].got), s.buffered())
	}
}

func TestAckTimeoutRedeliversToAnotherClient(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	first := sinks[0].got
	if len(first) != 1 {
		t.Fatalf("client 1 got %d deliveries", len(first))
	}
	s.expire(t0.Add(timeout - time.Millisecond))
	s.dispatch(t0)
	if len(sinks[1].got) != 0 {
		t.Fatal("redelivered before the deadline")
	}
	s.expire(t0.Add(timeout))
	s.dispatch(t0.Add(timeout))
	if len(sinks[1].got) != 1 {
		t.Fatalf("client 2 got %d deliveries, want the redelivery", len(sinks[1].got))
	}
	re := sinks[1].got[0]
	if re.Msg.Offset != 0 || re.Attempt != 2 || re.ID == first[0].ID {
		t.Fatalf("redelivery = %+v", re)
	}
	if len(sinks[0].got) != 1 {
		t.Fatal("client 1 got the redelivery although client 2 had room")
	}
	// The late ack of the first attempt names an unknown delivery.
	s.ack(1, ids(first))
	if st := s.snapshot(); st.UnknownAcks != 1 || st.Acked != 0 || st.Redelivered[RedeliverTimeout] != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if c, _ := s.tracker.Committable(0); c != 0 {
		t.Fatalf("committable = %d after a stale ack", c)
	}
	s.ack(2, ids(sinks[1].got))
	if c, _ := s.tracker.Committable(0); c != 1 {
		t.Fatalf("committable = %d after the ack", c)
	}
}

func TestRedeliveryToTheSameClientWhenAlone(t *testing.T) {
	t.Parallel()
	s, sinks := setup(5)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	s.expire(t0.Add(timeout))
	s.dispatch(t0.Add(timeout))
	if len(sinks[0].got) != 2 || sinks[0].got[1].Attempt != 2 {
		t.Fatalf("deliveries = %+v", sinks[0].got)
	}
}

func TestRedeliveriesGoFirst(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(t0)
	s.addBatch(batch(0, 2, 4), t0)
	s.nack(1, ids(sinks[0].got), NackInfo{}, t0) // offset 0 back; client 1 has room again
	s.dispatch(t0)
	// Client 1 is skipped for its own redelivery while client 2 is full,
	// so it gets it back: there is no one else.
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 0}) {
		t.Fatalf("client 1 got %v", got)
	}
	s.ack(2, ids(sinks[1].got))
	s.dispatch(t0)
	if got := offsetsOf(sinks[1].got); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("client 2 got %v", got)
	}
}

func TestNackGoesToAnotherClientAtOnce(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	s.nack(1, ids(sinks[0].got), NackInfo{}, t0)
	s.dispatch(t0)
	if len(sinks[1].got) != 1 || sinks[1].got[0].Attempt != 2 {
		t.Fatalf("client 2 got %+v", sinks[1].got)
	}
	if st := s.snapshot(); st.Nacked != 1 || st.Redelivered[RedeliverNack] != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestLeaveRedeliversEverythingElsewhere(t *testing.T) {
	t.Parallel()
	s, sinks := setup(3, 3)
	s.addBatch(batch(0, 0, 6), t0)
	s.dispatch(t0)
	s.leave(1, LeaveDisconnect, t0)
	s.ack(2, ids(sinks[1].got))
	s.dispatch(t0)
	got := offsetsOf(sinks[1].got)
	if !slices.Equal(got, []int64{1, 3, 5, 0, 2, 4}) {
		t.Fatalf("client 2 got %v", got)
	}
	for _, d := range sinks[1].got[3:] {
		if d.Attempt != 2 {
			t.Fatalf("redelivery attempt %d", d.Attempt)
		}
	}
	st := s.snapshot()
	if st.Redelivered[RedeliverDisconnect] != 3 || st.Clients != 1 || st.InFlight != 3 {
		t.Fatalf("stats = %+v", st)
	}
	// Nothing is sent to the client that left.
	if len(sinks[0].got) != 3 {
		t.Fatalf("departed client got %d", len(sinks[0].got))
	}
}

func TestAckFromAnotherClientIgnored(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	s.ack(2, ids(sinks[0].got))
	s.ack(1, []uint64{999})
	if st := s.snapshot(); st.UnknownAcks != 2 || st.InFlight != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestTouchRestartsTheTimeout(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	s.touch(1, ids(sinks[0].got), t0.Add(20*time.Second))
	s.expire(t0.Add(timeout))
	if st := s.snapshot(); st.InFlight != 1 {
		t.Fatal("touched delivery expired at the old deadline")
	}
	if dl, _ := s.nextDeadline(); !dl.Equal(t0.Add(20*time.Second + timeout)) {
		t.Fatalf("deadline = %v", dl)
	}
	s.expire(t0.Add(20*time.Second + timeout))
	if st := s.snapshot(); st.InFlight != 0 {
		t.Fatal("touched delivery did not expire at its new deadline")
	}
}

func TestBufferedUntilAClientJoins(t *testing.T) {
	t.Parallel()
	s := newState(timeout)
	s.addBatch(batch(0, 0, 3), t0)
	s.dispatch(t0)
	if s.buffered() != 3 || s.bytes != 3 {
		t.Fatalf("buffered %d (%d bytes)", s.buffered(), s.bytes)
	}
	k := &recSink{}
	s.join(7, "late", 10, k)
	s.dispatch(t0)
	if got := offsetsOf(k.got); !slices.Equal(got, []int64{0, 1, 2}) || s.buffered() != 0 || s.bytes != 0 {
		t.Fatalf("got %v, buffered %d (%d bytes)", got, s.buffered(), s.bytes)
	}
}

func TestCommittableFollowsAckedPrefixAcrossPartitions(t *testing.T) {
	t.Parallel()
	s, sinks := setup(100)
	s.addBatch(Batch{Partition: 0, Start: 100}, t0)
	b := batch(0, 100, 106)
	s.addBatch(b, t0)
	s.addBatch(Batch{Partition: 1, Start: 7}, t0)
	s.dispatch(t0)
	byOffset := map[int64]uint64{}
	for _, d := range sinks[0].got {
		byOffset[d.Msg.Offset] = d.ID
	}
	// Ack everything but 104.
	for _, o := range []int64{100, 101, 102, 103, 105} {
		s.ack(1, []uint64{byOffset[o]})
	}
	d := s.tracker.Dirty()
	if d[0] != 104 || d[1] != 7 {
		t.Fatalf("dirty = %v, want partition 0 at 104 and partition 1 at 7", d)
	}
	s.ack(1, []uint64{byOffset[104]})
	if d := s.tracker.Dirty(); d[0] != 106 || len(d) != 1 {
		t.Fatalf("dirty = %v, want partition 0 at 106", d)
	}
}

func TestDrainSaysGoodbyeAndStopsDeliveries(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(t0)
	s.drain("shutting down")
	s.addBatch(batch(0, 2, 4), t0)
	s.dispatch(t0)
	if sinks[0].goodbye != "shutting down" || len(sinks[0].got) != 2 {
		t.Fatalf("goodbye %q, deliveries %d", sinks[0].goodbye, len(sinks[0].got))
	}
	late := &recSink{}
	s.join(9, "late", 10, late)
	if late.goodbye == "" {
		t.Fatal("a client joining while draining was not told goodbye")
	}
	s.ack(1, ids(sinks[0].got))
	if st := s.snapshot(); st.InFlight != 0 {
		t.Fatalf("acks not taken while draining: %+v", st)
	}
}

func TestLeaveTakesClientOutOfRotation(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10)
	s.leave(1, LeaveDisconnect, t0)
	s.addBatch(batch(0, 0, 4), t0)
	s.dispatch(t0)
	if len(sinks[0].got) != 0 || len(sinks[1].got) != 4 {
		t.Fatalf("deliveries: %d and %d", len(sinks[0].got), len(sinks[1].got))
	}
}

// BenchmarkDispatchAck measures one message through the dispatcher's state:
// received, delivered round-robin to 4 clients, acked (by ids, or by one
// range per client and round as batch clients do).
func BenchmarkDispatchAck(b *testing.B) {
	b.Run("sizes=none", func(b *testing.B) { benchDispatchAck(b, benchOpts{}) })
	// Clients announce a frame limit and every message has a frame size,
	// as in the daemon.
	b.Run("sizes=limited", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true}) })
	b.Run("sizes=limited/acks=ranges", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, ranges: true}) })
	// The delivery policies' hot paths: smooth weighted round-robin (one
	// client of another weight), key gating with a key per message (many
	// keys, each free) and with 8 keys (most messages wait behind their
	// key), one observer.
	b.Run("weights", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, weighted: true}) })
	b.Run("keys=many", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, keys: 1 << 30}) })
	b.Run("keys=few", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, keys: 8}) })
	b.Run("observer", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, observer: true}) })
	// With --delivery-log: two events per message (delivery, ack) queued
	// for the log's writer.
	b.Run("delivery-log", func(b *testing.B) { benchDispatchAck(b, benchOpts{sized: true, deliveryLog: true}) })
}

type benchOpts struct {
	sized, weighted, observer bool
	ranges                    bool // acks by ranges, as batch clients send them
	keys                      int  // key ordering over this many keys; 0: off
	deliveryLog               bool // a delivery log in a temporary directory
}

// weightedDiscardSink is a discarding client of weight w.
type weightedDiscardSink struct {
	*discardSink
	w int
}

func (w weightedDiscardSink) Weight() int { return w.w }

func benchDispatchAck(b *testing.B, o benchOpts) {
	const clients, batchSize = 4, 256
	s := newState(timeout)
	if o.sized {
		s.frameSize = func(m *Message) int { return 64 + m.Size() }
	}
	if o.keys > 0 {
		s.keys = map[uint64]keyGate{}
	}
	if o.deliveryLog {
		quiet := logrus.New()
		quiet.SetOutput(io.Discard)
		l, err := deliverylog.OpenFile(filepath.Join(b.TempDir(), "delivery.log"), "bench", logrus.NewEntry(quiet))
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		s.trace = l
	}
	sinks := make([]ClientSink, clients)
	discards := make([]*discardSink, clients)
	for i := range sinks {
		discards[i] = &discardSink{}
		sinks[i] = discards[i]
		if o.sized {
			sinks[i] = &sizedDiscardSink{discards[i]}
		}
		if o.weighted && i == 0 {
			sinks[i] = weightedDiscardSink{discards[i], 5}
		}
		s.join(uint64(i+1), "c", 1000, sinks[i])
	}
	if o.observer {
		s.observe(99, "watch", &discardSink{})
	}
	msgs := make([]*Message, batchSize)
	for i := range msgs {
		msgs[i] = &Message{Value: make([]byte, 100)}
	}
	var rs []Range
	var keys [][]byte
	if o.keys > 0 {
		keys = make([][]byte, min(o.keys, 1<<16))
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "key-%d", i)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	off := int64(0)
	for i := 0; i < b.N; i += batchSize {
		for _, m := range msgs {
			m.Offset = off
			if keys != nil {
				if o.keys < len(keys) {
					m.Key = keys[off%int64(o.keys)]
				} else {
					m.Key = keys[off%int64(len(keys))]
				}
			}
			off++
		}
		s.addBatch(Batch{Start: -1, Messages: msgs}, t0)
		// With few keys the messages behind their key go out as the acks
		// free it: a round per message of a key.
		for s.buffered() > 0 {
			s.dispatch(t0)
			for j, k := range discards {
				if o.ranges {
					rs = appendRanges(rs[:0], k.ids)
					s.settle(uint64(j+1), OpAck, nil, rs, NackInfo{}, t0)
				} else {
					s.ack(uint64(j+1), k.ids)
				}
				k.ids = k.ids[:0]
			}
		}
	}
}

// appendRanges appends the runs of consecutive ids as ranges.
func appendRanges(rs []Range, ids []uint64) []Range {
	for _, id := range ids {
		if n := len(rs); n > 0 && rs[n-1].First+rs[n-1].Count == id {
			rs[n-1].Count++
			continue
		}
		rs = append(rs, Range{First: id, Count: 1})
	}
	return rs
}

// BenchmarkDelayHeap measures one delayed redelivery: a nack with a delay
// (into the heap among 1000 others), and its redelivery once due.
func BenchmarkDelayHeap(b *testing.B) {
	const waiting = 1000
	s := newState(timeout)
	k := &discardSink{}
	s.join(1, "c", 1<<20, k)
	msgs := make([]*Message, waiting+1)
	b0 := Batch{Start: -1}
	for i := range msgs {
		msgs[i] = &Message{Offset: int64(i), Value: make([]byte, 100)}
		b0.Messages = append(b0.Messages, msgs[i])
	}
	s.addBatch(b0, t0)
	s.dispatch(t0)
	now := t0
	for i, id := range k.ids[:waiting] { // 1000 waiting, due over the next 1000s
		s.nack(1, []uint64{id}, NackInfo{Delay: time.Duration(1000+i) * time.Second}, now)
	}
	k.ids = k.ids[waiting:]
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s.nack(1, k.ids, NackInfo{Delay: time.Millisecond}, now)
		k.ids = k.ids[:0]
		now = now.Add(time.Millisecond)
		s.expire(now)
		s.dispatch(now)
	}
}

type sizedDiscardSink struct{ *discardSink }

func (sizedDiscardSink) MaxFrameSize() int { return 4 << 20 }

type discardSink struct{ ids []uint64 }

func (d *discardSink) Send(ds []Delivery) {
	for _, x := range ds {
		d.ids = append(d.ids, x.ID)
	}
}
func (d *discardSink) Goodbye(string) {}

// After a partition restarts lower (the log was truncated), an ack of a
// delivery made before the restart does not count for the message that now
// has the same offset.
func TestAckFromBeforeARestartDoesNotCommitTheRefetch(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(t0)
	before := sinks[0].got // offsets 0 and 1, not acked
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 2), t0) // the same offsets, fetched again
	s.dispatch(t0)
	s.ack(1, ids(before))
	if c, _ := s.tracker.Committable(0); c != 0 {
		t.Fatalf("committable = %d after acks of deliveries from before the restart, want 0", c)
	}
	s.ack(1, ids(sinks[0].got[2:]))
	if c, _ := s.tracker.Committable(0); c != 2 {
		t.Fatalf("committable = %d after the refetched messages were acked, want 2", c)
	}
}

// sizedSink is a recSink whose client takes frames up to max bytes.
type sizedSink struct {
	recSink
	max int
}

func (s *sizedSink) MaxFrameSize() int { return s.max }

// sizedBatch returns messages of partition 0 whose frame size is their
// value's length.
func sizedBatch(from int64, sizes ...int) Batch {
	b := Batch{Partition: 0, Start: -1}
	for i, n := range sizes {
		b.Messages = append(b.Messages, &Message{Partition: 0, Offset: from + int64(i), Value: make([]byte, n)})
	}
	return b
}

func sizedState() *state {
	s := newState(timeout)
	s.frameSize = func(m *Message) int { return len(m.Value) }
	return s
}

// A message larger than every client accepts waits, reported once, while the
// messages behind it flow; a client that announces a large enough limit
// gets it.
func TestTooLargeWaitsWhileSmallerFlow(t *testing.T) {
	t.Parallel()
	s := sizedState()
	var reported []int64
	s.onTooLarge = func(m *Message, largest int) {
		if largest != 100 {
			t.Errorf("largest limit reported %d, want 100", largest)
		}
		reported = append(reported, m.Offset)
	}
	small := &sizedSink{max: 100}
	s.join(1, "small", 10, small)
	s.addBatch(sizedBatch(0, 10, 500, 20, 30), t0)
	s.dispatch(t0)
	if got := offsetsOf(small.got); !slices.Equal(got, []int64{0, 2, 3}) {
		t.Fatalf("small client got %v, want 0, 2, 3 (1 is 500 bytes)", got)
	}
	if !slices.Equal(reported, []int64{1}) {
		t.Fatalf("reported too large: %v, want [1]", reported)
	}
	if st := s.snapshot(); st.TooLarge != 1 || st.Buffered != 1 || st.BufferBytes != 500 {
		t.Fatalf("stats: too large %d, buffered %d (%d bytes); want 1, 1 (500)", st.TooLarge, st.Buffered, st.BufferBytes)
	}
	// More traffic: the waiting message stays put and is not reported again.
	s.ack(1, ids(small.got))
	s.addBatch(sizedBatch(4, 40), t0)
	s.dispatch(t0)
	if got := offsetsOf(small.got); !slices.Equal(got, []int64{0, 2, 3, 4}) {
		t.Fatalf("small client got %v, want 0, 2, 3, 4", got)
	}
	if len(reported) != 1 {
		t.Fatalf("reported %v, want the one message once", reported)
	}

	big := &sizedSink{max: 1000}
	s.join(2, "big", 10, big)
	s.dispatch(t0)
	if got := offsetsOf(big.got); !slices.Equal(got, []int64{1}) {
		t.Fatalf("big client got %v, want the waiting message 1", got)
	}
	if st := s.snapshot(); st.TooLarge != 0 || st.Buffered != 0 || st.BufferBytes != 0 {
		t.Fatalf("stats after: too large %d, buffered %d (%d bytes)", st.TooLarge, st.Buffered, st.BufferBytes)
	}
	// Acked, it is committed with the rest.
	s.ack(1, ids(small.got[3:]))
	s.ack(2, ids(big.got))
	if off, _ := s.tracker.Committable(0); off != 5 {
		t.Fatalf("committable offset %d, want 5", off)
	}
}

// A message that fits only a client that is full waits for it without
// holding up the others, and is the first thing that client gets when it
// has room again; it is not reported as too large.
func TestLargeWaitsForTheClientItFits(t *testing.T) {
	t.Parallel()
	s := sizedState()
	var reported []int64
	s.onTooLarge = func(m *Message, _ int) { reported = append(reported, m.Offset) }
	small, big := &sizedSink{max: 100}, &sizedSink{max: 1000}
	s.join(1, "small", 10, small)
	s.join(2, "big", 1, big)
	s.addBatch(sizedBatch(0, 10, 20, 500, 30, 600, 40), t0)
	s.dispatch(t0)
	// Round-robin: 0 small, 1 big (now full), 2 large waits, 3 small, 4
	// waits, 5 small.
	if got := offsetsOf(small.got); !slices.Equal(got, []int64{0, 3, 5}) {
		t.Fatalf("small client got %v, want 0, 3, 5", got)
	}
	if got := offsetsOf(big.got); !slices.Equal(got, []int64{1}) {
		t.Fatalf("big client got %v, want 1", got)
	}
	if st := s.snapshot(); st.TooLarge != 0 || st.Buffered != 2 {
		t.Fatalf("too large %d, buffered %d; want 0, 2", st.TooLarge, st.Buffered)
	}
	// Acks of the small client change nothing for the large messages.
	s.ack(1, ids(small.got))
	s.dispatch(t0)
	if len(small.got) != 3 {
		t.Fatalf("small client got %v", offsetsOf(small.got))
	}
	for _, want := range []int64{2, 4} {
		s.ack(2, ids(big.got[len(big.got)-1:]))
		s.dispatch(t0)
		if got := big.got[len(big.got)-1].Msg.Offset; got != want {
			t.Fatalf("big client's next delivery %d, want %d", got, want)
		}
	}
	if len(reported) != 0 {
		t.Fatalf("reported too large %v while a client that takes them was joined", reported)
	}
	// When the only client that fits leaves, the large message it held is
	// too large for everyone left.
	s.leave(2, LeaveDisconnect, t0)
	s.dispatch(t0)
	if st := s.snapshot(); st.TooLarge != 1 || !slices.Equal(reported, []int64{4}) {
		t.Fatalf("too large %d, reported %v after the big client left; want 1, [4]", st.TooLarge, reported)
	}
}

// Clients that take any size (not a LimitedSink) and messages without a
// size (no FrameSize) are never held back.
func TestNoLimitsNoWaiting(t *testing.T) {
	t.Parallel()
	s := sizedState()
	any := &recSink{}
	s.join(1, "any", 10, any)
	s.addBatch(sizedBatch(0, 10, 1<<30), t0)
	s.dispatch(t0)
	if got := offsetsOf(any.got); !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("unlimited client got %v", got)
	}
	s = newState(timeout) // no FrameSize
	small := &sizedSink{max: 1}
	s.join(1, "small", 10, small)
	s.addBatch(sizedBatch(0, 10, 1<<20), t0)
	s.dispatch(t0)
	if got := offsetsOf(small.got); !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("client got %v without FrameSize", got)
	}
}

// Per-client counters: only the client's own acks of outstanding deliveries
// count as acks (its nacks count as nacks); unknown ids and another client's
// ids count for nobody; a client that
// leaves is gone from the snapshot; weights and observers are reported.
func TestClientStats(t *testing.T) {
	t.Parallel()
	s, sinks := setup(4, 3)
	s.addBatch(batch(0, 0, 6), t0)
	s.dispatch(t0)
	a, b := ids(sinks[0].got), ids(sinks[1].got) // 3 each
	s.ack(1, []uint64{a[0], a[1], b[0], 999})    // b[0] is not client 1's, 999 unknown
	s.nack(2, []uint64{b[1]}, NackInfo{}, t0)
	s.ack(2, []uint64{b[2]})
	s.ack(2, []uint64{b[2]}) // again: no longer outstanding
	got := s.clientStats()
	slices.SortFunc(got, func(a, b ClientStats) int { return cmp.Compare(a.ID, b.ID) })
	want := []ClientStats{
		{ID: 1, Name: "c1", InFlight: 1, MaxInFlight: 4, Acked: 2, Weight: 100},
		{ID: 2, Name: "c2", InFlight: 1, MaxInFlight: 3, Acked: 1, Weight: 100, Nacked: 1, Redelivered: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("clientStats() = %+v, want %+v", got, want)
	}
	if st := s.snapshot(); st.Acked != 3 || st.UnknownAcks != 3 {
		t.Errorf("Acked %d, UnknownAcks %d; want 3 and 3", st.Acked, st.UnknownAcks)
	}
	s.leave(1, LeaveDisconnect, t0)
	if got := s.clientStats(); len(got) != 1 || got[0].ID != 2 {
		t.Errorf("after client 1 left: %+v", got)
	}
	// An observer is listed, as such, with no weight or credit.
	s.observe(9, "watch", &discardSink{})
	got = s.clientStats()
	slices.SortFunc(got, func(a, b ClientStats) int { return cmp.Compare(a.ID, b.ID) })
	if len(got) != 2 || got[1] != (ClientStats{ID: 9, Name: "watch", Observer: true}) {
		t.Errorf("with an observer: %+v", got)
	}
}

// bufferedOffsets lists the offsets of the messages waiting for a client:
// redeliveries, fresh messages, then large ones.
func bufferedOffsets(s *state) []int64 {
	var out []int64
	for i := range s.retries.len() {
		out = append(out, s.retries.at(i).msg.Offset)
	}
	for i := range s.fresh.len() {
		out = append(out, s.fresh.at(i).Offset)
	}
	for i := range s.large.len() {
		out = append(out, s.large.at(i).msg.Offset)
	}
	return out
}

// A partition that restarts at R (its offset went out of range) forgets
// what it holds at or above R, buffered or in flight, and keeps every
// unacked message below R outstanding: their acks count, and the committable
// offset never passes them. One client, partition 0; after each step the
// dispatcher runs a round.
func TestRestartKeepsUnackedBelowAndForgetsFrom(t *testing.T) {
	t.Parallel()
	type step struct {
		op   string // "start", "batch", "ack" (the latest delivery of each offset), "ack-first", "expire", "check"
		offs []int64

		// for "check":
		committable int64
		buffered    []int64
		delivered   []int64 // every delivery so far, in order
	}
	start := func(r int64) step { return step{op: "start", offs: []int64{r}} }
	batchOf := func(from, to int64) step { return step{op: "batch", offs: []int64{from, to}} }
	ack := func(offs ...int64) step { return step{op: "ack", offs: offs} }
	ackFirst := func(offs ...int64) step { return step{op: "ack-first", offs: offs} }
	expire := step{op: "expire"}
	check := func(committable int64, buffered, delivered []int64) step {
		return step{op: "check", committable: committable, buffered: buffered, delivered: delivered}
	}
	tests := []struct {
		name        string
		maxInFlight int
		steps       []step
	}{
		// The case: fetched 100-109, 100-102 in flight, the log is
		// truncated to 103 and the partition restarts there.
		{"forward restart, the rest buffered", 3, []step{
			start(100), batchOf(100, 110),
			check(100, offsetsFrom(103, 110), []int64{100, 101, 102}),
			start(103),
			check(100, nil, []int64{100, 101, 102}),
			ackFirst(100, 101, 102),
			check(103, nil, []int64{100, 101, 102}),
			batchOf(103, 105), ack(104), ack(103),
			check(105, nil, []int64{100, 101, 102, 103, 104}),
		}},
		{"forward restart, the rest in flight", 10, []step{
			start(100), batchOf(100, 110), ack(104),
			start(103),
			ackFirst(105), // forgotten: its ack does not count
			check(100, nil, offsetsFrom(100, 110)),
			expire, // 100-102 come again; 103, 105-109 are dropped
			check(100, nil, append(offsetsFrom(100, 110), 100, 101, 102)),
			ack(100, 101, 102),
			check(103, nil, append(offsetsFrom(100, 110), 100, 101, 102)),
		}},
		{"forward restart, acks of the first deliveries count", 10, []step{
			start(0), batchOf(0, 4), start(10), ackFirst(3, 1, 2),
			check(0, nil, offsetsFrom(0, 4)),
			ackFirst(0),
			check(10, nil, offsetsFrom(0, 4)),
		}},
		// The log was truncated and refilled below what was delivered: the
		// offsets from R are other records.
		{"lower restart", 2, []step{
			start(0), batchOf(0, 6), // 0, 1 in flight; 2-5 buffered
			start(1),
			check(0, nil, []int64{0, 1}),
			batchOf(1, 3), // the new 1 and 2
			check(0, []int64{1, 2}, []int64{0, 1}),
			ackFirst(1), // the old 1: forgotten, its ack only frees the client's slot
			check(0, []int64{2}, []int64{0, 1, 1}),
			ack(0),
			check(1, nil, []int64{0, 1, 1, 2}),
			ack(1, 2),
			check(3, nil, []int64{0, 1, 1, 2}),
		}},
		{"lower restart keeps what is below", 10, []step{
			start(0), batchOf(0, 5), ack(1, 3),
			start(2),
			check(0, nil, offsetsFrom(0, 5)),
			ackFirst(0),
			check(2, nil, offsetsFrom(0, 5)),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, sinks := setup(tt.maxInFlight)
			k := sinks[0]
			now := t0
			for i, st := range tt.steps {
				switch st.op {
				case "start":
					s.addBatch(Batch{Partition: 0, Start: st.offs[0]}, t0)
				case "batch":
					s.addBatch(batch(0, st.offs[0], st.offs[1]), t0)
				case "ack", "ack-first":
					var acks []uint64
					for _, o := range st.offs {
						var found *Delivery
						for j := range k.got {
							if d := &k.got[j]; d.Msg.Offset == o && (found == nil || st.op == "ack") {
								found = d
							}
						}
						if found == nil {
							t.Fatalf("step %d: offset %d never delivered", i, o)
						}
						acks = append(acks, found.ID)
					}
					s.ack(1, acks)
				case "expire":
					now = now.Add(timeout)
					s.expire(now)
				case "check":
					if c, _ := s.tracker.Committable(0); c != st.committable {
						t.Fatalf("step %d: committable %d, want %d", i, c, st.committable)
					}
					if got := bufferedOffsets(s); !slices.Equal(got, st.buffered) {
						t.Fatalf("step %d: buffered %v, want %v", i, got, st.buffered)
					}
					// Redeliveries of one expiry come in deadline-heap order.
					if got := offsetsOf(k.got); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(st.delivered))) {
						t.Fatalf("step %d: delivered %v, want %v", i, got, st.delivered)
					}
					wantBytes := 0
					for _, o := range st.buffered {
						wantBytes += len(fmt.Sprint(o))
					}
					if s.bytes != wantBytes {
						t.Fatalf("step %d: %d buffered bytes, want %d", i, s.bytes, wantBytes)
					}
					continue
				}
				s.dispatch(now)
			}
		})
	}
}

func offsetsFrom(from, to int64) []int64 {
	var out []int64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

// With a dead-letter topic, a message that fits no joined client is not
// kept forever: once it has fitted none for MaxAttempts ack timeouts it
// goes to the dead letter (last failure "too_large"), holding its offset
// until stored, and the partition moves on. The time counts only while it
// fits nobody connected: a client that fits it, or no client at all,
// starts the count again.
func TestTooLargeDeadLetteredAfterMaxAttemptsTimeouts(t *testing.T) {
	t.Parallel()
	s := sizedState()
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 2, dl
	limit := 2 * timeout // MaxAttempts ack timeouts
	small := &sizedSink{max: 100}
	s.join(1, "small", 10, small)
	s.addBatch(sizedBatch(0, 10, 500, 20), t0)
	s.dispatch(t0)
	s.ack(1, ids(small.got))
	if got := s.expireTooLarge(t0.Add(limit)); len(got) != 0 || len(dl.sent) != 0 {
		t.Fatalf("dead-lettered %d after exactly %v, want none before it is longer", len(got), limit)
	}
	// A client that fits it joins and leaves: the count starts again.
	s.join(2, "big", 1, &sizedSink{max: 1000}) // no dispatch round: it does not take the message
	if got := s.expireTooLarge(t0.Add(limit + time.Second)); len(got) != 0 {
		t.Fatal("dead-lettered while a joined client fits it")
	}
	s.leave(2, LeaveDisconnect, t0)
	restart := t0.Add(limit + 2*time.Second)
	if got := s.expireTooLarge(restart); len(got) != 0 {
		t.Fatal("dead-lettered at once after the client that fits it left")
	}
	if got := s.expireTooLarge(restart.Add(limit)); len(got) != 0 {
		t.Fatal("dead-lettered before it fitted nobody for MaxAttempts ack timeouts again")
	}
	got := s.expireTooLarge(restart.Add(limit + time.Millisecond))
	if len(got) != 1 || got[0].Offset != 1 || len(dl.sent) != 1 {
		t.Fatalf("dead-lettered %v, sent %v; want offset 1", got, dl.sent)
	}
	if r := dl.sent[0]; r.LastFailure != FailureTooLarge || r.Attempts != 0 {
		t.Fatalf("dead letter %+v, want last failure %q and no attempt", r, FailureTooLarge)
	}
	if st := s.snapshot(); st.TooLarge != 0 || st.DeadLetterPending != 1 || st.Buffered != 1 || st.TooLargeDeadLettered != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if c, _ := s.tracker.Committable(0); c != 1 {
		t.Fatalf("committable %d while the dead letter is not stored, want 1", c)
	}
	s.deadLettered(got)
	if c, _ := s.tracker.Committable(0); c != 3 {
		t.Fatalf("committable %d after the dead letter is stored, want 3", c)
	}
	if st := s.snapshot(); st.Buffered != 0 || st.BufferBytes != 0 {
		t.Fatalf("stats after: %+v", st)
	}
}

// Without clients, or without a dead-letter topic, a message too large for
// the clients seen waits as before.
func TestTooLargeWaitsWithoutClientsOrDeadLetterTopic(t *testing.T) {
	t.Parallel()
	for _, maxAttempts := range []uint32{0, 2} {
		s := sizedState()
		dl := &recDeadLetter{}
		if maxAttempts > 0 {
			s.maxAttempts, s.deadLetter = maxAttempts, dl
		}
		s.join(1, "small", 10, &sizedSink{max: 100})
		s.addBatch(sizedBatch(0, 500), t0)
		s.dispatch(t0)
		if maxAttempts > 0 {
			s.leave(1, LeaveDisconnect, t0)
		}
		if got := s.expireTooLarge(t0.Add(time.Hour)); len(got) != 0 || len(dl.sent) != 0 {
			t.Fatalf("max attempts %d: dead-lettered %v", maxAttempts, got)
		}
		if st := s.snapshot(); st.Buffered != 1 {
			t.Fatalf("max attempts %d: buffered %d, want 1", maxAttempts, st.Buffered)
		}
	}
}

// The oldest pending message of each partition is dated by when its batch
// arrived, on the dispatcher's clock: acks of later messages do not change
// it, a redelivery does not make it younger, an ack of it moves to the next
// pending message's arrival, and a partition with nothing pending has none.
func TestPendingSinceOnAFakeClock(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.addBatch(batch(0, 0, 3), t0)
	s.addBatch(batch(1, 0, 2), t0.Add(5*time.Second))
	s.addBatch(batch(0, 3, 5), t0.Add(10*time.Second))
	s.dispatch(t0.Add(10 * time.Second))
	want := func(what string, exp map[int32]time.Time) {
		t.Helper()
		got := s.snapshot().PendingSince
		if len(got) != len(exp) {
			t.Fatalf("%s: PendingSince %v, want %v", what, got, exp)
		}
		for p, at := range exp {
			if !got[p].Equal(at) {
				t.Fatalf("%s: PendingSince %v, want %v", what, got, exp)
			}
		}
	}
	want("received", map[int32]time.Time{0: t0, 1: t0.Add(5 * time.Second)})

	byOffset := map[[2]int64]uint64{} // partition, offset -> delivery id
	for _, d := range sinks[0].got {
		byOffset[[2]int64{int64(d.Msg.Partition), d.Msg.Offset}] = d.ID
	}
	s.ack(1, []uint64{byOffset[[2]int64{0, 1}], byOffset[[2]int64{0, 2}], byOffset[[2]int64{0, 3}]})
	want("acks behind the oldest", map[int32]time.Time{0: t0, 1: t0.Add(5 * time.Second)})

	// Partition 1's first message fails and is delivered again: still as old.
	s.nack(1, []uint64{byOffset[[2]int64{1, 0}]}, NackInfo{}, t0.Add(20*time.Second))
	s.dispatch(t0.Add(20 * time.Second))
	want("redelivered", map[int32]time.Time{0: t0, 1: t0.Add(5 * time.Second)})

	s.ack(1, []uint64{byOffset[[2]int64{0, 0}]})
	want("oldest acked", map[int32]time.Time{0: t0.Add(10 * time.Second), 1: t0.Add(5 * time.Second)})

	var rest []uint64
	for _, d := range sinks[0].got {
		rest = append(rest, d.ID)
	}
	s.ack(1, rest)
	want("all acked", map[int32]time.Time{})
}
