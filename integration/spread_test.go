//go:build integration

package integration

// Spread-mode tests: fanout daemon PROCESSES with --assignment spread share
// the partitions of one topic, each serving its own, fenced per partition
// by its ownership record in ZooKeeper. They reuse the cluster tests'
// helpers (clNewCluster, clFlow, clRecorder, ...). Helpers here are
// prefixed sp.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The spread members' timing: a short ZooKeeper session (the server's
// minimum is 2 × its tick, 4 s), so that a crashed member's partitions are
// free within leader timeout + session timeout.
const (
	spSessionTimeout = 4 * time.Second
	spHandoffTimeout = 3 * time.Second
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
		logPath: strings.Replace(c.nodes[0].logPath, "node-1.log", fmt.Sprintf("node-%d.log", i), 1), args: slices.Clone(c.nodes[0].args)}
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

// spConn returns a ZooKeeper session to read the ownership records of a
// cluster of the ZooKeeper store, nil for the Kafka store (its group says
// who holds what).
func spConn(t *testing.T, c *clCluster) *zk.Conn {
	t.Helper()
	if c.kafkaStore {
		return nil
	}
	return spZK(t)
}

// spOwners returns, per node, the partitions it holds: whose ownership
// record names it and is live (its member znode is of the recorded
// session), or, with the Kafka store, that the group's assignment lets it
// hold (skOwners).
func spOwners(t *testing.T, conn *zk.Conn, c *clCluster) map[string][]int32 {
	t.Helper()
	if c.kafkaStore {
		return skOwners(t, c)
	}
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

// spConsumers returns one consumer address list per node, its own address
// first: each Go client follows the member list from there.
func spConsumers(nodes []*clNode) [][]string {
	var out [][]string
	for _, nd := range nodes {
		out = append(out, []string{nd.addr})
	}
	return out
}

// spRecordLog samples every partition's ownership record (owner, version)
// every 20 ms in the background, keeping each change; with the Kafka store,
// each partition's holder in the group's generation (version), failing the
// test when two members hold one partition in a generation.
type spRecordLog struct {
	mu      sync.Mutex
	history map[int32][]spRecordState
	kafka   bool
}

type spRecordState struct {
	owner   string
	version int32
	at      time.Time
}

func spSampleRecords(t *testing.T, c *clCluster) *spRecordLog {
	t.Helper()
	l := &spRecordLog{history: map[int32][]spRecordState{}, kafka: c.kafkaStore}
	var read func() map[int32]spRecordState
	if c.kafkaStore {
		// The group's holders; the version is the generation.
		store := ksStore(t, c.id, c.topic)
		read = func() map[int32]spRecordState {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			out := map[int32]spRecordState{}
			d, err := store.Describe(ctx)
			if plan := d.Plan(); err == nil && plan != nil {
				for _, m := range d.Members {
					for _, p := range m.Held {
						if prev, ok := out[p]; ok {
							t.Errorf("partition %d held by %s and %s in one generation (%d)", p, prev.owner, m.InstanceID, plan.Generation)
						}
						out[p] = spRecordState{owner: m.InstanceID, version: plan.Generation}
					}
				}
			}
			return out
		}
	} else {
		conn := spZK(t)
		read = func() map[int32]spRecordState {
			out := map[int32]spRecordState{}
			if states, _, err := zkstore.ReadOwners(conn, "", c.id, c.topic); err == nil {
				for p, st := range states {
					out[p] = spRecordState{owner: st.Owner, version: st.Version}
				}
			}
			return out
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			states := read()
			now := time.Now()
			l.mu.Lock()
			for p, st := range states {
				h := l.history[p]
				if len(h) == 0 || h[len(h)-1].version != st.version || h[len(h)-1].owner != st.owner {
					st.at = now
					l.history[p] = append(h, st)
				}
			}
			l.mu.Unlock()
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

// ownedAfter returns when the record of partition p was first seen, after
// t0, naming an owner that is not "" and for which ok holds (zero when
// never).
func (l *spRecordLog) ownedAfter(p int32, ok func(owner string) bool, t0 time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, st := range l.history[p] {
		if st.at.After(t0) && st.owner != "" && ok(st.owner) {
			return st.at
		}
	}
	return time.Time{}
}

// checkReleaseBeforeReserve reports every partition whose record went from
// one owner to another without a write in between (a release): in a
// cluster where nobody crashed, a partition changes hands only through its
// owner's release. With the Kafka store it counts the moves: the holder
// changes only with the generation, and a partition held twice in one was
// reported by the sampler.
func (l *spRecordLog) checkReleaseBeforeReserve(t *testing.T) (moves int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, h := range l.history {
		var last spRecordState // the last owned state seen
		released := false      // a released state was seen since
		for _, cur := range h {
			switch {
			case cur.owner == "":
				released = true
				continue
			case last.owner != "" && cur.owner != last.owner:
				moves++
				// A reserve right after a release is the release's version
				// plus one: the owner's reserve, its release, this reserve.
				if !l.kafka && !released && cur.version-last.version < 2 {
					t.Errorf("partition %d went from %s (version %d) to %s (version %d) without a release in between",
						p, last.owner, last.version, cur.owner, cur.version)
				}
			}
			last, released = cur, false
		}
	}
	return moves
}

// spRaw is a raw protocol client of one member, without
// CAPABILITY_MEMBERS: as a client of today's protocol it receives that
// member's deliveries only, so what it records is what the member
// delivered. It acks every delivery, and records it into rec when set
// (the receipts of a flow: it is one more consumer of the flow).
type spRaw struct {
	node   *clNode
	conn   *procRaw
	mu     sync.Mutex
	got    []spDelivery
	pongs  map[uint64]int // a Pong's nonce: how many deliveries came before it
	closed bool           // the connection ended: nothing more comes
	change chan struct{}  // closed and replaced whenever pongs or closed change
}

type spDelivery struct {
	part  int32
	off   int64
	value string
	at    time.Time
}

func spRawConsume(t *testing.T, nd *clNode, rec *clRecorder) *spRaw {
	t.Helper()
	c := procRawDial(t, nd.addr, 100)
	r := &spRaw{node: nd, conn: c, pongs: map[uint64]int{}, change: make(chan struct{})}
	if f := c.next(t, 30*time.Second); f.GetWelcome() == nil {
		t.Fatalf("%s answered %v, want a Welcome", nd.id, f)
	}
	notify := func(f func()) {
		r.mu.Lock()
		f()
		close(r.change)
		r.change = make(chan struct{})
		r.mu.Unlock()
	}
	go func() {
		defer notify(func() { r.closed = true })
		for f := range c.frames {
			if pong := f.GetPong(); pong != nil {
				notify(func() { r.pongs[pong.GetNonce()] = len(r.got) })
				continue
			}
			d := f.GetDeliver()
			if d == nil {
				continue
			}
			now := time.Now()
			r.mu.Lock()
			r.got = append(r.got, spDelivery{part: d.GetPartition(), off: d.GetOffset(), value: string(d.GetValue()), at: now})
			r.mu.Unlock()
			err := c.send(protocol.AckFrame([]uint64{d.GetDeliveryId()}))
			if rec != nil {
				rc := clReceipt{seq: -1, part: d.GetPartition(), off: d.GetOffset(), attempt: int(d.GetAttempt()),
					node: nd.id, consumer: -1, at: now, acked: err == nil}
				if v, ok := strings.CutPrefix(string(d.GetValue()), "m-"); ok {
					if n, err := strconv.Atoi(v); err == nil {
						rc.seq = n
					}
				}
				rec.add(rc)
			}
		}
	}()
	return r
}

// close ends the connection: its unacked deliveries go to other clients.
func (r *spRaw) close() { _ = r.conn.conn.Close() }

// barrier returns how many deliveries the member wrote to this client
// before it answered a Ping sent now: the connection's frames go out in the
// order they were queued, so every delivery the member queued after it
// read the Ping comes after that count. When the connection has ended, it
// is everything received.
func (r *spRaw) barrier(t *testing.T, nonce uint64) int {
	t.Helper()
	sendErr := r.conn.send(protocol.PingFrame(nonce))
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		n, ok := r.pongs[nonce]
		closed, got, ch := r.closed, len(r.got), r.change
		r.mu.Unlock()
		switch {
		case ok:
			return n
		case closed:
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: no Pong %d within 30s, and the connection is open (ping: %v)", r.node.id, nonce, sendErr)
		}
	}
}

func (r *spRaw) all() []spDelivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// spFirstBeyond returns the first receipt, after t0, of one of parts at an
// offset beyond any received of that partition before t0: a record the
// consumers had not seen, so one that whoever serves the partition now
// delivered (zero when none yet).
func spFirstBeyond(f *clFlow, parts []int32, t0 time.Time) (clReceipt, bool) {
	seen := map[int32]int64{}
	var after []clReceipt
	for _, rc := range f.rec.all() {
		switch {
		case !slices.Contains(parts, rc.part):
		case rc.at.After(t0):
			after = append(after, rc)
		case rc.off >= seen[rc.part]:
			seen[rc.part] = rc.off + 1
		}
	}
	slices.SortFunc(after, func(a, b clReceipt) int { return a.at.Compare(b.at) })
	for _, rc := range after {
		if rc.off >= seen[rc.part] {
			return rc, true
		}
	}
	return clReceipt{}, false
}

// spLogTimes returns the times of the lines of nd's log (after marker)
// that contain every one of substrs, parsed from logrus' time field.
func spLogLines(nd *clNode, marker string, substrs ...string) []string {
	return clGrep(nd.logAfter(marker), substrs...)
}

// 1. Three spread members share a topic of 12 partitions: each owns 4 (in
// its ownership records) and delivers exactly those (to a client of today's
// protocol); one Go client given one member's address receives and acks the
// messages of all 12 through a session per member; fanout status shows it.
func TestSpreadThreeMembersShareTwelvePartitions(t *testing.T) {
	t.Parallel()
	testSpreadThreeMembersShareTwelvePartitions(t, spNewCluster)
}

func testSpreadThreeMembersShareTwelvePartitions(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) *clCluster {
	const partitions, n = 12, 240
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	owned := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	t.Logf("ownership records: %v", owned)
	for _, nd := range c.nodes {
		if len(owned[nd.id]) != 4 {
			t.Fatalf("%s owns %v, want 4 partitions", nd.id, owned[nd.id])
		}
	}
	// A client of today's protocol (no member list) connected to a member
	// receives that member's partitions only.
	var raws []*spRaw
	for _, nd := range c.nodes {
		raws = append(raws, spRawConsume(t, nd, nil))
	}
	produceSeq(t, topic, "m", n, partitions)
	testutil.WaitFor(t, 60*time.Second, fmt.Sprintf("the %d messages received by the members' raw clients", n), func() bool {
		got := map[string]bool{}
		for _, r := range raws {
			for _, d := range r.all() {
				got[d.value] = true
			}
		}
		return len(got) == n
	})
	for _, r := range raws {
		parts := map[int32]bool{}
		for _, d := range r.all() {
			parts[d.part] = true
		}
		got := slices.Sorted(maps.Keys(parts))
		if !slices.Equal(got, owned[r.node.id]) {
			t.Errorf("%s delivered partitions %v to its raw client, it owns %v", r.node.id, got, owned[r.node.id])
		}
	}
	for _, r := range raws {
		r.close()
	}
	watch := c.watchOffsets()

	// One Go client given one member's address follows the member list: a
	// session per member, and every partition's messages, acked.
	hook := &clHook{}
	one := dial(t, clClientConfig("sp-one-address", hook), c.nodes[0].addr)
	const more = 240
	produceSeq(t, topic, "more", more, partitions)
	seen, parts := map[string]bool{}, map[int32]bool{}
	for len(seen) < more {
		m := recv(t, one, 30*time.Second)
		if !strings.HasPrefix(string(m.Value), "more-") {
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatalf("ack %s: %v", m.Value, err)
		}
		seen[string(m.Value)], parts[m.Partition] = true, true
	}
	hook.mu.Lock()
	connects := slices.Clone(hook.connects)
	hook.mu.Unlock()
	slices.Sort(connects)
	if len(parts) != partitions || !slices.Equal(slices.Compact(connects), []string{"node-1", "node-2", "node-3"}) {
		t.Fatalf("the client given %s received partitions %v through sessions with %v: want all %d, through every member",
			c.nodes[0].addr, slices.Sorted(maps.Keys(parts)), connects, partitions)
	}
	testutil.WaitFor(t, 30*time.Second, "the one-address client's acks committed", func() bool {
		offs := watch.latest()
		for p := range int32(partitions) {
			if offs[p] != (n+more)/partitions {
				return false
			}
		}
		return true
	})
	t.Logf("one client given %s received and acked %d messages of all %d partitions through sessions with %v",
		c.nodes[0].addr, more, partitions, slices.Compact(connects))

	// fanout status shows the mode, the assignment with each member's
	// partitions and lag, and no handoff.
	args := append([]string{"status", "--id", c.id, "--topic", topic, "--kafka", strings.Join(kafkaAddrs(t), ",")}, c.storeFlags()...)
	out, err := exec.Command(procBinary(t), append(args, "--json")...).Output()
	if err != nil {
		t.Fatalf("fanout status --json: %v", err)
	}
	var st struct {
		Mode       string `json:"mode"`
		Assignment *struct {
			Epoch      uint64 `json:"epoch"`
			Generation uint64 `json:"generation"`
			Members    []struct {
				NodeID     string  `json:"node_id"`
				Partitions []int32 `json:"partitions"`
				Owned      []int32 `json:"owned"`
				Lag        int64   `json:"lag"`
			} `json:"members"`
		} `json:"assignment"`
		Handoffs []json.RawMessage `json:"handoffs"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("fanout status --json printed %q: %v", out, err)
	}
	if st.Mode != "spread" || st.Assignment == nil || len(st.Assignment.Members) != 3 || len(st.Handoffs) != 0 {
		t.Fatalf("fanout status: %s", out)
	}
	for _, m := range st.Assignment.Members {
		if !slices.Equal(m.Partitions, owned[m.NodeID]) || !slices.Equal(m.Owned, owned[m.NodeID]) || m.Lag != 0 {
			t.Errorf("fanout status: %s assigned %v, owns %v, lag %d; want %v, %v, 0", m.NodeID, m.Partitions, m.Owned, m.Lag,
				owned[m.NodeID], owned[m.NodeID])
		}
	}
	text, err := exec.Command(procBinary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("fanout status: %v\n%s", err, text)
	}
	t.Logf("fanout status:\n%s", text)

	// Each member's Welcome to a client with CAPABILITY_MEMBERS carries the
	// list's version: the assignment's epoch and generation.
	want := &protocol.MembersVersion{Epoch: st.Assignment.Epoch, Generation: st.Assignment.Generation}
	for _, nd := range c.nodes {
		var w *protocol.Welcome
		testutil.WaitFor(t, 30*time.Second, nd.id+"'s Welcome to list the members of the assignment's version", func() bool {
			w = spCapableWelcome(nd.addr)
			return len(w.GetMembers()) == 3 && w.GetMembersVersion().Compare(want) == 0
		})
	}
	return c
}

// spCapableWelcome says Hello with CAPABILITY_MEMBERS to addr and returns
// the Welcome, or nil.
func spCapableWelcome(addr string) *protocol.Welcome {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	w := protocol.NewWriter(nc, 0)
	if w.WriteFrame(protocol.HelloFrame(&protocol.Hello{ClientId: "members-probe", ProtocolVersion: protocol.Version, MaxInFlight: 1,
		Capabilities: []protocol.Capability{protocol.Capability_CAPABILITY_MEMBERS}})) != nil || w.Flush() != nil {
		return nil
	}
	r := protocol.NewReader(nc, 0)
	var f protocol.Frame
	for {
		if err := r.ReadFrame(&f); err != nil {
			return nil
		}
		if wel := f.GetWelcome(); wel != nil {
			_ = w.WriteFrame(protocol.GoodbyeFrame("members probe"))
			_ = w.Flush()
			return wel
		}
		if f.GetPing() == nil {
			return nil
		}
	}
}

// spOwnerAt returns the owner of each partition in owned.
func spOwnerAt(owned map[string][]int32) map[int32]string {
	out := map[int32]string{}
	for id, ps := range owned {
		for _, p := range ps {
			out[p] = id
		}
	}
	return out
}

// 2. A fourth member joins while sequenced messages flow: partitions move
// release-before-reserve (the sampled ownership records never go from one
// owner to another without a release), each member ends with 3, nothing is
// lost (the consumers learn of the new member from the members list), and
// no message acked before the move is delivered again.
func TestSpreadJoinHandsOverReleaseBeforeReserve(t *testing.T) {
	t.Parallel()
	testSpreadJoinHandsOver(t, spNewCluster)
}

func testSpreadJoinHandsOver(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const partitions, n = 12, 2400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	before := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	records := spSampleRecords(t, c)
	// Consumers hold each message a while: the old owners' handoffs wait
	// for acks, while the joiner is ready to reserve.
	f := clStartFlowOn(t, c, n, partitions, 10*time.Second, spConsumers(c.nodes), 300*time.Millisecond)
	f.waitAcked(n/4, 60*time.Second)

	joiner := spAdd(t, c)
	joined := time.Now()
	c.start(joiner) // no consumer is given its address: they learn it from the members list
	after := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	var slowest time.Duration
	testutil.WaitFor(t, 10*time.Second, "the record sampler to see the joiner's partitions", func() bool {
		slowest = 0
		for _, p := range after[joiner.id] {
			at := records.ownedAfter(p, func(o string) bool { return o == joiner.id }, joined)
			if at.IsZero() {
				return false
			}
			slowest = max(slowest, at.Sub(joined))
		}
		return true
	})
	t.Logf("%s reserved its %d partitions within %d ms of its start (records sampled every 20 ms); before %v, after %v",
		joiner.id, len(after[joiner.id]), slowest.Milliseconds(), before, after)
	for _, nd := range c.nodes[:3] {
		if kept := len(slices.DeleteFunc(slices.Clone(after[nd.id]), func(p int32) bool { return !slices.Contains(before[nd.id], p) })); kept != 3 {
			t.Errorf("%s owns %v after the join, had %v: want 3 of its 4 kept", nd.id, after[nd.id], before[nd.id])
		}
	}
	// The handoffs as the old owners logged them.
	for _, nd := range c.nodes[:3] {
		for _, line := range spLogLines(nd, "", "partition handed over") {
			t.Logf("%s: %s", nd.id, spField(line, "partition", "took", "unacked_dropped"))
		}
	}
	for _, line := range spLogLines(joiner, "", "partition reserved") {
		t.Logf("%s: %s", joiner.id, spField(line, "partition", "waited", "condition"))
	}

	f.finish(90 * time.Second)
	if moves := records.checkReleaseBeforeReserve(t); moves < 3 {
		t.Errorf("the sampled records saw %d moves, want at least the 3 of the join", moves)
	}
	dups, _ := f.rec.duplicates()
	for seq, rs := range dups {
		for i, rc := range rs[:len(rs)-1] {
			if rc.acked {
				t.Errorf("m-%d acked (%+v) and then delivered again: %+v", seq, rc, rs[i+1:])
				break
			}
		}
	}
	f.logDuplicates("after a join")
}

// spField returns the named logfmt fields of a log line, "k=v ...".
func spField(line string, keys ...string) string {
	var out []string
	for _, k := range keys {
		i := strings.Index(line, " "+k+"=")
		if i < 0 {
			continue
		}
		v := line[i+len(k)+2:]
		if j := strings.IndexByte(v, ' '); j >= 0 {
			v = v[:j]
		}
		out = append(out, k+"="+v)
	}
	return strings.Join(out, " ")
}

// 2b. SIGTERM of a member while messages flow is a handoff of all its
// partitions: it resigns, drains (its in-flight acked), commits, releases
// and exits 0; the others reserve each partition as it is released, and no
// message acked before the move is delivered again.
func TestSpreadSigtermHandsOver(t *testing.T) { testSpreadSigtermHandsOver(t, spNewCluster) }

func testSpreadSigtermHandsOver(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const partitions, n = 12, 2400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	before := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	records := spSampleRecords(t, c)
	f := clStartFlowOn(t, c, n, partitions, 10*time.Second, spConsumers(c.nodes), 300*time.Millisecond)
	f.waitAcked(n/4, 60*time.Second)

	leaving := c.nodes[0]
	theirs := before[leaving.id]
	// Only what it logs from SIGTERM on counts: on the Kafka store the first
	// member owns every partition until the others join, and hands eight over
	// one by one then, as a rebalance should.
	leaving.mark(t, "SIGTERM")
	termAt := time.Now()
	leaving.signal(t, syscall.SIGTERM)
	code, exitAt := leaving.waitExit(t, spHandoffTimeout+30*time.Second)
	if code != 0 {
		t.Errorf("%s exited with code %d after SIGTERM, want 0", leaving.id, code)
	}
	testutil.WaitFor(t, 60*time.Second, "a new message of the stopped member's partitions", func() bool {
		_, ok := spFirstBeyond(f, theirs, termAt)
		return ok
	})
	after := spWaitOwned(t, conn, c, c.others(leaving), partitions, 60*time.Second)
	t.Logf("SIGTERM of %s (partitions %v): exited after %d ms; owners now %v", leaving.id, theirs, exitAt.Sub(termAt).Milliseconds(), after)
	var slowest time.Duration
	testutil.WaitFor(t, 10*time.Second, "the record sampler to see the stopped member's partitions taken", func() bool {
		slowest = 0
		for _, p := range theirs {
			at := records.ownedAfter(p, func(o string) bool { return o != leaving.id }, termAt)
			if at.IsZero() {
				return false
			}
			slowest = max(slowest, at.Sub(termAt))
		}
		return true
	})
	t.Logf("every partition of %s reserved by another member within %d ms of SIGTERM (ownership records sampled every 20 ms)",
		leaving.id, slowest.Milliseconds())
	for _, line := range spLogLines(leaving, "SIGTERM", "partition handed over") {
		t.Errorf("%s handed a partition over one by one at SIGTERM: %s", leaving.id, line)
	}
	if len(spLogLines(leaving, "SIGTERM", "stopping: handing every partition over")) == 0 {
		t.Errorf("%s did not log its handoff at SIGTERM", leaving.id)
	}

	f.finish(90 * time.Second)
	if moves := records.checkReleaseBeforeReserve(t); moves < len(theirs) {
		t.Errorf("the sampled records saw %d moves, want at least the %d of the stopped member", moves, len(theirs))
	}
	dups, _ := f.rec.duplicates()
	for seq, rs := range dups {
		for i, rc := range rs[:len(rs)-1] {
			if rc.acked {
				t.Errorf("m-%d acked (%+v) and then delivered again: %+v", seq, rc, rs[i+1:])
				break
			}
		}
	}
	f.logDuplicates("after a SIGTERM")
}

// 3. kill -9 of a member while messages flow: the others serve its
// partitions within the leader timeout plus the ZooKeeper session timeout
// (measured), nothing is lost, and the only messages delivered twice are
// the crashed member's: of its partitions, at or above the offsets it had
// committed.
func TestSpreadMemberCrash(t *testing.T) {
	t.Parallel()
	testSpreadMemberCrash(t, spNewCluster, func(c *clCluster) *clNode {
		return c.nodes[0] // not the leader (the highest id leads first)
	})
}

// testSpreadMemberCrash is the crash test on the clusters newCluster
// makes, of the member victim chooses.
func testSpreadMemberCrash(t *testing.T, newCluster func(*testing.T, string, int) *clCluster, victimOf func(*clCluster) *clNode) {
	const partitions, n = 12, 2400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	before := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	records := spSampleRecords(t, c)
	f := clStartFlowOn(t, c, n, partitions, 10*time.Second, spConsumers(c.nodes), 0)
	f.waitAcked(n/3, 60*time.Second)

	victim := victimOf(c)
	theirs := before[victim.id]
	killed := time.Now()
	victim.signal(t, syscall.SIGKILL)
	committed := c.offsets()
	readAt := time.Now()
	victim.waitExit(t, 10*time.Second)

	var first clReceipt
	testutil.WaitFor(t, 60*time.Second, "a new message of the crashed member's partitions", func() bool {
		var ok bool
		// What the consumers read within a second of the kill is what the
		// victim sent before it (read late on a loaded machine): no other
		// member can serve its partitions before its ZooKeeper session
		// (spSessionTimeout) expires.
		first, ok = spFirstBeyond(f, theirs, killed.Add(time.Second))
		return ok
	})
	took := first.at.Sub(killed)
	after := spWaitOwned(t, conn, c, c.others(victim), partitions, 60*time.Second)
	var reserved time.Duration
	testutil.WaitFor(t, 10*time.Second, "the record sampler to see the crashed member's partitions taken", func() bool {
		reserved = 0
		for _, p := range theirs {
			at := records.ownedAfter(p, func(o string) bool { return o != victim.id }, killed)
			if at.IsZero() {
				return false
			}
			reserved = max(reserved, at.Sub(killed))
		}
		return true
	})
	t.Logf("crash of %s (partitions %v): all reserved by others %d ms after the kill, the first new message of "+
		"them received after %d ms (leader timeout %v, session timeout %v); owners now %v", victim.id, theirs,
		reserved.Milliseconds(), took.Milliseconds(), clLeaderTimeout, c.sessionTimeout(), after)
	if !readAt.Before(first.at) {
		t.Fatalf("committed offsets read after another member served: cannot tell what may come again")
	}
	for _, nd := range c.others(victim) {
		if kept := len(slices.DeleteFunc(slices.Clone(after[nd.id]), func(p int32) bool { return !slices.Contains(before[nd.id], p) })); kept != 4 {
			t.Errorf("%s owns %v after the crash, had %v: want all 4 kept", nd.id, after[nd.id], before[nd.id])
		}
	}

	f.finish(90 * time.Second)
	dups, extra := f.rec.duplicates()
	for seq, rs := range dups {
		rc := rs[0]
		switch {
		case !slices.Contains(theirs, rc.part):
			t.Errorf("m-%d of partition %d (not the crashed member's) delivered %d times: %+v", seq, rc.part, len(rs), rs)
		case rc.off < committed[rc.part]:
			t.Errorf("m-%d (partition %d offset %d, below the committed %d) delivered %d times: %+v",
				seq, rc.part, rc.off, committed[rc.part], len(rs), rs)
		}
	}
	t.Logf("duplicates after the crash: %d extra deliveries, all of the crashed member's partitions", extra)
}

// 4. A member paused (SIGSTOP) past its ZooKeeper session loses its
// partitions to the others; resumed, it cannot commit them (the records
// moved on: the committed offsets never go backwards) and it stops
// delivering them: after it noticed, it delivers only partitions it
// reserved anew.
func TestSpreadPausedMemberLosesItsPartitions(t *testing.T) {
	t.Parallel()
	testSpreadPausedMemberLosesItsPartitions(t, spNewCluster)
}

func testSpreadPausedMemberLosesItsPartitions(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const partitions, n = 12, 2400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	before := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	paused := c.nodes[0]
	theirs := before[paused.id]
	f := clStartFlowOn(t, c, n, partitions, 12*time.Second, spConsumers(c.nodes), 0)
	raw := spRawConsume(t, paused, f.rec) // what the paused member delivers, and only that
	f.waitAcked(n/4, 60*time.Second)

	stopAt := time.Now()
	paused.signal(t, syscall.SIGSTOP)
	atStop := c.offsets()
	paused.mark(t, "paused") // whatever the daemon logs from here on, it did after SIGCONT
	after := spWaitOwned(t, conn, c, c.others(paused), partitions, 60*time.Second)
	t.Logf("%s paused: its partitions %v owned by the others after %d ms: %v",
		paused.id, theirs, time.Since(stopAt).Milliseconds(), after)
	contAt := time.Now()
	paused.signal(t, syscall.SIGCONT)

	// It notices by whichever comes first after SIGCONT: its membership
	// gone, a partition's record moved, or the commit under way at SIGSTOP
	// outstanding for the session timeout (its dispatcher stops, dropping
	// every partition, as a leader's does).
	var noticed time.Time
	var queued int // deliveries of the raw client the member queued before it noticed
	noticedLines := func() []string {
		var lines []string
		for _, marker := range []string{"dropping them all", "partition lost", "offset commits keep failing: stopping"} {
			lines = append(lines, spLogLines(paused, "paused", marker)...)
		}
		return lines
	}
	testutil.WaitFor(t, 30*time.Second, "the resumed member to drop what it lost", func() bool {
		if len(noticedLines()) == 0 {
			return false
		}
		noticed = time.Now()
		return true
	})
	queued = raw.barrier(t, 0xfa0)
	t.Logf("the resumed member noticed its loss within %d ms after SIGCONT: %q", noticed.Sub(contAt).Milliseconds(), noticedLines())

	f.finish(90 * time.Second)
	// It may serve partitions again, reserved anew after it rejoined.
	var reservedAgain []int32
	for _, line := range spLogLines(paused, "paused", "partition reserved") {
		var p int32
		if _, err := fmt.Sscanf(spField(line, "partition"), "partition=%d", &p); err == nil {
			reservedAgain = append(reservedAgain, p)
		}
	}
	mine := 0
	for i, d := range raw.all() {
		if slices.Contains(theirs, d.part) && d.at.Before(stopAt) {
			mine++
		}
		if i >= queued && slices.Contains(theirs, d.part) && !slices.Contains(reservedAgain, d.part) {
			t.Errorf("the resumed member delivered %+v after its Pong to a Ping sent once it noticed its loss, of a partition it did not reserve again", d)
		}
	}
	// A commit the resumed member logs of a partition it lost is one made
	// before the pause (logged after it), naming the offset read at the
	// pause; any other is a commit after it lost the partition.
	for _, line := range spLogLines(paused, "paused", `msg="offsets committed"`) {
		m := clCommittedLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("commit of the resumed member not parsed: %s", line)
			continue
		}
		for _, po := range strings.Fields(m[1]) {
			var p int32
			var o int64
			if _, err := fmt.Sscanf(strings.Replace(po, ":", " ", 1), "%d %d", &p, &o); err != nil {
				t.Errorf("commit %q of the resumed member not parsed", po)
				continue
			}
			if slices.Contains(theirs, p) && !slices.Contains(reservedAgain, p) && atStop[p] != o {
				t.Errorf("the resumed member committed partition %d at %d after it lost it (at the pause: %d): %s", p, o, atStop[p], line)
			}
		}
	}
	t.Logf("fenced commit attempts of the resumed member: %d", len(spLogLines(paused, "paused", "offset commit fenced")))
	t.Logf("partitions the resumed member reserved anew: %v; its raw client received %d of its partitions' messages before the pause, %d deliveries in all",
		reservedAgain, mine, len(raw.all()))
	if mine == 0 {
		t.Errorf("the raw client of %s received nothing of its partitions before the pause: it observed nothing", paused.id)
	}
	f.logDuplicates("after a pause")
}

// 5. The leader crashes: the new leader keeps the assignment of the members
// still alive (only the crashed leader's partitions move).
func TestSpreadLeaderCrashKeepsTheAssignment(t *testing.T) {
	t.Parallel()
	const partitions = 12
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := spNewCluster(t, topic, 3)
	c.startAll()
	conn := spZK(t)
	before := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	rec := clFencePath(t, c)
	data, _, err := conn.Get(rec)
	if err != nil {
		t.Fatal(err)
	}
	var leader *clNode
	for _, nd := range c.nodes {
		if strings.Contains(string(data), `"`+nd.id+`"`) {
			leader = nd
		}
	}
	if leader == nil {
		t.Fatalf("no node named by the fence record %s", data)
	}
	killed := time.Now()
	leader.signal(t, syscall.SIGKILL)
	leader.waitExit(t, 10*time.Second)
	after := spWaitOwned(t, conn, c, c.others(leader), partitions, 60*time.Second)
	t.Logf("leader %s crashed; owners before %v, after %v (%d ms)", leader.id, before, after, time.Since(killed).Milliseconds())
	for _, nd := range c.others(leader) {
		for _, p := range before[nd.id] {
			if !slices.Contains(after[nd.id], p) {
				t.Errorf("partition %d moved from %s, which stayed alive, when the leader crashed", p, nd.id)
			}
		}
	}
	var published []string
	for _, nd := range c.others(leader) {
		published = append(published, spLogLines(nd, "", "assignment published")...)
	}
	if len(published) == 0 {
		t.Error("no survivor published an assignment")
	}
}

// 6. Partitions added to the topic are spread over the members, and their
// messages (produced before the members noticed) are delivered.
func TestSpreadPartitionIncrease(t *testing.T) { testSpreadPartitionIncrease(t, spNewCluster) }

func testSpreadPartitionIncrease(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 3)
	c := newCluster(t, topic, 3)
	c.startAll()
	conn := spConn(t, c)
	spWaitOwned(t, conn, c, c.nodes, 3, 60*time.Second)
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatalf("sarama.NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreatePartitions(topic, 9, nil, false); err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	added := time.Now()
	kc := newClient(t)
	testutil.WaitFor(t, 30*time.Second, "the new partitions to have leaders", func() bool {
		if kc.RefreshMetadata(topic) != nil {
			return false
		}
		for p := range int32(9) {
			if _, err := kc.Leader(topic, p); err != nil {
				return false
			}
		}
		return true
	})
	produceSeq(t, topic, "m", 9, 9) // one to each partition, before the members noticed
	owned := spWaitOwned(t, conn, c, c.nodes, 9, 60*time.Second)
	t.Logf("9 partitions owned %v after the increase: %v", time.Since(added).Round(time.Millisecond), owned)
	var raws []*spRaw
	for _, nd := range c.nodes {
		raws = append(raws, spRawConsume(t, nd, nil))
	}
	seen := map[int32]string{}
	testutil.WaitFor(t, 60*time.Second, "a message of every partition", func() bool {
		for _, r := range raws {
			for _, d := range r.all() {
				seen[d.part] = r.node.id
			}
		}
		return len(seen) == 9
	})
	ownerOf := spOwnerAt(owned)
	for p, id := range seen {
		if ownerOf[p] != id {
			t.Errorf("partition %d delivered by %s, owned by %s", p, id, ownerOf[p])
		}
	}
}

// 7. Members of one cluster in different modes: a member whose
// --assignment differs from the leader's says so in its log and serves
// nothing (a client is told to retry: no Welcome, no Redirect); a spread
// leader leaves a leader-mode member out of the assignment.
func TestSpreadModeMismatch(t *testing.T) {
	t.Parallel()
	const partitions = 4
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := spNewCluster(t, topic, 3)
	leaderMode := c.nodes[2] // node-3, the highest id: it leads first, in leader mode
	leaderMode.args = nil
	c.startAll()
	clWaitFor := func(nd *clNode, what string) {
		t.Helper()
		testutil.WaitFor(t, 60*time.Second, nd.id+" to say "+what, func() bool {
			return len(clGrep(nd.logAfter(""), "the leader runs another --assignment", what)) > 0
		})
	}
	for _, nd := range c.nodes[:2] {
		clWaitFor(nd, `leader_assignment=leader`)
		if a := clHello(nd.addr); a.welcome != "" || a.redirectTo != "" || a.code != protocol.ErrorCode_ERROR_CODE_NO_LEADER {
			t.Errorf("%s (spread, under a leader-mode leader) answered %v, want NO_LEADER", nd.id, a)
		}
	}
	// The spread members see node-3 recorded as leader a moment before its
	// term serves (it loads the offsets first): until then it answers
	// NO_LEADER like them.
	testutil.WaitFor(t, 60*time.Second, "the leader-mode leader to welcome a client", func() bool {
		return clHello(leaderMode.addr).welcome == leaderMode.id
	})

	// The leader-mode leader stops: a spread member leads and assigns every
	// partition to the spread members; node-3, back in leader mode, is left
	// out and serves nothing.
	leaderMode.signal(t, syscall.SIGTERM)
	leaderMode.waitExit(t, 30*time.Second)
	leaderMode.mark(t, "restarted")
	c.start(leaderMode)
	conn := spZK(t)
	owned := spWaitOwned(t, conn, c, c.nodes[:2], partitions, 60*time.Second)
	testutil.WaitFor(t, 60*time.Second, leaderMode.id+" to say the leader runs spread", func() bool {
		return len(clGrep(leaderMode.logAfter("restarted"), "the leader runs another --assignment", "leader_assignment=spread")) > 0
	})
	if a := clHello(leaderMode.addr); a.welcome != "" || a.redirectTo != "" || a.code != protocol.ErrorCode_ERROR_CODE_NO_LEADER {
		t.Errorf("%s (leader mode, under a spread leader) answered %v, want NO_LEADER", leaderMode.id, a)
	}
	if _, ok := owned[leaderMode.id]; ok {
		t.Errorf("the leader-mode member owns partitions: %v", owned)
	}
	t.Logf("owners under the spread leader: %v", owned)
}
