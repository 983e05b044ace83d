//go:build integration

package integration

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// zkConnect opens a session with zkstore.Connect (closed at cleanup).
func zkConnect(t *testing.T) *zk.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, logrus.NewEntry(logrus.StandardLogger()))
	if err != nil {
		t.Fatalf("zkstore.Connect: %v", err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// zkChroot returns a fresh chroot for the test, deleted at cleanup.
func zkChroot(t *testing.T, conn *zk.Conn) string {
	t.Helper()
	chroot := "/" + uniqueName(t, "zkstore")
	t.Cleanup(func() { deleteTree(t, conn, chroot) })
	return chroot
}

// zkFence creates the znode <chroot>/leader (and the chroot) and returns the
// fence of its version 0, as the term that created it would hold.
func zkFence(t *testing.T, conn *zk.Conn, chroot string) offsets.Fence {
	t.Helper()
	for _, p := range []string{chroot, chroot + "/leader"} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	return offsets.TopicFence(zkstore.Version{Path: chroot + "/leader", Version: 0})
}

func mustLoad(t *testing.T, s *zkstore.Store) map[int32]int64 {
	t.Helper()
	got, err := s.Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return got
}

func equalOffsets(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for p, o := range a {
		if ob, ok := b[p]; !ok || ob != o {
			return false
		}
	}
	return true
}

func TestZKStoreRoundTrip(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	base := zkChroot(t, conn)
	// The chroot comes from the server list, as the daemon gets it.
	_, chroot, err := zkstore.ParseServers([]string{strings.Join(zkAddrs(t), ",") + base + "/"})
	if err != nil || chroot != base {
		t.Fatalf("ParseServers: chroot %q, %v; want %q", chroot, err, base)
	}
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "a", "orders")
	if got := mustLoad(t, s); len(got) != 0 {
		t.Fatalf("Load before any commit = %v, want empty", got)
	}
	fence := zkFence(t, conn, chroot)
	if err := s.Commit(ctx, fence, map[int32]int64{0: 10, 1: 20, 2: 0}); err != nil {
		t.Fatalf("first Commit: %v", err)
	}
	if err := s.Commit(ctx, fence, map[int32]int64{1: 25, 3: 7}); err != nil { // one update, one create
		t.Fatalf("second Commit: %v", err)
	}

	// A new session and a new Store read what was committed.
	fresh := zkstore.New(zkConnect(t), chroot, "a", "orders")
	want := map[int32]int64{0: 10, 1: 25, 2: 0, 3: 7}
	if got := mustLoad(t, fresh); !equalOffsets(got, want) {
		t.Fatalf("Load in a new Store = %v, want %v", got, want)
	}
	// Another id or topic does not see them.
	if got := mustLoad(t, zkstore.New(conn, chroot, "b", "orders")); len(got) != 0 {
		t.Errorf("Load of another id = %v, want empty", got)
	}

	// The classic layout, readable by lag tools.
	znode := base + "/consumers/fanout_a/offsets/orders/1"
	if data, _, err := conn.Get(znode); err != nil || string(data) != "25" {
		t.Errorf("Get(%s) = %q, %v; want \"25\"", znode, data, err)
	}
}

func TestZKStoreForeignZnodes(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	writer := zkstore.New(conn, chroot, "a", "t")
	fence := zkFence(t, conn, chroot)
	if err := writer.Commit(ctx, fence, map[int32]int64{0: 1}); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	// Partition 5 appears behind a Store that never loaded: its Create
	// fails in the multi and is retried as a SetData.
	late := zkstore.New(conn, chroot, "a", "t")
	if _, err := conn.Create(late.Path()+"/5", []byte("3"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("create partition 5: %v", err)
	}
	if err := late.Commit(ctx, fence, map[int32]int64{0: 2, 5: 9}); err != nil {
		t.Fatalf("Commit over foreign znodes: %v", err)
	}
	if got, want := mustLoad(t, writer), map[int32]int64{0: 2, 5: 9}; !equalOffsets(got, want) {
		t.Fatalf("Load = %v, want %v", got, want)
	}

	// A value that is not an offset is an error naming the znode.
	bad := late.Path() + "/5"
	if _, err := conn.Set(bad, []byte("abc"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Load(ctx); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("Load with a bad value: %v, want an error naming %s", err, bad)
	}
}

// The fence is a value each commit carries: one Store shared by two terms
// commits for the new term while an abandoned committer of the old term is
// refused, however late it runs; a per-partition fence checks exactly the
// partitions written; a deleted fence or none refuses; a refused commit
// writes nothing.
func TestZKStoreFenceIsAValue(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "a", "t")
	oldTerm := zkFence(t, conn, chroot) // <chroot>/leader@0
	leader := chroot + "/leader"
	owner := func(p string) string { return chroot + "/owners/" + p }
	for _, p := range []string{chroot + "/owners", owner("0"), owner("1")} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	owned := offsets.PartitionFence(map[int32]offsets.Condition{
		0: zkstore.Version{Path: owner("0"), Version: 0},
		1: zkstore.Version{Path: owner("1"), Version: 0},
	})
	newTerm := offsets.TopicFence(zkstore.Version{Path: leader, Version: 1})

	committed := map[int32]int64{}
	steps := []struct {
		name       string
		before     func() // changes the world before the commit
		fence      offsets.Fence
		commit     map[int32]int64
		wantFenced bool
	}{
		{"old term, still current", nil, oldTerm, map[int32]int64{0: 1, 1: 1}, false},
		{"a new term began (the fence znode was rewritten)", func() {
			if _, err := conn.Set(leader, []byte("next"), 0); err != nil {
				t.Fatal(err)
			}
		}, newTerm, map[int32]int64{0: 2}, false},
		{"the old term's abandoned committer, late", nil, oldTerm, map[int32]int64{0: 9, 2: 9}, true},
		{"the new term again", nil, newTerm, map[int32]int64{1: 3, 2: 3}, false},
		{"no fence", nil, offsets.Fence{}, map[int32]int64{0: 9}, true},
		{"per partition: both owned", nil, owned, map[int32]int64{0: 4, 1: 4}, false},
		{"per partition: partition 1 lost", func() {
			if _, err := conn.Set(owner("1"), []byte("other"), 0); err != nil {
				t.Fatal(err)
			}
		}, owned, map[int32]int64{0: 9, 1: 9}, true},
		{"per partition: partition 0 alone still commits", nil, owned, map[int32]int64{0: 5}, false},
		{"per partition: partition 2 never owned", nil, owned, map[int32]int64{0: 9, 2: 9}, true},
		{"fence znode deleted", func() {
			if err := conn.Delete(leader, -1); err != nil {
				t.Fatal(err)
			}
		}, newTerm, map[int32]int64{0: 9, 3: 9}, true},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		err := s.Commit(ctx, st.fence, st.commit)
		if got := errors.Is(err, offsets.ErrFenced); got != st.wantFenced || (err != nil && !st.wantFenced) {
			t.Fatalf("%s: Commit = %v, want fenced %v", st.name, err, st.wantFenced)
		}
		if !st.wantFenced {
			for p, o := range st.commit {
				committed[p] = o
			}
		}
		// A fenced commit writes none of its partitions.
		if got := mustLoad(t, zkstore.New(conn, chroot, "a", "t")); !equalOffsets(got, committed) {
			t.Fatalf("%s: stored %v, want %v", st.name, got, committed)
		}
	}
}

func TestZKConnectUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a port nobody listens on

	// Connect retries until its context ends, then returns with the
	// context's error: one that went on retrying would not return at all.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	type result struct {
		conn *zk.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := zkstore.Connect(ctx, []string{addr}, 5*time.Second, logrus.NewEntry(logrus.StandardLogger()))
		done <- result{conn, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Connect has not returned a minute after its 2s context ended")
	}
	if r.err == nil {
		r.conn.Close()
		t.Fatalf("Connect to closed port %s succeeded", addr)
	}
	if !strings.Contains(r.err.Error(), "zookeeper unreachable at "+addr) || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("Connect error %q: want \"zookeeper unreachable at %s\" wrapping the deadline", r.err, addr)
	}
}

