package dispatch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// recDeadLetter records the dead letters it is sent; the test stores them
// by calling s.deadLettered.
type recDeadLetter struct{ sent []DeadLetterRecord }

func (r *recDeadLetter) Send(rec DeadLetterRecord) { r.sent = append(r.sent, rec) }
func (r *recDeadLetter) Stored() <-chan []*Message { return nil }

func last(k *recSink) Delivery { return k.got[len(k.got)-1] }

// keysBatch returns a batch of partition 0 from offset 0, a message per
// key ("" for a message without one).
func keysBatch(keys ...string) Batch {
	b := Batch{Partition: 0, Start: -1}
	for i, k := range keys {
		m := &Message{Partition: 0, Offset: int64(i), Value: []byte{1}}
		if k != "" {
			m.Key = []byte(k)
		}
		b.Messages = append(b.Messages, m)
	}
	return b
}

// A nack with a delay parks the message in the delay heap: it is not
// delivered before the delay is over, counts as buffered and delayed, holds
// the committed offset, and is the next deadline of the dispatcher's timer.
func TestNackDelayWaitsInTheHeap(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 1)
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	nacked := t0.Add(time.Second)
	s.nack(1, ids(sinks[0].got), NackInfo{Delay: 5 * time.Second}, nacked)
	s.dispatch(nacked)
	if len(sinks[1].got) != 0 {
		t.Fatal("redelivered at once despite the nack's delay")
	}
	if st := s.snapshot(); st.Delayed != 1 || st.Buffered != 1 || st.BufferBytes != 1 || st.InFlight != 0 {
		t.Fatalf("stats while delayed: %+v", st)
	}
	if dl, ok := s.nextDeadline(); !ok || !dl.Equal(nacked.Add(5*time.Second)) {
		t.Fatalf("next deadline %v, %v; want the delay's end %v", dl, ok, nacked.Add(5*time.Second))
	}
	if c, _ := s.tracker.Committable(0); c != 0 {
		t.Fatalf("committable %d while the message waits", c)
	}
	s.expire(nacked.Add(5*time.Second - time.Millisecond))
	s.dispatch(nacked.Add(5*time.Second - time.Millisecond))
	if len(sinks[1].got) != 0 {
		t.Fatal("redelivered before the delay was over")
	}
	s.expire(nacked.Add(5 * time.Second))
	s.dispatch(nacked.Add(5 * time.Second))
	if len(sinks[1].got) != 1 || sinks[1].got[0].Attempt != 2 {
		t.Fatalf("after the delay client 2 got %+v, want the redelivery (attempt 2)", sinks[1].got)
	}
	if st := s.snapshot(); st.Delayed != 0 || st.Buffered != 0 || st.BufferBytes != 0 {
		t.Fatalf("stats after: %+v", st)
	}
}

