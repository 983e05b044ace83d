package dispatch

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A partition whose committable offset stays put for StallAfter while
// offsets above it are acked is reported once, with where the message
// holding it is, counted in Stats.Stalled, and reported again when it moves.
func TestStalledPartitionReported(t *testing.T) {
	t.Parallel()
	const after = time.Minute
	s, sinks := setup(10)
	s.addBatch(batch(0, 0, 3), t0)
	s.addBatch(batch(1, 0, 2), t0)
	s.dispatch(t0)
	got := sinks[0].got
	s.ack(1, []uint64{got[1].ID, got[2].ID, got[3].ID, got[4].ID}) // all but partition 0's offset 0
	if r := s.checkStalls(t0, after); r != nil {
		t.Fatalf("reports at the first check: %+v", r)
	}
	if r := s.checkStalls(t0.Add(after-time.Second), after); r != nil {
		t.Fatalf("reports before StallAfter: %+v", r)
	}
	r := s.checkStalls(t0.Add(after), after)
	if len(r) != 1 || r[0].Partition != 0 || r[0].Offset != 0 || r[0].Moved || r[0].Outstanding != 3 || r[0].For != after {
		t.Fatalf("reports %+v, want partition 0 stalled at 0 for %v with 3 offsets held", r, after)
	}
	if !strings.Contains(r[0].Where, `in flight to client "c1"`) {
		t.Errorf("where = %q, want in flight to c1", r[0].Where)
	}
	if st := s.snapshot(); !slices.Equal(st.Stalled, []int32{0}) {
		t.Errorf("Stats.Stalled = %v, want [0]", st.Stalled)
	}
	if r := s.checkStalls(t0.Add(2*after), after); r != nil {
		t.Fatalf("reported twice: %+v", r)
	}

	s.ack(1, []uint64{got[0].ID})
	r = s.checkStalls(t0.Add(2*after+time.Second), after)
	if len(r) != 1 || r[0].Partition != 0 || !r[0].Moved {
		t.Fatalf("reports %+v, want partition 0 moved", r)
	}
	if st := s.snapshot(); st.Stalled != nil {
		t.Errorf("Stats.Stalled = %v after it moved", st.Stalled)
	}
}

// A partition whose offsets move, however slowly, or that holds nothing, is
// never stalled; the watch says where a held message waits.
func TestStallWatchWhere(t *testing.T) {
	t.Parallel()
	const after = time.Minute
	s, sinks := setup(1)
	s.addBatch(batch(0, 0, 3), t0)
	s.dispatch(t0)
	for i := range 3 {
		now := t0.Add(time.Duration(i) * after)
		if r := s.checkStalls(now, after); r != nil {
			t.Fatalf("check %d: %+v while the offset moves every minute", i, r)
		}
		s.ack(1, []uint64{sinks[0].got[i].ID})
		s.dispatch(now)
	}
	if r := s.checkStalls(t0.Add(10*after), after); r != nil || s.stalls != nil {
		t.Fatalf("reports %+v, watch %v with nothing held", r, s.stalls)
	}

	s.addBatch(batch(0, 3, 5), t0) // the client holds 3: 4 waits for it
	s.dispatch(t0)
	s.nack(1, []uint64{sinks[0].got[3].ID}, NackInfo{Delay: time.Hour}, t0)
	s.checkStalls(t0, after)
	s.dispatch(t0)
	if r := s.checkStalls(t0.Add(after), after); len(r) != 1 || !strings.HasPrefix(r[0].Where, "waiting out a retry delay") {
		t.Fatalf("reports %+v, want 3 waiting out its delay", r)
	}

	s.tracker.Forget(0) // revoked or dropped: its watch goes, and so does its report
	if r := s.checkStalls(t0.Add(2*after), after); len(r) != 1 || !r[0].Moved || s.stalls != nil {
		t.Fatalf("reports %+v, watch %v after the partition was forgotten", r, s.stalls)
	}
}

// A message the tracker holds and the dispatcher does not (neither in
// flight nor buffered) would never be delivered: the report says so.
func TestStallWatchNamesALostMessage(t *testing.T) {
	t.Parallel()
	s, _ := setup()
	s.addBatch(batch(0, 0, 2), t0)
	s.fresh.pop() // offset 0 lost between the buffer and the clients
	s.checkStalls(t0, time.Minute)
	r := s.checkStalls(t0.Add(time.Minute), time.Minute)
	if len(r) != 1 || r[0].Offset != 0 || !strings.Contains(r[0].Where, "lost by the dispatcher") {
		t.Fatalf("reports %+v, want offset 0 lost by the dispatcher", r)
	}
}

// Run checks for stalls on its commit tick: a message held by a client
// that never acks it makes its partition stalled once StallAfter has
// passed, in Stats; its ack ends it.
func TestRunReportsAStalledPartition(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunReportsAStalledPartition)
}

func testRunReportsAStalledPartition(t *testing.T) {
	h := start(t, Config{StallAfter: 50 * time.Millisecond})
	k := newChanSink()
	h.d.Join(1, "holder", 10, k)
	h.src.ch <- batch(3, 0, 2)
	first, second := k.next(t), k.next(t)
	h.d.Ack(1, []uint64{second.ID})
	testutil.WaitFor(t, 5*time.Second, "partition 3 stalled", func() bool { return slices.Equal(h.stats(t).Stalled, []int32{3}) })
	h.d.Ack(1, []uint64{first.ID})
	testutil.WaitFor(t, 5*time.Second, "partition 3 no longer stalled", func() bool { return h.stats(t).Stalled == nil })
}
