package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// ownedSetup is setup for a per-partition state serving partitions 0 and 1.
func ownedSetup(maxes ...int) (*state, []*recSink) {
	s, sinks := setup(maxes...)
	s.parts = map[int32]*owned{}
	s.assign(0, testTerm(10), offsets.Progress{})
	s.assign(1, testTerm(11), offsets.Progress{})
	return s, sinks
}

// Revoking a partition drops its buffered messages (only its own), awaits
// its deliveries in flight, whose acks still count, and never queues one of
// them again; the partition's committable offset is then handed back.
func TestRevokeDropsBufferedAndAwaitsInFlight(t *testing.T) {
	t.Parallel()
	s, sinks := ownedSetup(4)
	k := sinks[0]
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 6), t0)
	s.addBatch(Batch{Partition: 1, Start: 0}, t0)
	s.addBatch(batch(1, 0, 3), t0)
	s.dispatch(t0) // 0@0..3 in flight; 0@4, 0@5 and 1@0..2 buffered
	if got := offsetsOf(k.got); !slices.Equal(got, []int64{0, 1, 2, 3}) {
		t.Fatalf("delivered %v", got)
	}
	reply := make(chan revokeReply, 1)
	s.revokeStart(0, t0.Add(time.Second), reply)
	if got := waitingOffsets(s); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Fatalf("buffered after the revoke %v, want partition 1's 0, 1, 2 only", got)
	}
	if s.takes(0) || !s.takes(1) {
		t.Fatal("a revoked partition's batches must be refused, the others' taken")
	}
	if ready, _ := s.revocations(t0); len(ready) != 0 {
		t.Fatalf("revocation ready with 4 deliveries in flight: %v", ready)
	}
	s.ack(1, ids(k.got[:2]))                         // 0@0, 0@1 acked
	s.nack(1, []uint64{k.got[3].ID}, NackInfo{}, t0) // 0@3 given back: not queued again
	s.expire(t0.Add(2 * timeout))                    // 0@2 expires: not queued again
	s.dispatch(t0.Add(2 * timeout))                  // room again: partition 1's messages go out
	if got := offsetsOf(k.got[4:]); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Fatalf("after the revoke the client got %v, want only partition 1's 0, 1, 2", got)
	}
	ready, _ := s.revocations(t0)
	if !slices.Equal(ready, []int32{0}) {
		t.Fatalf("revocations ready %v, want partition 0 (nothing in flight)", ready)
	}
	o, off, tracked, unacked, _ := s.revokeEnd(0)
	if off != 2 || !tracked || unacked != 0 {
		t.Fatalf("revokeEnd = offset %d tracked %v unacked %d, want 2 (0 and 1 acked), true, 0", off, tracked, unacked)
	}
	if o.revoke.returned != 2 {
		t.Errorf("%d deliveries counted as returned during the revoke, want 2 (0@2 expired, 0@3 nacked)", o.revoke.returned)
	}
	if s.revoking != 0 || s.parts[0] != nil {
		t.Fatal("the revoked partition is still there")
	}
	if s.stats.Redelivered != [numRedeliverReasons]uint64{} {
		t.Fatalf("redeliveries counted during the revoke: %v", s.stats.Redelivered)
	}
}

// At the deadline a revocation drops what is still in flight: the offset
// handed back is the lowest unacked one, and a late ack is unknown.
func TestRevokeDeadlineDropsUnacked(t *testing.T) {
	t.Parallel()
	s, sinks := ownedSetup(10)
	k := sinks[0]
	s.addBatch(Batch{Partition: 0, Start: 5}, t0)
	s.addBatch(batch(0, 5, 9), t0)
	s.dispatch(t0)
	s.ack(1, []uint64{k.got[0].ID, k.got[2].ID}) // 5 and 7 acked; 6 and 8 not
	reply := make(chan revokeReply, 1)
	deadline := t0.Add(time.Second)
	s.revokeStart(0, deadline, reply)
	if ready, next := s.revocations(t0); len(ready) != 0 || !next.Equal(deadline) {
		t.Fatalf("revocations = %v, next %v; want none ready, next at the deadline", ready, next)
	}
	ready, _ := s.revocations(deadline)
	if !slices.Equal(ready, []int32{0}) {
		t.Fatalf("at the deadline: %v ready", ready)
	}
	_, off, _, unacked, _ := s.revokeEnd(0)
	if off != 6 || unacked != 2 {
		t.Fatalf("revokeEnd = offset %d, %d unacked; want 6, 2", off, unacked)
	}
	if s.flights.live != 0 || k.got == nil {
		t.Fatalf("%d flights left", s.flights.live)
	}
	before := s.stats.UnknownAcks
	s.ack(1, []uint64{k.got[1].ID})
	if s.stats.UnknownAcks != before+1 {
		t.Fatal("an ack of a delivery dropped at the revoke counted")
	}
	if _, ok := s.tracker.Committable(0); ok {
		t.Fatal("the revoked partition is still tracked")
	}
}