// --retry-backoff delays a redelivery after a timeout, a nack without delay
// or a disconnect by min·2^(failures−1) capped at max, jittered into the
// upper half; a nack's own delay wins over it.
func TestRetryBackoffWindows(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1)
	s.retryMin, s.retryMax = time.Second, 4*time.Second
	s.addBatch(batch(0, 0, 1), t0)
	delivered := t0 // when the latest delivery was made
	s.dispatch(delivered)
	windows := []struct{ lo, hi time.Duration }{{500 * time.Millisecond, time.Second}, {time.Second, 2 * time.Second},
		{2 * time.Second, 4 * time.Second}, {2 * time.Second, 4 * time.Second}}
	for i, w := range windows {
		var now time.Time // when the delivery fails
		switch i % 3 {
		case 0: // ack timeout
			now = delivered.Add(timeout)
			s.expire(now)
		case 1: // nack without a delay
			now = delivered.Add(time.Second)
			s.nack(1, ids(sinks[0].got[len(sinks[0].got)-1:]), NackInfo{}, now)
		case 2: // the client leaves; it comes back
			now = delivered.Add(time.Second)
			s.leave(1, LeaveDisconnect, now)
			sinks[0] = &recSink{}
			s.join(1, "again", 1, sinks[0])
		}
		s.dispatch(now)
		if len(sinks[0].got) > 0 && last(sinks[0]).Attempt == uint32(i+2) {
			t.Fatalf("failure %d: redelivered at once", i+1)
		}
		due, ok := s.nextDeadline()
		if !ok || due.Before(now.Add(w.lo)) || due.After(now.Add(w.hi)) {
			t.Fatalf("failure %d: redelivery due %v after it, want within [%v, %v]", i+1, due.Sub(now), w.lo, w.hi)
		}
		s.expire(due)
		s.dispatch(due)
		delivered = due
		if d := last(sinks[0]); d.Attempt != uint32(i+2) {
			t.Fatalf("failure %d: redelivery attempt %d, want %d", i+1, d.Attempt, i+2)
		}
	}
	now := delivered.Add(time.Second)
	// A nack's own delay is used as is.
	s.nack(1, ids(sinks[0].got[len(sinks[0].got)-1:]), NackInfo{Delay: 100 * time.Millisecond}, now)
	if due, _ := s.nextDeadline(); !due.Equal(now.Add(100 * time.Millisecond)) {
		t.Fatalf("nack with a delay: due %v after it, want 100ms", due.Sub(now))
	}
}

// With max attempts 3 a message that failed three times (timeout, nack with
// a reason, client gone) goes to the dead letter with what is known of its
// failures, is not delivered again, holds the committed offset until
// stored, and then counts as done; the messages behind it flow meanwhile.
func TestMaxAttemptsDeadLetters(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1, 10)
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 3, dl
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(t0)
	poison := sinks[0].got[0]
	s.expire(t0.Add(timeout)) // 1: timeout
	s.dispatch(t0.Add(timeout))
	s.nack(2, ids(sinks[1].got), NackInfo{Reason: "cannot parse"}, t0.Add(timeout)) // 2: nack
	s.dispatch(t0.Add(timeout))
	holder := uint64(1)
	if len(sinks[1].got) > 1 || last(sinks[0]).Msg != poison.Msg {
		holder = 2
	}
	s.addBatch(batch(0, 1, 3), t0)
	s.leave(holder, LeaveDisconnect, t0.Add(timeout)) // 3: disconnect
	s.dispatch(t0.Add(timeout))
	if len(dl.sent) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl.sent))
	}
	rec := dl.sent[0]
	if rec.Msg.Offset != 0 || rec.Attempts != 3 || rec.LastFailure != "disconnect" || rec.Reason != "cannot parse" {
		t.Fatalf("dead letter %+v, want offset 0, 3 attempts, last failure disconnect, reason \"cannot parse\"", rec)
	}
	total := 0
	for _, k := range sinks {
		for _, d := range k.got {
			if d.Msg.Offset == 0 {
				total++
			}
		}
	}
	if total != 3 {
		t.Fatalf("the poison message was delivered %d times, want 3", total)
	}
	st := s.snapshot()
	if st.DeadLetterPending != 1 || st.Buffered != 1 || st.BufferBytes != 1 {
		t.Fatalf("while the dead letter is stored: %+v", st)
	}
	other := sinks[2-holder]
	for _, d := range other.got {
		if d.Msg.Offset > 0 {
			s.ack(3-holder, []uint64{d.ID})
		}
	}
	if c, _ := s.tracker.Committable(0); c != 0 {
		t.Fatalf("committable %d before the dead letter is stored, want 0", c)
	}
	s.deadLettered([]*Message{rec.Msg})
	if c, _ := s.tracker.Committable(0); c != 3 {
		t.Fatalf("committable %d once stored, want 3", c)
	}
	st = s.snapshot()
	if st.DeadLettered != 1 || st.DeadLetterPending != 0 || st.Buffered != 0 || st.BufferBytes != 0 {
		t.Fatalf("after storing: %+v", st)
	}
	if st.Attempts[2] != 1 || st.Attempts[0] != 2 || st.AttemptsSum != 5 {
		t.Fatalf("attempts histogram %v sum %d, want 2 done in 1 attempt, 1 in 3", st.Attempts, st.AttemptsSum)
	}
}

