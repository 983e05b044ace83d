//go:build integration

package integration

// Cluster tests of the fence and of who is the authority for leadership,
// with daemon processes (the cl helpers of cluster_test.go): ZooKeeper's
// fence record says who leads; heartbeats only tell who is alive.

import (
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// clForge produces heartbeats to the cluster's heartbeat topic with a plain
// producer, as anybody with access to the topic could.
func clForge(t *testing.T, c *clCluster, hbs ...*cluster.Heartbeat) {
	t.Helper()
	p, err := sarama.NewSyncProducer(kafkaAddrs(t), kafka.NewConfig("fanout-integration-forger"))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	for _, hb := range hbs {
		b, err := proto.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{
			Topic: cluster.TopicName(c.id, c.topic), Key: sarama.StringEncoder(hb.NodeId), Value: sarama.ByteEncoder(b),
		}); err != nil {
			t.Fatalf("produce a forged heartbeat: %v", err)
		}
	}
}

// clFencePath returns the fence znode of the cluster (chroot included).
func clFencePath(t *testing.T, c *clCluster) string {
	t.Helper()
	_, chroot, err := zkstore.ParseServers(zkAddrs(t))
	if err != nil {
		t.Fatal(err)
	}
	return chroot + cluster.FencePath(c.id, c.topic)
}

// A forged heartbeat with a huge epoch and a foreign address, produced to
// the heartbeat topic with a plain producer, changes nothing: the leader
// keeps leading, the followers keep redirecting to the leader ZooKeeper
// records, and the next election counts on from the recorded epoch.
func TestClusterForgedHeartbeatChangesNothing(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	conn := zkConnect(t)
	epoch, node, _ := electorFence(t, conn, clFencePath(t, c))
	if node != leader.id {
		t.Fatalf("fence record names %s, the daemons %s", node, leader.id)
	}
	for _, nd := range c.nodes {
		nd.mark(t, "forged")
	}
	const foreign = "127.0.0.1:1"
	clForge(t, c,
		&cluster.Heartbeat{NodeId: "zz-forged", Addr: foreign, Epoch: math.MaxUint64, Role: cluster.Role_ROLE_LEADER,
			ClaimEpoch: math.MaxUint64},
		&cluster.Heartbeat{NodeId: leader.id, Addr: foreign, Epoch: 1 << 62, Role: cluster.Role_ROLE_FOLLOWER},
	)
	testutil.WaitFor(t, 15*time.Second, "every daemon to log the forged heartbeats as implausible", func() bool {
		for _, nd := range c.nodes {
			if len(clGrep(nd.logAfter("forged"), "implausible heartbeat ignored")) == 0 {
				return false
			}
		}
		return true
	})
	// An absence of change: probe for three leader timeouts.
	for end := time.Now().Add(3 * clLeaderTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, nd := range c.nodes {
			a := clHello(nd.addr)
			switch {
			case nd == leader && a.welcome != leader.id:
				t.Fatalf("the leader %s stopped welcoming clients after the forged heartbeat: %v", leader.id, a)
			case nd != leader && (a.redirectTo != leader.addr || a.redirectNode != leader.id):
				t.Fatalf("%s answers %v after the forged heartbeat, want a redirect to %s", nd.id, a, leader.id)
			}
		}
	}
	if lines := clGrep(leader.logAfter("forged"), "lost leadership"); len(lines) > 0 {
		t.Fatalf("the leader was deposed by a forged heartbeat: %q", lines)
	}

	// The next election counts on from the recorded epoch (no wrap to 0).
	leader.signal(t, syscall.SIGKILL)
	leader.waitExit(t, 10*time.Second)
	next := clWaitLeader(t, c.others(leader), clFailoverBound+10*time.Second)
	nextEpoch, nextNode, _ := electorFence(t, conn, clFencePath(t, c))
	if nextNode != next.id || nextEpoch != epoch+1 {
		t.Errorf("after the crash the fence record says %s at epoch %d, want %s at %d", nextNode, nextEpoch, next.id, epoch+1)
	}
}

