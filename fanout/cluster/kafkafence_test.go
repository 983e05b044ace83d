package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// kafkaNode is a node of a test whose authority is the Kafka group of its
// own offset store (as --offset-store kafka makes it).
type kafkaNode struct {
	*node
	client sarama.Client // the node's only client: closing it is a crash
	store  *kafkastore.Store
}

// startKafkaNode runs an Elector for nodeID on c whose authority is the
// group fanout_<id>, until cleanup or n.cancel.
func startKafkaNode(t *testing.T, c *kfake.Cluster, id, nodeID string) *kafkaNode {
	t.Helper()
	return startKafkaNodeWith(t, c, id, nodeID, nil)
}

// startKafkaNodeWith is startKafkaNode with the Config adjusted by tune,
// when set.
func startKafkaNodeWith(t *testing.T, c *kfake.Cluster, id, nodeID string, tune func(*Config)) *kafkaNode {
	t.Helper()
	cfg := testConfig(t, c, id, nodeID)
	if tune != nil {
		tune(&cfg)
	}
	store := kafkastore.New(cfg.Client, id, "jobs", 0)
	cfg.Fencer = KafkaFencer(store, cfg.Logger)
	n := runNode(t, cfg, func(e *Elector) fencer { return newKafkaFencer(store, e.log) })
	return &kafkaNode{node: n, client: cfg.Client, store: store}
}

// newKafkaWithTopic starts an in-process Kafka with the consumed topic
// "jobs" of two partitions (closed at cleanup).
func newKafkaWithTopic(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The Kafka group is the authority: three nodes agree on the highest as
// leader, named by the group's member; a crashed leader's membership is
// replaced by the next leader's join, and a commit under the crashed term's
// fence is refused while the new term's goes through.
func TestKafkaAuthorityFailover(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	a, b, cc := startKafkaNode(t, c, "k3", "a"), startKafkaNode(t, c, "k3", "b"), startKafkaNode(t, c, "k3", "c")
	agree := func(leader string, epoch uint64, nodes ...*kafkaNode) func() bool {
		return func() bool {
			for _, n := range nodes {
				l := n.e.Leadership()
				if !l.Known || l.LeaderID != leader || l.Epoch != epoch || l.LeaderAddr != leader+":4000" || l.Leader != (n.e.cfg.NodeID == leader) {
					return false
				}
			}
			return true
		}
	}
	testutil.WaitFor(t, 15*time.Second, "all to agree that c leads epoch 1", agree("c", 1, a, b, cc))
	cTerm := cc.lastTerm()
	if err := cc.store.Commit(testCtx(t), cTerm.Fence, map[int32]int64{0: 3}); err != nil {
		t.Fatalf("commit under the leader's fence: %v", err)
	}
	d, err := a.store.Describe(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if h, ok, err := d.Holder(); !ok || err != nil || *h.Leader != (kafkastore.Leader{Epoch: 1, Node: "c", Addr: "c:4000"}) {
		t.Fatalf("the group's member: %+v, %v, %v; want c's epoch 1", h, ok, err)
	}

	crashed := time.Now()
	_ = cc.client.Close() // a crash: no leave, the membership stays until replaced
	cc.stop()
	testutil.WaitFor(t, 15*time.Second, "b to lead epoch 2", agree("b", 2, a, b))
	t.Logf("failover after a crash: %v (LeaderTimeout %v)", time.Since(crashed), testLeaderTTL)

	err = b.store.Commit(testCtx(t), cTerm.Fence, map[int32]int64{0: 99})
	if !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("commit under the crashed leader's fence: %v, want ErrFenced", err)
	}
	bTerm := b.lastTerm()
	if err := b.store.Commit(testCtx(t), bTerm.Fence, map[int32]int64{0: 4}); err != nil {
		t.Fatalf("commit under the new leader's fence: %v", err)
	}
	if got, err := a.store.Load(testCtx(t)); err != nil || got[0] != 4 {
		t.Fatalf("offsets %v, %v; want partition 0 at 4", got, err)
	}
}

// A term whose membership another join replaced ends at the next read (its
// heartbeat is refused, the group names another member), and its commits
// are refused.
func TestKafkaAuthorityReplacedMembershipEndsTerm(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	n := startKafkaNode(t, c, "replaced", "n1")
	testutil.WaitFor(t, 15*time.Second, "n1 to lead", func() bool { return len(leaders(n.node)) == 1 })
	term := n.lastTerm()

	outsider := kafkastore.New(newKafkaClient(t, c), "replaced", "jobs", 0)
	if _, err := outsider.Join(testCtx(t), kafkastore.Leader{Epoch: term.Epoch + 1, Node: "outsider", Addr: "x:1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the term outlived the replacement of its membership")
	}
	if !errors.Is(term.Cause(), ErrSuperseded) && !errors.Is(term.Cause(), ErrSessionExpired) {
		t.Errorf("Cause() = %v, want ErrSuperseded or ErrSessionExpired", term.Cause())
	}
	t.Logf("term ended: %v", term.Cause())
	if err := n.store.Commit(testCtx(t), term.Fence, map[int32]int64{1: 1}); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("commit under the replaced term's fence: %v, want ErrFenced", err)
	}
}

