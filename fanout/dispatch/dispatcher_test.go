package dispatch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// fakeSource is a Source fed by the test.
type fakeSource struct {
	ch     chan Batch
	paused atomic.Bool
	pauses atomic.Int32

	mu   sync.Mutex // guards held and log
	held map[int32]bool
	log  []string // "pause <p>" and "resume <p>", in order
}

func newFakeSource() *fakeSource { return &fakeSource{ch: make(chan Batch), held: map[int32]bool{}} }

func (f *fakeSource) Batches() <-chan Batch { return f.ch }
func (f *fakeSource) Pause() {
	if !f.paused.Swap(true) {
		f.pauses.Add(1)
	}
}
func (f *fakeSource) Resume() { f.paused.Store(false) }

func (f *fakeSource) PausePartition(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[p] = true
	f.log = append(f.log, fmt.Sprint("pause ", p))
}

func (f *fakeSource) ResumePartition(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, p)
	f.log = append(f.log, fmt.Sprint("resume ", p))
}

// partitionLog returns the PausePartition and ResumePartition calls so far.
func (f *fakeSource) partitionLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// chanSink forwards deliveries to a channel.
type chanSink struct {
	ch  chan Delivery
	bye chan string
}

func newChanSink() *chanSink {
	return &chanSink{ch: make(chan Delivery, 1000), bye: make(chan string, 1)}
}
func (c *chanSink) Send(ds []Delivery) {
	for _, d := range ds {
		c.ch <- d
	}
}
func (c *chanSink) Goodbye(r string) { c.bye <- r }

func (c *chanSink) next(t *testing.T) Delivery {
	t.Helper()
	select {
	case d := <-c.ch:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery within 5s")
		return Delivery{}
	}
}

// recStore is an offsets.Store that records commits.
type recStore struct {
	mu      sync.Mutex
	offsets map[int32]int64
	commits int
	err     error
	failing int // the next commits that fail with a transient error
}

func (r *recStore) Load(context.Context) (map[int32]int64, error) { return nil, nil }
func (r *recStore) Commit(_ context.Context, fence offsets.Fence, m map[int32]int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence.IsZero() {
		return fmt.Errorf("recStore: no fence: %w", offsets.ErrFenced)
	}
	if r.err != nil {
		return r.err
	}
	if r.failing > 0 {
		r.failing--
		return errors.New("recStore: the group is rebalancing")
	}
	if r.offsets == nil {
		r.offsets = map[int32]int64{}
	}
	maps.Copy(r.offsets, m)
	r.commits++
	return nil
}
func (r *recStore) get() map[int32]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.offsets)
}

// testFence is the fence the tests' dispatchers commit under.
var testFence = offsets.TopicFence(testTerm(1))

// testTerm is a fence condition of the tests' stores, which do not check it.
type testTerm int

func (t testTerm) String() string { return fmt.Sprintf("test term %d", int(t)) }

type harness struct {
	d      *Dispatcher
	src    *fakeSource
	store  *recStore
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{src: newFakeSource(), store: &recStore{}, done: make(chan error, 1)}
	if cfg.Store == nil {
		cfg.Store = h.store
	}
	if cfg.Scope == nil {
		cfg.Scope = WholeTopic(testFence)
	}
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

func (h *harness) stats(t *testing.T) Stats {
	st, ok := h.d.Stats(context.Background())
	if !ok {
		t.Fatal("dispatcher stopped")
	}
	return st
}

func TestRunDeliversAcksAndCommits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDeliversAcksAndCommits)
}

func testRunDeliversAcksAndCommits(t *testing.T) {
	h := start(t, Config{})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 5}
	h.src.ch <- batch(0, 5, 8)
	var got []Delivery
	for range 3 {
		got = append(got, k.next(t))
	}
	h.d.Ack(1, []uint64{got[0].ID, got[2].ID})
	testutil.WaitFor(t, 5*time.Second, "commit of 6", func() bool { return h.store.get()[0] == 6 })
	h.d.Ack(1, []uint64{got[1].ID})
	testutil.WaitFor(t, 5*time.Second, "commit of 8", func() bool { return h.store.get()[0] == 8 })
}

