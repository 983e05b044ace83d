//go:build integration

package integration

// Spread-mode tests: fanout daemon PROCESSES with --assignment spread share
// the partitions of one topic, each serving its own, fenced per partition
// by its ownership record in ZooKeeper. They reuse the cluster tests'
// helpers (clNewCluster, clFlow, clRecorder, ...). Helpers here are
// prefixed sp.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The spread members' timing: a short ZooKeeper session (the server's
// minimum is 2 × its tick, 4 s), so that a crashed member's partitions are
// free within leader timeout + session timeout.
const (
	spSessionTimeout = 4 * time.Second
	spHandoffTimeout = 3 * time.Second
	// spCrashBound bounds the time from a member's crash to a message of
	// its partitions from another member on a loaded 2-core machine: the
	// leader timeout (reassignment), the session timeout plus up to a
	// ZooKeeper tick (the expiry), a reserve, a fetch, with a margin.
	spCrashBound = clLeaderTimeout + spSessionTimeout + 2*time.Second + 6*time.Second
)

// spNewCluster prepares n spread-mode daemons of topic.
func spNewCluster(t *testing.T, topic string, n int) *clCluster {
	t.Helper()
	c := clNewCluster(t, topic, n)
	for _, nd := range c.nodes {
		nd.args = spArgs()
	}
	return c
}

// spArgs are the flags of a spread-mode daemon of the tests.
func spArgs() []string {
	return []string{"--assignment", "spread", "--zookeeper-session-timeout", spSessionTimeout.String(),
		"--handoff-timeout", spHandoffTimeout.String()}
}

// spAdd adds one more node to c (not started).
func spAdd(t *testing.T, c *clCluster) *clNode {
	t.Helper()
	i := len(c.nodes) + 1
	nd := &clNode{n: i, id: fmt.Sprintf("node-%d", i), addr: procFreeAddr(t), kafka: c.nodes[0].kafka, zk: c.nodes[0].zk,
		logPath: strings.Replace(c.nodes[0].logPath, "node-1.log", fmt.Sprintf("node-%d.log", i), 1), args: spArgs()}
	c.nodes = append(c.nodes, nd)
	return nd
}

// spZK opens a ZooKeeper session for the test (closed at cleanup).
func spZK(t *testing.T) *zk.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, logrus.NewEntry(quiet))
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// spOwners returns, per node, the partitions whose ownership record names
// it and is live (its member znode is of the recorded session).
func spOwners(t *testing.T, conn *zk.Conn, c *clCluster) map[string][]int32 {
	t.Helper()
	states, _, err := zkstore.ReadOwners(conn, "", c.id, c.topic)
	if err != nil {
		t.Fatalf("ownership records: %v", err)
	}
	out := map[string][]int32{}
	for p, st := range states {
		if st.Live {
			out[st.Owner] = append(out[st.Owner], p)
		}
	}
	for _, ps := range out {
		slices.Sort(ps)
	}
	return out
}

// spWaitOwned waits until the live ownership records give each of nodes
// want partitions (every partition of the topic, partitions in all), and
// returns them.
func spWaitOwned(t *testing.T, conn *zk.Conn, c *clCluster, nodes []*clNode, partitions int, timeout time.Duration) map[string][]int32 {
	t.Helper()
	var got map[string][]int32
	testutil.WaitFor(t, timeout, fmt.Sprintf("%d partitions owned by %d members, balanced", partitions, len(nodes)), func() bool {
		got = spOwners(t, conn, c)
		total := 0
		for _, nd := range nodes {
			k := len(got[nd.id])
			if k < partitions/len(nodes) || k > (partitions+len(nodes)-1)/len(nodes) {
				return false
			}
			total += k
		}
		return total == partitions && len(got) == len(nodes)
	})
	return got
}

// spConsumers returns one consumer address list per node: its own address
// alone, so that each member's partitions have a consumer.
func spConsumers(nodes []*clNode) [][]string {
	var out [][]string
	for _, nd := range nodes {
		out = append(out, []string{nd.addr})
	}
	return out
}

// spRecordLog samples every partition's ownership record (owner, version)
// every 20 ms in the background, keeping each change.
type spRecordLog struct {
	mu      sync.Mutex
	history map[int32][]spRecordState
}

type spRecordState struct {
	owner   string
	version int32
	at      time.Time
}

func spSampleRecords(t *testing.T, c *clCluster) *spRecordLog {
	t.Helper()
	conn := spZK(t)
	l := &spRecordLog{history: map[int32][]spRecordState{}}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if states, _, err := zkstore.ReadOwners(conn, "", c.id, c.topic); err == nil {
				now := time.Now()
				l.mu.Lock()
				for p, st := range states {
					h := l.history[p]
					if len(h) == 0 || h[len(h)-1].version != st.Version {
						l.history[p] = append(h, spRecordState{owner: st.Owner, version: st.Version, at: now})
					}
				}
				l.mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return l
}

// checkReleaseBeforeReserve reports every partition whose record went from
// one owner to another without a write in between (a release): in a
// cluster where nobody crashed, a partition changes hands only through its
// owner's release.
func (l *spRecordLog) checkReleaseBeforeReserve(t *testing.T) (moves int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, h := range l.history {
		for i := 1; i < len(h); i++ {
			prev, cur := h[i-1], h[i]
			if prev.owner == "" || cur.owner == "" || prev.owner == cur.owner {
				continue
			}
			moves++
			if cur.version-prev.version < 2 {
				t.Errorf("partition %d went from %s (version %d) to %s (version %d) without a release in between",
					p, prev.owner, prev.version, cur.owner, cur.version)
			}
		}
	}
	return moves
}

// spLogTimes returns the times of the lines of nd's log (after marker)
// that contain every one of substrs, parsed from logrus' time field.
func spLogLines(nd *clNode, marker string, substrs ...string) []string {
	return clGrep(nd.logAfter(marker), substrs...)
}

// 1. Three spread members share a topic of 12 partitions: each owns 4 (in
// its ownership records), serves exactly those, and every message is
// delivered and acked.
func TestSpreadThreeMembersShareTwelvePartitions(t *testing.T) {
	const partitions, n = 12, 1200
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := spNewCluster(t, topic, 3)
	c.startAll()
	conn := spZK(t)
	owned := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	t.Logf("ownership records: %v", owned)
	for _, nd := range c.nodes {
		if len(owned[nd.id]) != 4 {
			t.Fatalf("%s owns %v, want 4 partitions", nd.id, owned[nd.id])
		}
	}
	f := clStartFlowOn(t, c, n, partitions, 3*time.Second, spConsumers(c.nodes))
	f.finish(90 * time.Second)
	ownerOf := map[int32]string{}
	for id, ps := range owned {
		for _, p := range ps {
			ownerOf[p] = id
		}
	}
	by := map[string]map[int32]bool{}
	for _, rc := range f.rec.all() {
		if ownerOf[rc.part] != rc.node {
			t.Errorf("%s delivered partition %d, which %s owns", rc.node, rc.part, ownerOf[rc.part])
		}
		if by[rc.node] == nil {
			by[rc.node] = map[int32]bool{}
		}
		by[rc.node][rc.part] = true
	}
	for id, ps := range by {
		t.Logf("%s delivered partitions %v", id, slices.Sorted(maps.Keys(ps)))
	}
	f.logDuplicates("three spread members")
}

var _ = syscall.SIGKILL