// A resigning leader leaves the group, so that it is empty at once; a node
// that starts later goes on from the highest epoch the committed offsets
// name, not from 1.
func TestKafkaAuthorityResignLeavesAndEpochsGoOn(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	n := startKafkaNode(t, c, "resign", "n1")
	testutil.WaitFor(t, 15*time.Second, "n1 to lead", func() bool { return len(leaders(n.node)) == 1 })
	term := n.lastTerm()
	if err := n.store.Commit(testCtx(t), term.Fence, map[int32]int64{0: 7}); err != nil {
		t.Fatal(err)
	}
	if err := n.e.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the group to be empty", func() bool {
		d, err := n.store.Describe(testCtx(t))
		return err == nil && len(d.Members) == 0
	})
	n.stop()

	next := startKafkaNode(t, c, "resign", "n2")
	testutil.WaitFor(t, 15*time.Second, "n2 to lead", func() bool { return len(leaders(next.node)) == 1 })
	if got := next.lastTerm().Epoch; got != term.Epoch+1 {
		t.Errorf("n2 leads epoch %d, want %d (after the last committed epoch %d)", got, term.Epoch+1, term.Epoch)
	}
}

// A group with a member that is not a fanout leader (a consumer given
// fanout's group id) is an unreadable record: nobody leads, and the nodes
// say why.
func TestKafkaAuthorityForeignMemberLeavesNobodyLeading(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	client := newKafkaClient(t, c)
	coord, err := client.Coordinator(kafkastore.GroupName("foreign"))
	if err != nil {
		t.Fatal(err)
	}
	instance := "some-app"
	join := &sarama.JoinGroupRequest{Version: 5, GroupId: kafkastore.GroupName("foreign"), SessionTimeout: 30000,
		RebalanceTimeout: 30000, GroupInstanceId: &instance, ProtocolType: "consumer"}
	join.AddGroupProtocol("range", []byte{0, 0, 0, 0, 0, 0, 0, 0})
	if r, err := coord.JoinGroup(join); err != nil || r.Err != sarama.ErrNoError {
		t.Fatalf("foreign join: %v, %v", r, err)
	}

	n := startKafkaNode(t, c, "foreign", "n1")
	testutil.WaitFor(t, 10*time.Second, "n1 to log the unreadable record", func() bool {
		return n.logs.count("error: the fence record in kafka is unreadable", "not a fanout leader") > 0
	})
	time.Sleep(3 * testLeaderTTL) // an absence: nobody leads meanwhile
	if got := leaders(n.node); len(got) != 0 {
		t.Fatalf("n1 leads a group with a foreign member")
	}
}