// Settle takes ranges of ids through the request queue: acks of a whole
// batch in one call commit it.
func TestRunSettlesRanges(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunSettlesRanges)
}

func testRunSettlesRanges(t *testing.T) {
	h := start(t, Config{})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 5}
	h.src.ch <- batch(0, 5, 10)
	var got []Delivery
	for range 5 {
		got = append(got, k.next(t))
	}
	h.d.Settle(1, OpTouch, []Range{{got[0].ID, 5}}, NackInfo{})
	h.d.Settle(1, OpAck, []Range{{got[0].ID, 2}, {got[3].ID, 2}}, NackInfo{})
	testutil.WaitFor(t, 5*time.Second, "commit of 7", func() bool { return h.store.get()[0] == 7 })
	h.d.Settle(1, OpNack, []Range{{got[2].ID, 1}}, NackInfo{})
	again := k.next(t)
	if again.Msg.Offset != 7 || again.Attempt != 2 {
		t.Fatalf("after a nack by range: offset %d attempt %d", again.Msg.Offset, again.Attempt)
	}
	h.d.Settle(1, OpAck, []Range{{again.ID, 1}}, NackInfo{})
	testutil.WaitFor(t, 5*time.Second, "commit of 10", func() bool { return h.store.get()[0] == 10 })
	if st := h.stats(t); st.Acked != 5 || st.Nacked != 1 || st.UnknownAcks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRunRedeliversAfterAckTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunRedeliversAfterAckTimeout)
}

func testRunRedeliversAfterAckTimeout(t *testing.T) {
	h := start(t, Config{AckTimeout: 50 * time.Millisecond})
	a, b := newChanSink(), newChanSink()
	h.d.Join(1, "a", 10, a)
	h.d.Join(2, "b", 10, b)
	h.src.ch <- batch(0, 0, 1)
	var first Delivery
	var other *chanSink
	select {
	case first = <-a.ch:
		other = b
	case first = <-b.ch:
		other = a
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}
	re := other.next(t)
	if re.Msg.Offset != first.Msg.Offset || re.Attempt != 2 {
		t.Fatalf("redelivery %+v after %+v", re, first)
	}
}

func TestRunPausesWithoutClientsAndResumesOnJoin(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunPausesWithoutClientsAndResumesOnJoin)
}

func testRunPausesWithoutClientsAndResumesOnJoin(t *testing.T) {
	h := start(t, Config{})
	testutil.WaitFor(t, 5*time.Second, "pause with no clients", func() bool { return h.src.paused.Load() })
	h.src.ch <- batch(0, 0, 3) // already fetched: buffered
	if st := h.stats(t); st.Buffered != 3 || !st.Paused {
		t.Fatalf("stats = %+v", st)
	}
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	for range 3 {
		k.next(t)
	}
	testutil.WaitFor(t, 5*time.Second, "resume", func() bool { return !h.src.paused.Load() })
	h.d.Leave(1, LeaveDisconnect)
	testutil.WaitFor(t, 5*time.Second, "pause after the last client left", func() bool { return h.src.paused.Load() })
	if st := h.stats(t); st.Buffered != 3 || st.Redelivered[RedeliverDisconnect] != 3 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestRunStopsReadingWhenBufferFull(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunStopsReadingWhenBufferFull)
}

func testRunStopsReadingWhenBufferFull(t *testing.T) {
	h := start(t, Config{MaxBuffered: 4})
	k := newChanSink()
	h.d.Join(1, "a", 1, k) // takes one message, then is full
	h.src.ch <- batch(0, 0, 5)
	d := k.next(t)
	if st := h.stats(t); st.Buffered != 4 || !st.Paused {
		t.Fatalf("stats = %+v", st)
	}
	select {
	case h.src.ch <- batch(0, 5, 6):
		t.Fatal("dispatcher took a batch with a full buffer")
	case <-time.After(50 * time.Millisecond):
	}
	// Acks drain the buffer below half; then reading and fetching resume.
	for range 3 {
		h.d.Ack(1, []uint64{d.ID})
		d = k.next(t)
	}
	h.src.ch <- batch(0, 5, 6)
	testutil.WaitFor(t, 5*time.Second, "resume", func() bool { return !h.src.paused.Load() })
}

