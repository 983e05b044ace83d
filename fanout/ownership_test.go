package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// fakeZK is the ownership records and member znodes of a test, in memory,
// with the rules of zkstore.Owners: a record is free when released or when
// its owner's member znode is gone or of another session; reserve and
// release are compare-and-sets on its version. Every change is logged.
type fakeZK struct {
	mu      sync.Mutex
	records map[int32]*fakeRecord
	members map[string]int64 // node -> session of its member znode
	changed chan struct{}    // closed and replaced on every change
	events  []string
}

type fakeRecord struct {
	owner   string
	session int64
	version int32
}

func newFakeZK() *fakeZK {
	return &fakeZK{records: map[int32]*fakeRecord{}, members: map[string]int64{}, changed: make(chan struct{})}
}

// noteLocked logs an event and wakes every waiter; z.mu held.
func (z *fakeZK) noteLocked(format string, args ...any) {
	z.events = append(z.events, fmt.Sprintf(format, args...))
	close(z.changed)
	z.changed = make(chan struct{})
}

// note logs an event of a fake outside the records (a revoke).
func (z *fakeZK) note(format string, args ...any) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.noteLocked(format, args...)
}

func (z *fakeZK) log() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.events)
}

func (z *fakeZK) record(p int32) fakeRecord {
	z.mu.Lock()
	defer z.mu.Unlock()
	if r := z.records[p]; r != nil {
		return *r
	}
	return fakeRecord{}
}

// takeOver makes node own p with a compare-and-set of its own, as another
// member whose reserve found p free would.
func (z *fakeZK) takeOver(p int32, node string, session int64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	r := z.records[p]
	r.owner, r.session = node, session
	r.version++
	z.noteLocked("reserve %d %s v%d", p, node, r.version)
}

func recordPath(p int32) string { return fmt.Sprintf("/owners/%d", p) }

// fakeMember is one member's view of a fakeZK (ownerRecords).
type fakeMember struct {
	zk      *fakeZK
	node    string
	session atomic.Int64
	// failReleases is how many Releases fail next, as with ZooKeeper out of
	// reach (a restart: the session survives it).
	failReleases atomic.Int32
}

func (m *fakeMember) Session() int64 { return m.session.Load() }

// expire ends the member's session (ZooKeeper deletes its member znode)
// and gives it a new one.
func (m *fakeMember) expire() {
	m.zk.mu.Lock()
	defer m.zk.mu.Unlock()
	if m.zk.members[m.node] == m.session.Load() {
		delete(m.zk.members, m.node)
	}
	m.session.Add(1)
	m.zk.noteLocked("expire %s", m.node)
}

