//go:build integration

package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// ownersMember is one member's ZooKeeper session, ownership records and
// offset store.
type ownersMember struct {
	conn   *zk.Conn
	owners *zkstore.Owners
	store  *zkstore.Store
}

func ownersJoin(t *testing.T, chroot, id, topic, node string) *ownersMember {
	t.Helper()
	conn := zkConnect(t)
	m := &ownersMember{conn: conn, owners: zkstore.NewOwners(conn, chroot, id, topic, node, node+":4987", zkstore.ACL{}),
		store: zkstore.New(conn, chroot, id, topic)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.owners.Join(ctx, nil); err != nil {
		t.Fatalf("%s: Join: %v", node, err)
	}
	return m
}

// commit commits offset o of partition p under condition v.
func (m *ownersMember) commit(v zkstore.Version, p int32, o int64) error {
	return m.store.Commit(context.Background(), offsets.PartitionFence(map[int32]offsets.Condition{p: v}),
		map[int32]int64{p: o})
}

// The ownership protocol against the real ZooKeeper: a partition held by a
// live member is reserved by another only after its release (the waiter
// watches, it does not poll), and then the releaser cannot commit it; a
// member whose session ends loses its partitions at once; a member that
// lost a partition can never commit it again, even when it holds it again
// later (the version only grows); a restarted node waits for the znode of
// its previous session.
func TestOwnersReserveReleaseTakeover(t *testing.T) {
	t.Parallel()
	admin := zkConnect(t)
	chroot := zkChroot(t, admin)
	const id, topic = "svc", "jobs"
	a := ownersJoin(t, chroot, id, topic, "node-a")
	b := ownersJoin(t, chroot, id, topic, "node-b")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	va, err := a.owners.Reserve(ctx, 0, 1, nil)
	if err != nil {
		t.Fatalf("a: Reserve(0): %v", err)
	}
	if err := a.commit(va, 0, 10); err != nil {
		t.Fatalf("a: commit under its reserve: %v", err)
	}

	// b waits for a's release.
	type reserved struct {
		v   zkstore.Version
		err error
	}
	var mu sync.Mutex
	var holders []zkstore.Holder
	got := make(chan reserved, 1)
	go func() {
		v, err := b.owners.Reserve(ctx, 0, 2, func(h zkstore.Holder) {
			mu.Lock()
			holders = append(holders, h)
			mu.Unlock()
		})
		got <- reserved{v, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("b reserved partition 0 while a holds it: %+v", r)
	case <-time.After(500 * time.Millisecond):
	}
	mu.Lock()
	if len(holders) != 1 || holders[0].Node != "node-a" {
		t.Errorf("b was told of holders %+v, want node-a once", holders)
	}
	mu.Unlock()
	if err := a.owners.Release(0, va, 2); err != nil {
		t.Fatalf("a: Release: %v", err)
	}
	released := time.Now()
	var vb zkstore.Version
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("b: Reserve: %v", r.err)
		}
		vb = r.v
		t.Logf("b reserved partition 0 %v after a's release (version %d)", time.Since(released).Round(time.Millisecond), vb.Version)
	case <-time.After(10 * time.Second):
		t.Fatal("b did not reserve partition 0 after a released it")
	}
	if vb.Version != va.Version+2 {
		t.Errorf("versions: a reserved %d, b %d: want a release in between", va.Version, vb.Version)
	}
	if err := a.commit(va, 0, 11); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("a committed after its release: %v", err)
	}
	if err := b.commit(vb, 0, 12); err != nil {
		t.Fatalf("b: commit: %v", err)
	}
	if err := a.owners.Release(0, va, 3); !errors.Is(err, zkstore.ErrNotOwner) {
		t.Fatalf("a released a partition b holds: %v", err)
	}

	// b's session ends (as at a crash, once it expires): a, waiting for
	// the partition, reserves it at once.
	va2Ch := make(chan reserved, 1)
	go func() {
		v, err := a.owners.Reserve(ctx, 0, 3, nil)
		va2Ch <- reserved{v, err}
	}()
	b.conn.Close()
	var va2 zkstore.Version
	select {
	case r := <-va2Ch:
		if r.err != nil {
			t.Fatalf("a: Reserve after b's session ended: %v", r.err)
		}
		va2 = r.v
	case <-time.After(10 * time.Second):
		t.Fatal("a did not reserve partition 0 after b's session ended")
	}
	if err := a.commit(va, 0, 13); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("a committed under its first, lost, reserve: %v", err)
	}
	if err := a.commit(va2, 0, 13); err != nil {
		t.Fatalf("a: commit under its new reserve: %v", err)
	}
	if o, ok, err := a.store.LoadPartition(context.Background(), 0); err != nil || !ok || o != 13 {
		t.Fatalf("LoadPartition(0) = %d, %v, %v; want 13", o, ok, err)
	}

	// A watcher of a's hold sees another member take it over.
	c := ownersJoin(t, chroot, id, topic, "node-c")
	watch := make(chan error, 1)
	go func() { watch <- a.owners.Watch(ctx, va2) }()
	if _, err := a.owners.Reserve(ctx, 0, 4, nil); err != nil { // a again: bumps the version
		t.Fatalf("a: Reserve again in its own session: %v", err)
	}
	select {
	case err := <-watch:
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not see the record change")
	}
	if err := a.commit(va2, 0, 14); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("a committed under a hold it reserved again since: %v", err)
	}

	// A node restarting while its previous session lives waits for it.
	c2Joined := make(chan error, 1)
	var waitedFor int64
	go func() {
		conn := zkConnect(t)
		o := zkstore.NewOwners(conn, chroot, id, topic, "node-c", "", zkstore.ACL{})
		_, err := o.Join(ctx, func(s int64) { waitedFor = s })
		c2Joined <- err
	}()
	select {
	case err := <-c2Joined:
		t.Fatalf("node-c joined again while its first session lives: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	c.conn.Close()
	select {
	case err := <-c2Joined:
		if err != nil {
			t.Fatalf("node-c's second Join: %v", err)
		}
		if waitedFor == 0 {
			t.Errorf("the second Join was not told which session it waited for")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node-c did not join again after its first session ended")
	}

	states, members, err := zkstore.ReadOwners(admin, chroot, id, topic)
	if err != nil {
		t.Fatal(err)
	}
	if st := states[0]; st.Owner != "node-a" || !st.Live || st.Generation != 4 {
		t.Errorf("ReadOwners: partition 0 %+v, want node-a, live, generation 4", st)
	}
	if _, ok := members["node-a"]; !ok || len(members) != 2 {
		t.Errorf("ReadOwners: members %v, want node-a and node-c", members)
	}
}