func TestRunDrainsCommitsAndReturns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDrainsCommitsAndReturns)
}

func testRunDrainsCommitsAndReturns(t *testing.T) {
	h := start(t, Config{DrainTimeout: 5 * time.Second, CommitInterval: time.Hour})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 2, Start: 0}
	h.src.ch <- batch(2, 0, 3)
	ds := []Delivery{k.next(t), k.next(t), k.next(t)}
	h.d.Ack(1, []uint64{ds[0].ID})
	h.cancel()
	select {
	case r := <-k.bye:
		if r == "" {
			t.Fatal("empty goodbye")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no goodbye")
	}
	h.d.Ack(1, []uint64{ds[1].ID}) // acks still count while draining
	select {
	case err := <-h.done:
		t.Fatalf("Run returned %v with a delivery outstanding", err)
	case <-time.After(30 * time.Millisecond):
	}
	h.d.Ack(1, []uint64{ds[2].ID})
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	if got := h.store.get(); got[2] != 3 {
		t.Fatalf("final commit %v, want partition 2 at 3", got)
	}
}

// A final commit that fails for a moment (a store out of reach, a Kafka
// group rebalancing as its members stop one after another) is tried again:
// what was acked is committed, not delivered again by the next owner.
func TestRunFinalCommitRetriesATransientFailure(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunFinalCommitRetriesATransientFailure)
}

// startAcked starts a dispatcher that commits only at its end, with n
// messages of partition 2 delivered and acked.
func startAcked(t *testing.T, n int64) *harness {
	t.Helper()
	h := start(t, Config{DrainTimeout: 5 * time.Second, CommitInterval: time.Hour})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 2, Start: 0}
	h.src.ch <- batch(2, 0, n)
	for range n {
		h.d.Ack(1, []uint64{k.next(t).ID})
	}
	testutil.WaitFor(t, 5*time.Second, "acks", func() bool { return h.stats(t).Acked == uint64(n) })
	return h
}

func testRunFinalCommitRetriesATransientFailure(t *testing.T) {
	h := startAcked(t, 3)
	h.store.mu.Lock()
	h.store.failing = 3
	h.store.mu.Unlock()
	h.cancel()
	if err := <-h.done; err != nil {
		t.Fatalf("Run: %v, want the final commit retried until it succeeds", err)
	}
	if got := h.store.get(); got[2] != 3 {
		t.Fatalf("final commit %v, want partition 2 at 3", got)
	}
}

// A final commit the store refuses (fenced) is not tried again.
func TestRunFinalCommitFencedIsNotRetried(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunFinalCommitFencedIsNotRetried)
}

func testRunFinalCommitFencedIsNotRetried(t *testing.T) {
	h := startAcked(t, 1)
	h.store.mu.Lock()
	h.store.err = fmt.Errorf("recStore: another leader: %w", offsets.ErrFenced)
	h.store.mu.Unlock()
	h.cancel()
	if err := <-h.done; !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("Run: %v, want the fenced final commit's error", err)
	}
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	if h.store.commits != 0 {
		t.Fatalf("%d commits written by a fenced dispatcher", h.store.commits)
	}
}

func TestRunDrainTimeoutCommitsAckedPrefix(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunDrainTimeoutCommitsAckedPrefix)
}

func testRunDrainTimeoutCommitsAckedPrefix(t *testing.T) {
	h := start(t, Config{DrainTimeout: 50 * time.Millisecond, CommitInterval: time.Hour})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, 3)
	ds := []Delivery{k.next(t), k.next(t), k.next(t)}
	h.d.Ack(1, []uint64{ds[0].ID, ds[2].ID})
	testutil.WaitFor(t, 5*time.Second, "acks", func() bool { return h.stats(t).Acked == 2 })
	h.cancel()
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	if got := h.store.get(); got[0] != 1 {
		t.Fatalf("final commit %v, want partition 0 at 1 (offset 1 unacked)", got)
	}
}

func TestRunStopsWhenFenced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunStopsWhenFenced)
}

