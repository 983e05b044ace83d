package dispatch

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestFlightIDsAreNeverReused(t *testing.T) {
	t.Parallel()
	tab := newFlightTable()
	seen := map[uint64]bool{}
	var live []*flight
	for i := range 1000 {
		f := tab.take()
		tab.insert(f)
		if f.id == 0 || seen[f.id] {
			t.Fatalf("insert %d: id %#x is zero or was used before", i, f.id)
		}
		seen[f.id] = true
		if tab.get(f.id) != f {
			t.Fatalf("get(%#x) does not find the flight", f.id)
		}
		live = append(live, f)
		if i%3 == 2 { // free two of every three: slots are reused
			for _, g := range live[:2] {
				id := g.id
				tab.release(g)
				if tab.get(id) != nil {
					t.Fatalf("released id %#x still found", id)
				}
			}
			live = live[2:]
		}
	}
	if tab.live != len(live) || len(tab.slots) > 4*len(live) || len(tab.slots) < 2*len(live) {
		t.Fatalf("live %d (want %d) in %d slots", tab.live, len(live), len(tab.slots))
	}
	if tab.get(0) != nil || tab.get(tab.next) != nil {
		t.Fatal("ids never issued are found")
	}
	for _, f := range live {
		if tab.get(f.id) != f {
			t.Fatalf("live flight %#x lost", f.id)
		}
	}
}

// Ids follow one counter: a flight that waits long for its ack keeps its
// slot, and the ids that would take it are skipped, never reused.
func TestFlightIDsSkipTakenSlots(t *testing.T) {
	t.Parallel()
	tab := newFlightTable()
	old := tab.take()
	tab.insert(old)
	var prev uint64 = old.id
	skipped := 0
	for range 10 * minSlots {
		f := tab.take()
		tab.insert(f)
		if f.id <= prev {
			t.Fatalf("id %#x after %#x", f.id, prev)
		}
		if f.id != prev+1 {
			skipped++
			if (f.id-1)&uint64(len(tab.slots)-1) != old.id&uint64(len(tab.slots)-1) {
				t.Fatalf("ids %#x to %#x skipped, and not for the old flight's slot", prev+1, f.id-1)
			}
		}
		prev = f.id
		tab.release(f)
	}
	if skipped == 0 || tab.get(old.id) != old || len(tab.slots) != minSlots {
		t.Fatalf("%d skips; old flight found %v; %d slots", skipped, tab.get(old.id) == old, len(tab.slots))
	}
}

// The deliveries a client gets in one round have consecutive ids, whatever
// the round-robin order among clients, so that it can ack them as a range.
func TestRoundIDsAreConsecutivePerClient(t *testing.T) {
	t.Parallel()
	s, sinks := setup(100, 100, 100, 100)
	s.addBatch(batch(0, 0, 40), t0)
	s.dispatch(t0)
	s.addBatch(batch(1, 0, 8), t0)
	s.dispatch(t0)
	for i, k := range sinks {
		if got := offsetsOf(k.got[:10]); !slices.Equal(got, []int64{int64(i), int64(i + 4), int64(i + 8), int64(i + 12), int64(i + 16),
			int64(i + 20), int64(i + 24), int64(i + 28), int64(i + 32), int64(i + 36)}) {
			t.Fatalf("client %d got offsets %v: not round-robin", i+1, got)
		}
		for _, round := range [][]Delivery{k.got[:10], k.got[10:]} {
			for j := 1; j < len(round); j++ {
				if round[j].ID != round[j-1].ID+1 {
					t.Fatalf("client %d: ids %v of one round are not consecutive", i+1, ids(round))
				}
			}
		}
	}
}