func (m *fakeMember) Join(ctx context.Context, waiting func(int64)) (int64, error) {
	for {
		m.zk.mu.Lock()
		sid := m.session.Load()
		other, exists := m.zk.members[m.node]
		if !exists || other == sid {
			m.zk.members[m.node] = sid
			m.zk.mu.Unlock()
			return sid, nil
		}
		ch := m.zk.changed
		m.zk.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (m *fakeMember) Reserve(ctx context.Context, p int32, gen uint64, waiting func(authority.Holder)) (offsets.Condition, error) {
	told := false
	for {
		m.zk.mu.Lock()
		sid := m.session.Load()
		r := m.zk.records[p]
		free := r == nil || r.owner == "" || (r.owner == m.node && r.session == sid) || m.zk.members[r.owner] != r.session
		if free {
			if r == nil {
				r = &fakeRecord{version: -1}
				m.zk.records[p] = r
			}
			r.owner, r.session = m.node, sid
			r.version++
			m.zk.noteLocked("reserve %d %s v%d", p, m.node, r.version)
			m.zk.mu.Unlock()
			return zkstore.Version{Path: recordPath(p), Version: r.version}, nil
		}
		holder, ch := r.owner, m.zk.changed
		m.zk.mu.Unlock()
		if !told && waiting != nil {
			told = true
			waiting(authority.Holder{Node: holder})
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (m *fakeMember) Release(p int32, cond offsets.Condition, gen uint64) error {
	v, _ := cond.(zkstore.Version)
	if m.failReleases.Add(-1) >= 0 {
		m.zk.note("release %d %s failed", p, m.node)
		return errors.New("zk: could not connect to a server")
	}
	m.zk.mu.Lock()
	defer m.zk.mu.Unlock()
	r := m.zk.records[p]
	if r == nil || v.Path != recordPath(p) || r.version != v.Version {
		return authority.ErrNotOwner
	}
	r.owner, r.session = "", 0
	r.version++
	m.zk.noteLocked("release %d %s v%d", p, m.node, r.version)
	return nil
}

func (m *fakeMember) Watch(ctx context.Context, cond offsets.Condition) error {
	v, _ := cond.(zkstore.Version)
	var p int32
	fmt.Sscanf(v.Path, "/owners/%d", &p)
	for {
		m.zk.mu.Lock()
		r := m.zk.records[p]
		if r == nil || r.version != v.Version {
			m.zk.mu.Unlock()
			return nil
		}
		ch := m.zk.changed
		m.zk.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fakeAssign is an assignments the test sets.
type fakeAssign struct {
	a       atomic.Pointer[cluster.Assignment]
	changed chan struct{}
}

func newFakeAssign() *fakeAssign { return &fakeAssign{changed: make(chan struct{}, 1)} }

func (f *fakeAssign) Assignment() *cluster.Assignment    { return f.a.Load() }
func (f *fakeAssign) AssignmentChanged() <-chan struct{} { return f.changed }

// set publishes generation gen: node -> partitions; partitions below
// initial start at --initial-offset when they have no committed offset.
func (f *fakeAssign) set(gen uint64, initial int32, owners map[string][]int32) {
	a := &cluster.Assignment{Epoch: 1, Generation: gen, InitialPartitions: initial}
	for _, id := range slices.Sorted(maps.Keys(owners)) {
		a.Owners = append(a.Owners, cluster.Owner{NodeID: id, Addr: id + ":1", Partitions: owners[id]})
	}
	f.a.Store(a)
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// clear publishes that no assignment is in force.
func (f *fakeAssign) clear() {
	f.a.Store(nil)
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// fakeParts is the member's source and dispatcher: it logs their calls
// into the fakeZK's log, so that the order against the records shows.
type fakeParts struct {
	zk     *fakeZK
	node   string
	mu     sync.Mutex
	added  map[int32]int64 // partition -> offset or policy given to Add
	conds  map[int32]offsets.Condition
	revoke chan struct{} // when set, Revoke waits for it
}

func newFakeParts(zk *fakeZK, node string) *fakeParts {
	return &fakeParts{zk: zk, node: node, added: map[int32]int64{}, conds: map[int32]offsets.Condition{}}
}

func (f *fakeParts) Add(p int32, offset int64) {
	f.mu.Lock()
	f.added[p] = offset
	f.mu.Unlock()
	f.zk.note("add %d %s", p, f.node)
}

func (f *fakeParts) Remove(p int32) {
	f.mu.Lock()
	delete(f.added, p)
	f.mu.Unlock()
	f.zk.note("remove %d %s", p, f.node)
}

func (f *fakeParts) Assign(p int32, cond offsets.Condition, stored int64, _ offsets.Progress) bool {
	f.mu.Lock()
	f.conds[p] = cond
	f.mu.Unlock()
	return true
}

func (f *fakeParts) Revoke(ctx context.Context, p int32, timeout time.Duration) (dispatch.Revoked, error) {
	if f.revoke != nil {
		select {
		case <-f.revoke:
		case <-ctx.Done():
		}
	}
	f.mu.Lock()
	delete(f.conds, p)
	f.mu.Unlock()
	f.zk.note("revoke %d %s", p, f.node)
	return dispatch.Revoked{Offset: 7, Committed: true}, nil
}

func (f *fakeParts) Drop(p int32) {
	f.mu.Lock()
	delete(f.conds, p)
	f.mu.Unlock()
	f.zk.note("drop %d %s", p, f.node)
}

func (f *fakeParts) fetching() []int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.added))
}

func (f *fakeParts) start(p int32) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.added[p]
	return o, ok
}

// fakeLoader holds the committed offsets.
type fakeLoader map[int32]int64

func (l fakeLoader) LoadPartition(_ context.Context, p int32) (int64, bool, error) {
	o, ok := l[p]
	return o, ok, nil
}

// testMember is a running ownership loop.
type testMember struct {
	own      *ownership
	rec      *fakeMember
	parts    *fakeParts
	status   atomic.Pointer[OwnershipStatus]
	total    atomic.Uint64
	cancel   context.CancelFunc
	done     chan struct{}
	stopped  atomic.Bool // stop was called
	stopping atomic.Bool // onStop was called
	stop     func()      // stops the member's dispatcher
}

// startMember runs the ownership loop of node; setup, if any, sets its
// callbacks before it runs.
func startMember(t *testing.T, zk *fakeZK, assign *fakeAssign, node string, loader fakeLoader, setup ...func(*ownership)) *testMember {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	m := &testMember{rec: &fakeMember{zk: zk, node: node}, parts: newFakeParts(zk, node), done: make(chan struct{})}
	m.rec.session.Store(int64(len(node)*1000 + int(node[len(node)-1])))
	opts := Options{NodeID: node, ClusterHeartbeat: 10 * time.Millisecond, ConnectBackoffMax: 50 * time.Millisecond,
		HandoffTimeout: time.Second, ZooKeeperSessionTimeout: time.Second, InitialOffset: "newest"}
	own, err := newOwnership(node, opts, logrus.NewEntry(l), assign, m.rec, loader, m.parts, m.parts, &m.status, &m.total)
	if err != nil {
		t.Fatal(err)
	}
	own.onStop = func() { m.stopping.Store(true) }
	for _, f := range setup {
		f(own)
	}
	m.own = own
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	dispDone := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			m.stopped.Store(true)
			zk.note("drain %s", node)
			close(dispDone)
		})
	}
	m.stop = stop
	go func() {
		defer close(m.done)
		own.run(ctx, dispDone, stop)
	}()
	t.Cleanup(func() {
		cancel()
		<-m.done
	})
	return m
}

// owned returns the partitions the member serves, as it publishes them.
func (m *testMember) owned() []int32 {
	if st := m.status.Load(); st != nil {
		return st.Owned
	}
	return nil
}

// indexOf returns the position of the first event with prefix, or -1.
func indexOf(events []string, prefix string) int {
	return slices.IndexFunc(events, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// A member reserves what its assignment gives it and serves it from the
// committed offset (or by policy: --initial-offset below InitialPartitions,
// oldest above); a partition moved to another member is revoked, then
// released, and only then reserved by the other (release-before-reserve).
func TestOwnershipReservesHandsOverAndWaitsForRelease(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{0: 40})
	b := startMember(t, zk, assign, "node-b", fakeLoader{0: 40})
	assign.set(1, 2, map[string][]int32{"node-a": {0, 1}, "node-b": {}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	if off, _ := a.parts.start(0); off != 40 {
		t.Errorf("partition 0 started at %d, want its committed 40", off)
	}
	if off, _ := a.parts.start(1); off != sarama.OffsetNewest {
		t.Errorf("partition 1 (no committed offset, below InitialPartitions) started at %d, want --initial-offset", off)
	}
	if st := a.status.Load(); st.Generation != 1 || !slices.Equal(st.Assigned, st.Owned) {
		t.Errorf("status %+v: want every partition assigned owned, at generation 1", st)
	}

	// node-a's revoke of partition 1 takes a while (in-flight acks): node-b
	// waits for its release.
	a.parts.mu.Lock()
	a.parts.revoke = make(chan struct{})
	a.parts.mu.Unlock()
	assign.set(2, 2, map[string][]int32{"node-a": {0}, "node-b": {1, 2}})
	testutil.WaitFor(t, 5*time.Second, "node-b to serve 2, node-a to hand 1 over", func() bool {
		st := a.status.Load()
		return slices.Contains(b.owned(), 2) && st != nil && slices.Equal(st.HandingOff, []int32{1})
	})
	if off, _ := b.parts.start(2); off != sarama.OffsetOldest {
		t.Errorf("partition 2 (added: at or above InitialPartitions) started at %d, want oldest", off)
	}
	if slices.Contains(b.owned(), 1) {
		t.Fatal("node-b serves partition 1 before node-a released it")
	}
	close(a.parts.revoke)
	testutil.WaitFor(t, 5*time.Second, "node-b to serve 1", func() bool { return slices.Equal(b.owned(), []int32{1, 2}) })
	events := zk.log()
	order := []string{"remove 1 node-a", "revoke 1 node-a", "release 1 node-a", "reserve 1 node-b", "add 1 node-b"}
	last := -1
	for _, e := range order {
		i := indexOf(events, e)
		if i <= last {
			t.Fatalf("events %v: want %v in that order", events, order)
		}
		last = i
	}
	if got := a.total.Load(); got != 1 {
		t.Errorf("node-a counted %d handoffs, want 1", got)
	}
}

// A handoff whose release fails (ZooKeeper out of reach, the session alive:
// a ZooKeeper restart) retries it: a record left naming a live session
// would keep the next owner waiting until that session ends (a chaos
// --quick spread run, seed 8, lost 453 records that way).
func TestOwnershipRetriesAFailedRelease(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{})
	b := startMember(t, zk, assign, "node-b", fakeLoader{})
	assign.set(1, 2, map[string][]int32{"node-a": {0, 1}, "node-b": {}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	a.rec.failReleases.Store(2)
	assign.set(2, 2, map[string][]int32{"node-a": {0}, "node-b": {1}})
	testutil.WaitFor(t, 5*time.Second, "node-b to serve 1", func() bool { return slices.Equal(b.owned(), []int32{1}) })
	events := zk.log()
	if i, j := indexOf(events, "release 1 node-a failed"), indexOf(events, "release 1 node-a v"); i < 0 || j < i {
		t.Errorf("events %v: want a failed release of 1, then one done", events)
	}
}

// When the dispatcher stops (commits failing: ZooKeeper out of reach, the
// session alive), the partitions dropped have their records released, with
// retries: another member assigned one meanwhile reserves it.
func TestOwnershipReleasesWhenTheDispatcherStops(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{})
	b := startMember(t, zk, assign, "node-b", fakeLoader{})
	assign.set(1, 2, map[string][]int32{"node-a": {0, 1}, "node-b": {}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	a.rec.failReleases.Store(1)
	a.stop()
	<-a.done
	assign.set(2, 2, map[string][]int32{"node-a": {}, "node-b": {0, 1}})
	testutil.WaitFor(t, 5*time.Second, "node-b to serve 0 and 1", func() bool { return slices.Equal(b.owned(), []int32{0, 1}) })
}

// A partition whose record another member took over is dropped at once
// (not revoked, not released); still assigned, it is reserved again only
// once free.
func TestOwnershipDropsALostPartition(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{})
	assign.set(1, 2, map[string][]int32{"node-a": {0, 1}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })

	zk.mu.Lock()
	zk.members["node-x"] = 77
	zk.mu.Unlock()
	zk.takeOver(1, "node-x", 77)
	testutil.WaitFor(t, 5*time.Second, "node-a to drop 1", func() bool { return slices.Equal(a.owned(), []int32{0}) })
	events := zk.log()
	if indexOf(events, "drop 1 node-a") < 0 || indexOf(events, "remove 1 node-a") < 0 {
		t.Fatalf("events %v: want partition 1 dropped and removed", events)
	}
	if indexOf(events, "revoke 1") >= 0 || indexOf(events, "release 1 node-a") >= 0 {
		t.Fatalf("events %v: a lost partition is neither revoked nor released", events)
	}
	// node-x's session ends: the record is free, node-a reserves it again.
	zk.mu.Lock()
	delete(zk.members, "node-x")
	zk.noteLocked("expire node-x")
	zk.mu.Unlock()
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 1 again", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	if r := zk.record(1); r.owner != "node-a" || r.version != 2 {
		t.Fatalf("record of 1: %+v, want node-a at version 2", r)
	}
}

// When the member's session expires it drops every partition at once,
// joins again in the new session and reserves them again (the records of
// its old session are free).
func TestOwnershipSessionExpiryDropsEverything(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{})
	assign.set(1, 3, map[string][]int32{"node-a": {0, 1, 2}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0-2", func() bool { return len(a.owned()) == 3 })
	a.rec.expire()
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0-2 in the new session", func() bool {
		events := zk.log()
		return indexOf(events, "drop 2 node-a") >= 0 && len(a.owned()) == 3 && zk.record(2).session == a.rec.Session()
	})
	events := zk.log()
	for _, p := range []int32{0, 1, 2} {
		drop, again := indexOf(events, fmt.Sprintf("drop %d node-a", p)), -1
		for i, e := range events {
			if i > drop && strings.HasPrefix(e, fmt.Sprintf("reserve %d node-a", p)) {
				again = i
			}
		}
		if drop < 0 || again < 0 {
			t.Fatalf("events %v: partition %d not dropped and reserved again", events, p)
		}
	}
}

// Stopping (ctx ends) resigns first, stops fetching everything, lets the
// dispatcher drain, and only then releases the records.
func TestOwnershipShutdownReleasesAfterTheDrain(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	a := startMember(t, zk, assign, "node-a", fakeLoader{})
	// Many partitions, so that each one's release naming another's
	// condition cannot pass by the luck of the map's order.
	parts := []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	assign.set(1, 2, map[string][]int32{"node-a": parts})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve every partition", func() bool { return len(a.owned()) == len(parts) })
	a.cancel()
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not return after ctx ended")
	}
	if !a.stopping.Load() || !a.stopped.Load() {
		t.Fatalf("onStop called %v, the dispatcher stopped %v: want both", a.stopping.Load(), a.stopped.Load())
	}
	for _, p := range parts {
		if r := zk.record(p); r.owner != "" {
			t.Errorf("record of %d after shutdown: %+v, want released", p, r)
		}
	}
	events := zk.log()
	for _, p := range []string{"0", "1"} {
		if r := indexOf(events, "release "+p+" node-a"); r < indexOf(events, "drain node-a") || indexOf(events, "remove "+p+" node-a") > r {
			t.Fatalf("events %v: want partition %s removed, the drain, then its release", events, p)
		}
	}
	if indexOf(events, "revoke") >= 0 {
		t.Fatalf("events %v: the drain commits: no revoke", events)
	}
}

// A member left without an assignment in force (its heartbeats do not come
// back) hands its partitions over first, its clients still connected to ack
// what they hold, and sends them away only then: sent away at once, each
// closed connection's deliveries went to the next client about to be closed
// (a chaos run, spread mode, in a Kafka restart). Once only, until an
// assignment is in force again.
func TestOwnershipSendsTheClientsAwayAfterTheHandoffs(t *testing.T) {
	t.Parallel()
	zk, assign := newFakeZK(), newFakeAssign()
	var sentAway atomic.Int32
	a := startMember(t, zk, assign, "node-a", fakeLoader{}, func(o *ownership) {
		o.onUnassigned = func() { sentAway.Add(1); zk.note("send away node-a") }
	})
	assign.set(1, 2, map[string][]int32{"node-a": {0, 1}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	a.parts.mu.Lock()
	a.parts.revoke = make(chan struct{}) // the clients' acks take a while
	a.parts.mu.Unlock()
	assign.clear()
	testutil.WaitFor(t, 5*time.Second, "node-a to hand 0 and 1 over", func() bool {
		st := a.status.Load()
		return st != nil && slices.Equal(st.HandingOff, []int32{0, 1})
	})
	if n := sentAway.Load(); n != 0 {
		t.Fatalf("clients sent away %d times while the handoffs wait for their acks", n)
	}
	close(a.parts.revoke)
	testutil.WaitFor(t, 5*time.Second, "the clients sent away", func() bool { return sentAway.Load() == 1 })
	events := zk.log()
	if i, j := indexOf(events, "release 1 node-a"), indexOf(events, "send away node-a"); i < 0 || j < i {
		t.Fatalf("events %v: want the clients sent away after the releases", events)
	}
	assign.set(2, 2, map[string][]int32{"node-a": {0, 1}})
	testutil.WaitFor(t, 5*time.Second, "node-a to serve 0 and 1 again", func() bool { return slices.Equal(a.owned(), []int32{0, 1}) })
	if n := sentAway.Load(); n != 1 {
		t.Fatalf("clients sent away %d times, want once per loss of the assignment", n)
	}
	assign.clear()
	testutil.WaitFor(t, 5*time.Second, "the clients sent away again", func() bool { return sentAway.Load() == 2 })
}