func testRunStopsWhenFenced(t *testing.T) {
	store := &recStore{err: fmt.Errorf("check leader: %w", offsets.ErrFenced)}
	h := start(t, Config{Store: store})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	select {
	case err := <-h.done:
		if !errors.Is(err, offsets.ErrFenced) {
			t.Fatalf("Run = %v, want ErrFenced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop when fenced")
	}
	if store.commits != 0 {
		t.Fatal("a fenced dispatcher committed")
	}
}

func TestRunRetriesFailedCommits(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunRetriesFailedCommits)
}

func testRunRetriesFailedCommits(t *testing.T) {
	store := &recStore{err: errors.New("zookeeper down")}
	h := start(t, Config{Store: store})
	h.src.ch <- Batch{Partition: 0, Start: 42}
	time.Sleep(30 * time.Millisecond) // a few failed attempts
	store.mu.Lock()
	store.err = nil
	store.mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, "commit after recovery", func() bool { return store.get()[0] == 42 })
}

func TestRunAbandonedReturnsWithoutCommit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunAbandonedReturnsWithoutCommit)
}

func testRunAbandonedReturnsWithoutCommit(t *testing.T) {
	src, store := newFakeSource(), &recStore{}
	d, err := New(Config{Store: store, Scope: WholeTopic(testFence), CommitInterval: time.Hour, DrainTimeout: time.Hour}, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	k := newChanSink()
	d.Join(1, "a", 10, k)
	src.ch <- Batch{Partition: 0, Start: 0}
	src.ch <- batch(0, 0, 2)
	first := k.next(t)
	k.next(t)
	d.Ack(1, []uint64{first.ID})
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { st, _ := d.Stats(context.Background()); return st.Acked == 1 })
	cancel(fmt.Errorf("superseded: %w", ErrAbandon))
	select {
	case err := <-done:
		if !errors.Is(err, ErrAbandon) {
			t.Fatalf("Run = %v, want ErrAbandon", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("abandoned dispatcher waited for its drain")
	}
	if store.commits != 0 {
		t.Fatalf("abandoned dispatcher committed %v", store.get())
	}
}

func TestRunStatsReportCommits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		storeErr      error
		wantCommitted map[int32]int64
		wantFailing   bool
	}{
		{"commit succeeds", nil, map[int32]int64{0: 7, 1: 3}, false},
		{"commit fails", errors.New("zookeeper down"), map[int32]int64{1: 3}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, testutil.InBubble(func(t *testing.T) {
			var observed atomic.Int32
			var observedErr atomic.Bool
			h := start(t, Config{
				Store:  &recStore{err: tt.storeErr},
				Stored: map[int32]int64{1: 3},
				OnCommit: func(_ time.Duration, err error) {
					observed.Add(1)
					if err != nil {
						observedErr.Store(true)
					}
				},
			})
			if got := h.stats(t).Committed; !maps.Equal(got, map[int32]int64{1: 3}) {
				t.Fatalf("Committed before any commit = %v, want the stored offsets", got)
			}
			h.src.ch <- Batch{Partition: 0, Start: 7}
			testutil.WaitFor(t, 5*time.Second, "a commit attempt", func() bool { return observed.Load() > 0 })
			testutil.WaitFor(t, 5*time.Second, "stats to show the attempt", func() bool {
				st := h.stats(t)
				return st.CommitFailures > 0 || len(st.Committed) == 2
			})
			st := h.stats(t)
			if !maps.Equal(st.Committed, tt.wantCommitted) {
				t.Errorf("Committed = %v, want %v", st.Committed, tt.wantCommitted)
			}
			if failing := !st.CommitFailingSince.IsZero(); failing != tt.wantFailing {
				t.Errorf("CommitFailingSince = %v, want failing %v", st.CommitFailingSince, tt.wantFailing)
			}
			if (st.CommitFailures > 0) != tt.wantFailing || observedErr.Load() != tt.wantFailing {
				t.Errorf("CommitFailures = %d, OnCommit saw an error: %v; want failing %v",
					st.CommitFailures, observedErr.Load(), tt.wantFailing)
			}
		}))
	}
}

// blockStore's commits hang until release is closed, like a ZooKeeper that
// is out of reach.
type blockStore struct {
	entered chan struct{}
	release chan struct{}
	inner   offsets.Store // when set, commits go on to it once released ...
	result  chan error    // ... and their results are sent here
}

