package dispatch

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// ms returns t as a Delay's NotBefore.
func ms(t time.Time) int64 { return offsets.NotBefore(t) }

// A delayed message's due time goes into the progress a commit stores: a
// nack's delay and the retry backoff's, rounded up to the millisecond, and
// marks the partition's progress changed even when the failure does not
// count.
func TestDelaysInTheCommittedProgress(t *testing.T) {
	s, sinks := setup(10)
	s.tracker.TrackProgress()
	s.retryMin, s.retryMax = time.Second, time.Second
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 4), t0)
	s.addBatch(Batch{Partition: 1, Start: 0}, t0)
	s.addBatch(batch(1, 0, 1), t0)
	s.dispatch(t0)
	s.tracker.Dirty()
	got := map[string]Delivery{}
	for _, d := range sinks[0].got {
		got[fmt.Sprintf("%d@%d", d.Msg.Partition, d.Msg.Offset)] = d
	}
	nacked := t0.Add(1500*time.Millisecond + 300*time.Microsecond)
	s.nack(1, []uint64{got["0@1"].ID}, NackInfo{Delay: 20 * time.Second}, nacked)
	s.nack(1, []uint64{got["0@3"].ID}, NackInfo{}, nacked)                                      // the backoff: 0.5 to 1 s
	s.nack(1, []uint64{got["1@0"].ID}, NackInfo{Delay: time.Minute, Unprocessed: true}, nacked) // does not count, waits
	offs := s.tracker.Dirty()
	if !reflect.DeepEqual(offs, map[int32]int64{0: 0, 1: 0}) {
		t.Fatalf("Dirty = %v, want both partitions", offs)
	}
	prog := s.progress(offs)
	backoff := s.delays[slices.IndexFunc(s.delays, func(d delayed) bool { return d.msg.Offset == 3 })].due
	want := map[int32]offsets.Progress{
		0: {Base: 0, Failed: []offsets.Failure{{Offset: 1, Count: 1}, {Offset: 3, Count: 1}},
			Delayed: []offsets.Delay{{Offset: 1, NotBefore: ms(t0) + 21_501}, {Offset: 3, NotBefore: ms(backoff)}}},
		1: {Base: 0, Delayed: []offsets.Delay{{Offset: 0, NotBefore: ms(t0) + 61_501}}},
	}
	if !reflect.DeepEqual(prog, want) {
		t.Fatalf("progress %+v, want %+v", prog, want)
	}
	// Once the delay is over the message is no longer delayed.
	s.ack(1, []uint64{got["0@0"].ID, got["0@2"].ID})
	s.expire(nacked.Add(time.Minute))
	s.dispatch(nacked.Add(time.Minute))
	if prog := s.progress(map[int32]int64{0: 0}); len(prog[0].Delayed) != 0 {
		t.Fatalf("delays %+v after they ended", prog[0].Delayed)
	}
}

// A message restored with a not-before time waits for it before its first
// delivery (on the dispatcher's clock), with its failure count; one whose
// time has passed goes at once; a time far ahead (a member whose clock is
// behind) is cut to the longest delay a nack may ask for. While it waits it
// is delayed like any, and in the progress of the next commit.
func TestRestoredDelayWaits(t *testing.T) {
	s, sinks := setup(10)
	s.tracker.TrackProgress()
	s.restore = newRestore(map[int32]offsets.Progress{0: {Base: 10,
		Failed:  []offsets.Failure{{Offset: 11, Count: 2}, {Offset: 13, Count: 1}},
		Delayed: []offsets.Delay{{Offset: 11, NotBefore: ms(t0) + 10_000}, {Offset: 12, NotBefore: ms(t0) + 3_600_000}, {Offset: 13, NotBefore: ms(t0) - 1}}}})
	s.addBatch(Batch{Partition: 0, Start: 10}, t0)
	s.addBatch(batch(0, 10, 15), t0)
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{10, 13, 14}) {
		t.Fatalf("delivered %v at once, want 10, 13 (its time passed) and 14", got)
	}
	if st := s.snapshot(); st.Delayed != 2 || st.Buffered != 2 {
		t.Fatalf("delayed %d, buffered %d; want 2 and 2", st.Delayed, st.Buffered)
	}
	prog := s.progress(map[int32]int64{0: 10})
	wantDelays := []offsets.Delay{{Offset: 11, NotBefore: ms(t0) + 10_000}, {Offset: 12, NotBefore: ms(t0.Add(protocol.MaxNackDelay))}}
	if !reflect.DeepEqual(prog[0].Delayed, wantDelays) {
		t.Fatalf("delays in the progress %+v, want %+v", prog[0].Delayed, wantDelays)
	}
	step := func(at time.Time) {
		s.ack(1, ids(sinks[0].got)) // no ack timeout in the way
		s.expire(at)
		s.dispatch(at)
	}
	step(t0.Add(10*time.Second - time.Millisecond))
	if n := len(sinks[0].got); n != 3 {
		t.Fatalf("%d deliveries before 11's time, want 3", n)
	}
	if due, ok := s.nextDeadline(); !ok || !due.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("next deadline %v, %v; want 11's time", due, ok)
	}
	step(t0.Add(10 * time.Second))
	if d := last(sinks[0]); d.Msg.Offset != 11 || d.Attempt != 3 {
		t.Fatalf("at 11's time: %d attempt %d, want 11 attempt 3", d.Msg.Offset, d.Attempt)
	}
	step(t0.Add(protocol.MaxNackDelay - time.Millisecond))
	if n := len(sinks[0].got); n != 4 {
		t.Fatalf("%d deliveries before 12's cut time, want 4", n)
	}
	step(t0.Add(protocol.MaxNackDelay))
	if d := last(sinks[0]); d.Msg.Offset != 12 || d.Attempt != 1 {
		t.Fatalf("at 12's cut time: %d attempt %d, want 12 attempt 1", d.Msg.Offset, d.Attempt)
	}
}