// A partition dropped (lost) loses everything at once; assigned again it
// starts afresh: what was outstanding before does not hold its offset.
func TestForgetAndAssignAgain(t *testing.T) {
	t.Parallel()
	s, sinks := ownedSetup(2)
	k := sinks[0]
	s.addBatch(Batch{Partition: 0, Start: 0}, t0)
	s.addBatch(batch(0, 0, 5), t0)
	s.dispatch(t0) // 0, 1 in flight; 2-4 buffered
	s.forget(0, "lost")
	if s.flights.live != 0 || s.buffered() != 0 || s.bytes != 0 || s.takes(0) {
		t.Fatalf("after forget: %d flights, %d buffered, %d bytes, takes %v", s.flights.live, s.buffered(), s.bytes, s.takes(0))
	}
	s.assign(0, testTerm(20), offsets.Progress{})
	s.addBatch(Batch{Partition: 0, Start: 3}, t0)
	s.addBatch(batch(0, 3, 4), t0)
	s.dispatch(t0)
	s.ack(1, []uint64{k.got[len(k.got)-1].ID})
	if off, _ := s.tracker.Committable(0); off != 4 {
		t.Fatalf("committable %d after the new stretch acked 3, want 4", off)
	}
}

// condStore is an offsets.Store that records each commit with the
// conditions it was made under, and refuses the conditions in fenced.
type condStore struct {
	mu      sync.Mutex
	commits []condCommit
	offsets map[int32]int64
	fenced  map[offsets.Condition]bool
	failing error // every commit fails with it (not fenced)
}

type condCommit struct {
	offsets map[int32]int64
	conds   map[int32]offsets.Condition
}

func (c *condStore) Load(context.Context) (map[int32]int64, error) { return nil, nil }

func (c *condStore) Commit(_ context.Context, f offsets.Fence, m map[int32]int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing != nil {
		return c.failing
	}
	cc := condCommit{offsets: maps.Clone(m), conds: map[int32]offsets.Condition{}}
	for p := range m {
		conds, err := f.Conditions([]int32{p})
		if err != nil {
			return err
		}
		if c.fenced[conds[0]] {
			return fmt.Errorf("condition %v: %w", conds[0], offsets.ErrFenced)
		}
		cc.conds[p] = conds[0]
	}
	c.commits = append(c.commits, cc)
	if c.offsets == nil {
		c.offsets = map[int32]int64{}
	}
	maps.Copy(c.offsets, m)
	return nil
}

func (c *condStore) get() map[int32]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.offsets)
}

// committedUnder reports whether some commit wrote partition p under cond.
func (c *condStore) committedUnder(p int32, cond offsets.Condition) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.commits {
		if cc.conds[p] == cond {
			return true
		}
	}
	return false
}

// startOwned runs a dispatcher of AssignedPartitions on store (cfg.Scope,
// when set, says what it does with a lost partition).
func startOwned(t *testing.T, store offsets.Store, cfg Config) *harness {
	t.Helper()
	cfg.Store = store
	if cfg.Scope == nil {
		cfg.Scope = AssignedPartitions(nil)
	}
	h := &harness{src: newFakeSource(), done: make(chan error, 1)}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = 10 * time.Millisecond
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 100 * time.Millisecond
	}
	d, err := New(cfg, h.src)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return h
}

// A per-partition dispatcher takes only its partitions, commits each under
// its own condition, and hands a revoked one back once its deliveries are
// acked, after a last commit of its offset: nothing of it is committed or
// delivered afterwards.
func TestPerPartitionRevoke(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testPerPartitionRevoke)
}