func (b *blockStore) Load(context.Context) (map[int32]int64, error) { return nil, nil }
func (b *blockStore) Commit(ctx context.Context, fence offsets.Fence, m map[int32]int64) error {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	if b.inner == nil {
		return nil
	}
	err := b.inner.Commit(ctx, fence, m)
	b.result <- err
	return err
}

func TestRunAbandonedDoesNotWaitForAHangingCommit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunAbandonedDoesNotWaitForAHangingCommit)
}

func testRunAbandonedDoesNotWaitForAHangingCommit(t *testing.T) {
	store := &blockStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(store.release)
	src := newFakeSource()
	d, err := New(Config{Store: store, Scope: WholeTopic(testFence), CommitInterval: 5 * time.Millisecond}, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	src.ch <- Batch{Partition: 0, Start: 7}
	select {
	case <-store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no commit started")
	}
	cancel(fmt.Errorf("cut off: %w", ErrAbandon))
	select {
	case err := <-done:
		if !errors.Is(err, ErrAbandon) {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an abandoned dispatcher waited for a hanging commit")
	}
}

// Acks, nacks and touches are queued in requests of at most maxRequestIDs
// ids, so the ids waiting in the full request queue are bounded (8 MiB)
// whatever a client's in-flight limit allows a frame to name.
func TestIDRequestsBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testIDRequestsBounded)
}

func testIDRequestsBounded(t *testing.T) {
	mem := offsets.NewMemoryStore()
	d, err := New(Config{Store: mem, Scope: WholeTopic(mem.NewTerm())}, newFakeSource())
	if err != nil {
		t.Fatal(err)
	}
	// Not running: nothing takes requests, as when the queue is full.
	const n = 3*maxRequestIDs + 5
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)
	}
	nack := func(id uint64, ids []uint64) { d.Nack(id, ids, NackInfo{Delay: time.Second}) }
	for _, call := range []func(uint64, []uint64){d.Ack, nack, d.Touch} {
		call(7, ids)
	}
	if got, want := len(d.reqs), 3*4; got != want {
		t.Fatalf("%d requests queued, want %d", got, want)
	}
	var next uint64
	for range len(d.reqs) {
		r := <-d.reqs
		if len(r.ids) > maxRequestIDs || r.id != 7 {
			t.Fatalf("request of client %d with %d ids, want at most %d", r.id, len(r.ids), maxRequestIDs)
		}
		for _, id := range r.ids {
			if id != next {
				t.Fatalf("id %d, want %d: ids reordered or lost", id, next)
			}
			next = (next + 1) % n
		}
	}
	// A request's ids cannot be appended to in place by a later request.
	d.Ack(7, ids[:maxRequestIDs+1])
	if r := <-d.reqs; cap(r.ids) != len(r.ids) {
		t.Errorf("request ids of len %d have cap %d", len(r.ids), cap(r.ids))
	}
	<-d.reqs
	// Ranges likewise, at most maxRequestIDs a request.
	ranges := make([]Range, 2*maxRequestIDs+1)
	for i := range ranges {
		ranges[i] = Range{First: uint64(i) << 20, Count: 1 << 19}
	}
	d.Settle(7, OpTouch, ranges, NackInfo{})
	if got := len(d.reqs); got != 3 {
		t.Fatalf("%d requests queued for %d ranges, want 3", got, len(ranges))
	}
	var all []Range
	for range 3 {
		r := <-d.reqs
		if r.kind != reqSettle || r.op != OpTouch || len(r.ranges) > maxRequestIDs || cap(r.ranges) != len(r.ranges) {
			t.Fatalf("request %v with %d ranges (cap %d)", r.kind, len(r.ranges), cap(r.ranges))
		}
		all = append(all, r.ranges...)
	}
	if !slices.Equal(all, ranges) {
		t.Fatal("ranges reordered or lost")
	}
}

// The committer of an abandoned term whose commit was hanging cannot write
// once a new term began: the commit carries its own term's fence, however
// late it reaches the store.
func TestAbandonedCommitterCannotWriteInANewTerm(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testAbandonedCommitterCannotWriteInANewTerm)
}