// In key order a restored delayed message keeps its key's order: it waits
// behind an earlier message of its key still unacked, then waits out its
// time holding the key, the later messages of its key behind it.
func TestRestoredDelayKeepsKeyOrder(t *testing.T) {
	s, sinks := setup(10)
	s.keys = map[uint64]keyGate{}
	s.tracker.TrackProgress()
	s.restore = newRestore(map[int32]offsets.Progress{0: {Base: 0,
		Delayed: []offsets.Delay{{Offset: 1, NotBefore: ms(t0) + 10_000}, {Offset: 3, NotBefore: ms(t0) + 5_000}}}})
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(keysBatch("a", "a", "a", "b", "b"), t0)
	s.dispatch(t0)
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0}) {
		t.Fatalf("delivered %v at once, want 0 alone (1 behind it, 2 behind 1; 3 waits its time, 4 behind it)", got)
	}
	prog := s.progress(map[int32]int64{0: 0})
	if want := []offsets.Delay{{Offset: 1, NotBefore: ms(t0) + 10_000}, {Offset: 3, NotBefore: ms(t0) + 5_000}}; !reflect.DeepEqual(prog[0].Delayed, want) {
		t.Fatalf("delays in the progress %+v, want %+v (1 waits for its key, still delayed)", prog[0].Delayed, want)
	}
	at := t0.Add(time.Second)
	s.ack(1, ids(sinks[0].got))
	s.expire(at)
	s.dispatch(at)
	if len(sinks[0].got) != 1 {
		t.Fatalf("after 0's ack: %v, want nothing (1 waits its time, holding a)", offsetsOf(sinks[0].got))
	}
	for _, step := range []struct {
		at   time.Duration
		want []int64
	}{{5 * time.Second, []int64{0, 3}}, {10 * time.Second, []int64{0, 3, 1}}} {
		s.expire(t0.Add(step.at))
		s.dispatch(t0.Add(step.at))
		if got := offsetsOf(sinks[0].got); !slices.Equal(got, step.want) {
			t.Fatalf("at t0+%v: %v, want %v", step.at, got, step.want)
		}
	}
	s.ack(1, ids(sinks[0].got[1:]))
	s.dispatch(t0.Add(10 * time.Second))
	if got := offsetsOf(sinks[0].got); !slices.Equal(got, []int64{0, 3, 1, 4, 2}) {
		t.Fatalf("at the end: %v, want 4 and 2 after their keys' messages", got)
	}
}

// A second failover soon after the first: what the restored progress says
// of offsets not received yet stays in the progress committed meanwhile
// (acked ranges, failure counts, delays), so that the next member restores
// it all the same.
func TestRestoredProgressCarriedUntilReceived(t *testing.T) {
	s, _ := setup(10)
	s.tracker.TrackProgress()
	stored := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 15}, {First: 20, Last: 21}},
		Failed:  []offsets.Failure{{Offset: 11, Count: 1}, {Offset: 18, Count: 4}},
		Delayed: []offsets.Delay{{Offset: 11, NotBefore: ms(t0) + 9_000}, {Offset: 18, NotBefore: ms(t0) + 7_000}}}
	s.restore = newRestore(map[int32]offsets.Progress{0: stored})
	s.addBatch(Batch{Partition: 0, Start: 10}, t0)
	s.addBatch(batch(0, 10, 14), t0) // 10-13 received; 14 on not yet
	s.dispatch(t0)
	got := s.progress(map[int32]int64{0: 10})[0]
	if !reflect.DeepEqual(got.Acked, []offsets.Range{{First: 12, Last: 13}, {First: 14, Last: 15}, {First: 20, Last: 21}}) ||
		!reflect.DeepEqual(got.Failed, stored.Failed) || !reflect.DeepEqual(got.Delayed, stored.Delayed) {
		t.Fatalf("progress %+v, want what was stored (%+v)", got, stored)
	}
	if got.Encode() != "v1 b=10 f=1:1,7:4 a=1+2,0+2,4+2" {
		t.Fatalf("encoded %q", got.Encode())
	}
}