func testPerPartitionRevoke(t *testing.T) {
	store := &condStore{}
	h := startOwned(t, store, Config{})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.d.Assign(0, testTerm(10), -1, offsets.Progress{})
	h.d.Assign(1, testTerm(11), 7, offsets.Progress{})
	h.src.ch <- Batch{Partition: 2, Start: 0} // not ours
	h.src.ch <- batch(2, 0, 3)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, 2)
	h.src.ch <- Batch{Partition: 1, Start: 7}
	d0, d1 := k.next(t), k.next(t)
	if d0.Msg.Partition != 0 || d1.Msg.Partition != 0 {
		t.Fatalf("delivered %+v, %+v; want partition 0's two messages (2 is not assigned)", d0.Msg, d1.Msg)
	}
	h.d.Ack(1, []uint64{d0.ID})
	testutil.WaitFor(t, 5*time.Second, "partition 0 committed at 1 under its condition", func() bool {
		return store.get()[0] == 1 && store.committedUnder(0, testTerm(10))
	})
	if _, ok := store.get()[2]; ok {
		t.Fatal("a partition not assigned was committed")
	}

	type result struct {
		r   Revoked
		err error
	}
	revoked := make(chan result, 1)
	go func() {
		r, err := h.d.Revoke(context.Background(), 0, time.Minute)
		revoked <- result{r, err}
	}()
	select {
	case r := <-revoked:
		t.Fatalf("Revoke returned %+v with a delivery in flight", r)
	case <-time.After(50 * time.Millisecond):
	}
	h.d.Ack(1, []uint64{d1.ID})
	var r result
	select {
	case r = <-revoked:
	case <-time.After(5 * time.Second):
		t.Fatal("Revoke did not return once everything was acked")
	}
	if r.err != nil || r.r.Offset != 2 || !r.r.Committed || r.r.Unacked != 0 {
		t.Fatalf("Revoke = %+v, %v; want offset 2 committed, nothing unacked", r.r, r.err)
	}
	if got := store.get()[0]; got != 2 {
		t.Fatalf("stored %d for partition 0 after the revoke, want 2", got)
	}
	commits := len(store.commits)
	h.src.ch <- batch(0, 2, 4) // late batch of the revoked partition: dropped
	h.src.ch <- batch(1, 7, 8)
	if d := k.next(t); d.Msg.Partition != 1 {
		t.Fatalf("delivered %+v after the revoke, want partition 1 only", d.Msg)
	}
	st := h.stats(t)
	if _, ok := st.Committed[0]; ok || st.Committed[1] != 7 {
		t.Fatalf("Stats.Committed = %v: want partition 1 at its stored 7, partition 0 gone", st.Committed)
	}
	store.mu.Lock()
	for _, cc := range store.commits[commits:] {
		if _, ok := cc.offsets[0]; ok {
			t.Errorf("partition 0 committed after its final commit: %v", cc.offsets)
		}
	}
	store.mu.Unlock()
	if _, err := h.d.Revoke(context.Background(), 0, time.Minute); err == nil {
		t.Fatal("a second Revoke of the same partition succeeded")
	}
}

// A revocation that times out drops the unacked deliveries and commits the
// lowest unacked offset.
func TestPerPartitionRevokeTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testPerPartitionRevokeTimeout)
}

func testPerPartitionRevokeTimeout(t *testing.T) {
	store := &condStore{}
	h := startOwned(t, store, Config{})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.d.Assign(0, testTerm(10), -1, offsets.Progress{})
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, 3)
	ds := []Delivery{k.next(t), k.next(t), k.next(t)}
	h.d.Ack(1, []uint64{ds[0].ID, ds[2].ID})
	begin := time.Now() // before the revoke: the wait is measured from here
	r, err := h.d.Revoke(context.Background(), 0, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < 200*time.Millisecond {
		t.Errorf("Revoke returned after %v, before the handoff timeout", took)
	}
	if r.Offset != 1 || r.Unacked != 1 || !r.Committed {
		t.Fatalf("Revoke = %+v, want offset 1 (1 unacked) committed, 1 unacked dropped", r)
	}
	if store.get()[0] != 1 {
		t.Fatalf("stored %v", store.get())
	}
	testutil.WaitFor(t, 5*time.Second, "the late ack counted as unknown", func() bool {
		h.d.Ack(1, []uint64{ds[1].ID})
		return h.stats(t).UnknownAcks > 0
	})
}

// A commit refused for one partition (its ownership record changed) drops
// that partition alone, with OnLost; the others go on being committed.
func TestPerPartitionLostPartition(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testPerPartitionLostPartition)
}