// Two daemons started with the same --node-id: neither claims, each logs a
// clear error, and the next id leads.
func TestClusterDuplicateNodeIDRefused(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 4)
	twin := c.nodes[3]
	twin.id = "node-3" // the same node id as c.nodes[2], its own port and log
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	if leader.id != "node-2" {
		t.Errorf("leader %s, want node-2: neither daemon with node id node-3 may claim", leader.id)
	}
	for _, nd := range []*clNode{c.nodes[2], twin} {
		lines := clGrep(nd.logAfter(""), "level=error", "another live process has this node id")
		if len(lines) == 0 {
			t.Errorf("%s (%s) did not log the duplicate node id", nd.id, nd.addr)
		}
		if lines := clGrep(nd.logAfter(""), "won the claim"); len(lines) > 0 {
			t.Errorf("%s (%s) claimed leadership with a duplicate node id: %q", nd.id, nd.addr, lines)
		}
	}
	t.Logf("the duplicate's error: %s", strings.Join(clGrep(twin.logAfter(""), "another live process"), "\n"))
}

// A corrupt fence record: the leader's term ends (ZooKeeper no longer names
// it), every member whose claim fails logs the cause and waits a leader
// timeout before claiming again (no member claims in a loop, each gets its
// turn), nobody serves; once the znode is deleted a leader is elected again
// and the epochs count on.
func TestClusterCorruptFenceRecord(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	conn := zkConnect(t)
	path := clFencePath(t, c)
	epoch, _, _ := electorFence(t, conn, path)
	for _, nd := range c.nodes {
		nd.mark(t, "corrupt")
	}
	corruptAt := time.Now()
	if _, err := conn.Set(path, []byte("\x00not a fence record"), -1); err != nil {
		t.Fatalf("corrupt %s: %v", path, err)
	}
	testutil.WaitFor(t, 15*time.Second, "every daemon to refuse clients (no leader)", func() bool {
		for _, nd := range c.nodes {
			if a := clHello(nd.addr); a.welcome != "" || a.redirectTo != "" {
				return false
			}
		}
		return true
	})
	testutil.WaitFor(t, 15*time.Second, "every daemon to log the unreadable record", func() bool {
		for _, nd := range c.nodes {
			if len(clGrep(nd.logAfter("corrupt"), "level=error", "fence record in zookeeper is unreadable")) == 0 {
				return false
			}
		}
		return true
	})
	// Let them take turns for a while: nobody may serve meanwhile.
	for end := time.Now().Add(4 * clLeaderTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, nd := range c.nodes {
			if a := clHello(nd.addr); a.welcome != "" {
				t.Fatalf("%s welcomes clients under a corrupt fence record", nd.id)
			}
		}
	}
	elapsed := time.Since(corruptAt)
	for _, nd := range c.nodes {
		claims := len(clGrep(nd.logAfter("corrupt"), "won the claim"))
		failures := clGrep(nd.logAfter("corrupt"), "level=error", "cannot record won epoch")
		t.Logf("%s: %d claims, %d failures logged in %v", nd.id, claims, len(failures), elapsed.Round(time.Millisecond))
		if max := int(elapsed/clLeaderTimeout) + 1; claims > max {
			t.Errorf("%s claimed %d times in %v, want at most %d (one per leader timeout)", nd.id, claims, elapsed, max)
		}
		if claims > 0 && len(clGrep(failures, "not a fence record")) != claims {
			t.Errorf("%s: %d claims but %d failures logged with the record's content: %q", nd.id, claims, len(failures), failures)
		}
	}
	if lines := clGrep(leader.logAfter("corrupt"), "lost leadership"); len(lines) == 0 {
		t.Errorf("the leader did not lose leadership when its fence record became unreadable")
	}

	// The operator deletes the record: a leader again, at a later epoch.
	if err := conn.Delete(path, -1); err != nil {
		t.Fatalf("delete %s: %v", path, err)
	}
	next := clWaitLeader(t, c.nodes, clFailoverBound+10*time.Second)
	nextEpoch, nextNode, _ := electorFence(t, conn, path)
	if nextNode != next.id || nextEpoch <= epoch {
		t.Errorf("after the reset the fence record says %s at epoch %d, want %s above %d", nextNode, nextEpoch, next.id, epoch)
	}
}

