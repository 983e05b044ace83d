package authority

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// kafkaGroup is the Kafka store: the consumer group fanout_<id>, whose
// committed offsets are the offsets, and whose members are, in leader mode,
// the leader alone (cluster.KafkaFencer), in spread mode every member
// (kafkaOwners).
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
func (k *kafkaGroup) Owners() (Owners, bool) { return kafkaOwners{k}, true }

// Close does nothing: the client is the caller's.
func (k *kafkaGroup) Close() {}

func (k *kafkaGroup) Fencer(log *logrus.Entry) cluster.Fencer {
	return cluster.KafkaFencer(k.store, log)
}

// Leader reads the group's member: nil when the group has none. In spread
// mode it is the member that planned the generation in force (the group's
// leader; epoch 0: no election), nil while the group rebalances.
func (k *kafkaGroup) Leader(ctx context.Context) (*status.Leader, error) {
	d, err := k.store.Describe(ctx)
	if err != nil {
		return nil, fmt.Errorf("leader record: %w", err)
	}
	if d.Mode() == kafkastore.ModeSpread {
		plan := d.Plan()
		if plan == nil {
			return nil, nil
		}
		o, _ := plan.Owner(plan.Leader)
		return &status.Leader{Node: plan.Leader, Addr: o.Addr}, nil
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

// kafkaOwners are spread mode on the Kafka store: the members of the group
// fanout_<id>, each with its node id as static instance id; the group's
// leader plans every generation with cluster.PlanGroup, the coordinator
// hands each member its partitions and fences its commits by generation.
type kafkaOwners struct{ k *kafkaGroup }

// Assigns is true: the group assigns, nobody is elected.
func (kafkaOwners) Assigns() bool { return true }

// Member returns the claims of m's membership of the group (on m.Client);
// the election's assignment is not used.
func (o kafkaOwners) Member(m Member, _ Assignments) Claims {
	sp := o.k.store.Spread(kafkastore.SpreadConfig{Node: m.Node, Addr: m.Addr, Weight: m.Weight, Client: m.Client,
		Heartbeat: m.Heartbeat, Planner: cluster.PlanGroup, Committed: m.Committed, Logger: m.Logger})
	return &kafkaClaims{sp: sp, Store: o.k.store}
}

// Read describes the group: each member holds the partitions its
// assignment gives it; the assignment is the newest plan the members
// carry. A group that rebalances shows no holder and no assignment.
func (o kafkaOwners) Read(ctx context.Context) (Holdings, error) {
	d, err := o.k.store.Describe(ctx)
	if err != nil {
		return Holdings{}, err
	}
	h := Holdings{Holders: map[int32]status.Holder{}}
	if d.Mode() != kafkastore.ModeSpread {
		return h, nil
	}
	for _, m := range d.Members {
		for _, p := range m.Held {
			h.Holders[p] = status.Holder{Node: m.InstanceID, Live: true}
		}
	}
	h.Assignment = cluster.AssignmentOfPlan(d.Plan())
	return h, nil
}

// kafkaClaims are a member's claims on the Kafka store: its membership of
// the group (kafkastore.Spread), whose claims (kafkastore.Claim) are the
// conditions; the group's committed offsets for a partition's offset.
type kafkaClaims struct {
	sp                *kafkastore.Spread
	*kafkastore.Store // LoadPartition, LoadPartitionProgress

	mu       sync.Mutex // guards the cache below
	planned  *kafkastore.Plan
	assigned *cluster.Assignment // of planned
}

// Assignment is the plan in force as spread mode's assignment: the same
// value until the plan changes.
func (c *kafkaClaims) Assignment() *cluster.Assignment {
	plan := c.sp.Plan()
	c.mu.Lock()
	defer c.mu.Unlock()
	if plan != c.planned {
		c.planned, c.assigned = plan, cluster.AssignmentOfPlan(plan)
	}
	return c.assigned
}

func (c *kafkaClaims) AssignmentChanged() <-chan struct{} { return c.sp.Changed() }
func (c *kafkaClaims) Session() int64                     { return c.sp.Session() }

// Join waits for the membership; waiting is not used (a process that
// joins with this node id replaces the one that held it).
func (c *kafkaClaims) Join(ctx context.Context, _ func(int64)) (int64, error) { return c.sp.Join(ctx) }

func (c *kafkaClaims) Reserve(ctx context.Context, p int32, _ uint64, waiting func(Holder)) (offsets.Condition, error) {
	claim, err := c.sp.Reserve(ctx, p, func(holder string) {
		if waiting != nil {
			waiting(Holder{Node: holder})
		}
	})
	if err != nil {
		return nil, err
	}
	return claim, nil
}

func (c *kafkaClaims) Release(p int32, cond offsets.Condition, _ uint64) error {
	claim, ok := cond.(kafkastore.Claim)
	if !ok || claim.Partition != p {
		return fmt.Errorf("%w: %v is no claim of partition %d", ErrNotOwner, cond, p)
	}
	if err := c.sp.Release(claim); errors.Is(err, kafkastore.ErrNotHeld) {
		return fmt.Errorf("%w: %w", ErrNotOwner, err)
	} else if err != nil {
		return err
	}
	return nil
}

func (c *kafkaClaims) Watch(ctx context.Context, cond offsets.Condition) error {
	claim, ok := cond.(kafkastore.Claim)
	if !ok {
		return nil // not ours: it does not hold
	}
	return c.sp.Watch(ctx, claim)
}

func (c *kafkaClaims) Leave(ctx context.Context) error { return c.sp.Leave(ctx) }