func testPerPartitionLostPartition(t *testing.T) {
	store := &condStore{fenced: map[offsets.Condition]bool{testTerm(11): true}}
	lost := make(chan int32, 4)
	h := startOwned(t, store, Config{Scope: AssignedPartitions(func(p int32, c offsets.Condition) {
		if c != testTerm(11) {
			t.Errorf("onLost(%d, %v): wrong condition", p, c)
		}
		lost <- p
	})})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.d.Assign(0, testTerm(10), -1, offsets.Progress{})
	h.d.Assign(1, testTerm(11), -1, offsets.Progress{})
	h.src.ch <- Batch{Partition: 0, Start: 3}
	h.src.ch <- Batch{Partition: 1, Start: 5}
	h.src.ch <- batch(1, 5, 7)
	select {
	case p := <-lost:
		if p != 1 {
			t.Fatalf("lost partition %d, want 1", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fenced partition was not dropped")
	}
	testutil.WaitFor(t, 5*time.Second, "partition 0 committed", func() bool { return store.get()[0] == 3 })
	st := h.stats(t)
	if st.Buffered != 0 || st.InFlight != 0 {
		t.Fatalf("the lost partition's messages are still there: %+v", st)
	}
	select {
	case err := <-h.done:
		t.Fatalf("Run returned %v: a lost partition must not stop the dispatcher", err)
	default:
	}
	h.src.ch <- batch(0, 3, 4)
	if d := k.next(t); d.Msg.Partition != 0 {
		// The lost partition's earlier deliveries may come first: skip them.
		for d.Msg.Partition != 0 {
			d = k.next(t)
		}
	}
}

// An offset offered in one stretch of a partition is never committed under
// the condition of a later stretch: the offsets of a commit that fails go
// back only while the partition keeps the condition they were taken under.
func TestCommitterNeverCarriesOffsetsIntoANewStretch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testCommitterNeverCarriesOffsetsIntoANewStretch)
}

func testCommitterNeverCarriesOffsetsIntoANewStretch(t *testing.T) {
	store := &condStore{}
	gate := &failOnce{entered: make(chan struct{}), release: make(chan struct{}), inner: store}
	cm := newTestCommitter(t, gate, 5*time.Millisecond)
	cm.assign(0, testTerm(1), -1)
	cm.start()
	defer cm.stop()
	cm.offer(map[int32]int64{0: 10}, nil)
	select {
	case <-gate.entered: // the commit of 10 under the first stretch is under way
	case <-time.After(5 * time.Second):
		t.Fatal("no commit started")
	}
	cm.forget(0)
	cm.assign(0, testTerm(2), 3)
	close(gate.release) // ... and fails: its offsets must not come back
	testutil.WaitFor(t, 5*time.Second, "the failure recorded", func() bool {
		cm.mu.Lock()
		defer cm.mu.Unlock()
		return cm.failures > 0
	})
	time.Sleep(20 * time.Millisecond) // a retry interval or more: what came back is committed
	cm.offer(map[int32]int64{0: 4}, nil)
	testutil.WaitFor(t, 5*time.Second, "the new stretch's commit", func() bool { return store.get()[0] == 4 })
	time.Sleep(30 * time.Millisecond) // a few more retry intervals
	store.mu.Lock()
	defer store.mu.Unlock()
	for _, cc := range store.commits {
		if cc.offsets[0] == 10 {
			t.Fatalf("offset 10 of the first stretch committed under %v", cc.conds[0])
		}
	}
}

// failOnce fails its first commit once released; later commits go to inner.
type failOnce struct {
	entered, release chan struct{}
	inner            offsets.Store
	once             sync.Once
}

func (f *failOnce) Load(ctx context.Context) (map[int32]int64, error) { return f.inner.Load(ctx) }

func (f *failOnce) Commit(ctx context.Context, fence offsets.Fence, m map[int32]int64) error {
	first := false
	f.once.Do(func() { first = true })
	if first {
		close(f.entered)
		<-f.release
		return errors.New("zookeeper down")
	}
	return f.inner.Commit(ctx, fence, m)
}

func TestNewRefusesAWholeTopicWithoutAFence(t *testing.T) {
	if _, err := New(Config{Store: &recStore{}, Scope: WholeTopic(offsets.Fence{})}, newFakeSource()); err == nil {
		t.Fatal("New with WholeTopic and no fence succeeded")
	}
	if _, err := New(Config{Store: &recStore{}}, newFakeSource()); err == nil {
		t.Fatal("New without a Scope succeeded")
	}
	if _, err := New(Config{Store: &recStore{}, Scope: AssignedPartitions(nil)}, newFakeSource()); err != nil {
		t.Fatalf("New with AssignedPartitions: %v", err)
	}
}