func testAbandonedCommitterCannotWriteInANewTerm(t *testing.T) {
	mem := offsets.NewMemoryStore()
	store := &blockStore{entered: make(chan struct{}, 1), release: make(chan struct{}), inner: mem, result: make(chan error, 10)}
	src := newFakeSource()
	old, err := New(Config{Store: store, Scope: WholeTopic(mem.NewTerm()), CommitInterval: 5 * time.Millisecond}, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- old.Run(ctx) }()
	src.ch <- Batch{Partition: 0, Start: 7}
	select {
	case <-store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no commit started")
	}
	cancel(fmt.Errorf("deposed: %w", ErrAbandon))
	if err := <-done; !errors.Is(err, ErrAbandon) {
		t.Fatalf("Run = %v, want ErrAbandon", err)
	}

	// The next term commits its own offsets, then the old commit goes on.
	next := mem.NewTerm()
	if err := mem.Commit(context.Background(), next, map[int32]int64{0: 3}); err != nil {
		t.Fatalf("commit of the new term: %v", err)
	}
	close(store.release)
	select {
	case err := <-store.result:
		if !errors.Is(err, offsets.ErrFenced) {
			t.Fatalf("the abandoned term's late commit: %v, want ErrFenced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the abandoned commit never reached the store")
	}
	if got, _ := mem.Load(context.Background()); !maps.Equal(got, map[int32]int64{0: 3}) {
		t.Fatalf("stored %v, want the new term's {0: 3}", got)
	}
}

func TestNewRequiresAFence(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Store: &recStore{}}, newFakeSource()); err == nil {
		t.Fatal("New without a fence succeeded")
	}
}

// A leader whose commits keep failing (ZooKeeper out of reach) stops
// delivering once they have failed for MaxCommitFailure, and not before.
func TestRunStopsWhenCommitsKeepFailing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunStopsWhenCommitsKeepFailing)
}

func testRunStopsWhenCommitsKeepFailing(t *testing.T) {
	const bound = 200 * time.Millisecond
	store := &recStore{err: errors.New("zk: could not connect to a server")}
	begin := time.Now() // before the first commit can fail
	h := start(t, Config{Store: store, MaxCommitFailure: bound})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	h.src.ch <- Batch{Partition: 0, Start: 42}
	select {
	case err := <-h.done:
		if !errors.Is(err, ErrCommitsFailing) {
			t.Fatalf("Run = %v, want ErrCommitsFailing", err)
		}
		if took := time.Since(begin); took < bound {
			t.Errorf("gave up after %v, before commits failed for %v", took, bound)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on while commits failed")
	}
	select {
	case <-k.bye:
	default:
		t.Error("the client was not told goodbye")
	}
}

// A commit that hangs counts as failing: Run gives up without waiting for it.
func TestRunStopsWhenACommitHangs(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunStopsWhenACommitHangs)
}

func testRunStopsWhenACommitHangs(t *testing.T) {
	store := &blockStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(store.release)
	h := start(t, Config{Store: store, MaxCommitFailure: 200 * time.Millisecond})
	h.src.ch <- Batch{Partition: 0, Start: 7}
	select {
	case err := <-h.done:
		if !errors.Is(err, ErrCommitsFailing) {
			t.Fatalf("Run = %v, want ErrCommitsFailing", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on while a commit hung")
	}
}

// Clients is a request answered by the running dispatcher, and false once
// Run has returned.
func TestRunClients(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunClients)
}

func testRunClients(t *testing.T) {
	h := start(t, Config{})
	k := newChanSink()
	h.d.Join(7, "worker", 5, k)
	h.src.ch <- batch(0, 0, 2)
	d0, d1 := k.next(t), k.next(t)
	h.d.Ack(7, []uint64{d0.ID})
	var got []ClientStats
	testutil.WaitFor(t, 5*time.Second, "one ack counted for the client", func() bool {
		var ok bool
		got, ok = h.d.Clients(context.Background())
		return ok && len(got) == 1 && got[0].Acked == 1
	})
	if want := (ClientStats{ID: 7, Name: "worker", InFlight: 1, MaxInFlight: 5, Acked: 1, Weight: 100}); got[0] != want {
		t.Errorf("Clients() = %+v, want %+v", got[0], want)
	}
	h.d.Ack(7, []uint64{d1.ID})
	h.cancel()
	if err := <-h.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, ok := h.d.Clients(context.Background()); ok {
		t.Error("Clients answered after Run returned")
	}
}

// waitClosed fails the test unless ch is closed within 5s.
func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not closed within 5s", what)
	}
}

