package authority

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// zooKeeper is the ZooKeeper store: the offsets znodes (zkstore.Store),
// the fence znode that records the leader (cluster.ZooKeeperFencer), and
// the partitions' ownership records (zkstore.Owners), in one session.
type zooKeeper struct {
	kind      Kind
	id, topic string
	conn      *zk.Conn
	chroot    string
	acl       zkstore.ACL
	store     *zkstore.Store
}

// openZooKeeper connects to ZooKeeper and opens its store.
func openZooKeeper(ctx context.Context, kind Kind, cfg Config) (Authority, error) {
	if cfg.ConnectZooKeeper == nil {
		return nil, errors.New("authority: the ZooKeeper store needs Config.ConnectZooKeeper")
	}
	servers, chroot, err := zkstore.ParseServers(cfg.ZooKeeper)
	if err != nil {
		return nil, err
	}
	conn, err := cfg.ConnectZooKeeper(ctx, servers)
	if err != nil {
		return nil, err
	}
	z := &zooKeeper{kind: kind, id: cfg.ID, topic: cfg.Topic, conn: conn, chroot: chroot,
		acl: cfg.ZooKeeperSecurity.ACL(chroot), store: zkstore.New(conn, chroot, cfg.ID, cfg.Topic)}
	z.store.SetACL(z.acl)
	if cfg.Logger != nil {
		z.acl.WarnOpen(conn, cfg.Logger, z.store.Path(), z.store.ProgressPath(), z.fencePath(),
			zkstore.OwnersPath(chroot, cfg.ID, cfg.Topic))
	}
	return z, nil
}

func (z *zooKeeper) Kind() Kind             { return z.kind }
func (z *zooKeeper) Location() string       { return z.store.Path() }
func (z *zooKeeper) Where() string          { return z.kind.Name + " " + z.Location() }
func (z *zooKeeper) Offsets() offsets.Store { return z.store }
func (z *zooKeeper) Close()                 { z.conn.Close() }

// fencePath is the fence znode, chroot included.
func (z *zooKeeper) fencePath() string { return z.chroot + cluster.FencePath(z.id, z.topic) }

func (z *zooKeeper) Fencer(*logrus.Entry) cluster.Fencer {
	return cluster.ZooKeeperFencer(z.conn, z.chroot, z.id, z.topic, z.acl)
}

// Leader reads the fence znode: nil when there is none, or at epoch 0
// (created, never won).
func (z *zooKeeper) Leader(context.Context) (*status.Leader, error) {
	path := z.fencePath()
	data, _, err := z.conn.Get(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("leader record %s: %w", path, err)
	}
	var rec status.Leader
	if len(data) > 0 {
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, fmt.Errorf("leader record %s holds %q: %w", path, data, err)
		}
	}
	if rec.Epoch == 0 {
		return nil, nil
	}
	return &rec, nil
}

func (z *zooKeeper) Owners() (Owners, bool) { return zkOwners{z}, true }

// Take prepares the compare-and-set of the fence znode that the commit
// makes in the same multi-op as the offsets (cluster.TakeZooKeeper).
func (z *zooKeeper) Take(_ context.Context, seen uint64) (Taken, error) {
	take, epoch, err := cluster.TakeZooKeeper(z.conn, z.chroot, z.id, z.topic, z.acl, seen)
	if err != nil {
		return nil, err
	}
	return &zkTaken{store: z.store, take: take, epoch: epoch}, nil
}

func (z *zooKeeper) IdleFence(context.Context, string) (offsets.Fence, error) {
	return cluster.IdleFence(z.conn, z.chroot, z.id, z.topic, z.acl)
}

// zkTaken is the take of the fence znode, written with the offsets.
type zkTaken struct {
	store *zkstore.Store
	take  zkstore.Take
	epoch uint64
}

func (t *zkTaken) Epoch() uint64 { return t.epoch }
func (t *zkTaken) Commit(ctx context.Context, offs map[int32]int64) error {
	return t.store.CommitTaking(ctx, []zkstore.Take{t.take}, offs)
}

// Release does nothing: the record stays until the next leader's
// compare-and-set.
func (t *zkTaken) Release() {}

// zkOwners are the ownership records of the ZooKeeper store.
type zkOwners struct{ z *zooKeeper }

// Assigns is false: the elected leader assigns, ZooKeeper records who
// holds each partition.
func (zkOwners) Assigns() bool { return false }

func (o zkOwners) Member(m Member, elected Assignments) Claims {
	return &zkClaims{Assignments: elected, owners: zkstore.NewOwners(o.z.conn, o.z.chroot, o.z.id, o.z.topic, m.Node, m.Addr, o.z.acl),
		Store: o.z.store}
}

// Read reads every partition's ownership record: its owner, live while the
// owner's member znode is of the session the record names.
func (o zkOwners) Read(context.Context) (Holdings, error) {
	owners, _, err := zkstore.ReadOwners(o.z.conn, o.z.chroot, o.z.id, o.z.topic)
	if err != nil {
		return Holdings{}, err
	}
	h := Holdings{Holders: make(map[int32]status.Holder, len(owners))}
	for p, st := range owners {
		h.Holders[p] = status.Holder{Node: st.Owner, Live: st.Live}
	}
	return h, nil
}

// zkClaims are a member's claims on the ZooKeeper store: the ownership
// records (zkstore.Owners), whose versions (zkstore.Version) are the
// conditions, following the elected leader's assignment; the offsets znodes
// for a partition's offset.
type zkClaims struct {
	Assignments
	*zkstore.Store // LoadPartition, LoadPartitionProgress
	owners         *zkstore.Owners
}

func (c *zkClaims) Session() int64 { return c.owners.Session() }

func (c *zkClaims) Join(ctx context.Context, waiting func(int64)) (int64, error) {
	return c.owners.Join(ctx, waiting)
}

func (c *zkClaims) Reserve(ctx context.Context, p int32, gen uint64, waiting func(Holder)) (offsets.Condition, error) {
	v, err := c.owners.Reserve(ctx, p, gen, func(h zkstore.Holder) {
		if waiting != nil {
			waiting(Holder{Node: h.Node, Session: h.Session})
		}
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (c *zkClaims) Release(p int32, cond offsets.Condition, gen uint64) error {
	v, ok := cond.(zkstore.Version)
	if !ok {
		return fmt.Errorf("%w: %v is no ownership record's version", ErrNotOwner, cond)
	}
	if err := c.owners.Release(p, v, gen); errors.Is(err, zkstore.ErrNotOwner) {
		return fmt.Errorf("%w: %w", ErrNotOwner, err)
	} else if err != nil {
		return err
	}
	return nil
}

// Leave does nothing: the member znode goes when the session closes.
func (c *zkClaims) Leave(context.Context) error { return nil }

func (c *zkClaims) Watch(ctx context.Context, cond offsets.Condition) error {
	v, ok := cond.(zkstore.Version)
	if !ok {
		return nil // not ours: it does not hold
	}
	return c.owners.Watch(ctx, v)
}
