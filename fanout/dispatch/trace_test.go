package dispatch

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// openLog opens a delivery log in a temporary directory; read returns its
// events once it is closed, the Open event left out.
func openLog(t *testing.T) (l *deliverylog.Log, read func() []deliverylog.Event) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "delivery.log")
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	l, err := deliverylog.OpenFile(path, "d0", logrus.NewEntry(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return l, func() []deliverylog.Event {
		t.Helper()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		evs, bad, err := deliverylog.ReadFile(path)
		if err != nil || bad != 0 || len(evs) == 0 || evs[0].Kind != deliverylog.Open {
			t.Fatalf("log: %d events, %d bad lines, err %v", len(evs), bad, err)
		}
		return evs[1:]
	}
}

// line is what a test compares of an event.
func line(e deliverylog.Event) string {
	return fmt.Sprintf("%v %d/%d a%d s%d %s %s", e.Kind, e.Partition, e.Offset, e.Attempt, e.Session, e.Detail, e.Client)
}

// checkOutcomes checks that every event with a delivery id names one the
// log delivered before, to the same session, with the same attempt.
func checkOutcomes(t *testing.T, evs []deliverylog.Event) {
	t.Helper()
	sent := map[uint64]deliverylog.Event{}
	for _, e := range evs {
		switch {
		case e.Kind == deliverylog.Deliver:
			if _, dup := sent[e.ID]; dup || e.ID == 0 {
				t.Fatalf("delivery id %d logged twice or zero", e.ID)
			}
			sent[e.ID] = e
		case e.ID != 0:
			d, ok := sent[e.ID]
			if !ok || d.Session != e.Session || d.Attempt != e.Attempt || d.Offset != e.Offset {
				t.Fatalf("%s names no delivery of its own: %+v", line(e), d)
			}
			delete(sent, e.ID)
		}
	}
}

// Every attempt of a message and its outcome, and whether its failure
// counted toward MaxAttempts, until it is dead-lettered.
func TestDeliveryLogRecordsEveryAttemptAndItsOutcome(t *testing.T) {
	t.Parallel()
	l, read := openLog(t)
	now := t0
	s := newState(timeout)
	// The state's clock runs a little ahead of the rounds' time.
	s.trace, s.now = l, func() time.Time { return now.Add(time.Millisecond) }
	s.maxAttempts, s.deadLetter, s.disconnectWindow = 3, &recDeadLetter{}, 2*time.Second
	k1, k2 := &recSink{}, &recSink{}
	s.join(1, "c1", 1, k1)
	s.join(2, "c2", 1, k2)
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(now)                                                       // 0 to c1, 1 to c2
	s.ack(1, ids(k1.got))                                                 // 0 done
	s.nack(2, ids(k2.got), NackInfo{Unprocessed: true}, now)              // 1 given back: not counted
	s.dispatch(now)                                                       // 1 to c1 (another client)
	s.leave(1, LeaveDisconnect, now)                                      // counted
	s.dispatch(now)                                                       // 1 to c2, attempt 2
	now = now.Add(timeout)                                                //
	s.expire(now)                                                         // counted
	s.dispatch(now)                                                       // 1 to c2 again, attempt 3
	s.nack(2, []uint64{last(k2).ID}, NackInfo{Reason: "no"}, now)         // counted: the third
	s.deadLettered([]*Message{s.deadLetter.(*recDeadLetter).sent[0].Msg}) // stored
	evs := read()
	checkLog(t, evs, []string{
		"join -1/-1 a0 s1  c1",
		"join -1/-1 a0 s2  c2",
		"restart 0/0 a0 s0  ",
		"deliver 0/0 a1 s1  c1",
		"deliver 0/1 a1 s2  c2",
		"ack 0/0 a1 s1  c1",
		"nack 0/1 a1 s2 uncounted-unprocessed c2",
		"deliver 0/1 a1 s1  c1",
		"gone 0/1 a1 s1 counted c1",
		"deliver 0/1 a2 s2  c2",
		"timeout 0/1 a2 s2 counted c2",
		"deliver 0/1 a3 s2  c2",
		"nack 0/1 a3 s2 counted c2",
		"dead-letter 0/1 a3 s0 nack ",
		"dead-lettered 0/1 a3 s0  ",
	})
	checkOutcomes(t, evs)
	// A delivery is stamped with the round's time, which its ack deadline
	// counts from: its timeout comes no sooner than the ack timeout after.
	for _, e := range evs {
		if e.Kind == deliverylog.Deliver && !e.At.Equal(t0) && !e.At.Equal(t0.Add(timeout)) {
			t.Fatalf("%s stamped %v, not its round's time", line(e), e.At.Sub(t0))
		}
		if e.Kind == deliverylog.Timeout && e.At.Sub(evs[9].At) < timeout {
			t.Fatalf("timed out %v after its delivery", e.At.Sub(evs[9].At))
		}
	}
}

// checkLog compares the events, as lines, with want.
func checkLog(t *testing.T, evs []deliverylog.Event, want []string) {
	t.Helper()
	var got []string
	for _, e := range evs {
		got = append(got, line(e))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("log:\n%s\nwant:\n%s", join(got), join(want))
	}
}

func join(ls []string) string {
	out := ""
	for _, l := range ls {
		out += "  " + l + "\n"
	}
	return out
}

// Per-partition mode: a partition assigned, handed over (a delivery that
// comes back is left to the next owner, one still out at the end is
// dropped), assigned again and lost.
func TestDeliveryLogRecordsWhatThePartitionsDo(t *testing.T) {
	t.Parallel()
	l, read := openLog(t)
	now := t0
	s, sinks := setup(1, 1)
	s.parts = map[int32]*owned{}
	s.trace, s.now = l, func() time.Time { return now }
	s.assign(0, testTerm(1), offsets.Progress{})
	s.tracePartition(deliverylog.Assign, 0, -1, "") // as the dispatcher's handle does
	s.addBatch(batch(0, 0, 2), t0)
	s.dispatch(now)
	reply := make(chan revokeReply, 1)
	s.revokeStart(0, now.Add(time.Second), reply)
	s.nack(1, ids(sinks[0].got), NackInfo{}, now)
	s.revokeEnd(0)
	s.assign(0, testTerm(2), offsets.Progress{})
	s.addBatch(batch(0, 0, 1), t0)
	s.dispatch(now)
	s.forget(0, "lost")
	checkLog(t, read(), []string{
		"assign 0/-1 a0 s0  ",
		"deliver 0/0 a1 s1  c1",
		"deliver 0/1 a1 s2  c2",
		"revoke 0/-1 a0 s0  ",
		"returned 0/0 a1 s1 nack c1",
		"dropped 0/1 a1 s2 revoked c2",
		"revoked 0/0 a0 s0  ",
		"deliver 0/0 a1 s1  c1",
		"lost 0/-1 a0 s0 lost ",
		"dropped 0/0 a1 s1 lost c1",
	})
}

// The dispatcher logs its start, and at its stop every delivery still out
// (nobody will learn its outcome) and why it stopped.
func TestDeliveryLogRecordsTheDispatchersStartAndStop(t *testing.T) {
	t.Parallel()
	l, read := openLog(t)
	h := &harness{src: newFakeSource(), store: &recStore{}}
	d, err := New(Config{Store: h.store, Scope: WholeTopic(testFence), DeliveryLog: l}, h.src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	k := newChanSink()
	d.Join(7, "c7", 10, k)
	h.src.ch <- batch(0, 0, 1)
	k.next(t)
	cancel(ErrAbandon)
	<-done
	checkLog(t, read(), []string{
		"start -1/-1 a0 s0 all-partitions ",
		"join -1/-1 a0 s7  c7",
		"deliver 0/0 a1 s7  c7",
		"dropped 0/0 a1 s7 stopped c7",
		"stop -1/-1 a0 s0 abandoned ",
	})
}