// A Start batch with an Anchor is committed at once (the commit interval is
// an hour here), and its Anchor is closed only once the commit is stored.
func TestRunAnchorClosedOnceStored(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunAnchorClosedOnceStored)
}

func testRunAnchorClosedOnceStored(t *testing.T) {
	mem := offsets.NewMemoryStore()
	store := &blockStore{entered: make(chan struct{}, 1), release: make(chan struct{}), inner: mem, result: make(chan error, 10)}
	h := start(t, Config{Store: store, Scope: WholeTopic(mem.NewTerm()), CommitInterval: time.Hour})
	anchor := make(chan struct{})
	h.src.ch <- Batch{Partition: 3, Start: 7, Anchor: anchor}
	select {
	case <-store.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the anchor was not committed at once")
	}
	select {
	case <-anchor:
		t.Fatal("anchor closed while its commit is under way")
	default:
	}
	close(store.release)
	waitClosed(t, anchor, "anchor")
	if stored, _ := mem.Load(context.Background()); stored[3] != 7 {
		t.Fatalf("stored %v when the anchor was closed, want partition 3 at 7", stored)
	}
}

// The anchor of a restart is the partition's committable offset, not the
// restart offset: unacked messages below it stay outstanding and the stored
// offset must not pass them.
func TestRunAnchorOfARestartKeepsUnackedBelow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunAnchorOfARestartKeepsUnackedBelow)
}

func testRunAnchorOfARestartKeepsUnackedBelow(t *testing.T) {
	h := start(t, Config{CommitInterval: time.Hour})
	k := newChanSink()
	h.d.Join(1, "a", 10, k)
	first := make(chan struct{})
	h.src.ch <- Batch{Partition: 0, Start: 0, Anchor: first}
	waitClosed(t, first, "first anchor")
	h.src.ch <- batch(0, 0, 4)
	var got []Delivery
	for range 4 {
		got = append(got, k.next(t))
	}
	h.d.Ack(1, []uint64{got[0].ID, got[1].ID}) // committable 2, not stored yet
	restart := make(chan struct{})
	h.src.ch <- Batch{Partition: 0, Start: 10, Anchor: restart}
	waitClosed(t, restart, "anchor of the restart")
	if o := h.store.get()[0]; o != 2 {
		t.Fatalf("anchored offset %d, want 2: 2 and 3 are unacked", o)
	}
}

// An anchor whose commit fails waits for the retry.
func TestRunAnchorWaitsForAFailedCommitsRetry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunAnchorWaitsForAFailedCommitsRetry)
}

func testRunAnchorWaitsForAFailedCommitsRetry(t *testing.T) {
	var failed atomic.Int32
	store := &recStore{err: errors.New("zookeeper down")}
	h := start(t, Config{Store: store, OnCommit: func(_ time.Duration, err error) {
		if err != nil {
			failed.Add(1)
		}
	}})
	anchor := make(chan struct{})
	h.src.ch <- Batch{Partition: 0, Start: 5, Anchor: anchor}
	testutil.WaitFor(t, 5*time.Second, "a failed commit", func() bool { return failed.Load() > 0 })
	select {
	case <-anchor:
		t.Fatal("anchor closed after a failed commit")
	default:
	}
	store.mu.Lock()
	store.err = nil
	store.mu.Unlock()
	waitClosed(t, anchor, "anchor after the retry")
	if o := store.get()[0]; o != 5 {
		t.Fatalf("stored %d, want 5", o)
	}
}

// One message never acked holds its partition's commit, and the tracker
// keeps every later offset: past MaxOutstanding that partition's fetching
// pauses (the tracker stays within the bound plus what was already fetched),
// the other partitions keep flowing, and once the message is acked the
// partition resumes.
func TestRunPausesAPartitionHoldingTooManyOffsets(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunPausesAPartitionHoldingTooManyOffsets)
}

