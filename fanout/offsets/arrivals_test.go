package offsets

import (
	"maps"
	"testing"
	"time"
)

var base = time.Unix(1_700_000_000, 0)

// at returns base plus s seconds.
func at(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }

// receiveBatch receives offsets from..to (inclusive) of p and marks them as
// arrived at when, as the dispatcher does once per batch.
func receiveBatch(tr *Tracker, p int32, from, to int64, when time.Time) {
	mark, ok := tr.Receivable(p)
	if !ok {
		mark = from
	}
	for o := from; o <= to; o++ {
		tr.Received(p, o)
	}
	tr.Arrived(p, mark, when)
}

func wantOldest(t *testing.T, tr *Tracker, p int32, want time.Time, ok bool) {
	t.Helper()
	got, gotOK := tr.OldestPending(p)
	if gotOK != ok || !got.Equal(want) {
		t.Fatalf("OldestPending(%d) = %v, %v; want %v, %v", p, got, gotOK, want, ok)
	}
}

// The oldest pending message's arrival follows the lowest unacked offset:
// an ack behind it changes nothing, an ack of it moves to the next unacked
// one's batch, and nothing pending reports none.
func TestOldestPendingFollowsLowestUnacked(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	wantOldest(t, tr, 0, time.Time{}, false)
	receiveBatch(tr, 0, 0, 2, at(1))
	receiveBatch(tr, 0, 3, 5, at(5))
	receiveBatch(tr, 0, 6, 6, at(9))
	wantOldest(t, tr, 0, at(1), true)

	tr.Ack(0, 1) // behind 0: still the first batch
	tr.Ack(0, 3)
	wantOldest(t, tr, 0, at(1), true)
	tr.Ack(0, 0)
	tr.Ack(0, 2) // 3 acked too: the lowest unacked is 4, of the second batch
	wantOldest(t, tr, 0, at(5), true)
	tr.Ack(0, 4)
	tr.Ack(0, 5)
	wantOldest(t, tr, 0, at(9), true)
	tr.Ack(0, 6)
	wantOldest(t, tr, 0, time.Time{}, false)

	receiveBatch(tr, 0, 7, 8, at(20))
	wantOldest(t, tr, 0, at(20), true)
	if n := tr.get(0).arrivals.n; n != 1 {
		t.Fatalf("%d marks held for one pending batch", n)
	}
}

// Marks are held only for pending batches: a partition that keeps acking
// holds one or two however many batches went through, and one whose first
// message is never acked holds one per batch behind it (as it holds their
// offsets), dropped once that message is acked.
func TestArrivalMarksBounded(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	for b := range int64(1000) {
		receiveBatch(tr, 0, b*4, b*4+3, at(int(b)))
		for o := b * 4; o <= b*4+3; o++ {
			tr.Ack(0, o)
		}
	}
	if n := tr.get(0).arrivals.n; n > 1 {
		t.Fatalf("%d marks held with nothing pending", n)
	}

	tr.Start(1, 0)
	for b := range int64(100) {
		receiveBatch(tr, 1, b*4, b*4+3, at(int(b)))
		for o := b * 4; o <= b*4+3; o++ {
			if o != 0 {
				tr.Ack(1, o)
			}
		}
	}
	if n := tr.get(1).arrivals.n; n != 100 {
		t.Fatalf("%d marks held behind an unacked first message, want 100 (one per batch)", n)
	}
	wantOldest(t, tr, 1, at(0), true)
	tr.Ack(1, 0)
	wantOldest(t, tr, 1, time.Time{}, false)
	receiveBatch(tr, 1, 400, 401, at(500))
	if n := tr.get(1).arrivals.n; n != 1 {
		t.Fatalf("%d marks held for one pending batch after the others were acked", n)
	}
	wantOldest(t, tr, 1, at(500), true)
}

