package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// kafkaFencer is the fencer of the Kafka offset store: the consumer group
// fanout_<id> records the leader. Its one member, which holds the static
// instance id every node joins with, is the leader; the member's metadata
// names its epoch, node and address (the record); its membership (member id
// and generation) fences the term's commits. Recording an epoch is a join,
// which replaces the previous member at once; the term keeps its membership
// alive with a heartbeat at every read, and a membership the coordinator no
// longer knows (replaced, expired) is a lost session: the term ends.
type kafkaFencer struct {
	store *kafkastore.Store
	log   *logrus.Entry

	member *kafkastore.Member // the membership this node holds; only the fence watcher touches it
	lost   atomic.Int64       // memberships lost so far: the session changes with each
	ok     atomic.Bool        // the coordinator answered the last request
}

// newKafkaFencer returns the fencer of store.
func newKafkaFencer(store *kafkastore.Store, log *logrus.Entry) *kafkaFencer {
	return &kafkaFencer{store: store, log: log.WithField("group", store.Group())}
}

// name implements fencer.
func (f *kafkaFencer) name() string { return "kafka" }

// offsetStore implements Fencer.
func (f *kafkaFencer) offsetStore() OffsetStore { return OffsetStore_OFFSET_STORE_KAFKA }

// repair implements Fencer.
func (f *kafkaFencer) repair() string {
	return "remove the members that are not fanout leaders from the group, or run every member with the same --assignment"
}

// read implements fencer: a heartbeat of the membership this node holds, if
// any (a refusal drops it), then the group's description. A group cannot be
// watched: changed is nil, and the watcher reads again every heartbeat.
func (f *kafkaFencer) read(ctx context.Context) (record, <-chan zk.Event, error) {
	if f.member != nil {
		err := f.store.Heartbeat(ctx, *f.member)
		switch {
		case errors.Is(err, offsets.ErrFenced):
			f.drop(err)
		case err != nil:
			f.ok.Store(false)
			return record{}, nil, fmt.Errorf("cluster: heartbeat of the leader membership: %w", err)
		}
	}
	rec, err := f.describe(ctx)
	return rec, nil, err
}

// describe reads the record from the group: its holder's metadata, or, in
// a group without members, Missing with the highest epoch its committed
// offsets name (so that epochs go on from there).
func (f *kafkaFencer) describe(ctx context.Context) (record, error) {
	d, err := f.store.Describe(ctx)
	if err != nil {
		f.ok.Store(false)
		return record{}, fmt.Errorf("cluster: read the leader record: %w", err)
	}
	f.ok.Store(true)
	h, held, err := d.Holder()
	switch {
	case errors.Is(err, kafkastore.ErrForeignMember), errors.Is(err, kafkastore.ErrOtherMode):
		return record{Corrupt: true}, fmt.Errorf("cluster: group %s: %w", f.store.Group(), err)
	case err != nil:
		return record{}, fmt.Errorf("cluster: group %s: %w", f.store.Group(), err)
	case !held:
		epoch, err := f.store.LastEpoch(ctx)
		if err != nil {
			return record{}, fmt.Errorf("cluster: read the last epoch: %w", err)
		}
		return record{Missing: true, Epoch: epoch}, nil
	}
	return record{Epoch: h.Leader.Epoch, Node: h.Leader.Node, Addr: h.Leader.Addr, Member: h.MemberID}, nil
}

// fence implements fencer: when the group records an epoch below epoch
// (its member's, or the highest its offsets name), this node joins it,
// replacing the member, and the term's commits are fenced by the new
// membership. The check and the join are two requests: two nodes could both
// pass the check (the vote makes it rare), then the later join replaces the
// earlier one, whose term ends and whose commits are refused.
func (f *kafkaFencer) fence(ctx context.Context, epoch uint64, node, addr string) (record, offsets.Fence, uint64, error) {
	cur, err := f.describe(ctx)
	if err != nil {
		return record{}, offsets.Fence{}, 0, err
	}
	if cur.Epoch >= epoch {
		return record{}, offsets.Fence{}, cur.Epoch, fmt.Errorf("group %s holds epoch %d (node %q), not below %d: %w",
			f.store.Group(), cur.Epoch, cur.Node, epoch, errVoid)
	}
	m, err := f.store.Join(ctx, kafkastore.Leader{Epoch: epoch, Node: node, Addr: addr})
	switch {
	case errors.Is(err, offsets.ErrFenced):
		return record{}, offsets.Fence{}, 0, fmt.Errorf("another node joined group %s under epoch %d: %w: %w", f.store.Group(), epoch, errVoid, err)
	case err != nil:
		return record{}, offsets.Fence{}, 0, fmt.Errorf("cluster: %w", err)
	}
	f.member = &m
	rec := record{Epoch: epoch, Node: node, Addr: addr, Member: m.MemberID}
	return rec, offsets.TopicFence(m), epoch, nil
}

// release implements fencer: the membership of the ended term that wrote
// rec leaves the group (if this node still holds it), so that the group is
// empty at once rather than after the session timeout.
func (f *kafkaFencer) release(ctx context.Context, rec record) {
	if f.member == nil || f.member.MemberID != rec.Member {
		return
	}
	m := *f.member
	f.member = nil
	if err := f.store.Leave(ctx, m); err != nil {
		f.log.WithError(err).Info("leaving the group after the term: the coordinator drops the membership at its session timeout")
	}
}

// drop forgets the membership the coordinator no longer knows: a new
// session.
func (f *kafkaFencer) drop(cause error) {
	f.log.WithError(cause).WithField("member", f.member.MemberID).Warn("the group no longer has this node's membership")
	f.member = nil
	f.lost.Add(1)
}

// session implements fencer: it changes whenever a membership is lost.
func (f *kafkaFencer) session() int64 { return f.lost.Load() + 1 }

// connected implements fencer.
func (f *kafkaFencer) connected() bool { return f.ok.Load() }

// WithoutLeader returns a Fencer that records no leader, for a mode whose
// members elect none: spread mode on the Kafka store, whose group
// coordinator tracks the members and whose group leader plans the
// assignment. Its members still heartbeat (who is alive, ready, in which
// mode and store, for fanout status and the console), saying f's store, but
// nobody claims: the record is always missing.
func WithoutLeader(f Fencer) Fencer { return unled{store: f.offsetStore(), label: f.name()} }

// unled is WithoutLeader's fencer.
type unled struct {
	store OffsetStore
	label string
}

func (u unled) read(context.Context) (record, <-chan zk.Event, error) {
	return record{Missing: true}, nil, nil
}
func (u unled) fence(context.Context, uint64, string, string) (record, offsets.Fence, uint64, error) {
	return record{}, offsets.Fence{}, 0, fmt.Errorf("cluster: %s records no leader: %w", u.label, errVoid)
}
func (u unled) release(context.Context, record) {}
func (u unled) session() int64                  { return 1 }
func (u unled) connected() bool                 { return false }
func (u unled) name() string                    { return u.label + " (no leader: its group assigns)" }
func (u unled) offsetStore() OffsetStore        { return u.store }
func (u unled) repair() string                  { return "nothing to repair: no leader is recorded" }
