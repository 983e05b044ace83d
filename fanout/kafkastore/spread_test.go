package kafkastore_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The membership's timing on the in-process Kafka: a short session, so
// that a crashed member is dropped soon.
const (
	spSession   = time.Second
	spHeartbeat = 50 * time.Millisecond
)

// spreadKafka returns an in-process Kafka with the topic "jobs" of n
// partitions, whose groups accept short sessions.
func spreadKafka(t *testing.T, n int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(n, "jobs"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// spMember is one spread member: its store (on a client of its own) and
// its membership (on another).
type spMember struct {
	node   string
	store  *kafkastore.Store
	sp     *kafkastore.Spread
	client sarama.Client // the membership's
}

func newClient(t *testing.T, c *kfake.Cluster) sarama.Client {
	t.Helper()
	client, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("spread-test"))
	if err != nil {
		t.Fatalf("sarama client: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func quiet() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

func newMember(t *testing.T, c *kfake.Cluster, node string) *spMember {
	t.Helper()
	return newWeightedMember(t, c, node, 1)
}

func newWeightedMember(t *testing.T, c *kfake.Cluster, node string, weight int) *spMember {
	t.Helper()
	store := kafkastore.New(newClient(t, c), "svc", "jobs", spSession)
	m := &spMember{node: node, store: store, client: newClient(t, c)}
	m.sp = store.Spread(kafkastore.SpreadConfig{Node: node, Addr: node + ":4987", Weight: weight, Client: m.client,
		Heartbeat: spHeartbeat, Planner: cluster.PlanGroup, Logger: quiet()})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.sp.Leave(ctx)
	})
	return m
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (m *spMember) join(t *testing.T) {
	t.Helper()
	if _, err := m.sp.Join(tctx(t)); err != nil {
		t.Fatalf("%s: Join: %v", m.node, err)
	}
}

// target and held return what the plan in force gives m.
func (m *spMember) target() []int32 {
	o, _ := m.sp.Plan().Owner(m.node)
	return o.Target
}

func (m *spMember) held() []int32 {
	o, _ := m.sp.Plan().Owner(m.node)
	return o.Held
}

// reserve reserves p, which the generation in force must grant m already.
func (m *spMember) reserve(t *testing.T, p int32) kafkastore.Claim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := m.sp.Reserve(ctx, p, nil)
	if err != nil {
		t.Fatalf("%s: Reserve(%d): %v", m.node, p, err)
	}
	return c
}

// commit commits offs, each partition under its claim.
func (m *spMember) commit(ctx context.Context, claims map[int32]kafkastore.Claim, offs map[int32]int64) error {
	conds := map[int32]offsets.Condition{}
	for p := range offs {
		conds[p] = claims[p]
	}
	return m.store.Commit(ctx, offsets.PartitionFence(conds), offs)
}

// Two members share four partitions: each holds its targets and commits
// them under its claims, with the member's node and the group's generation
// in the metadata. A third member joins: the partitions that move stay
// with their holder until it releases them (its commits of them still
// count meanwhile; the joiner waits), the others never pause (the claims
// made before both rebalances still commit); then the joiner reserves them,
// and the holder's old claims are refused and watched out.
func TestSpreadMembersShareAndMoveCooperatively(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 6)
	a, b := newMember(t, c, "node-a"), newMember(t, c, "node-b")
	a.join(t)
	b.join(t)
	testutil.WaitFor(t, 20*time.Second, "a plan of both members, each holding its targets", func() bool {
		pa, pb := a.sp.Plan(), b.sp.Plan()
		return pa != nil && pb != nil && pa.Generation == pb.Generation && len(a.held()) == 3 && len(b.held()) == 3 &&
			slices.Equal(a.held(), a.target())
	})
	claims := map[int32]kafkastore.Claim{}
	for _, p := range a.held() {
		claims[p] = a.reserve(t, p)
	}
	offs := map[int32]int64{}
	for _, p := range a.held() {
		offs[p] = int64(10 + p)
	}
	if err := a.commit(tctx(t), claims, offs); err != nil {
		t.Fatalf("a's commit under its claims: %v", err)
	}
	committed, err := b.store.Committed(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	p0 := a.held()[0]
	info, ok := kafkastore.ParseCommitInfo(committed[p0].Metadata)
	if !ok || info.Node != "node-a" || info.Generation != a.sp.Plan().Generation || info.Epoch != 0 {
		t.Errorf("metadata %q: want node-a, generation %d, no epoch", committed[p0].Metadata, a.sp.Plan().Generation)
	}

	aHeld := slices.Clone(a.held())
	joined := newMember(t, c, "node-c")
	joined.join(t)
	var moving, staying []int32
	testutil.WaitFor(t, 20*time.Second, "the plan of three members", func() bool {
		pc := joined.sp.Plan()
		if pc == nil || len(pc.Owners) != 3 || a.sp.Plan() == nil || a.sp.Plan().Generation < pc.Generation {
			return false
		}
		moving, staying = nil, nil
		for _, p := range aHeld {
			if slices.Contains(a.target(), p) {
				staying = append(staying, p)
			} else {
				moving = append(moving, p)
			}
		}
		return len(a.target()) == 2
	})
	if len(moving) != 1 || !slices.Equal(a.held(), aHeld) {
		t.Fatalf("a targets %v, holds %v (held %v before): want one partition moving, every one still held", a.target(), a.held(), aHeld)
	}
	mv := moving[0]
	if slices.Contains(joined.held(), mv) || !slices.Contains(joined.target(), mv) {
		t.Fatalf("the joiner holds %v, targets %v: partition %d is its target, and a's until released", joined.held(), joined.target(), mv)
	}
	var told []string
	var mu sync.Mutex
	reserved := make(chan kafkastore.Claim, 1)
	go func() {
		cl, err := joined.sp.Reserve(tctx(t), mv, func(h string) {
			mu.Lock()
			told = append(told, h)
			mu.Unlock()
		})
		if err == nil {
			reserved <- cl
		}
	}()
	if err := a.commit(tctx(t), claims, map[int32]int64{mv: 50, staying[0]: 60}); err != nil {
		t.Fatalf("a's last commit of the partition it hands over: %v", err)
	}
	select {
	case <-reserved:
		t.Fatal("the joiner reserved the partition before its holder released it")
	case <-time.After(300 * time.Millisecond):
	}
	if err := a.sp.Release(claims[mv]); err != nil {
		t.Fatalf("a releases %d: %v", mv, err)
	}
	var cc kafkastore.Claim
	select {
	case cc = <-reserved:
	case <-time.After(20 * time.Second):
		t.Fatal("the joiner never reserved the released partition")
	}
	mu.Lock()
	if !slices.Equal(told, []string{"node-a"}) {
		t.Errorf("the joiner was told of holders %v, want [node-a]", told)
	}
	mu.Unlock()
	err = a.commit(tctx(t), claims, map[int32]int64{mv: 99})
	if !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("a's commit of the partition it released: %v, want ErrFenced", err)
	}
	if err := a.sp.Watch(tctx(t), claims[mv]); err != nil {
		t.Errorf("Watch of the released claim: %v", err)
	}
	// Until a has the new generation the coordinator refuses its commits,
	// as rebalancing, never as fenced: they are made again.
	testutil.WaitFor(t, 20*time.Second, "a's claims of the partitions it kept, made before both rebalances, commit", func() bool {
		err := a.commit(tctx(t), claims, map[int32]int64{staying[0]: 61, staying[1]: 70})
		if errors.Is(err, offsets.ErrFenced) {
			t.Fatalf("a's commit of the partitions it kept: %v", err)
		}
		return err == nil
	})
	if err := joined.commit(tctx(t), map[int32]kafkastore.Claim{mv: cc}, map[int32]int64{mv: 51}); err != nil {
		t.Errorf("the joiner's commit of the partition it reserved: %v", err)
	}
	got, _ := b.store.Load(tctx(t))
	if got[mv] != 51 || got[staying[0]] != 61 {
		t.Errorf("offsets %v: want %d at 51 and %d at 61", got, mv, staying[0])
	}
}

// Each member's weight goes to the group's leader in its join: a member of
// weight 2 holds twice the share of one of weight 1, whichever of them
// plans, and the plan every member receives carries both addresses.
func TestSpreadWeightIsTheShare(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 6)
	a, b := newWeightedMember(t, c, "node-a", 1), newWeightedMember(t, c, "node-b", 2)
	a.join(t)
	b.join(t)
	testutil.WaitFor(t, 20*time.Second, "a plan of both members, each holding its targets", func() bool {
		pa, pb := a.sp.Plan(), b.sp.Plan()
		return pa != nil && pb != nil && pa.Generation == pb.Generation && len(pa.Owners) == 2 &&
			len(a.held())+len(b.held()) == 6 && slices.Equal(a.held(), a.target()) && slices.Equal(b.held(), b.target())
	})
	if len(a.held()) != 2 || len(b.held()) != 4 {
		t.Errorf("node-a (weight 1) holds %v, node-b (weight 2) %v: want 2 and 4 of 6", a.held(), b.held())
	}
	for _, m := range []*spMember{a, b} {
		var addrs []string
		for _, o := range m.sp.Plan().Owners {
			addrs = append(addrs, o.Addr)
		}
		if !slices.Equal(addrs, []string{"node-a:4987", "node-b:4987"}) {
			t.Errorf("%s's plan lists addresses %v, want both members'", m.node, addrs)
		}
	}
}