// clHeartbeatsFrom reads the cluster's heartbeat log from offset to its
// current end and returns the heartbeats of node id.
func clHeartbeatsFrom(t *testing.T, c *clCluster, offset int64, id string) []*cluster.Heartbeat {
	t.Helper()
	client := newClient(t)
	topic := cluster.TopicName(c.id, c.topic)
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatalf("end of %s: %v", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, offset)
	if err != nil {
		t.Fatalf("consume %s at %d: %v", topic, offset, err)
	}
	defer pc.Close()
	var out []*cluster.Heartbeat
	for next := offset; next < end; {
		select {
		case m := <-pc.Messages():
			next = m.Offset + 1
			var hb cluster.Heartbeat
			if err := proto.Unmarshal(m.Value, &hb); err == nil && hb.NodeId == id {
				out = append(out, &hb)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("heartbeat log %s: stuck at offset %d of %d", topic, next, end)
		}
	}
	return out
}

// clHeartbeatEnd returns the end offset of the cluster's heartbeat log.
func clHeartbeatEnd(t *testing.T, c *clCluster) int64 {
	t.Helper()
	end, err := newClient(t).GetOffset(cluster.TopicName(c.id, c.topic), 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatalf("end of the heartbeat log: %v", err)
	}
	return end
}

// The fence record rewritten or deleted under a running leader (an operator,
// a ZooKeeper restored from a backup) while messages flow: the leader's fence
// no longer holds, so it stops serving AND ends its term in the election;
// another member leads within about a leader timeout, the old one stops
// heartbeating as leader (it stays a member), and nothing is lost.
func TestClusterFenceChangedHandsOver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c *clCluster, path string)
	}{
		{"rewritten", func(t *testing.T, c *clCluster, path string) {
			conn := zkConnect(t)
			data, _, err := conn.Get(path)
			clCheck(t, err, "get %s", path)
			_, err = conn.Set(path, data, -1) // the same content, a new version
			clCheck(t, err, "rewrite %s", path)
		}},
		{"deleted", func(t *testing.T, c *clCluster, path string) {
			clCheck(t, zkConnect(t).Delete(path, -1), "delete %s", path)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 900
			c, leader, f := clFlowingCluster(t, n)
			leader.mark(t, "fence changed")
			serving := clWatchWelcome(t, c.others(leader))
			changedAt := time.Now()
			tc.change(t, c, clFencePath(t, c))

			testutil.WaitFor(t, 60*time.Second, "another member to welcome clients", func() bool {
				at, _ := serving()
				return !at.IsZero()
			})
			at, who := serving()
			t.Logf("%s welcomed clients %d ms after the fence record was %s", who, at.Sub(changedAt).Milliseconds(), tc.name)
			next := clWaitLeader(t, c.nodes, 30*time.Second)
			if next == leader {
				t.Errorf("the leader whose fence changed leads again; want another member")
			}
			// It logs so once its term has stopped (its source and
			// dispatcher), which may come after the next leader serves.
			testutil.WaitFor(t, 30*time.Second, "the old leader to log that it lost leadership", func() bool {
				return len(clGrep(leader.logAfter("fence changed"), "lost leadership")) > 0
			})
			// From now on the old leader heartbeats as a member, never as leader.
			from := clHeartbeatEnd(t, c)
			time.Sleep(5 * clHeartbeat) // an absence: let it heartbeat a few times
			hbs := clHeartbeatsFrom(t, c, from, leader.id)
			if len(hbs) == 0 {
				t.Errorf("the old leader stopped heartbeating altogether; want it to stay a member")
			}
			for _, hb := range hbs {
				if hb.Role == cluster.Role_ROLE_LEADER {
					t.Errorf("the old leader still heartbeats as leader: %v", hb)
					break
				}
			}
			f.finish(60 * time.Second)
			f.logDuplicates("after the fence record was " + tc.name)
		})
	}
}