// Progress goes in the same multi as its offset, into its own tree (the
// offsets tree still lists only partitions, each a plain decimal), comes
// back in a new Store, is emptied by a commit without it, is refused with a
// fenced commit, and progress that does not decode is reported while the
// rest loads.
func TestZKStoreProgress(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "a", "t")
	fence := zkFence(t, conn, chroot)
	pr := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 15}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}}}
	if err := s.CommitProgress(ctx, fence, map[int32]int64{0: 10, 1: 20}, map[int32]offsets.Progress{0: pr, 1: {Base: 20}}); err != nil {
		t.Fatalf("CommitProgress: %v", err)
	}
	fresh := zkstore.New(zkConnect(t), chroot, "a", "t")
	if got := mustLoad(t, fresh); !equalOffsets(got, map[int32]int64{0: 10, 1: 20}) {
		t.Fatalf("Load = %v", got)
	}
	got, err := fresh.LoadProgress(ctx)
	if err != nil || len(got) != 1 || got[0].Encode() != pr.Encode() {
		t.Fatalf("LoadProgress = %v, %v; want partition 0: %+v", got, err, pr)
	}
	if data, _, err := conn.Get(s.Path() + "/0"); err != nil || string(data) != "10" {
		t.Fatalf("offset znode holds %q, %v; want the plain decimal 10", data, err)
	}
	if children, _, err := conn.Children(s.Path()); err != nil || len(children) != 2 {
		t.Fatalf("offsets tree lists %q, %v; want the two partitions only", children, err)
	}

	// A fenced commit writes neither offsets nor progress.
	stale := offsets.TopicFence(zkstore.Version{Path: chroot + "/leader", Version: 41})
	if err := fresh.CommitProgress(ctx, stale, map[int32]int64{0: 11}, map[int32]offsets.Progress{0: {Base: 11, Acked: []offsets.Range{{First: 13, Last: 13}}}}); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("CommitProgress under a stale fence: %v", err)
	}
	if got, _ := fresh.LoadProgress(ctx); got[0].Encode() != pr.Encode() {
		t.Fatalf("after a fenced commit LoadProgress = %v", got)
	}

	// A commit of the offset without progress empties it.
	if err := fresh.Commit(ctx, fence, map[int32]int64{0: 16}); err != nil {
		t.Fatal(err)
	}
	if got, err := zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx); err != nil || len(got) != 0 {
		t.Fatalf("LoadProgress after a commit without progress = %v, %v; want none", got, err)
	}

	// Progress that does not decode is reported; the rest loads.
	if err := s.CommitProgress(ctx, fence, map[int32]int64{1: 21}, map[int32]offsets.Progress{1: {Base: 21, Acked: []offsets.Range{{First: 30, Last: 30}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Set(zkstore.ProgressPath(chroot, "a", "t")+"/0", []byte("v1 b=oops"), -1); err != nil {
		t.Fatal(err)
	}
	got, err = zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx)
	if !errors.Is(err, offsets.ErrBadProgress) || !strings.Contains(err.Error(), "/progress/t/0") || len(got) != 1 || got[1].Base != 21 {
		t.Fatalf("LoadProgress with a bad znode = %v, %v; want partition 1 and an error naming partition 0's znode", got, err)
	}

	// A Store that read the offsets but never the progress (another
	// process: the offsets tool's reset) empties it with the offset it
	// writes, so that stale progress can never apply to the offset set.
	tool := zkstore.New(conn, chroot, "a", "t")
	mustLoad(t, tool)
	if err := tool.Commit(ctx, fence, map[int32]int64{1: 21}); err != nil {
		t.Fatal(err)
	}
	if got, _ := zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx); len(got) != 0 {
		t.Fatalf("LoadProgress after a new Store's commit = %v, want none", got)
	}
}

// The delays of a progress go in the same multi, into a tree of their own
// beside the progress, whose znode holds what a daemon that knows no delays
// reads (offsets.Progress.Encode, read by its parser in the offsets
// package's tests); they come back in a new Store, alone or with the rest,
// are emptied by a commit without them, and delays left by a writer that
// knows none (stale: another base) are not taken.
func TestZKStoreDelays(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "a", "t")
	fence := zkFence(t, conn, chroot)
	pr := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 15}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}},
		Delayed: []offsets.Delay{{Offset: 10, NotBefore: 1_700_000_020_000}, {Offset: 11, NotBefore: 1_700_000_030_000}}}
	only := offsets.Progress{Base: 20, Delayed: []offsets.Delay{{Offset: 21, NotBefore: 1_700_000_040_000}}}
	if err := s.CommitProgress(ctx, fence, map[int32]int64{0: 10, 1: 20}, map[int32]offsets.Progress{0: pr, 1: only}); err != nil {
		t.Fatalf("CommitProgress: %v", err)
	}
	progress := zkstore.ProgressPath(chroot, "a", "t")
	delays := zkstore.DelaysPath(chroot, "a", "t")
	if data, _, err := conn.Get(progress + "/0"); err != nil || string(data) != pr.Encode() {
		t.Fatalf("progress znode holds %q, %v; want %q, what a daemon that knows no delays reads", data, err, pr.Encode())
	}
	if data, _, err := conn.Get(delays + "/0"); err != nil || string(data) != pr.EncodeDelays() {
		t.Fatalf("delays znode holds %q, %v; want %q", data, err, pr.EncodeDelays())
	}
	fresh := zkstore.New(zkConnect(t), chroot, "a", "t")
	got, err := fresh.LoadProgress(ctx)
	if err != nil || !reflect.DeepEqual(got, map[int32]offsets.Progress{0: pr, 1: only}) {
		t.Fatalf("LoadProgress = %+v, %v; want %+v and %+v", got, err, pr, only)
	}
	if one, err := zkstore.New(conn, chroot, "a", "t").LoadPartitionProgress(ctx, 0); err != nil || !reflect.DeepEqual(one, pr) {
		t.Fatalf("LoadPartitionProgress(0) = %+v, %v; want %+v", one, err, pr)
	}

	// Committed again without delays: emptied, the rest kept.
	pr2 := offsets.Progress{Base: 10, Failed: pr.Failed}
	if err := fresh.CommitProgress(ctx, fence, map[int32]int64{0: 10}, map[int32]offsets.Progress{0: pr2}); err != nil {
		t.Fatal(err)
	}
	if got, err := zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx); err != nil || !reflect.DeepEqual(got[0], pr2) {
		t.Fatalf("LoadProgress after a commit without delays = %+v, %v; want %+v", got, err, pr2)
	}

	// A writer that knows no delays moves the offset and writes its
	// progress, leaving the delays znode as it was: stale, not taken.
	if err := s.CommitProgress(ctx, fence, map[int32]int64{0: 10}, map[int32]offsets.Progress{0: pr}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Set(s.Path()+"/0", []byte("12"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Set(progress+"/0", []byte("v1 b=12 a=0+3"), -1); err != nil {
		t.Fatal(err)
	}
	want := offsets.Progress{Base: 12, Acked: []offsets.Range{{First: 13, Last: 15}}}
	if got, err := zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx); err != nil || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("LoadProgress with stale delays = %+v, %v; want %+v", got[0], err, want)
	}

	// A commit of the offset alone (the offsets tool) empties both.
	if err := zkstore.New(conn, chroot, "a", "t").Commit(ctx, fence, map[int32]int64{0: 12, 1: 20}); err != nil {
		t.Fatal(err)
	}
	if got, err := zkstore.New(conn, chroot, "a", "t").LoadProgress(ctx); err != nil || len(got) != 0 {
		t.Fatalf("LoadProgress after a commit of offsets alone = %+v, %v; want none", got, err)
	}
}

