package dispatch

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// noDelivery fails the test if k has a delivery once every goroutine of the
// bubble is blocked.
func noDelivery(t *testing.T, k *chanSink, while string) {
	t.Helper()
	synctest.Wait()
	select {
	case d := <-k.ch:
		t.Fatalf("%s: delivery of offset %d (attempt %d)", while, d.Msg.Offset, d.Attempt)
	default:
	}
}

// clientStats returns the ClientStats of session id, failing the test when
// it is not joined.
func clientStats(t *testing.T, h *harness, id uint64) ClientStats {
	t.Helper()
	cs, ok := h.d.Clients(context.Background())
	if !ok {
		t.Fatal("dispatcher stopped")
	}
	for _, c := range cs {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("client %d not joined: %+v", id, cs)
	return ClientStats{}
}

// While the switch is on, the dispatcher hands nothing out and pauses
// fetching, but takes acks, nacks and touches, and ack timeouts run out;
// what failed meanwhile, and what was buffered, goes out once the switch
// is off. Each client's outcomes are counted.
func TestRunPauseHoldsDeliveriesUntilResumed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunPauseHoldsDeliveriesUntilResumed)
}

func testRunPauseHoldsDeliveriesUntilResumed(t *testing.T) {
	pause := NewPause()
	h := start(t, Config{Pause: pause, AckTimeout: 10 * time.Second})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- batch(0, 0, 4)
	got := map[int64]Delivery{}
	for range 4 {
		d := k.next(t)
		got[d.Msg.Offset] = d
	}

	pause.Set(true)
	testutil.WaitFor(t, 5*time.Second, "deliveries paused and fetching with them", func() bool {
		return h.stats(t).DeliveryPaused && h.src.paused.Load()
	})
	h.src.ch <- batch(0, 4, 6) // fetched before the source paused: buffered
	h.d.Ack(1, []uint64{got[0].ID})
	h.d.Nack(1, []uint64{got[1].ID}, NackInfo{})
	h.d.Touch(1, []uint64{got[2].ID})
	time.Sleep(6 * time.Second)
	h.d.Touch(1, []uint64{got[2].ID}) // kept alive past its first deadline
	time.Sleep(6 * time.Second)       // offset 3's deadline passed
	noDelivery(t, k, "paused")
	st := h.stats(t)
	if st.Acked != 1 || st.Nacked != 1 || st.Redelivered[RedeliverTimeout] != 1 || st.InFlight != 1 || st.Buffered != 4 {
		t.Fatalf("while paused: acked %d, nacked %d, timed out %d, in flight %d, buffered %d; want 1, 1, 1, 1, 4 (%+v)",
			st.Acked, st.Nacked, st.Redelivered[RedeliverTimeout], st.InFlight, st.Buffered, st)
	}
	if c := clientStats(t, h, 1); c.Acked != 1 || c.Nacked != 1 || c.TimedOut != 1 || c.Redelivered != 2 || c.InFlight != 1 {
		t.Fatalf("the client while paused: %+v", c)
	}

	pause.Set(false)
	var again []int64
	for range 4 {
		d := k.next(t)
		again = append(again, d.Msg.Offset)
		h.d.Ack(1, []uint64{d.ID})
	}
	slices.Sort(again)
	if !slices.Equal(again, []int64{1, 3, 4, 5}) {
		t.Fatalf("after the resume: offsets %v, want the nacked 1, the timed out 3 and the buffered 4 and 5", again)
	}
	h.d.Ack(1, []uint64{got[2].ID})
	testutil.WaitFor(t, 5*time.Second, "commit of 6", func() bool { return h.store.get()[0] == 6 })
	testutil.WaitFor(t, 5*time.Second, "fetching resumed", func() bool { return !h.src.paused.Load() })
	if c := clientStats(t, h, 1); c.Acked != 6 || c.Nacked != 1 || c.TimedOut != 1 || c.Redelivered != 2 {
		t.Fatalf("the client after the resume: %+v, want 6 acked, 1 nacked, 1 timed out, 2 queued again", c)
	}
}

// A dispatcher starts as its switch stands: one made while deliveries are
// paused delivers nothing until they resume.
func TestRunStartsPausedWhenTheSwitchIsOn(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunStartsPausedWhenTheSwitchIsOn)
}