// A member that leaves hands its partitions to the others at once; its
// claims are refused from then on.
func TestSpreadLeaveHandsOver(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 4)
	a, b := newMember(t, c, "node-a"), newMember(t, c, "node-b")
	a.join(t)
	b.join(t)
	testutil.WaitFor(t, 20*time.Second, "both hold two partitions", func() bool {
		return len(a.held()) == 2 && len(b.held()) == 2
	})
	p := a.held()[0]
	claim := a.reserve(t, p)
	if err := a.sp.Leave(tctx(t)); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	testutil.WaitFor(t, 20*time.Second, "b holds every partition", func() bool {
		return len(b.held()) == 4 && len(b.sp.Plan().Owners) == 1
	})
	if err := a.commit(tctx(t), map[int32]kafkastore.Claim{p: claim}, map[int32]int64{p: 5}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("the left member's commit: %v, want ErrFenced", err)
	}
	if a.sp.Session() != 0 {
		t.Errorf("session %d after Leave, want 0", a.sp.Session())
	}
}

// A member whose process stops without leaving (its heartbeats stop) is
// dropped by the coordinator at its session timeout; its partitions go to
// the others. The dropped member, its heartbeats answered again, learns it
// lost its membership: its claims are refused and watched out.
func TestSpreadCrashedMemberIsDropped(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 4)
	a, b := newMember(t, c, "node-a"), newMember(t, c, "node-b")
	a.join(t)
	b.join(t)
	testutil.WaitFor(t, 20*time.Second, "both hold two partitions", func() bool {
		return len(a.held()) == 2 && len(b.held()) == 2
	})
	p := b.held()[0]
	claim := b.reserve(t, p)
	session := b.sp.Session()
	// b's membership client loses its connection for good: its heartbeats
	// stop reaching the coordinator.
	_ = b.client.Close()
	testutil.WaitFor(t, 20*time.Second, "a holds every partition", func() bool { return len(a.held()) == 4 })
	testutil.WaitFor(t, 20*time.Second, "b notices it lost its membership", func() bool { return b.sp.Session() != session })
	if err := b.sp.Watch(tctx(t), claim); err != nil {
		t.Errorf("Watch: %v", err)
	}
	if err := b.commit(tctx(t), map[int32]kafkastore.Claim{p: claim}, map[int32]int64{p: 5}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("the dropped member's commit: %v, want ErrFenced", err)
	}
}

