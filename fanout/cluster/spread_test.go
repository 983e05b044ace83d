package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// newSpreadKafka starts an in-process Kafka with topic "jobs" of n
// partitions (closed at cleanup).
func newSpreadKafka(t *testing.T, n int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(n, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// startSpread runs an Elector in spread mode.
func startSpread(t *testing.T, c *kfake.Cluster, fence *memFence, id, nodeID string) *node {
	t.Helper()
	return startNodeWith(t, c, fence, id, nodeID, func(cfg *Config) {
		cfg.Mode, cfg.PartitionRefresh = Mode_MODE_SPREAD, 100*time.Millisecond
	})
}

// agreed returns the assignment every node has in force when they all
// have the same generation, else nil.
func agreed(nodes ...*node) *Assignment {
	var a *Assignment
	for _, n := range nodes {
		got := n.e.Assignment()
		if got == nil || (a != nil && got.Generation != a.Generation) {
			return nil
		}
		a = got
	}
	return a
}

// owners returns the partitions of each member of a.
func owners(a *Assignment) map[string][]int32 { return a.owned() }

// In spread mode the leader assigns the topic's partitions to the live
// members: each of three owns four of twelve; a fourth member takes one
// from each; when the leader crashes, the new leader keeps the assignment
// of the members still alive and moves only the crashed one's partitions;
// the topic grows and the new partitions are spread.
func TestSpreadAssignmentFollowsTheMembers(t *testing.T) {
	t.Parallel()
	c := newSpreadKafka(t, 12)
	fence := &memFence{}
	a, b, cc := startSpread(t, c, fence, "sp", "a"), startSpread(t, c, fence, "sp", "b"), startSpread(t, c, fence, "sp", "c")
	var three *Assignment
	testutil.WaitFor(t, 15*time.Second, "a, b and c to agree on 4 partitions each", func() bool {
		three = agreed(a, b, cc)
		if three == nil || len(three.Owners) != 3 {
			return false
		}
		for _, o := range three.Owners {
			if len(o.Partitions) != 4 {
				return false
			}
		}
		return true
	})
	if three.Partitions != 12 || three.InitialPartitions != 12 || three.Epoch != cc.lastTerm().Epoch {
		t.Fatalf("assignment %+v: want 12 partitions, from c's epoch", three)
	}
	if got := three.Addrs(); !slices.Equal(got, []string{"a:4000", "b:4000", "c:4000"}) {
		t.Fatalf("Addrs() = %v", got)
	}
	if p := cc.e.Published(); p == nil || p.Generation != three.Generation {
		t.Fatalf("the leader publishes %+v, the members have generation %d", p, three.Generation)
	}

	d := startSpread(t, c, fence, "sp", "d")
	var four *Assignment
	testutil.WaitFor(t, 15*time.Second, "the four to agree on 3 partitions each", func() bool {
		four = agreed(a, b, cc, d)
		return four != nil && len(four.Owners) == 4 && len(four.Of("d")) == 3
	})
	for _, id := range []string{"a", "b", "c"} {
		if kept := common(three.Of(id), four.Of(id)); len(kept) != 3 {
			t.Errorf("after d joined %s owns %v, had %v: want 3 of its partitions kept", id, four.Of(id), three.Of(id))
		}
	}
	if four.Generation <= three.Generation {
		t.Errorf("generation %d after the join, was %d", four.Generation, three.Generation)
	}

	// The leader c crashes: b leads, keeps a's, b's and d's partitions, and
	// spreads c's three.
	cc.stop()
	var after *Assignment
	testutil.WaitFor(t, 15*time.Second, "a new leader's assignment without c", func() bool {
		after = agreed(a, b, d)
		return after != nil && after.Epoch > four.Epoch && len(after.Owners) == 3
	})
	for _, id := range []string{"a", "b", "d"} {
		if kept := common(four.Of(id), after.Of(id)); len(kept) != 3 || len(after.Of(id)) != 4 {
			t.Errorf("after c crashed %s owns %v, had %v: want its 3 and one of c's", id, after.Of(id), four.Of(id))
		}
	}
	if after.Generation <= four.Generation {
		t.Errorf("the new leader's generation %d, the old one's %d: generations must go on", after.Generation, four.Generation)
	}

	// The topic grows to 15 partitions: the new ones are spread, nothing
	// else moves.
	admin, err := sarama.NewClusterAdminFromClient(newKafkaClient(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreatePartitions("jobs", 15, nil, false); err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	var grown *Assignment
	testutil.WaitFor(t, 15*time.Second, "an assignment of 15 partitions", func() bool {
		grown = agreed(a, b, d)
		return grown != nil && grown.Partitions == 15
	})
	for _, id := range []string{"a", "b", "d"} {
		if kept := common(after.Of(id), grown.Of(id)); len(kept) != 4 || len(grown.Of(id)) != 5 {
			t.Errorf("after growing to 15 %s owns %v, had %v: want its 4 and one new", id, grown.Of(id), after.Of(id))
		}
	}
	if grown.InitialPartitions != 12 {
		t.Errorf("InitialPartitions = %d after the growth, want 12 (carried over)", grown.InitialPartitions)
	}
}

// Members accept an assignment only from the leader ZooKeeper records, for
// its epoch: forged heartbeats (another node, another epoch) change nothing.
func TestSpreadForgedAssignmentsIgnored(t *testing.T) {
	t.Parallel()
	c := newSpreadKafka(t, 4)
	fence := &memFence{}
	a, b := startSpread(t, c, fence, "spf", "a"), startSpread(t, c, fence, "spf", "b")
	var real *Assignment
	testutil.WaitFor(t, 15*time.Second, "a and b to agree", func() bool {
		real = agreed(a, b)
		return real != nil && len(real.Owners) == 2
	})
	rec := fence.get()
	forged := &PartitionAssignment{Epoch: rec.Epoch, Generation: real.Generation + 100, Partitions: 4,
		Owners: []*PartitionOwner{{NodeId: "a", Addr: "evil:666", Partitions: []int32{0, 1, 2, 3}}}}
	for _, hb := range []*Heartbeat{
		// Not the recorded leader.
		{NodeId: "a", Addr: "a:4000", Epoch: rec.Epoch, Role: Role_ROLE_LEADER, Mode: Mode_MODE_SPREAD, Assignment: forged},
		// The recorded leader's id, another epoch.
		{NodeId: rec.Node, Addr: "evil:666", Epoch: rec.Epoch + 1, Role: Role_ROLE_LEADER, Mode: Mode_MODE_SPREAD,
			Assignment: &PartitionAssignment{Epoch: rec.Epoch + 1, Generation: real.Generation + 100, Partitions: 4,
				Owners: forged.Owners}},
		// The recorded leader's id and epoch, not leading.
		{NodeId: rec.Node, Addr: "evil:666", Epoch: rec.Epoch, Role: Role_ROLE_FOLLOWER, Mode: Mode_MODE_SPREAD, Assignment: forged},
	} {
		produceHeartbeat(t, c, "spf", hb)
	}
	deadline := time.Now().Add(2 * time.Second) // many heartbeats after the forged ones
	for time.Now().Before(deadline) {
		for _, n := range []*node{a, b} {
			if got := n.e.Assignment(); got == nil || got.Generation >= real.Generation+100 || slices.Contains(got.Addrs(), "evil:666") {
				t.Fatalf("%s accepted a forged assignment: %+v", n.e.cfg.NodeID, got)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A member whose mode differs from the leader's says so and has no
// assignment in force; a spread leader leaves a leader-mode member out.
func TestSpreadModeMismatch(t *testing.T) {
	t.Parallel()
	c := newSpreadKafka(t, 4)
	fence := &memFence{}
	// b (spread) leads first: the highest id.
	a := startNode(t, c, fence, "mix", "a") // leader mode
	b := startSpread(t, c, fence, "mix", "b")
	var as *Assignment
	testutil.WaitFor(t, 15*time.Second, "b's assignment, without a", func() bool {
		as = b.e.Published()
		return as != nil && b.e.Leadership().Leader
	})
	if len(as.Owners) != 1 || as.Owners[0].NodeID != "b" || len(as.Of("b")) != 4 {
		t.Fatalf("b's assignment %+v: want every partition to b, none to the leader-mode a", as)
	}
	testutil.WaitFor(t, 10*time.Second, "a to say that the leader runs another mode", func() bool {
		return a.logs.count("the leader runs another --assignment") > 0
	})
	if l := a.e.Leadership(); !l.Known || l.Mode != Mode_MODE_SPREAD {
		t.Fatalf("a: Leadership() = %+v, want b known, in spread mode", l)
	}

	// c, in spread mode, joins a cluster led by a leader-mode d.
	c2 := newSpreadKafka(t, 4)
	fence2 := &memFence{}
	d := startNode(t, c2, fence2, "mix2", "d")
	s := startSpread(t, c2, fence2, "mix2", "c")
	testutil.WaitFor(t, 15*time.Second, "c to say that the leader runs another mode", func() bool {
		return s.logs.count("the leader runs another --assignment") > 0 && d.e.Leadership().Leader
	})
	if got := s.e.Assignment(); got != nil {
		t.Fatalf("c has an assignment in force under a leader-mode leader: %+v", got)
	}
	if got := s.logs.count("the leader runs another --assignment"); got != 1 {
		t.Errorf("the mismatch was logged %d times, want once per leader and epoch", got)
	}

	// A spread member that served under a spread leader drops its
	// assignment when a leader-mode member takes over.
	c3 := newSpreadKafka(t, 4)
	fence3 := &memFence{}
	x, y := startSpread(t, c3, fence3, "mix3", "x"), startSpread(t, c3, fence3, "mix3", "y")
	testutil.WaitFor(t, 15*time.Second, "x and y to agree", func() bool {
		a := agreed(x, y)
		return a != nil && len(a.Owners) == 2
	})
	z := startNode(t, c3, fence3, "mix3", "z") // leader mode, the highest id: it leads next
	y.stop()
	testutil.WaitFor(t, 15*time.Second, "z to lead", func() bool { return z.e.Leadership().Leader })
	testutil.WaitFor(t, 10*time.Second, "x to drop its assignment", func() bool { return x.e.Assignment() == nil })
}

func TestAssignmentString(t *testing.T) {
	t.Parallel()
	a := &Assignment{Owners: []Owner{{NodeID: "n1", Partitions: []int32{0, 1, 2, 3, 6}}, {NodeID: "n2"}}}
	if got, want := a.String(), "n1:0-3,6 n2:-"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got := fmt.Sprint((*Assignment)(nil)); got != "none" {
		t.Fatalf("nil: %q", got)
	}
	back := fromProto(a.proto())
	if !a.sameOwners(back) {
		t.Fatalf("round trip: %+v", back)
	}
}

// A line of assignments that begins in a group that has committed offsets
// gives --initial-offset to no partition (InitialPartitions 0); one that
// begins in a group that never committed, to those the topic has.
func TestSpreadInitialPartitions(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprint("committed=", committed), func(t *testing.T) {
			t.Parallel()
			c := newSpreadKafka(t, 6)
			n := startNodeWith(t, c, &memFence{}, "init", "a", func(cfg *Config) {
				cfg.Mode, cfg.PartitionRefresh = Mode_MODE_SPREAD, 100*time.Millisecond
				cfg.Committed = func() bool { return committed }
			})
			var a *Assignment
			testutil.WaitFor(t, 15*time.Second, "an assignment", func() bool { a = n.e.Assignment(); return a != nil })
			want := int32(6)
			if committed {
				want = 0
			}
			if a.InitialPartitions != want {
				t.Fatalf("InitialPartitions = %d, want %d", a.InitialPartitions, want)
			}
		})
	}
}