func testRunPausesAPartitionHoldingTooManyOffsets(t *testing.T) {
	const max = 20
	h := start(t, Config{MaxOutstanding: max})
	k := newChanSink()
	h.d.Join(1, "a", 1000, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- Batch{Partition: 1, Start: 0}
	var poison Delivery
	off := int64(0)
	feed := func(p int32, n int64) {
		t.Helper()
		h.src.ch <- batch(p, off, off+n)
		for range n {
			d := k.next(t)
			if d.Msg.Partition == 0 && d.Msg.Offset == 0 {
				poison = d // never acked until the end
				continue
			}
			h.d.Ack(1, []uint64{d.ID})
		}
	}
	for off < 3*max { // partition 0, in batches of 5, until it is held
		feed(0, 5)
		off += 5
		if slices.Contains(h.src.partitionLog(), "pause 0") {
			break
		}
	}
	if got := h.src.partitionLog(); !slices.Equal(got, []string{"pause 0"}) {
		t.Fatalf("partition calls %v after %d offsets of partition 0, want [pause 0]", got, off)
	}
	st := h.stats(t)
	if n := st.Outstanding[0]; n <= max || n > max+5 {
		t.Fatalf("partition 0 holds %d offsets when paused, want just above %d (one batch)", n, max)
	}
	if !slices.Equal(st.Held, []int32{0}) {
		t.Fatalf("Held = %v, want [0]", st.Held)
	}
	// Batches of partition 0 fetched before the pause took effect still
	// count; partition 1 flows on.
	held := off
	for off = 0; off < 3*max; off += 5 {
		feed(1, 5)
	}
	if st := h.stats(t); st.Outstanding[1] != 0 || st.Outstanding[0] != int(held) || !slices.Equal(st.Held, []int32{0}) {
		t.Fatalf("outstanding %v, held %v: want partition 1 committed, partition 0 held at %d", st.Outstanding, st.Held, held)
	}

	h.d.Ack(1, []uint64{poison.ID})
	testutil.WaitFor(t, 5*time.Second, "partition 0 resumed", func() bool {
		return slices.Equal(h.src.partitionLog(), []string{"pause 0", "resume 0"})
	})
	if st := h.stats(t); st.Outstanding[0] != 0 || len(st.Held) != 0 {
		t.Fatalf("after the ack: outstanding %v, held %v", st.Outstanding, st.Held)
	}
	testutil.WaitFor(t, 5*time.Second, "partition 0 committed past everything", func() bool { return h.store.get()[0] == held })
}

// A partition held for its offsets resumes only once back at half of the
// bound (hysteresis), not as soon as it drops below it.
func TestRunHeldPartitionResumesAtHalf(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testRunHeldPartitionResumesAtHalf)
}

func testRunHeldPartitionResumesAtHalf(t *testing.T) {
	const max = 10
	h := start(t, Config{MaxOutstanding: max})
	k := newChanSink()
	h.d.Join(1, "a", 1000, k)
	h.src.ch <- Batch{Partition: 0, Start: 0}
	h.src.ch <- batch(0, 0, max+2) // 12 outstanding: held
	ds := make([]Delivery, max+2)
	for i := range ds {
		ds[i] = k.next(t)
	}
	testutil.WaitFor(t, 5*time.Second, "partition 0 held", func() bool { return slices.Contains(h.src.partitionLog(), "pause 0") })
	ack := func(from, to int) {
		for _, d := range ds[from:to] {
			h.d.Ack(1, []uint64{d.ID})
		}
	}
	ack(0, 6) // 6 outstanding: below the bound, above half
	if st := h.stats(t); st.Outstanding[0] != 6 || len(h.src.partitionLog()) != 1 {
		t.Fatalf("at 6 of %d: outstanding %v, partition calls %v; want still held", max, st.Outstanding, h.src.partitionLog())
	}
	ack(6, 7) // 5: half
	testutil.WaitFor(t, 5*time.Second, "partition 0 resumed at half", func() bool {
		return slices.Equal(h.src.partitionLog(), []string{"pause 0", "resume 0"})
	})
}