func TestSettleRanges(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10)
	s.addBatch(batch(0, 0, 20), t0)
	s.dispatch(t0)
	a, b := sinks[0].got, sinks[1].got // 10 each, offsets 0, 2, ... and 1, 3, ...
	first := a[0].ID
	// A range naming client 2's deliveries from client 1 does nothing.
	s.settle(1, OpAck, nil, []Range{{b[0].ID, 10}}, NackInfo{}, t0)
	if s.stats.Acked != 0 || s.stats.UnknownAcks != 10 {
		t.Fatalf("acked %d, unknown %d after a range of another client's ids", s.stats.Acked, s.stats.UnknownAcks)
	}
	// Acks of 0..2 by a range and of 4 by id; a range over the gap names
	// ids never delivered to client 1 (counted unknown).
	s.settle(1, OpAck, []uint64{a[4].ID}, []Range{{first, 3}}, NackInfo{}, t0)
	if s.stats.Acked != 4 || s.clients[1].n != 6 {
		t.Fatalf("acked %d, client holds %d", s.stats.Acked, s.clients[1].n)
	}
	if c, _ := s.tracker.Committable(0); c != 1 {
		t.Fatalf("committable %d, want 1 (offset 1 of client 2 unacked)", c)
	}
	// Touch the rest by a range wider than what the client holds (the
	// walk), then nack two of them by a range.
	later := t0.Add(time.Second)
	s.settle(1, OpTouch, nil, []Range{{first, 1000}}, NackInfo{}, later)
	if s.stats.UnknownAcks != 10+1000-6 {
		t.Fatalf("unknown %d after a touch of 1000 ids naming 6 flights", s.stats.UnknownAcks)
	}
	for f := s.clients[1].first; f != nil; f = f.next {
		if !f.deadline.Equal(later.Add(timeout)) {
			t.Fatalf("flight %#x deadline %v, want %v", f.id, f.deadline, later.Add(timeout))
		}
	}
	if f := s.deadlines.peek(); f.client.id != 2 {
		t.Fatal("the earliest deadline is not one of the untouched client's")
	}
	s.settle(1, OpNack, nil, []Range{{a[5].ID, 2}}, NackInfo{}, later)
	if s.stats.Nacked != 2 || s.retries.len() != 2 {
		t.Fatalf("nacked %d, %d retries", s.stats.Nacked, s.retries.len())
	}
	// Ack everything client 1 holds in one range: the walk.
	s.settle(1, OpAck, nil, []Range{{first, 1 << 40}}, NackInfo{}, later)
	if s.clients[1].n != 0 || s.stats.Acked != 4+4 {
		t.Fatalf("client holds %d after a range over everything, acked %d", s.clients[1].n, s.stats.Acked)
	}
	// Ranges from a client that left are ignored and counted.
	before := s.stats.UnknownAcks
	s.leave(2, LeaveDisconnect, later)
	s.settle(2, OpAck, nil, []Range{{b[0].ID, 10}}, NackInfo{}, later)
	if s.stats.UnknownAcks != before+10 || s.stats.Acked != 8 {
		t.Fatalf("unknown %d (+%d), acked %d after acks of a client that left", s.stats.UnknownAcks, s.stats.UnknownAcks-before, s.stats.Acked)
	}
}

// Deadlines are kept in delivery and touch order; a clock that steps back
// makes a flight expire late, never early.
func TestDeadlineListOrder(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.addBatch(batch(0, 0, 3), t0)
	s.dispatch(t0)
	got := sinks[0].got
	s.touch(1, []uint64{got[0].ID}, t0.Add(5*time.Second))
	s.addBatch(batch(0, 3, 4), t0)
	s.dispatch(t0.Add(-time.Hour)) // the clock stepped back
	var order []int64
	var deadlines []time.Time
	for f := s.deadlines.peek(); f != nil; f = f.dnext {
		order = append(order, f.msg.Offset)
		deadlines = append(deadlines, f.deadline)
	}
	if !slices.Equal(order, []int64{1, 2, 0, 3}) {
		t.Fatalf("deadline order %v, want offsets 1, 2, 0, 3", order)
	}
	if !deadlines[3].Equal(deadlines[2]) || !slices.IsSortedFunc(deadlines, time.Time.Compare) {
		t.Fatalf("deadlines %v", deadlines)
	}
	s.expire(t0.Add(timeout))
	s.dispatch(t0.Add(timeout))
	if s.stats.Redelivered[RedeliverTimeout] != 2 {
		t.Fatalf("%d expired at t0+timeout, want offsets 1 and 2", s.stats.Redelivered[RedeliverTimeout])
	}
}

// rangeOf names deliveries of one round, consecutive ids, as one range.
func rangeOf(t *testing.T, ds []Delivery) []Range {
	t.Helper()
	for i := 1; i < len(ds); i++ {
		if ds[i].ID != ds[i-1].ID+1 {
			t.Fatalf("ids %v are not consecutive", ids(ds))
		}
	}
	return []Range{{First: ds[0].ID, Count: uint64(len(ds))}}
}