func testRunStartsPausedWhenTheSwitchIsOn(t *testing.T) {
	pause := NewPause()
	pause.Set(true)
	h := start(t, Config{Pause: pause})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- batch(0, 0, 2)
	noDelivery(t, k, "started paused")
	if st := h.stats(t); !st.DeliveryPaused || !st.Paused || st.Buffered != 2 {
		t.Fatalf("stats %+v, want deliveries and fetching paused, 2 buffered", st)
	}
	if pause.Set(true) {
		t.Error("Set(true) of a switch that is on reports a change")
	}
	pause.Set(false)
	k.next(t)
	k.next(t)
}

// A paused dispatcher does not report its partitions stalled: their offsets
// stand still by the operator's choice. The watch starts again at the
// resume.
func TestRunPauseSuspendsTheStallWatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunPauseSuspendsTheStallWatch)
}

func testRunPauseSuspendsTheStallWatch(t *testing.T) {
	pause := NewPause()
	pause.Set(true)
	h := start(t, Config{Pause: pause, StallAfter: time.Minute})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- batch(0, 0, 2)
	time.Sleep(3 * time.Minute)
	synctest.Wait()
	if st := h.stats(t); len(st.Stalled) != 0 {
		t.Fatalf("stalled %v while paused", st.Stalled)
	}
	pause.Set(false)
	k.next(t) // held unacked: the partition stalls a minute after the resume
	time.Sleep(30 * time.Second)
	synctest.Wait()
	if st := h.stats(t); len(st.Stalled) != 0 {
		t.Fatalf("stalled %v half a minute after the resume: the pause counted", st.Stalled)
	}
	time.Sleep(time.Minute)
	synctest.Wait()
	if st := h.stats(t); !slices.Equal(st.Stalled, []int32{0}) {
		t.Fatalf("stalled %v, want partition 0 a minute after the resume", st.Stalled)
	}
}

// discSink is a chanSink that records Disconnect.
type discSink struct {
	*chanSink
	mu     sync.Mutex
	reason string
}

func (d *discSink) Disconnect(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reason = reason
}

func (d *discSink) disconnected() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

// A client drained gets Goodbye and no more deliveries; its acks count;
// when it has acked everything it is disconnected at once.
func TestRunDrainClientEndsOnceItHoldsNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDrainClientEndsOnceItHoldsNothing)
}

func testRunDrainClientEndsOnceItHoldsNothing(t *testing.T) {
	h := start(t, Config{DrainTimeout: time.Hour})
	a, b := &discSink{chanSink: newChanSink()}, newChanSink()
	h.d.Join(1, "a", 2, a)
	h.src.ch <- batch(0, 0, 2)
	held := []Delivery{a.next(t), a.next(t)}
	h.d.Join(2, "b", 10, b)

	drained, ok := h.d.DrainClient(context.Background(), 0, "a", "drained by ops")
	if !ok || len(drained) != 1 || drained[0].ID != 1 || drained[0].InFlight != 2 || !drained[0].Draining {
		t.Fatalf("DrainClient = %+v, %v; want session 1 holding 2", drained, ok)
	}
	if got := <-a.bye; got != "drained by ops" {
		t.Fatalf("Goodbye %q", got)
	}
	h.src.ch <- batch(0, 2, 4)
	b.next(t)
	b.next(t)
	h.d.Ack(1, []uint64{held[0].ID})
	synctest.Wait()
	if a.disconnected() != "" {
		t.Fatal("disconnected while it still holds a delivery")
	}
	h.d.Ack(1, []uint64{held[1].ID})
	testutil.WaitFor(t, 5*time.Second, "the drained client disconnected", func() bool { return a.disconnected() == "drained" })
	cs, _ := h.d.Clients(context.Background())
	if len(cs) != 1 || cs[0].ID != 2 {
		t.Fatalf("clients after the drain: %+v, want b alone", cs)
	}
	if st := h.stats(t); st.Acked != 2 || st.NotCounted != 0 {
		t.Fatalf("stats %+v: want both of a's acks counted, nothing given back", st)
	}
	noDelivery(t, a.chanSink, "drained")
}

// A client that does not ack what it holds within the drain timeout is
// disconnected then, and its deliveries go to another client without
// counting as failed attempts.
func TestRunDrainClientTimesOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDrainClientTimesOut)
}

