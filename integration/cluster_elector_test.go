//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

const (
	electorHeartbeat = 200 * time.Millisecond
	electorTimeout   = 1 * time.Second
)

// electorNode is one Elector running against the real services.
type electorNode struct {
	id     string
	e      *cluster.Elector
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned and Terms is drained

	mu   sync.Mutex // guards term
	term *cluster.Term
}

// current returns the last term received and whether it still runs.
func (n *electorNode) current() (*cluster.Term, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.term, n.term != nil && n.term.Cause() == nil
}

// electorClock is an Elector's clock (Config.Now) that reads the time until
// stopped, then always the time it was stopped at: a member whose clock
// stands still never finds another silent for a leader timeout, so what it
// does after that, it does on the records it reads.
type electorClock struct{ at atomic.Pointer[time.Time] }

func (c *electorClock) Now() time.Time {
	if at := c.at.Load(); at != nil {
		return *at
	}
	return time.Now()
}

func (c *electorClock) stop() {
	now := time.Now()
	c.at.Store(&now)
}

// startElector runs an Elector with its own Kafka client and ZooKeeper
// session, on clock, until cleanup or cancel.
func startElector(t *testing.T, id, topic, nodeID, chroot string, clock *electorClock) *electorNode {
	t.Helper()
	kcfg := kafka.NewConfig("fanout-" + nodeID)
	// The broker holds a fetch for MaxWaitTime (default 500 ms) even when
	// a heartbeat arrives meanwhile: every hop through the log would cost it.
	kcfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	client, err := sarama.NewClient(kafkaAddrs(t), kcfg)
	if err != nil {
		t.Fatalf("sarama.NewClient: %v", err)
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, logrus.NewEntry(log))
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	e, err := cluster.New(cluster.Config{
		ID: id, Topic: topic, NodeID: nodeID, Addr: nodeID + ":4150",
		Heartbeat: electorHeartbeat, LeaderTimeout: electorTimeout,
		Client: client, Fencer: cluster.ZooKeeperFencer(conn, chroot, id, topic, zkstore.ACL{}), Logger: logrus.NewEntry(log).WithField("test_node", nodeID),
		Now: clock.Now,
	})
	if err != nil {
		t.Fatalf("cluster.New: %v", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	n := &electorNode{id: nodeID, e: e, cancel: stop, done: make(chan struct{})}
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		if err := e.Run(runCtx); err != nil {
			t.Errorf("%s: Run: %v", nodeID, err)
		}
	}()
	go func() {
		defer close(n.done)
		for term := range e.Terms() {
			n.mu.Lock()
			n.term = term
			n.mu.Unlock()
		}
		<-runDone
	}()
	t.Cleanup(func() {
		stop()
		<-n.done
		conn.Close()
		_ = client.Close()
	})
	return n
}

// crash stops the node's Run without resigning and waits until it returned.
func (n *electorNode) crash() {
	n.cancel()
	<-n.done
}

// electorFence reads the fence znode.
func electorFence(t *testing.T, conn *zk.Conn, path string) (epoch uint64, node string, version int32) {
	t.Helper()
	data, stat, err := conn.Get(path)
	if err != nil {
		t.Fatalf("get %s: %v", path, err)
	}
	var rec struct {
		Epoch uint64 `json:"epoch"`
		Node  string `json:"node"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("fence %s holds %q: %v", path, data, err)
	}
	return rec.Epoch, rec.Node, stat.Version
}

func TestElectorRealKafkaAndZooKeeper(t *testing.T) {
	t.Parallel()
	id, topic := uniqueName(t, "el"), "jobs"
	chroot := "/" + uniqueName(t, "chroot")
	hosts, _, err := zkstore.ParseServers(zkAddrs(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	zconn, err := zkstore.Connect(ctx, hosts, 10*time.Second, nil)
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	t.Cleanup(zconn.Close) // after deleteTree (cleanups run last-in, first-out)
	fencePath := chroot + cluster.FencePath(id, topic)
	t.Cleanup(func() { deleteTree(t, zconn, chroot) })
	t.Cleanup(func() { electorDeleteTopic(t, cluster.TopicName(id, topic)) })

	var aClock electorClock
	nodes := []*electorNode{
		startElector(t, id, topic, "node-a", chroot, &aClock),
		startElector(t, id, topic, "node-b", chroot, &electorClock{}),
		startElector(t, id, topic, "node-c", chroot, &electorClock{}),
	}
	running := func() []*electorNode {
		var out []*electorNode
		for _, n := range nodes {
			select {
			case <-n.done:
			default:
				out = append(out, n)
			}
		}
		return out
	}
	// oneLeader waits until exactly one running node holds a term and
	// every running node agrees on it, and returns it.
	oneLeader := func(what string, timeout time.Duration) (*electorNode, *cluster.Term) {
		t.Helper()
		var leader *electorNode
		var term *cluster.Term
		testutil.WaitFor(t, timeout, what, func() bool {
			leader, term = nil, nil
			for _, n := range running() {
				if tm, ok := n.current(); ok {
					if leader != nil {
						return false // two terms at once: wait for the old one to end
					}
					leader, term = n, tm
				}
			}
			if leader == nil {
				return false
			}
			for _, n := range running() {
				l := n.e.Leadership()
				if !l.Known || l.LeaderID != leader.id || l.Epoch != term.Epoch || l.Leader != (n == leader) {
					return false
				}
			}
			return true
		})
		return leader, term
	}

	leader, term := oneLeader("one leader agreed by all three", 30*time.Second)
	if leader.id != "node-c" {
		t.Errorf("leader %s, want node-c (highest id)", leader.id)
	}
	epoch, node, version := electorFence(t, zconn, fencePath)
	if epoch != term.Epoch || node != leader.id || version != term.FenceVersion {
		t.Errorf("fence znode: epoch %d node %q version %d; term: epoch %d node %s version %d",
			epoch, node, version, term.Epoch, leader.id, term.FenceVersion)
	}
	if want := fmt.Sprintf("%s@%d", fencePath, term.FenceVersion); term.Fence.String() != want {
		t.Errorf("term's fence %v, want %s", term.Fence, want)
	}
	if m := nodes[0].e.Members(); len(m) != 3 {
		t.Errorf("node-a sees %d members, want 3: %+v", len(m), m)
	}

	// The fence works as zkstore uses it: the term's commits pass.
	store := zkstore.New(zconn, chroot, id, topic)
	if err := store.Commit(context.Background(), term.Fence, map[int32]int64{0: 10}); err != nil {
		t.Fatalf("commit under the leader's fence: %v", err)
	}

	// Crash: the leader's Run is cancelled without Resign.
	crashed := time.Now()
	leader.crash()
	next, nextTerm := oneLeader("a new leader after the crash", 60*time.Second)
	crashFailover := time.Since(crashed)
	t.Logf("failover after a crash: %v (Heartbeat %v, LeaderTimeout %v)", crashFailover, electorHeartbeat, electorTimeout)
	if next.id != "node-b" || nextTerm.Epoch != term.Epoch+1 {
		t.Errorf("after the crash: %s leads epoch %d, want node-b at epoch %d", next.id, nextTerm.Epoch, term.Epoch+1)
	}
	// The deposed leader's fence no longer holds; the new one's does.
	if err := store.Commit(context.Background(), term.Fence, map[int32]int64{0: 11}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("commit under the old fence: %v, want ErrFenced", err)
	}
	if err := store.Commit(context.Background(), nextTerm.Fence, map[int32]int64{0: 12}); err != nil {
		t.Errorf("commit under the new leader's fence: %v", err)
	}

	// Resign: the remaining follower leads on the resigned leader's
	// heartbeats, not after a leader timeout of silence: its clock stands
	// still from here on, so it never finds the leader silent for one.
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	// Before node-a's clock stops: it has read the log up to node-b's
	// heartbeats as leader (so every record of the crashed node-c), and
	// node-c is silent for a timeout in its view (else it would stay live
	// for good).
	testutil.WaitFor(t, 30*time.Second, "node-a to see node-b lead and node-c gone", func() bool {
		bLeads, cSeen := false, false
		for _, m := range nodes[0].e.Members() {
			switch m.NodeID {
			case "node-b":
				bLeads = m.Role == cluster.Role_ROLE_LEADER && m.Epoch == nextTerm.Epoch
			case "node-c":
				cSeen = true
			}
		}
		return bLeads && !cSeen
	})
	aClock.stop()
	resigned := time.Now()
	if err := next.e.Resign(rctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	var last *electorNode
	var lastTerm *cluster.Term
	testutil.WaitFor(t, 30*time.Second, "node-a to lead after Resign, on node-b's heartbeats", func() bool {
		tm, ok := nodes[0].current()
		if ok {
			last, lastTerm = nodes[0], tm
		}
		return ok
	})
	t.Logf("failover after Resign: %v", time.Since(resigned))
	if lastTerm.Epoch != nextTerm.Epoch+1 || last.id != "node-a" {
		t.Errorf("after Resign: %s leads epoch %d, want node-a at %d", last.id, lastTerm.Epoch, nextTerm.Epoch+1)
	}
	if !errors.Is(nextTerm.Cause(), cluster.ErrResigned) {
		t.Errorf("resigned term's cause: %v, want ErrResigned", nextTerm.Cause())
	}
	if epoch, node, _ := electorFence(t, zconn, fencePath); epoch != lastTerm.Epoch || node != "node-a" {
		t.Errorf("fence znode after Resign: epoch %d node %q, want %d node-a", epoch, node, lastTerm.Epoch)
	}
}

// electorDeleteTopic deletes a topic, logging failures.
func electorDeleteTopic(t *testing.T, name string) {
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Logf("cleanup: NewClusterAdmin: %v", err)
		return
	}
	defer admin.Close()
	if err := admin.DeleteTopic(name); err != nil {
		t.Logf("cleanup: DeleteTopic(%q): %v", name, err)
	}
}