// Deliveries settled by ranges follow the delivery policies as those named
// by ids do: a nack's delay and reason, max attempts and the dead-letter
// record, key gates, observers' copies.
func TestSettleRangesHonourPolicies(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 2, dl
	s.keys = map[uint64]keyGate{}
	obs := &recSink{}
	s.observe(9, "watch", obs)
	s.addBatch(keysBatch("a", "a", "b", ""), t0)
	s.dispatch(t0)
	k := sinks[0]
	if got := offsetsOf(k.got); !slices.Equal(got, []int64{0, 2, 3}) {
		t.Fatalf("first round %v, want 0, 2, 3 (1 waits behind key a)", got)
	}

	// A nack by range with a delay: nothing comes back before it is over.
	s.settle(1, OpNack, nil, rangeOf(t, k.got), NackInfo{Delay: 5 * time.Second, Reason: "busy"}, t0)
	s.dispatch(t0)
	if st := s.snapshot(); st.Delayed != 3 || len(k.got) != 3 {
		t.Fatalf("after a delayed nack by range: %d delayed, %d deliveries; want 3, 3", st.Delayed, len(k.got))
	}
	s.expire(t0.Add(5*time.Second - time.Millisecond))
	s.dispatch(t0.Add(5*time.Second - time.Millisecond))
	if len(k.got) != 3 {
		t.Fatal("redelivered before the nack's delay was over")
	}
	later := t0.Add(5 * time.Second)
	s.expire(later)
	s.dispatch(later)
	second := k.got[3:]
	if got := offsetsOf(second); len(got) != 3 || second[0].Attempt != 2 {
		t.Fatalf("after the delay: %v (attempt %d), want 0, 2, 3 again, attempt 2", got, second[0].Attempt)
	}

	// Offset 0 (key a) acked by a range of one: the gate opens for offset 1.
	s.settle(1, OpAck, nil, []Range{{First: second[0].ID, Count: 1}}, NackInfo{}, later)
	s.dispatch(later)
	if d := last(k); d.Msg.Offset != 1 || d.Attempt != 1 {
		t.Fatalf("after the ack of key a's first message: got offset %d attempt %d, want 1, 1", d.Msg.Offset, d.Attempt)
	}

	// The second failure of 2 and 3, by range, is their last: dead letters
	// with the range's reason.
	s.settle(1, OpNack, nil, rangeOf(t, second[1:]), NackInfo{Reason: "cannot parse"}, later)
	s.dispatch(later)
	if len(dl.sent) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dl.sent))
	}
	for _, rec := range dl.sent {
		if rec.Attempts != 2 || rec.Reason != "cannot parse" || rec.LastFailure != "nack" {
			t.Fatalf("dead letter %+v, want 2 attempts, reason \"cannot parse\", last failure nack", rec)
		}
	}

	var copies []string
	for _, d := range obs.got {
		if d.ID != 0 {
			t.Fatalf("observer copy with delivery id %d, want 0", d.ID)
		}
		copies = append(copies, fmt.Sprintf("%d#%d", d.Msg.Offset, d.Attempt))
	}
	slices.Sort(copies) // delays ending at the same time end in no set order
	if want := []string{"0#1", "0#2", "1#1", "2#1", "2#2", "3#1", "3#2"}; !slices.Equal(copies, want) {
		t.Fatalf("observer got %v, want %v", copies, want)
	}
	if s.stats.Acked != 1 || s.clients[1].acked != 1 {
		t.Fatalf("acked %d (client %d), want 1", s.stats.Acked, s.clients[1].acked)
	}
}

// With weights, a client's deliveries of one round still have consecutive
// ids, so one range per client and round settles them.
func TestWeightedRoundsSettleByRange(t *testing.T) {
	t.Parallel()
	s := newState(timeout)
	sinks := []*weightedSink{{w: 100}, {w: 50}}
	for i, k := range sinks {
		s.join(uint64(i+1), "c", 1<<20, k)
	}
	s.addBatch(batch(0, 0, 300), t0)
	s.dispatch(t0)
	if a, b := len(sinks[0].got), len(sinks[1].got); a != 200 || b != 100 {
		t.Fatalf("weights 100 and 50 got %d and %d of 300, want 200 and 100", a, b)
	}
	for i, k := range sinks {
		s.settle(uint64(i+1), OpAck, nil, rangeOf(t, k.got), NackInfo{}, t0)
	}
	if st := s.snapshot(); st.InFlight != 0 || st.Acked != 300 || st.UnknownAcks != 0 {
		t.Fatalf("after one range per client: %+v", st)
	}
}