// clCheck fails the test on err.
func clCheck(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf(format+": %v", append(args, err)...)
	}
}

// A leader cut off from ZooKeeper alone (its ZooKeeper traffic runs through a
// proxy the test cuts; Kafka, and so its heartbeats, still flow): nobody else
// can tell, so it steps down by itself once its commits have failed for the
// ZooKeeper session timeout; it stops delivering, another member leads, and
// nothing is lost. Restored, it follows.
func TestClusterLeaderCutOffFromZooKeeperOnly(t *testing.T) {
	t.Parallel()
	const n = 1500
	const sessionTimeout = 4 * time.Second // ZooKeeper's smallest with its default tickTime of 2 s
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	victim := c.nodes[2] // node-3: the highest id, started first, leads
	zkHost, chroot, _ := strings.Cut(zkAddrs(t)[0], "/")
	if chroot != "" {
		chroot = "/" + chroot
	}
	zp := clStartProxy(t, "127.0.0.1:0", zkHost)
	victim.zk = zp.addr() + chroot
	for _, nd := range c.nodes {
		nd.args = []string{"--zookeeper-session-timeout", sessionTimeout.String()}
	}
	c.start(victim)
	clWaitLeader(t, []*clNode{victim}, 60*time.Second)
	c.start(c.nodes[0])
	c.start(c.nodes[1])
	if l := clWaitLeader(t, c.nodes, 60*time.Second); l != victim {
		t.Fatalf("leader is %s, want the proxied %s", l.id, victim.id)
	}
	f := clStartFlow(t, c, n, 8*time.Second)
	f.waitAcked(n/4, 60*time.Second)

	victim.mark(t, "zookeeper cut")
	serving := clWatchWelcome(t, c.others(victim))
	cutAt := time.Now()
	zp.Cut()
	first := f.waitFirstAfter(cutAt, victim.id, sessionTimeout+clFailoverBound+10*time.Second)
	at, who := serving()
	t.Logf("failover after the ZooKeeper cut: %d ms to the first message (from %s); %s welcomed clients after %d ms",
		first.at.Sub(cutAt).Milliseconds(), first.node, who, at.Sub(cutAt).Milliseconds())
	if d := at.Sub(cutAt); d < sessionTimeout {
		t.Errorf("another member served %v after the cut, before the leader's commits had failed for %v", d, sessionTimeout)
	}
	var stoppedAt time.Time
	testutil.WaitFor(t, 15*time.Second, victim.id+" to stop welcoming clients", func() bool {
		a := clHello(victim.addr)
		stoppedAt = time.Now()
		return a.welcome == ""
	})
	lost := clGrep(victim.logAfter("zookeeper cut"), "lost leadership")
	if len(clGrep(lost, "offset commits failing")) == 0 {
		t.Errorf("the cut-off leader lost leadership for another reason than failing commits: %q", lost)
	}
	t.Logf("%s stepped down: %q", victim.id, lost)

	victim.mark(t, "restoring")
	zp.Restore()
	newLeader := clWaitLeader(t, c.nodes, 60*time.Second)
	if newLeader == victim {
		t.Errorf("the cut-off node leads again after the restore")
	}
	f.finish(60 * time.Second)
	late := clDeliveredBy(t, f, victim, cutAt, stoppedAt, "the cut-off leader delivered %+v after it stopped welcoming clients")
	t.Logf("messages the cut-off leader delivered after the cut: %d", late)
	if lines := clGrep(victim.logAfter("restoring"), `msg="offsets committed"`); len(lines) > 0 {
		t.Errorf("the stepped-down leader committed after the restore: %q", lines)
	}
	f.logDuplicates("after the ZooKeeper cut")
}