// newTestCommitter returns a committer of AssignedPartitions on store.
func newTestCommitter(t *testing.T, store offsets.Store, interval time.Duration) *committer {
	t.Helper()
	cm, err := newCommitter(store, AssignedPartitions(nil), interval, testLog(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// waitingOffsets lists the offsets of the messages waiting for a client:
// redeliveries, fresh messages, then large ones.
func waitingOffsets(s *state) []int64 {
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

// testLog is a logger that writes nothing.
func testLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// commitOnce runs one pass of the committer's loop by hand: take what is
// pending, commit it, release its anchors.
func commitOnce(t *testing.T, cm *committer) {
	t.Helper()
	m, fence, anchors := cm.take()
	if m == nil {
		return
	}
	done, _ := cm.commit(context.Background(), m, fence, anchors)
	release(anchors, done)
}

// A partition assigned again while the final commit of its previous
// stretch is pending (its handoff stopped waiting for it, and the partition
// came back) starts its new stretch clean: that final commit is answered
// with an error at once, never by a commit of the new stretch, and every
// offer of the new stretch is committed under the new condition.
func TestCommitterAssignedAgainWithAFinalCommitPending(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testCommitterAssignedAgainWithAFinalCommitPending)
}

func testCommitterAssignedAgainWithAFinalCommitPending(t *testing.T) {
	store := &condStore{}
	cm := newTestCommitter(t, store, time.Hour)
	first, second := testTerm(1), testTerm(2)
	cm.assign(0, first, -1)
	store.mu.Lock()
	store.failing = errors.New("zookeeper down")
	store.mu.Unlock()
	final := cm.finish(0, 10, nil)
	commitOnce(t, cm) // the final commit fails: pending again, as any failed commit
	select {
	case err := <-final:
		t.Fatalf("the final commit was answered (%v) though it failed", err)
	default:
	}
	cm.assign(0, second, 3) // the new stretch
	store.mu.Lock()
	store.failing = nil
	store.mu.Unlock()
	for _, o := range []int64{4, 5, 6} {
		cm.offer(map[int32]int64{0: o}, nil)
		commitOnce(t, cm)
		if got := store.get()[0]; got != o {
			t.Fatalf("offered %d in the new stretch, the store holds %d", o, got)
		}
	}
	if !store.committedUnder(0, second) || store.committedUnder(0, first) {
		t.Errorf("commits of partition 0: %+v, want them all under the new stretch's condition", store.commits)
	}
	select {
	case err := <-final:
		if err == nil {
			t.Fatal("the previous stretch's final commit was answered as done; it was never written")
		}
	default:
		t.Fatal("the previous stretch's final commit is still waiting")
	}
	var st Stats
	cm.report(&st)
	if st.Committed[0] != 6 {
		t.Errorf("Stats.Committed = %v, want partition 0 at 6", st.Committed)
	}
}

// The same through the dispatcher, on a fake clock: a handoff whose final
// commit keeps failing gives up (Revoke's context ends), the partition is
// assigned to this member again, and its new stretch is committed as it is
// acked.
func TestPerPartitionAssignedAgainAfterAHandoffGaveUp(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &condStore{}
		h := startOwned(t, store, Config{Logger: testLog()}) // quiet: commits fail for seconds
		k := newChanSink()
		h.d.Join(1, "a", 10, k)
		h.d.Assign(0, testTerm(10), -1, offsets.Progress{})
		h.src.ch <- Batch{Partition: 0, Start: 0}
		h.src.ch <- batch(0, 0, 2)
		d, _ := k.next(t), k.next(t) // offset 1 stays unacked: the handoff waits for it, then drops it
		h.d.Ack(1, []uint64{d.ID})
		synctest.Wait()
		store.mu.Lock()
		store.failing = errors.New("zookeeper down")
		store.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := h.d.Revoke(ctx, 0, time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Revoke with the store failing: %v, want the context's deadline", err)
		}
		h.d.Assign(0, testTerm(12), 1, offsets.Progress{}) // reserved again: the stretch starts at 1
		store.mu.Lock()
		store.failing = nil
		store.mu.Unlock()
		h.src.ch <- Batch{Partition: 0, Start: 1}
		h.src.ch <- batch(0, 1, 4)
		for want := int64(2); want <= 4; want++ {
			d := k.next(t)
			h.d.Ack(1, []uint64{d.ID})
			time.Sleep(time.Second) // commit intervals pass
			synctest.Wait()
			if got := store.get()[0]; got != want || !store.committedUnder(0, testTerm(12)) {
				t.Fatalf("after the ack of offset %d the store holds %d (commits %+v), want %d under the new condition",
					d.Msg.Offset, got, store.commits, want)
			}
		}
	})
}