// Progress loaded from the store: the messages it shows acked are taken as
// acked as they arrive and not delivered; the others resume their failure
// counts, so that max attempts counts across a restart (a message that had
// used them all goes to the dead letter without a delivery).
func TestRestoredProgress(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.tracker.TrackProgress()
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 3, dl
	s.restore = newRestore(map[int32]offsets.Progress{
		0: {Base: 10, Acked: []offsets.Range{{First: 12, Last: 13}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}, {Offset: 11, Count: 3}}},
		1: {Base: 5, Acked: []offsets.Range{{First: 6, Last: 6}}},
	})
	s.addBatch(Batch{Partition: 0, Start: 10}, t0)
	s.addBatch(batch(0, 10, 16), t0)
	s.addBatch(Batch{Partition: 1, Start: 7}, t0) // not where its progress was recorded: void
	s.addBatch(batch(1, 7, 8), t0)
	s.dispatch(t0)
	var got []string
	for _, d := range sinks[0].got {
		got = append(got, fmt.Sprintf("%d@%d#%d", d.Msg.Partition, d.Msg.Offset, d.Attempt))
	}
	if want := []string{"0@10#3", "0@14#1", "0@15#1", "1@7#1"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (12-13 acked before, 11 out of attempts)", got, want)
	}
	if len(dl.sent) != 1 || dl.sent[0].Msg.Offset != 11 || dl.sent[0].Attempts != 3 {
		t.Fatalf("dead letters %+v, want offset 11 after its 3 attempts", dl.sent)
	}
	if st := s.snapshot(); st.Skipped != 2 {
		t.Fatalf("skipped %d, want 2", st.Skipped)
	}
	// The restored counts and acks are in the progress the next commit stores.
	want := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 13}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}, {Offset: 11, Count: 3}}}
	if pr := s.tracker.Progress(0); fmt.Sprint(pr) != fmt.Sprint(want) {
		t.Fatalf("progress %+v, want %+v", pr, want)
	}
	s.ack(1, ids(sinks[0].got[:1]))
	s.deadLettered([]*Message{dl.sent[0].Msg})
	if c, _ := s.tracker.Committable(0); c != 14 {
		t.Fatalf("committable %d, want 14 (10 acked, 11 dead-lettered, 12-13 acked before)", c)
	}
}