// A commit of 1,024 partitions whose progress and delays are near as large
// as they may be (over 2 KB each, 2 MB in all: more than a ZooKeeper
// request may carry, jute.maxbuffer's 1 MB by default) goes through, in
// several multis each under the fence, and a fenced one writes nothing.
func TestZKStoreCommitOfManyPartitions(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "a", "t")
	fence := zkFence(t, conn, chroot)
	const parts = 1024
	offs := map[int32]int64{}
	prog := map[int32]offsets.Progress{}
	for p := range int32(parts) {
		base := int64(1_000_000_000) * int64(p+1)
		pr := offsets.Progress{Base: base}
		for i := range int64(400) {
			pr.Acked = append(pr.Acked, offsets.Range{First: base + 1 + 3*i, Last: base + 2 + 3*i})
		}
		for i := range int64(offsets.MaxProgressDelays) {
			pr.Delayed = append(pr.Delayed, offsets.Delay{Offset: base + 3*i, NotBefore: 4_000_000_000_000 + i})
		}
		if n := len(pr.Encode()) + len(pr.EncodeDelays()); n < 2048 {
			t.Fatalf("progress and delays of %d bytes: not near their bounds", n)
		}
		offs[p], prog[p] = base, pr
	}
	if err := s.CommitProgress(ctx, fence, offs, prog); err != nil {
		t.Fatalf("CommitProgress of %d partitions: %v", parts, err)
	}
	fresh := zkstore.New(zkConnect(t), chroot, "a", "t")
	if got := mustLoad(t, fresh); !equalOffsets(got, offs) {
		t.Fatalf("Load: %d partitions, want %d", len(got), parts)
	}
	got, err := fresh.LoadProgress(ctx)
	if err != nil || len(got) != parts {
		t.Fatalf("LoadProgress: %d partitions, %v", len(got), err)
	}
	for p, pr := range prog {
		if got[p].Encode() != pr.Encode() || got[p].EncodeDelays() != pr.EncodeDelays() {
			t.Fatalf("partition %d: progress read back differs", p)
		}
	}
	// Under a stale fence, nothing is written, whatever the number of multis.
	stale := offsets.TopicFence(zkstore.Version{Path: chroot + "/leader", Version: 7})
	moved := map[int32]int64{}
	for p, o := range offs {
		moved[p] = o + 1
	}
	if err := fresh.Commit(ctx, stale, moved); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("Commit under a stale fence: %v", err)
	}
	if got := mustLoad(t, zkstore.New(conn, chroot, "a", "t")); !equalOffsets(got, offs) {
		t.Fatal("a fenced commit wrote offsets")
	}
}