// revokingWithDelays returns a state whose partition 0 is being revoked:
// offset 0 was nacked with a 30 s delay at t0, before the revocation began
// (and committed: nothing is dirty then); during it, offset 1 with a 40 s
// delay a second later, and offset 2 acked.
func revokingWithDelays() *state {
	s, sinks := setup(10)
	s.parts = map[int32]*owned{}
	s.tracker.TrackProgress()
	s.assign(0, testTerm(10), offsets.Progress{})
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 3), t0)
	s.dispatch(t0)
	s.nack(1, ids(sinks[0].got[:1]), NackInfo{Delay: 30 * time.Second}, t0)
	s.tracker.Dirty()
	s.revokeStart(0, t0.Add(time.Minute), make(chan revokeReply, 1))
	s.nack(1, ids(sinks[0].got[1:2]), NackInfo{Delay: 40 * time.Second}, t0.Add(time.Second))
	s.ack(1, ids(sinks[0].got[2:]))
	return s
}

// revokedDelays are the delays of revokingWithDelays' partition.
var revokedDelays = []offsets.Delay{{Offset: 0, NotBefore: ms(t0) + 30_000}, {Offset: 1, NotBefore: ms(t0) + 41_000}}

// A handoff's final commit carries the partition's delays: those waiting in
// the heap when the revocation began and that of a delivery nacked with a
// delay meanwhile.
func TestRevokeCarriesDelays(t *testing.T) {
	s := revokingWithDelays()
	_, off, _, _, prog := s.revokeEnd(0)
	want := revokedDelays
	if off != 0 || !reflect.DeepEqual(prog.Delayed, want) {
		t.Fatalf("revoked at %d with delays %+v, want 0 and %+v", off, prog.Delayed, want)
	}
}

// While a partition is revoked, the commits made before its final one keep
// its delays in the progress they store: the revocation takes its delayed
// messages out of the heap, and a commit of an ack that arrives meanwhile
// wrote the partition's progress without them, so that a member killed
// before its final commit lost the delays it had stored (a chaos run: a
// 10 s nack delay came again after 8.9 s from the restarted member).
func TestRevokeKeepsDelaysInTheCommitsBeforeTheFinalOne(t *testing.T) {
	s := revokingWithDelays()
	offs := s.tracker.Dirty()
	if _, ok := offs[0]; !ok {
		t.Fatalf("Dirty = %v, want partition 0 (its progress changed)", offs)
	}
	want := revokedDelays
	if got := s.progress(offs)[0].Delayed; !reflect.DeepEqual(got, want) {
		t.Fatalf("a commit during the revocation stores delays %+v, want %+v", got, want)
	}
	if _, _, _, _, prog := s.revokeEnd(0); !reflect.DeepEqual(prog.Delayed, want) {
		t.Fatalf("the final commit stores delays %+v, want %+v", prog.Delayed, want)
	}
}

// Through the dispatcher and a store, on a fake clock: a message nacked
// with a 20 s delay, the dispatcher stopped 5 s later and another started
// from what the store holds: the message comes again no sooner than 20 s
// after the nack; the others at once.
func TestRunDelaySurvivesARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := offsets.NewMemoryStore()
		h := start(t, Config{Store: mem, Scope: WholeTopic(mem.NewTerm())})
		k := newChanSink()
		h.d.Join(1, "a", 10, k)
		h.src.ch <- Batch{Partition: 0, Start: 0}
		h.src.ch <- batch(0, 0, 3)
		var got []Delivery
		for range 3 {
			got = append(got, k.next(t))
		}
		nacked := time.Now()
		h.d.Nack(1, []uint64{got[1].ID}, NackInfo{Delay: 20 * time.Second})
		h.d.Ack(1, []uint64{got[0].ID})
		time.Sleep(5 * time.Second) // commit intervals pass
		synctest.Wait()
		h.cancel() // 2 unacked: redelivered by the next dispatcher
		<-h.done

		stored, _ := mem.Load(context.Background())
		progress, err := mem.LoadProgress(context.Background())
		if err != nil || stored[0] != 1 || len(progress[0].Delayed) != 1 {
			t.Fatalf("stored %v, progress %+v, %v", stored, progress, err)
		}
		h2 := start(t, Config{Store: mem, Scope: WholeTopic(mem.NewTerm()), Stored: stored, Progress: progress})
		k2 := newChanSink()
		h2.d.Join(1, "a", 10, k2)
		h2.src.ch <- Batch{Partition: 0, Start: stored[0]}
		h2.src.ch <- batch(0, 1, 3)
		if d := k2.next(t); d.Msg.Offset != 2 || time.Since(nacked) > 6*time.Second {
			t.Fatalf("first after the restart: %d at nack+%v, want 2 at once", d.Msg.Offset, time.Since(nacked))
		}
		var d Delivery
		select {
		case d = <-k2.ch:
		case <-time.After(time.Minute):
			t.Fatal("1 not delivered again within a minute")
		}
		if waited := time.Since(nacked); waited < 20*time.Second || d.Attempt != 2 {
			t.Fatalf("1 came again %v after its nack with a 20s delay, attempt %d; want at least 20s, attempt 2", waited, d.Attempt)
		}
	})
}