// In key order a key's messages go out one at a time in offset order: the
// next waits until the previous is acked; a redelivery keeps the order;
// other keys and unkeyed messages go out in parallel.
func TestKeyOrderingOneAtATime(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10)
	s.keys = map[uint64]keyGate{}
	s.addBatch(keysBatch("a", "b", "a", "a", "", "b"), t0)
	s.dispatch(t0)
	out := func() []int64 {
		var all []int64
		for _, k := range sinks {
			all = append(all, offsetsOf(k.got)...)
		}
		slices.Sort(all)
		return all
	}
	find := func(o int64) (uint64, Delivery) {
		for i, k := range sinks {
			for _, d := range k.got {
				if d.Msg.Offset == o {
					return uint64(i + 1), d
				}
			}
		}
		t.Fatalf("offset %d not delivered", o)
		return 0, Delivery{}
	}
	if got := out(); !slices.Equal(got, []int64{0, 1, 4}) {
		t.Fatalf("first round delivered %v, want 0 (a), 1 (b), 4 (no key)", got)
	}
	if st := s.snapshot(); st.KeyWaiting != 3 || st.Buffered != 3 {
		t.Fatalf("key waiting %d, buffered %d; want 3, 3", st.KeyWaiting, st.Buffered)
	}
	c, d := find(0)
	s.ack(c, []uint64{d.ID})
	s.dispatch(t0)
	if got := out(); !slices.Equal(got, []int64{0, 1, 2, 4}) {
		t.Fatalf("after a's first ack: %v, want a's next (2) out", got)
	}
	c, d = find(2)
	s.nack(c, []uint64{d.ID}, NackInfo{}, t0)
	s.dispatch(t0)
	if got := out(); !slices.Equal(got, []int64{0, 1, 2, 2, 4}) {
		t.Fatalf("after a nack of 2: %v, want 2 again and 3 still waiting", got)
	}
	for _, k := range sinks {
		for _, d := range k.got {
			if d.Msg.Offset == 2 && d.Attempt == 2 {
				s.ack(uint64(slices.Index(sinks, k)+1), []uint64{d.ID})
			}
		}
	}
	c, d = find(1)
	s.ack(c, []uint64{d.ID})
	s.dispatch(t0)
	if got := out(); !slices.Equal(got, []int64{0, 1, 2, 2, 3, 4, 5}) {
		t.Fatalf("at the end: %v", got)
	}
	if st := s.snapshot(); st.KeyWaiting != 0 || st.Buffered != 0 || st.BufferBytes != 0 {
		t.Fatalf("stats at the end: %+v", st)
	}
}

// Key order under churn: many keys, several clients acking in random order,
// random nacks, timeouts, clients leaving and joining, a dead letter now
// and then: for every key, the acked (or dead-lettered) sequence is in
// offset order and every message is done once the churn stops.
func TestKeyOrderingRandomized(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	s := newState(timeout)
	s.keys = map[uint64]keyGate{}
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 4, dl
	s.retryMin, s.retryMax = time.Second, 3*time.Second
	sinks := map[uint64]*recSink{}
	nextID := uint64(1)
	join := func() {
		sinks[nextID] = &recSink{}
		s.join(nextID, "c", 1+rng.IntN(8), sinks[nextID])
		nextID++
	}
	for range 4 {
		join()
	}
	const n = 3000
	keyOf := func(o int64) string { return fmt.Sprint("k", o%37) }
	done := map[string][]int64{} // per key, offsets in the order they were done
	doneSet := map[int64]bool{}
	finish := func(m *Message) {
		k := string(m.Key)
		done[k] = append(done[k], m.Offset)
		doneSet[m.Offset] = true
	}
	now := t0
	off := int64(0)
	for step := 0; len(doneSet) < n; step++ {
		if step > 200000 {
			t.Fatalf("stuck: %d of %d done; stats %+v", len(doneSet), n, s.snapshot())
		}
		if off < n && rng.IntN(3) == 0 {
			b := Batch{Partition: 0, Start: -1}
			for range rng.IntN(20) {
				if off < n {
					b.Messages = append(b.Messages, &Message{Partition: 0, Offset: off, Key: []byte(keyOf(off)), Value: []byte{1}})
					off++
				}
			}
			s.addBatch(b, t0)
		}
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		s.expire(now)
		s.dispatch(now)
		// Every client answers some of what it holds, in random order.
		for id, k := range sinks {
			c := s.clients[id]
			if c == nil {
				continue
			}
			var held []*flight
			for f := c.first; f != nil; f = f.next {
				held = append(held, f)
			}
			rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
			for _, f := range held[:rng.IntN(len(held)+1)] {
				m, fid := f.msg, f.id
				switch r := rng.IntN(20); {
				case r == 0 && off >= n/2: // no timeouts or nacks at the end, so it ends
				case r == 0:
					s.nack(id, []uint64{fid}, NackInfo{Delay: time.Duration(rng.IntN(2000)) * time.Millisecond}, now)
				case r == 1 && off < n/2:
					// left to time out
				default:
					s.ack(id, []uint64{fid})
					finish(m)
				}
			}
			_ = k
		}
		if rng.IntN(200) == 0 && off < n/2 {
			for id := range sinks {
				s.leave(id, LeaveDisconnect, now)
				delete(sinks, id)
				break
			}
			join()
		}
		for _, rec := range dl.sent {
			finish(rec.Msg)
			s.deadLettered([]*Message{rec.Msg})
		}
		dl.sent = dl.sent[:0]
		if off >= n && len(s.clients) > 0 {
			now = now.Add(timeout) // let everything left time out eventually
		}
	}
	for k, offs := range done {
		if !slices.IsSorted(offs) {
			t.Fatalf("key %s done in the order %v", k, offs)
		}
	}
	if st := s.snapshot(); st.KeyWaiting != 0 || st.Buffered != 0 || len(s.keys) != 0 {
		t.Fatalf("at the end: key waiting %d, buffered %d, %d gates", st.KeyWaiting, st.Buffered, len(s.keys))
	}
	if c, _ := s.tracker.Committable(0); c != n {
		t.Fatalf("committable %d, want %d", c, n)
	}
}

