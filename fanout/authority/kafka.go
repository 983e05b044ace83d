package authority

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// kafkaGroup is the Kafka store: the consumer group fanout_<id>, whose
// committed offsets are the offsets and whose one member is the leader
// (cluster.KafkaFencer). It keeps no ownership records.
type kafkaGroup struct {
	kind  Kind
	store *kafkastore.Store
}

// openKafka opens the Kafka store on cfg.Client: no connection of its own.
func openKafka(_ context.Context, kind Kind, cfg Config) (Authority, error) {
	if cfg.Client == nil {
		return nil, errors.New("authority: the Kafka store needs Config.Client")
	}
	return &kafkaGroup{kind: kind, store: kafkastore.New(cfg.Client, cfg.ID, cfg.Topic, cfg.KafkaSessionTimeout)}, nil
}

func (k *kafkaGroup) Kind() Kind             { return k.kind }
func (k *kafkaGroup) Location() string       { return k.store.Group() }
func (k *kafkaGroup) Where() string          { return k.kind.Name + " group " + k.Location() }
func (k *kafkaGroup) Offsets() offsets.Store { return k.store }
func (k *kafkaGroup) Owners() (Owners, bool) { return nil, false }

// Close does nothing: the client is the caller's.
func (k *kafkaGroup) Close() {}

func (k *kafkaGroup) Fencer(log *logrus.Entry) cluster.Fencer {
	return cluster.KafkaFencer(k.store, log)
}

// Leader reads the group's member: nil when the group has none.
func (k *kafkaGroup) Leader(ctx context.Context) (*status.Leader, error) {
	d, err := k.store.Describe(ctx)
	if err != nil {
		return nil, fmt.Errorf("leader record: %w", err)
	}
	h, ok, err := d.Holder()
	if err != nil {
		return nil, fmt.Errorf("leader record: group %s: %w", k.store.Group(), err)
	}
	if !ok {
		return nil, nil
	}
	return &status.Leader{Node: h.Leader.Node, Addr: h.Leader.Addr, Epoch: h.Leader.Epoch}, nil
}

// Take joins the group as the leader would (cluster.TakeKafka).
func (k *kafkaGroup) Take(ctx context.Context, seen uint64) (Taken, error) {
	m, err := cluster.TakeKafka(ctx, k.store, seen)
	if err != nil {
		return nil, err
	}
	return &kafkaTaken{store: k.store, member: m}, nil
}

func (k *kafkaGroup) IdleFence(_ context.Context, note string) (offsets.Fence, error) {
	return k.store.EmptyFence(note), nil
}

// leaveTimeout bounds a Taken's leave of the group.
const leaveTimeout = 5 * time.Second

// kafkaTaken is the membership a tool's join took.
type kafkaTaken struct {
	store  *kafkastore.Store
	member kafkastore.Member
}

func (t *kafkaTaken) Epoch() uint64 { return t.member.Epoch }
func (t *kafkaTaken) Commit(ctx context.Context, offs map[int32]int64) error {
	return t.store.Commit(ctx, offsets.TopicFence(t.member), offs)
}

// Release leaves the group: refused once a leader replaced the member,
// then there is nothing to leave.
func (t *kafkaTaken) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	_ = t.store.Leave(ctx, t.member)
}