func testRunDrainClientTimesOut(t *testing.T) {
	h := start(t, Config{DrainTimeout: 3 * time.Second, AckTimeout: time.Hour, MaxAttempts: 1, DeadLetter: newChanDeadLetter()})
	a, b := &discSink{chanSink: newChanSink()}, newChanSink()
	h.d.Join(1, "a", 10, a)
	h.src.ch <- batch(0, 0, 3)
	for range 3 {
		a.next(t)
	}
	h.d.Join(2, "b", 10, b)
	begun := time.Now()
	if drained, ok := h.d.DrainClient(context.Background(), 1, "", "drained"); !ok || len(drained) != 1 {
		t.Fatalf("DrainClient by session id = %+v, %v", drained, ok)
	}
	var offs []int64
	for range 3 {
		d := b.next(t)
		offs = append(offs, d.Msg.Offset)
		if d.Attempt != 1 {
			t.Errorf("offset %d came as attempt %d: the drain counted as a failure", d.Msg.Offset, d.Attempt)
		}
	}
	if waited := time.Since(begun); waited < 3*time.Second {
		t.Errorf("given to b %v after the drain, before the drain timeout", waited)
	}
	slices.Sort(offs)
	if !slices.Equal(offs, []int64{0, 1, 2}) || a.disconnected() == "" {
		t.Fatalf("b got %v (want 0-2); a disconnected %q", offs, a.disconnected())
	}
	if st := h.stats(t); st.NotCounted != 3 || st.DeadLetterPending != 0 {
		t.Fatalf("stats %+v: want 3 failures not counted, none dead-lettered", st)
	}
	if drained, ok := h.d.DrainClient(context.Background(), 0, "a", "again"); !ok || len(drained) != 0 {
		t.Fatalf("draining a client gone: %+v, %v", drained, ok)
	}
}

// An observer drained leaves at once.
func TestRunDrainObserver(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDrainObserver)
}

func testRunDrainObserver(t *testing.T) {
	h := start(t, Config{})
	o := &discSink{chanSink: newChanSink()}
	h.d.Observe(3, "watcher", o)
	drained, ok := h.d.DrainClient(context.Background(), 0, "watcher", "drained")
	if !ok || len(drained) != 1 || !drained[0].Observer {
		t.Fatalf("DrainClient = %+v, %v", drained, ok)
	}
	if o.disconnected() != "drained" || <-o.bye != "drained" {
		t.Fatalf("the observer was not told goodbye and disconnected")
	}
	if st := h.stats(t); st.Observers != 0 {
		t.Fatalf("%d observers after the drain", st.Observers)
	}
}

// The messages a client failed for the last time count as its dead
// letters, and wait per partition until stored.
func TestRunCountsDeadLettersPerClientAndPartition(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunCountsDeadLettersPerClientAndPartition)
}

func testRunCountsDeadLettersPerClientAndPartition(t *testing.T) {
	dl := newChanDeadLetter()
	h := start(t, Config{MaxAttempts: 1, DeadLetter: dl})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- batch(0, 0, 1)
	h.src.ch <- batch(2, 0, 2)
	var ds []Delivery
	for range 3 {
		ds = append(ds, k.next(t))
	}
	h.d.Nack(1, ids(ds), NackInfo{Reason: "bad"})
	testutil.WaitFor(t, 5*time.Second, "three dead letters handed over", func() bool { return len(dl.records()) == 3 })
	st := h.stats(t)
	if st.DeadLetterPendingBy[0] != 1 || st.DeadLetterPendingBy[2] != 2 || len(st.DeadLetterPendingBy) != 2 {
		t.Fatalf("dead letters pending by partition %v, want 0:1 2:2", st.DeadLetterPendingBy)
	}
	if c := clientStats(t, h, 1); c.DeadLettered != 3 || c.Nacked != 3 {
		t.Fatalf("client %+v, want 3 nacked and dead-lettered", c)
	}
	var msgs []*Message
	for _, r := range dl.records()[:2] {
		msgs = append(msgs, r.Msg)
	}
	dl.stored <- msgs
	testutil.WaitFor(t, 5*time.Second, "two stored", func() bool { return h.stats(t).DeadLetterPending == 1 })
	if st := h.stats(t); len(st.DeadLetterPendingBy) != 1 || st.DeadLetterPendingBy[dl.records()[2].Msg.Partition] != 1 {
		t.Fatalf("dead letters pending by partition %v after two were stored", st.DeadLetterPendingBy)
	}
}