// slowRelease is a fencer whose releases take a while, as a LeaveGroup to a
// busy coordinator does.
type slowRelease struct{ fencer }

func (f slowRelease) release(ctx context.Context, rec record) {
	time.Sleep(300 * time.Millisecond)
	f.fencer.release(ctx, rec)
}

// Run returns only after the release of a resigned term ran, so a daemon
// that stops cleanly leaves the group before it closes its Kafka client.
func TestKafkaAuthorityStopWaitsForTheRelease(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	cfg := testConfig(t, c, "slowleave", "n1")
	store := kafkastore.New(cfg.Client, "slowleave", "jobs", 0)
	cfg.Fencer = KafkaFencer(store, cfg.Logger)
	n := runNode(t, cfg, func(e *Elector) fencer { return slowRelease{newKafkaFencer(store, e.log)} })
	testutil.WaitFor(t, 15*time.Second, "n1 to lead", func() bool { return len(leaders(n)) == 1 })
	if err := n.e.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	n.stop()
	d, err := store.Describe(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Members) != 0 {
		t.Errorf("the group has %d members once Run returned, want none: the release ran after", len(d.Members))
	}
}

// Heartbeats say which offset store a member keeps its offsets in and
// whether it is ready: the other members see both (a member that says
// neither, as older ones, is unknown). A member of another store is logged,
// once.
func TestHeartbeatsSayStoreAndReadiness(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	a := startKafkaNodeWith(t, c, "say", "a", func(cfg *Config) {
		cfg.Readiness = func() (bool, string) { return true, "follower: leader b (epoch 1)" }
	})
	startKafkaNodeWith(t, c, "say", "b", func(cfg *Config) {
		cfg.Readiness = func() (bool, string) { return false, "leader: no partition of topic jobs consumed: 0 of 2 open" }
	})
	member := func(n *kafkaNode, id string) (Member, bool) {
		for _, m := range n.e.Members() {
			if m.NodeID == id {
				return m, true
			}
		}
		return Member{}, false
	}
	testutil.WaitFor(t, 10*time.Second, "a to see b's store and readiness", func() bool {
		m, ok := member(a, "b")
		return ok && m.Readiness != nil
	})
	b, _ := member(a, "b")
	if b.Store != OffsetStore_OFFSET_STORE_KAFKA || StoreName(b.Store) != "kafka" {
		t.Errorf("b's store as a sees it: %v (%q), want kafka", b.Store, StoreName(b.Store))
	}
	if b.Readiness.GetReady() || b.Readiness.GetReason() != "leader: no partition of topic jobs consumed: 0 of 2 open" {
		t.Errorf("b's readiness as a sees it: %v", b.Readiness)
	}

	produceHeartbeat(t, c, "say", &Heartbeat{NodeId: "old", Addr: "old:4000", Role: Role_ROLE_FOLLOWER})
	for range 2 {
		produceHeartbeat(t, c, "say", &Heartbeat{NodeId: "zk", Addr: "zk:4000", Role: Role_ROLE_FOLLOWER,
			OffsetStore: OffsetStore_OFFSET_STORE_ZOOKEEPER})
	}
	testutil.WaitFor(t, 10*time.Second, "a to see old and zk", func() bool {
		_, old := member(a, "old")
		_, zk := member(a, "zk")
		return old && zk
	})
	if old, _ := member(a, "old"); old.Store != OffsetStore_OFFSET_STORE_UNSPECIFIED || old.Readiness != nil || StoreName(old.Store) != "" {
		t.Errorf("a member that says nothing: store %v, readiness %v; want unknown", old.Store, old.Readiness)
	}
	if n := a.logs.count("error", "keeps its offsets in another store"); n != 1 {
		t.Errorf("a logged the member of the ZooKeeper store %d times, want once", n)
	}
}