// A restart below a key's messages drops them from the key's chain; a
// dropped holder passes the gate on, a holder in flight keeps it until its
// flight comes back.
func TestKeyOrderingRestart(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.keys = map[uint64]keyGate{}
	b := Batch{Partition: 0, Start: 0}
	for o := range int64(4) {
		b.Messages = append(b.Messages, &Message{Partition: 0, Offset: o, Key: []byte("k"), Value: []byte{1}})
	}
	s.addBatch(b, t0)
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0}) {
		t.Fatalf("delivered %v, want 0 alone", got)
	}
	// The partition restarts at 2: 2 and 3, waiting behind 0, are forgotten.
	s.addBatch(Batch{Partition: 0, Start: 2}, t0)
	if st := s.snapshot(); st.KeyWaiting != 1 || st.Buffered != 1 || st.BufferBytes != 2 {
		t.Fatalf("after the restart: %+v; want 1 waiting (offset 1)", st)
	}
	s.ack(1, ids(sinks[0].got))
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("delivered %v, want 0 then 1", got)
	}
	// The re-fetched 2 and 3 wait behind 1, in order.
	b = Batch{Partition: 0, Start: -1}
	for o := int64(2); o < 4; o++ {
		b.Messages = append(b.Messages, &Message{Partition: 0, Offset: o, Key: []byte("k"), Value: []byte{1}})
	}
	s.addBatch(b, t0)
	// A restart at 1 forgets the holder 1, in flight: it keeps the gate
	// until its flight comes back; 2 and 3 are forgotten.
	s.addBatch(Batch{Partition: 0, Start: 1}, t0)
	s.ack(1, ids(sinks[0].got[1:]))
	if len(s.keys) != 0 || s.keyWaiting != 0 || s.buffered() != 0 || s.bytes != 0 {
		t.Fatalf("gates %d, waiting %d, buffered %d (%d bytes); want none", len(s.keys), s.keyWaiting, s.buffered(), s.bytes)
	}
}

// A key whose message is dead-lettered waits for the dead letter to be
// stored before its next message goes out.
func TestKeyOrderingWaitsForTheDeadLetter(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	s.keys = map[uint64]keyGate{}
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 1, dl
	s.addBatch(Batch{Partition: 0, Start: -1, Messages: []*Message{
		{Partition: 0, Offset: 0, Key: []byte("k"), Value: []byte{1}},
		{Partition: 0, Offset: 1, Key: []byte("k"), Value: []byte{1}},
	}}, t0)
	s.dispatch(t0)
	s.nack(1, ids(sinks[0].got), NackInfo{}, t0)
	s.dispatch(t0)
	if len(dl.sent) != 1 || len(sinks[0].got) != 1 {
		t.Fatalf("dead letters %d, deliveries %v; want offset 0 dead-lettered, 1 waiting", len(dl.sent), offsetsOf(sinks[0].got))
	}
	s.deadLettered([]*Message{dl.sent[0].Msg})
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("delivered %v, want 1 once 0's dead letter is stored", got)
	}
}