// A restart below received offsets forgets their marks with them; the
// offsets received again arrive anew, and unacked offsets below the restart
// keep their own arrival.
func TestArrivalsAcrossRestart(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	receiveBatch(tr, 0, 0, 1, at(1))
	receiveBatch(tr, 0, 2, 9, at(2))
	tr.Start(0, 5) // 5..9 forgotten; 0..4 stay pending
	receiveBatch(tr, 0, 5, 9, at(30))
	wantOldest(t, tr, 0, at(1), true)
	for o := int64(0); o < 3; o++ {
		tr.AckIn(0, o, 1) // received before the restart, in generation 1
	}
	wantOldest(t, tr, 0, at(2), true) // 3 and 4, of the batch received at 2
	tr.AckIn(0, 3, 1)
	tr.AckIn(0, 4, 1)
	wantOldest(t, tr, 0, at(30), true)

	tr.Start(0, 2) // below everything: all forgotten, nothing pending
	wantOldest(t, tr, 0, time.Time{}, false)
	receiveBatch(tr, 0, 2, 3, at(40))
	wantOldest(t, tr, 0, at(40), true)

	tr.Forget(0)
	wantOldest(t, tr, 0, time.Time{}, false)
}

// A batch re-fetched in part is marked from the first offset it adds; a
// mark for offsets already marked is ignored.
func TestArrivalsOfARefetch(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	receiveBatch(tr, 0, 0, 3, at(1))
	receiveBatch(tr, 0, 2, 5, at(7)) // 2 and 3 again: only 4 and 5 are new
	tr.Arrived(0, 1, at(9))          // out of order: ignored
	for o := int64(0); o < 4; o++ {
		tr.Ack(0, o)
	}
	wantOldest(t, tr, 0, at(7), true)
}

func TestOldestPendingAll(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	tr.Start(1, 0)
	tr.Start(70000, 0) // sparse
	receiveBatch(tr, 0, 0, 0, at(3))
	receiveBatch(tr, 70000, 0, 1, at(4))
	receiveBatch(tr, 1, 0, 0, at(5))
	tr.Ack(1, 0)
	if got := tr.OldestPendingAll(); !maps.EqualFunc(got, map[int32]time.Time{0: at(3), 70000: at(4)}, time.Time.Equal) {
		t.Fatalf("OldestPendingAll = %v", got)
	}
}

// A batch that adds nothing (all of it re-fetched) leaves a mark that the
// next batch's arrival replaces: the next batch's messages are dated by
// their own arrival, not by the empty batch's.
func TestArrivalsOfAnEmptyBatch(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	receiveBatch(tr, 0, 0, 1, at(1))
	receiveBatch(tr, 0, 0, 1, at(5)) // nothing new
	receiveBatch(tr, 0, 2, 3, at(9))
	tr.Ack(0, 0)
	tr.Ack(0, 1)
	wantOldest(t, tr, 0, at(9), true)
}

// Receivable is where the next offset received may start: past the last
// received, or the start when nothing is pending, or a restart above both.
func TestReceivable(t *testing.T) {
	tr := NewTracker()
	if _, ok := tr.Receivable(0); ok {
		t.Fatal("an untracked partition is receivable")
	}
	tr.Start(0, 10)
	for _, step := range []struct {
		do   func()
		want int64
	}{
		{func() {}, 10},
		{func() { tr.Received(0, 10); tr.Received(0, 12) }, 13},
		{func() { tr.Ack(0, 10); tr.Ack(0, 12) }, 13},
		{func() { tr.Received(0, 13); tr.Start(0, 50) }, 50}, // 13 stays pending below the restart
	} {
		step.do()
		if got, ok := tr.Receivable(0); !ok || got != step.want {
			t.Fatalf("Receivable = %d %v, want %d", got, ok, step.want)
		}
		if tr.Received(0, step.want-1) {
			t.Fatalf("offset %d below Receivable %d was taken", step.want-1, step.want)
		}
	}
}