// A process that joins with a node id another process holds replaces it
// (static membership: the coordinator fences the old member id); the
// replaced member's commits are refused.
func TestSpreadSameNodeReplaces(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 2)
	a := newMember(t, c, "node-a")
	a.join(t)
	testutil.WaitFor(t, 20*time.Second, "a holds both partitions", func() bool { return len(a.held()) == 2 })
	claim := a.reserve(t, 0)
	again := newMember(t, c, "node-a")
	again.join(t)
	testutil.WaitFor(t, 20*time.Second, "the new process holds both partitions", func() bool { return len(again.held()) == 2 })
	err := a.commit(tctx(t), map[int32]kafkastore.Claim{0: claim}, map[int32]int64{0: 5})
	if !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("the replaced process's commit: %v, want ErrFenced", err)
	}
}

// Members of the two modes never share the group: the second is refused,
// with a message naming both modes and the members that hold the group.
func TestSpreadAndLeaderRefuseEachOther(t *testing.T) {
	t.Parallel()
	c := spreadKafka(t, 2)
	a := newMember(t, c, "node-a")
	a.join(t)
	leader := kafkastore.New(newClient(t, c), "svc", "jobs", spSession)
	_, err := leader.Join(tctx(t), kafkastore.Leader{Epoch: 1, Node: "node-l", Addr: "l:4987"})
	if !errors.Is(err, kafkastore.ErrOtherMode) || !strings.Contains(err.Error(), "node-a") ||
		!strings.Contains(err.Error(), "run --assignment spread, this member --assignment leader") {
		t.Errorf("a leader's join of a spread group: %v, want ErrOtherMode naming node-a and both modes", err)
	}
	d, err := leader.Describe(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Holder(); !errors.Is(err, kafkastore.ErrOtherMode) {
		t.Errorf("the leader record of a spread group: %v, want ErrOtherMode", err)
	}
	if err := a.sp.Leave(tctx(t)); err != nil {
		t.Fatal(err)
	}

	// The other way round: a leader holds the group.
	c2 := spreadKafka(t, 2)
	held := kafkastore.New(newClient(t, c2), "svc", "jobs", spSession)
	if _, err := held.Join(tctx(t), kafkastore.Leader{Epoch: 1, Node: "node-l", Addr: "l:4987"}); err != nil {
		t.Fatal(err)
	}
	s := newMember(t, c2, "node-s")
	_, err = s.sp.Join(tctx(t))
	if !errors.Is(err, kafkastore.ErrOtherMode) || !strings.Contains(err.Error(), "node-l") ||
		!strings.Contains(err.Error(), "run --assignment leader, this member --assignment spread") {
		t.Errorf("a spread member's join of a leader's group: %v, want ErrOtherMode naming node-l and both modes", err)
	}
}