// An observer gets a copy of every delivery, redeliveries included, with
// delivery id 0; it holds no credit, takes no turn and acks nothing.
func TestObserverSeesEveryDelivery(t *testing.T) {
	t.Parallel()
	s, sinks := setup(2)
	obs := &recSink{}
	s.observe(9, "watch", obs)
	s.addBatch(batch(0, 0, 3), t0)
	s.dispatch(t0)
	s.nack(1, ids(sinks[0].got[:1]), NackInfo{}, t0)
	s.dispatch(t0)
	var got []string
	for _, d := range obs.got {
		if d.ID != 0 {
			t.Fatalf("observer copy with delivery id %d, want 0", d.ID)
		}
		got = append(got, fmt.Sprintf("%d#%d", d.Msg.Offset, d.Attempt))
	}
	if want := []string{"0#1", "1#1", "0#2"}; !slices.Equal(got, want) {
		t.Fatalf("observer got %v, want %v", got, want)
	}
	st := s.snapshot()
	if st.Observers != 1 || st.Clients != 1 || st.InFlight != 2 || st.Buffered != 1 {
		t.Fatalf("stats %+v: the observer must not take credit or messages", st)
	}
	s.leave(9, LeaveDisconnect, t0)
	s.ack(1, ids(sinks[0].got))
	s.dispatch(t0)
	if len(obs.got) != 3 || s.snapshot().Observers != 0 {
		t.Fatalf("observer got %d copies after leaving", len(obs.got)-3)
	}
	s.observe(10, "late", obs)
	s.drain("bye")
	if obs.goodbye != "bye" {
		t.Fatal("observer not told goodbye at drain")
	}
}

// weightedSink is a recSink whose client gives a weight.
type weightedSink struct {
	recSink
	w int
}

func (w *weightedSink) Weight() int { return w.w }

// Smooth weighted round-robin: shares follow the weights exactly while every
// client has room, spread evenly; credit still applies; a redelivery
// prefers another client.
func TestWeightsShareDeliveries(t *testing.T) {
	t.Parallel()
	s := newState(timeout)
	sinks := []*weightedSink{{w: 100}, {w: 100}, {w: 5}}
	for i, k := range sinks {
		s.join(uint64(i+1), "c", 1<<20, k)
	}
	s.addBatch(batch(0, 0, 2050), t0)
	s.dispatch(t0)
	for i, want := range []int{1000, 1000, 50} {
		if got := len(sinks[i].got); got != want {
			t.Fatalf("client %d (weight %d) got %d of 2050, want %d", i+1, sinks[i].w, got, want)
		}
	}
	// Evenly spread: the canary never gets two within 41 messages.
	var canary []int64
	canary = append(canary, offsetsOf(sinks[2].got)...)
	for i := 1; i < len(canary); i++ {
		if canary[i]-canary[i-1] < 40 {
			t.Fatalf("canary got %d and %d: not spread", canary[i-1], canary[i])
		}
	}

	// Credit applies: a canary of weight 1000 with room for 1 gets 1.
	s2 := newState(timeout)
	big, small := &weightedSink{w: 1000}, &weightedSink{w: 1}
	s2.join(1, "big", 1, big)
	s2.join(2, "small", 100, small)
	s2.addBatch(batch(0, 0, 50), t0)
	s2.dispatch(t0)
	if len(big.got) != 1 || len(small.got) != 49 {
		t.Fatalf("big (room 1) got %d, small got %d; want 1 and 49", len(big.got), len(small.got))
	}
	// A redelivery goes to another client with room.
	s2.nack(1, ids(big.got), NackInfo{}, t0)
	s2.ack(2, ids(small.got))
	s2.dispatch(t0)
	if len(small.got) != 50 || last(&small.recSink).Msg.Offset != 0 {
		t.Fatalf("the redelivery of big's message went to %v", offsetsOf(big.got))
	}
}

