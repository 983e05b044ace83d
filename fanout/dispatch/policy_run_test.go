package dispatch

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// chanDeadLetter stores dead letters when the test says so.
type chanDeadLetter struct {
	mu     sync.Mutex
	sent   []DeadLetterRecord
	stored chan []*Message
}

func newChanDeadLetter() *chanDeadLetter { return &chanDeadLetter{stored: make(chan []*Message, 10)} }

func (c *chanDeadLetter) Send(r DeadLetterRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, r)
}
func (c *chanDeadLetter) Stored() <-chan []*Message { return c.stored }
func (c *chanDeadLetter) records() []DeadLetterRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]DeadLetterRecord(nil), c.sent...)
}

// Acked ranges and failure counts go to a store that keeps progress with
// each commit; a dispatcher started from what it loads does not deliver the
// acked ones again, and resumes the others' attempts.
func TestRunProgressSurvivesARestart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunProgressSurvivesARestart)
}

func testRunProgressSurvivesARestart(t *testing.T) {
	mem := offsets.NewMemoryStore()
	h := start(t, Config{Store: mem, Scope: WholeTopic(mem.NewTerm())})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, 6)
	got := map[int64]Delivery{}
	for range 6 {
		d := k.next(t)
		got[d.Msg.Offset] = d
	}
	h.d.Ack(1, []uint64{got[1].ID, got[2].ID, got[4].ID})
	h.d.Nack(1, []uint64{got[3].ID}, NackInfo{}) // delivered again at once, not acked (a delay's restore: TestRunDelaySurvivesARestart)
	testutil.WaitFor(t, 5*time.Second, "progress stored", func() bool {
		pr, _ := mem.LoadProgress(context.Background())
		return len(pr[0].Acked) == 2 && len(pr[0].Failed) == 1
	})
	h.cancel() // 0 and 5 unacked: redelivered by the next dispatcher
	<-h.done

	stored, _ := mem.Load(context.Background())
	progress, err := mem.LoadProgress(context.Background())
	if err != nil || stored[0] != 0 {
		t.Fatalf("stored %v, %v", stored, err)
	}
	h2 := start(t, Config{Store: mem, Scope: WholeTopic(mem.NewTerm()), Stored: stored, Progress: progress})
	k2 := newChanSink()
	h2.d.Join(1, "a", 10, k2)
	h2.src.ch <- Batch{Partition: 0, Start: stored[0]}
	h2.src.ch <- batch(0, 0, 6)
	attempts := map[int64]uint32{}
	for range 3 {
		d := k2.next(t)
		attempts[d.Msg.Offset] = d.Attempt
		h2.d.Ack(1, []uint64{d.ID})
	}
	if len(attempts) != 3 || attempts[0] != 1 || attempts[3] != 2 || attempts[5] != 1 {
		t.Fatalf("redelivered %v (offset: attempt), want 0, 3 (its second attempt) and 5", attempts)
	}
	// The batch was taken whole before its deliveries went out.
	if st := h2.stats(t); st.Skipped != 3 || st.Delivered != 3 {
		t.Fatalf("skipped %d, delivered %d; want 3 and 3", st.Skipped, st.Delivered)
	}
	testutil.WaitFor(t, 5*time.Second, "commit of 6", func() bool { o, _ := mem.Load(context.Background()); return o[0] == 6 })
}

// A dead letter holds its partition's offset until the DeadLetter stores it;
// a drain waits for it too.
func TestRunDeadLetterHoldsTheOffset(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDeadLetterHoldsTheOffset)
}

func testRunDeadLetterHoldsTheOffset(t *testing.T) {
	dl := newChanDeadLetter()
	h := start(t, Config{MaxAttempts: 1, DeadLetter: dl, DrainTimeout: 5 * time.Second})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, 2)
	first, second := k.next(t), k.next(t)
	h.d.Nack(1, []uint64{first.ID}, NackInfo{Reason: "bad"})
	h.d.Ack(1, []uint64{second.ID})
	testutil.WaitFor(t, 5*time.Second, "the dead letter sent", func() bool { return len(dl.records()) == 1 })
	testutil.WaitFor(t, 5*time.Second, "offset 1's ack taken", func() bool { return h.stats(t).Acked == 1 })
	if st := h.stats(t); st.DeadLetterPending != 1 || st.Outstanding[0] != 2 {
		t.Fatalf("dead letters pending %d, offsets held %d; want 1 and 2 (0 not stored, 1 behind it)", st.DeadLetterPending, st.Outstanding[0])
	}
	h.cancel() // drain: waits for the dead letter
	if bye := <-k.bye; bye == "" {
		t.Fatal("no goodbye")
	}
	if _, running := h.d.Stats(context.Background()); !running {
		t.Fatal("Run returned with a dead letter not stored")
	}
	if o := h.store.get()[0]; o != 0 {
		t.Fatalf("committed %d while the dead letter is not stored", o)
	}
	dl.stored <- []*Message{dl.records()[0].Msg}
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	if o := h.store.get()[0]; o != 2 {
		t.Fatalf("final commit %d, want 2", o)
	}
}

func TestNewRefusesMaxAttemptsWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	mem := offsets.NewMemoryStore()
	if _, err := New(Config{Store: mem, Scope: WholeTopic(mem.NewTerm()), MaxAttempts: 3}, newFakeSource()); err == nil {
		t.Fatal("New accepted MaxAttempts without a DeadLetter")
	}
	if _, err := New(Config{Store: mem, Scope: WholeTopic(mem.NewTerm()), MaxAttempts: -1}, newFakeSource()); err == nil {
		t.Fatal("New accepted a negative MaxAttempts")
	}
}

// Through the Backend: a nack's delay is waited out on the dispatcher's one
// timer (measured from before the nack: never earlier), and an observer
// gets its copies.
func TestRunNackDelayAndObserver(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunNackDelayAndObserver)
}

func testRunNackDelayAndObserver(t *testing.T) {
	h := start(t, Config{})
	k, obs := newChanSink(), newChanSink()
	h.d.Join(1, "a", 10, k)
	h.d.Observe(2, "watch", obs)
	// Requests are handled in order: once the stats answer, the observer
	// has joined, before the message arrives.
	if st := h.stats(t); st.Observers != 1 {
		t.Fatalf("observers %d, want 1", st.Observers)
	}
	h.src.ch <- batch(0, 0, 1)
	d := k.next(t)
	if c := obs.next(t); c.ID != 0 || c.Msg != d.Msg {
		t.Fatalf("observer copy %+v of %+v", c, d)
	}
	const delay = 200 * time.Millisecond
	before := time.Now()
	h.d.Nack(1, []uint64{d.ID}, NackInfo{Delay: delay})
	again := k.next(t)
	if waited := time.Since(before); waited < delay || again.Attempt != 2 {
		t.Fatalf("redelivered after %v (attempt %d), want at least %v", waited, again.Attempt, delay)
	}
	if c := obs.next(t); c.Attempt != 2 {
		t.Fatalf("observer copy of the redelivery: attempt %d", c.Attempt)
	}
	if st := h.stats(t); st.Observers != 1 || st.Clients != 1 {
		t.Fatalf("stats %+v", st)
	}
}