// Every client at the default weight: plain round-robin, as before weights
// existed (TestRoundRobin), even through a client that gave a weight
// joining and leaving.
func TestWeightsOffWhenAllDefault(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10, 10)
	canary := &weightedSink{w: 5}
	s.join(3, "canary", 10, canary)
	s.leave(3, LeaveDisconnect, t0)
	s.addBatch(batch(0, 0, 4), t0)
	s.dispatch(t0)
	if s.weighted != 0 || !slices.Equal(offsetsOf(sinks[0].got), []int64{0, 2}) || !slices.Equal(offsetsOf(sinks[1].got), []int64{1, 3}) {
		t.Fatalf("weighted %d; got %v and %v, want round-robin", s.weighted, offsetsOf(sinks[0].got), offsetsOf(sinks[1].got))
	}
}

// keyedBatch returns the messages from..to-1 of partition p, all with key k.
func keyedBatch(p int32, from, to int64, k string) Batch {
	b := Batch{Partition: p, Start: -1}
	for o := from; o < to; o++ {
		b.Messages = append(b.Messages, &Message{Partition: p, Offset: o, Key: []byte(k), Value: []byte{1}})
	}
	return b
}

// Per-partition mode (spread): a partition assigned with stored progress
// skips what it shows acked and resumes the failure counts; revoking it
// hands back its progress for the final commit, and releases its key gates,
// those of messages in flight and of one given back during the handoff, so
// that the partition assigned again orders its key afresh.
func TestPoliciesAcrossAHandoff(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	k := sinks[0]
	s.parts = map[int32]*owned{}
	s.keys = map[uint64]keyGate{}
	s.tracker.TrackProgress()
	s.assign(0, testTerm(10), offsets.Progress{Base: 0, Acked: []offsets.Range{{First: 1, Last: 1}}, Failed: []offsets.Failure{{Offset: 0, Count: 2}}})
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(keyedBatch(0, 0, 4, "k"), t0)
	s.dispatch(t0)
	if len(k.got) != 1 || k.got[0].Msg.Offset != 0 || k.got[0].Attempt != 3 {
		t.Fatalf("delivered %v, want 0@0 alone (its key holds 2, 3; 1 acked before), at attempt 3", k.got)
	}
	s.ack(1, ids(k.got))
	s.dispatch(t0)
	if len(k.got) != 2 || k.got[1].Msg.Offset != 2 {
		t.Fatalf("after the ack: %v, want 0@2 next (0@1 acked before the handoff)", k.got)
	}
	reply := make(chan revokeReply, 1)
	s.revokeStart(0, t0.Add(time.Second), reply)     // 0@3 waiting behind its key: dropped
	s.nack(1, []uint64{k.got[1].ID}, NackInfo{}, t0) // 0@2 given back: not queued again
	_, off, tracked, _, prog := s.revokeEnd(0)
	want := offsets.Progress{Base: 2}
	if off != 2 || !tracked || fmt.Sprint(prog) != fmt.Sprint(want) {
		t.Fatalf("revokeEnd = %d, %v, progress %+v; want 2 and %+v", off, tracked, prog, want)
	}
	if len(s.keys) != 0 || s.keyWaiting != 0 || s.buffered() != 0 || s.bytes != 0 {
		t.Fatalf("after the handoff: %d key gates, %d waiting, %d buffered, %d bytes; want none", len(s.keys), s.keyWaiting, s.buffered(), s.bytes)
	}
	// Assigned again (its offset 2 committed by the final commit): the key
	// is free.
	s.assign(0, testTerm(12), prog)
	s.addBatch(Batch{Partition: 0, Start: 2}, t0)
	s.addBatch(keyedBatch(0, 2, 4, "k"), t0)
	s.dispatch(t0)
	if len(k.got) != 3 || k.got[2].Msg.Offset != 2 {
		t.Fatalf("after the partition came back: %v, want 0@2 delivered", k.got[2:])
	}
}

// Failed deliveries that do not count toward MaxAttempts: a nack flagged
// unprocessed, a disconnect within DisconnectWindow of the last one counted
// (clients dropping together), a client's goodbye (a retiring session of
// the Go and Python clients holds, unprocessed, what reached it after it
// gave one delivery back: each goodbye cost those an attempt), and a
// connection the daemon itself closed (a spread member that stops serving
// sends its clients away). Each step fails the one delivery out
// and the next delivery's attempt shows what was counted.
func TestFailuresThatDoNotCount(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	type step struct {
		after time.Duration // since the previous step
		how   string        // "nack", "unprocessed", "leave", "goodbye" or "timeout"
		want  uint32        // the attempt of the redelivery
	}
	for _, tc := range []struct {
		name       string
		window     time.Duration
		steps      []step
		notCounted uint64
	}{
		{"an unprocessed nack", window, []step{{0, "unprocessed", 1}, {0, "unprocessed", 1}, {0, "nack", 2}}, 2},
		{"disconnects together", window, []step{{0, "leave", 2}, {10 * time.Millisecond, "leave", 2},
			{time.Second, "leave", 2}, {window - time.Second - 10*time.Millisecond, "leave", 3}, {0, "leave", 3}}, 3},
		{"a disconnect after a timeout", window, []step{{0, "timeout", 2}, {0, "leave", 3}, {0, "leave", 3}}, 1},
		{"no window", 0, []step{{0, "leave", 2}, {0, "leave", 3}, {0, "unprocessed", 3}}, 1},
		{"goodbyes", window, []step{{0, "goodbye", 1}, {0, "goodbye", 1}, {0, "leave", 2}, {0, "goodbye", 2}}, 3},
		{"connections the daemon closed", window, []step{{0, "closed", 1}, {0, "closed", 1}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(timeout)
			s.disconnectWindow = tc.window
			s.maxAttempts, s.deadLetter = 3, &recDeadLetter{}
			next := uint64(1)
			var sink *recSink
			join := func() {
				sink = &recSink{}
				s.join(next, fmt.Sprint("c", next), 1, sink)
				next++
			}
			join()
			now := t0
			s.addBatch(batch(0, 0, 1), t0)
			s.dispatch(now)
			for i, st := range tc.steps {
				now = now.Add(st.after)
				out := last(sink)
				switch st.how {
				case "nack", "unprocessed":
					s.nack(next-1, []uint64{out.ID}, NackInfo{Unprocessed: st.how == "unprocessed"}, now)
				case "leave":
					s.leave(next-1, LeaveDisconnect, now)
					join()
				case "goodbye":
					s.leave(next-1, LeaveGoodbye, now)
					join()
				case "closed":
					s.leave(next-1, LeaveShutdown, now)
					join()
				case "timeout":
					now = now.Add(timeout)
					s.expire(now)
				}
				s.dispatch(now)
				if len(sink.got) == 0 || last(sink).ID == out.ID {
					t.Fatalf("step %d (%s): no redelivery", i+1, st.how)
				}
				if got := last(sink).Attempt; got != st.want {
					t.Fatalf("step %d (%s): redelivered with attempt %d, want %d", i+1, st.how, got, st.want)
				}
			}
			if st := s.snapshot(); st.NotCounted != tc.notCounted || st.DeadLettered != 0 {
				t.Fatalf("not counted %d, dead-lettered %d; want %d, 0", st.NotCounted, st.DeadLettered, tc.notCounted)
			}
		})
	}
}
