package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// memFence is an in-memory fence znode shared by the electors of a test.
type memFence struct {
	mu       sync.Mutex // guards rec and watchers
	rec      record
	watchers []chan zk.Event
}

// set rewrites the fence record (as an operator or a restore would), with a
// new version, or deletes it when r.Missing.
func (f *memFence) set(r record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !r.Missing {
		r.Version = f.rec.Version + 1
	}
	f.rec = r
	f.notifyLocked()
}

func (f *memFence) get() record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rec
}

func (f *memFence) notifyLocked() {
	for _, ch := range f.watchers {
		ch <- zk.Event{Type: zk.EventNodeDataChanged}
	}
	f.watchers = nil
}

// nodeFence is one node's view of a memFence, with its own session.
type nodeFence struct {
	f     *memFence
	path  string // of the fence znode, for the term's fence
	sid   atomic.Int64
	fail  atomic.Pointer[error] // when set, every CAS fails with it
	calls atomic.Int32          // CASes attempted
}

func (n *nodeFence) read(context.Context) (record, <-chan zk.Event, error) {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	ch := make(chan zk.Event, 1)
	n.f.watchers = append(n.f.watchers, ch)
	return n.f.rec, ch, nil
}

func (n *nodeFence) fence(_ context.Context, epoch uint64, node, addr string) (record, offsets.Fence, uint64, error) {
	n.calls.Add(1)
	if err := n.fail.Load(); err != nil {
		return record{}, offsets.Fence{}, 0, *err
	}
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	if n.f.rec.Epoch >= epoch {
		return record{}, offsets.Fence{}, n.f.rec.Epoch, fmt.Errorf("holds %d: %w", n.f.rec.Epoch, errVoid)
	}
	n.f.rec = record{Epoch: epoch, Node: node, Addr: addr, Version: n.f.rec.Version + 1}
	n.f.notifyLocked()
	return n.f.rec, offsets.TopicFence(zkstore.Version{Path: n.path, Version: n.f.rec.Version}), epoch, nil
}

func (n *nodeFence) release(context.Context, record) {}

func (n *nodeFence) name() string { return "zookeeper" }

func (n *nodeFence) session() int64 { return n.sid.Load() }

func (n *nodeFence) connected() bool { return n.sid.Load() != 0 }

// newKafka starts an in-process Kafka (closed at cleanup).
func newKafka(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newKafkaClient returns a sarama client of c on kafka.NewConfig with short
// waits (closed at cleanup).
func newKafkaClient(t *testing.T, c *kfake.Cluster) sarama.Client {
	t.Helper()
	cfg := kafka.NewConfig("cluster-test")
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	cfg.Producer.Retry.Max = 1
	cfg.Metadata.Retry.Max, cfg.Metadata.Retry.Backoff, cfg.Metadata.Retry.BackoffFunc = 1, 10*time.Millisecond, nil
	client, err := sarama.NewClient(c.ListenAddrs(), cfg)
	if err != nil {
		t.Fatalf("sarama client: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// logHook keeps the log entries of a node, for assertions.
type logHook struct {
	mu      sync.Mutex // guards entries
	entries []string   // "level: message: error"
}

func (h *logHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *logHook) Fire(e *logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = append(h.entries, fmt.Sprintf("%s: %s: %v", e.Level, e.Message, e.Data[logrus.ErrorKey]))
	return nil
}

// count returns how many entries contain every one of substrs.
func (h *logHook) count(substrs ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
next:
	for _, e := range h.entries {
		for _, s := range substrs {
			if !strings.Contains(e, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// node is one running Elector of a test and the terms it received.
type node struct {
	e      *Elector
	fence  *nodeFence
	logs   *logHook
	cancel context.CancelFunc
	done   chan struct{} // closed when Run and the term reader have returned

	mu    sync.Mutex // guards terms
	terms []*Term
}

// lastTerm returns the last term received, or nil.
func (n *node) lastTerm() *Term {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.terms) == 0 {
		return nil
	}
	return n.terms[len(n.terms)-1]
}

// The electors of these tests run on real time, in parallel tests, not in
// testing/synctest bubbles: their Kafka client cannot run in one. sarama's
// Broker holds a mutex from a request to its response, and a Fetch's
// response waits up to the fetch's MaxWaitTime in the broker; the elector's
// producer, waiting for that mutex meanwhile, is not durably blocked, so a
// bubble's clock never advances to end the wait (tried on kfake's in-memory
// network, kfake.VirtualNetwork: the first heartbeat hangs). The election's
// rules run on a fake clock without I/O in vote_test.go; here the clocks
// are injected where a test needs one to stand still (stoppableClock).
const (
	testHeartbeat = 100 * time.Millisecond
	testLeaderTTL = 600 * time.Millisecond
)

// startNode runs an Elector for nodeID on c, fenced by memFence, until
// cleanup or n.cancel.
func startNode(t *testing.T, c *kfake.Cluster, fence *memFence, id, nodeID string) *node {
	t.Helper()
	return startNodeWith(t, c, fence, id, nodeID, nil)
}

// startNodeWith is startNode with the Config adjusted by tune, when set.
func startNodeWith(t *testing.T, c *kfake.Cluster, fence *memFence, id, nodeID string, tune func(*Config)) *node {
	t.Helper()
	nf := &nodeFence{f: fence, path: FencePath(id, "jobs")}
	nf.sid.Store(1)
	cfg := testConfig(t, c, id, nodeID)
	if tune != nil {
		tune(&cfg)
		cfg = cfg.withDefaults()
	}
	n := runNode(t, cfg, func(*Elector) fencer { return nf })
	n.fence = nf
	return n
}

// testConfig is the Config of node nodeID of instance id on c, with its own
// Kafka client and a logger that keeps its entries.
func testConfig(t *testing.T, c *kfake.Cluster, id, nodeID string) Config {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.InfoLevel)
	log.SetOutput(io.Discard)
	log.AddHook(&logHook{})
	cfg := Config{
		ID: id, Topic: "jobs", NodeID: nodeID, Addr: nodeID + ":4000",
		Heartbeat: testHeartbeat, LeaderTimeout: testLeaderTTL,
		Client: newKafkaClient(t, c), Logger: logrus.NewEntry(log),
	}.withDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runNode runs an Elector of cfg fenced by the fencer fence makes, until
// cleanup or n.cancel.
func runNode(t *testing.T, cfg Config, fence func(*Elector) fencer) *node {
	t.Helper()
	var hook *logHook
	for _, h := range cfg.Logger.Logger.Hooks[logrus.InfoLevel] {
		hook, _ = h.(*logHook)
	}
	n := &node{logs: hook, done: make(chan struct{})}
	n.e = newElector(cfg, nil)
	n.e.fence = fence(n.e)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		if err := n.e.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", cfg.NodeID, err)
		}
	}()
	go func() {
		defer close(n.done)
		for term := range n.e.Terms() {
			n.mu.Lock()
			n.terms = append(n.terms, term)
			n.mu.Unlock()
		}
		<-runDone
	}()
	t.Cleanup(func() {
		cancel()
		<-n.done
	})
	return n
}

// waitTerm waits until n's reader has received the term its Leadership
// already reports: the reader is a goroutine of its own, a moment behind.
func waitTerm(t *testing.T, n *node) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, n.e.cfg.NodeID+"'s term to be received", func() bool { return n.lastTerm() != nil })
}

// describeNodes says, for a failure, what each node's last term and
// Leadership are.
func describeNodes(nodes ...*node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%s: ", n.e.cfg.NodeID)
		if t := n.lastTerm(); t != nil {
			fmt.Fprintf(&b, "term %d (cause %v), ", t.Epoch, t.Cause())
		} else {
			b.WriteString("no term, ")
		}
		fmt.Fprintf(&b, "%+v; ", n.e.Leadership())
	}
	return b.String()
}

// leaders returns the nodes that hold a running term.
func leaders(nodes ...*node) []*node {
	var out []*node
	for _, n := range nodes {
		if t := n.lastTerm(); t != nil && t.Cause() == nil && n.e.Leadership().Leader {
			out = append(out, n)
		}
	}
	return out
}

func TestElectorSingleNodeCreatesTopicLeadsAndResigns(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	n := startNode(t, c, &memFence{rec: record{Epoch: 4}}, "solo", "n1")
	testutil.WaitFor(t, 10*time.Second, "n1 to lead", func() bool { return len(leaders(n)) == 1 })

	term := n.lastTerm()
	if term.Epoch != 5 || term.Fence.String() != "/fanout/solo/jobs/leader@1" || term.FenceVersion != 1 {
		t.Errorf("term = epoch %d fence %v version %d, want epoch 5 (above the stored 4) /fanout/solo/jobs/leader@1 version 1",
			term.Epoch, term.Fence, term.FenceVersion)
	}
	if l := n.e.Leadership(); !l.Leader || l.LeaderID != "n1" || l.Epoch != 5 {
		t.Errorf("Leadership() = %+v, want n1 leading epoch 5", l)
	}
	parts, err := newKafkaClient(t, c).Partitions("fanout_solo_jobs")
	if err != nil || len(parts) != 1 {
		t.Errorf("heartbeat topic partitions = %v, %v; want one", parts, err)
	}
	testutil.WaitFor(t, 5*time.Second, "n1 in Members", func() bool {
		m := n.e.Members()
		return len(m) == 1 && m[0].NodeID == "n1" && m[0].Role == Role_ROLE_LEADER
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	termCtx, stop := term.Context(context.Background())
	defer stop()
	if err := n.e.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	select {
	case <-term.Lost():
	default:
		t.Fatal("term not lost after Resign")
	}
	if !errors.Is(term.Cause(), ErrResigned) || !errors.Is(context.Cause(termCtx), ErrResigned) {
		t.Errorf("Cause() = %v, context.Cause = %v; want ErrResigned", term.Cause(), context.Cause(termCtx))
	}
	if n.e.Leadership().Leader {
		t.Error("Leadership().Leader after Resign")
	}
	// A resign is how a clean stop ends a term: nothing to warn of.
	if n.logs.count("warning: leadership term ended") != 0 || n.logs.count("info: leadership term ended", "resigned") != 1 {
		t.Errorf("the resigned term's end is not logged once at info: %d warnings", n.logs.count("warning: leadership term ended"))
	}
}

// stoppableClock is an Elector's clock (Config.Now) that reads the time
// until stopped, then always the time it was stopped at: a member whose
// clock stands still never finds another silent for a leader timeout, so
// what it does after that, it does on the records it reads.
type stoppableClock struct{ at atomic.Pointer[time.Time] }

func (c *stoppableClock) Now() time.Time {
	if at := c.at.Load(); at != nil {
		return *at
	}
	return time.Now()
}

func (c *stoppableClock) stop() {
	now := time.Now()
	c.at.Store(&now)
}

// withClock sets a node's clock.
func withClock(c *stoppableClock) func(*Config) { return func(cfg *Config) { cfg.Now = c.Now } }

func TestElectorThreeNodesAgreeAndFailOver(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	var aClock stoppableClock
	a := startNodeWith(t, c, fence, "trio", "a", withClock(&aClock))
	b, cc := startNode(t, c, fence, "trio", "b"), startNode(t, c, fence, "trio", "c")
	all := []*node{a, b, cc}
	agree := func(leader string, epoch uint64) func() bool {
		return func() bool {
			for _, n := range all {
				if n.cancelled() {
					continue
				}
				l := n.e.Leadership()
				if !l.Known || l.LeaderID != leader || l.Epoch != epoch || l.Leader != (n.e.cfg.NodeID == leader) {
					return false
				}
			}
			return true
		}
	}
	testutil.WaitFor(t, 10*time.Second, "all to agree that c leads epoch 1", agree("c", 1))
	waitTerm(t, cc)
	if got := leaders(all...); len(got) != 1 || got[0] != cc {
		t.Fatalf("%d leaders, want only c: %s", len(got), describeNodes(all...))
	}
	if l := a.e.Leadership(); l.LeaderAddr != "c:4000" {
		t.Errorf("a: LeaderAddr %q, want c:4000", l.LeaderAddr)
	}

	// c crashes: b (the highest live id) leads epoch 2 after the timeout.
	cTerm := cc.lastTerm()
	crashed := time.Now()
	cc.stop()
	testutil.WaitFor(t, 10*time.Second, "b to lead epoch 2", agree("b", 2))
	t.Logf("failover after a crash: %v (LeaderTimeout %v)", time.Since(crashed), testLeaderTTL)
	if !errors.Is(cTerm.Cause(), ErrStopped) {
		t.Errorf("c's term cause = %v, want ErrStopped", cTerm.Cause())
	}
	if a.e.Failovers() != 1 {
		t.Errorf("a: Failovers() = %d, want 1", a.e.Failovers())
	}

	// b resigns: a takes over on b's leaving heartbeat, not after a leader
	// timeout of silence: a's clock stands still from here on, so it never
	// finds b silent for one. b's term reaches its Terms channel after its
	// Leadership says so: wait for it.
	testutil.WaitFor(t, 10*time.Second, "b's term of epoch 2", func() bool {
		term := b.lastTerm()
		return term != nil && term.Epoch == 2
	})
	bTerm := b.lastTerm()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Before a's clock stops: a has read the log up to b's heartbeats as
	// leader of epoch 2 (so every record of the crashed c), and c is
	// silent for a timeout in its view (else it would stay live for good).
	testutil.WaitFor(t, 10*time.Second, "a to see b lead epoch 2 and c gone", func() bool {
		bLeads, cSeen := false, false
		for _, m := range a.e.Members() {
			switch m.NodeID {
			case "b":
				bLeads = m.Role == Role_ROLE_LEADER && m.Epoch == 2
			case "c":
				cSeen = true
			}
		}
		return bLeads && !cSeen
	})
	aClock.stop()
	resigned := time.Now()
	if err := b.e.Resign(ctx); err != nil {
		t.Fatalf("b: Resign: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "a to lead epoch 3 on b's leaving heartbeat", func() bool {
		l := a.e.Leadership()
		return l.Leader && l.Epoch == 3
	})
	t.Logf("failover after Resign: %v", time.Since(resigned))
	if !errors.Is(bTerm.Cause(), ErrResigned) {
		t.Errorf("b's term cause = %v, want ErrResigned", bTerm.Cause())
	}
}

func TestElectorTermEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cause error
		end   func(c *kfake.Cluster, n *node)
	}{
		{"zookeeper session expires", ErrSessionExpired, func(_ *kfake.Cluster, n *node) { n.fence.sid.Store(2) }},
		{"cut off from Kafka", ErrCutOff, func(c *kfake.Cluster, _ *node) { c.Close() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newKafka(t)
			n := startNode(t, c, &memFence{}, "ends", "n1")
			testutil.WaitFor(t, 10*time.Second, "n1 to lead", func() bool { return len(leaders(n)) == 1 })
			term := n.lastTerm()
			ended := time.Now()
			tc.end(c, n)
			select {
			case <-term.Lost():
			case <-time.After(testLeaderTTL + 2*time.Second):
				t.Fatalf("term still running %v after the cause", time.Since(ended))
			}
			if !errors.Is(term.Cause(), tc.cause) {
				t.Errorf("Cause() = %v, want %v", term.Cause(), tc.cause)
			}
			t.Logf("term ended after %v: %v", time.Since(ended), term.Cause())
		})
	}
}

// stop cancels the node's Run and waits until it has returned.
func (n *node) stop() {
	n.cancel()
	<-n.done
}

// cancelled reports whether the node was stopped.
func (n *node) cancelled() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// The highest id without ZooKeeper could never record a won epoch: it does
// not claim, so the next id leads instead of nobody.
func TestElectorHighestWithoutZooKeeperStandsAside(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a, b, cc := startNode(t, c, fence, "nozk", "a"), startNode(t, c, fence, "nozk", "b"), startNode(t, c, fence, "nozk", "c")
	cc.fence.sid.Store(0) // before the startup grace ends: c never had a session
	testutil.WaitFor(t, 10*time.Second, "b to lead", func() bool {
		l := b.e.Leadership()
		return l.Leader && l.LeaderID == "b"
	})
	testutil.WaitFor(t, 10*time.Second, "a and c to follow b", func() bool {
		for _, n := range []*node{a, cc} {
			if l := n.e.Leadership(); l.Leader || l.LeaderID != "b" {
				return false
			}
		}
		return true
	})
	waitTerm(t, b)
	if got := leaders(a, b, cc); len(got) != 1 || got[0] != b {
		t.Fatalf("%d leaders, want only b: %s", len(got), describeNodes(a, b, cc))
	}
}

// produceHeartbeat writes hb to the heartbeat log of instance id with a
// plain producer, as anybody with access to the topic could.
func produceHeartbeat(t *testing.T, c *kfake.Cluster, id string, hb *Heartbeat) {
	t.Helper()
	b, err := proto.Marshal(hb)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sarama.NewSyncProducerFromClient(newKafkaClient(t, c))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: TopicName(id, "jobs"), Value: sarama.ByteEncoder(b)}); err != nil {
		t.Fatalf("produce a heartbeat: %v", err)
	}
}

// ZooKeeper is the authority: forged heartbeats with huge epochs and a
// foreign address depose nobody, redirect nobody, and do not stop the next
// election from counting up from the recorded epoch.
func TestElectorForgedHeartbeatsChangeNothing(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a, b, cc := startNode(t, c, fence, "forge", "a"), startNode(t, c, fence, "forge", "b"), startNode(t, c, fence, "forge", "c")
	testutil.WaitFor(t, 10*time.Second, "c to lead and a and b to follow it", func() bool {
		la, lb := a.e.Leadership(), b.e.Leadership()
		return len(leaders(cc)) == 1 && la.LeaderID == "c" && lb.LeaderID == "c"
	})
	term := cc.lastTerm()

	for _, hb := range []*Heartbeat{
		{NodeId: "zz-forged", Addr: "evil:666", Epoch: math.MaxUint64, Role: Role_ROLE_LEADER, ClaimEpoch: math.MaxUint64},
		{NodeId: "c", Addr: "evil:666", Epoch: 1 << 62, Role: Role_ROLE_FOLLOWER},
		{NodeId: "b", Addr: "evil:666", Epoch: term.Epoch + 100, ClaimEpoch: term.Epoch + 100, Role: Role_ROLE_CANDIDATE},
		{NodeId: "zz-forged", Addr: "evil:666", Epoch: term.Epoch, Role: Role_ROLE_LEADER}, // plausible, but no record names it
	} {
		produceHeartbeat(t, c, "forge", hb)
	}
	testutil.WaitFor(t, 10*time.Second, "a to log the implausible heartbeats", func() bool {
		return a.logs.count("implausible heartbeat ignored") >= 2
	})
	time.Sleep(3 * testLeaderTTL) // an absence of change: give it time to happen
	if term.Cause() != nil {
		t.Fatalf("c's term ended: %v", term.Cause())
	}
	for _, n := range []*node{a, b} {
		if l := n.e.Leadership(); !l.Known || l.LeaderID != "c" || l.LeaderAddr != "c:4000" || l.Epoch != term.Epoch {
			t.Errorf("%s: Leadership() = %+v, want c at c:4000 in epoch %d", n.e.cfg.NodeID, l, term.Epoch)
		}
	}
	if r := fence.get(); r.Epoch != term.Epoch || r.Node != "c" {
		t.Errorf("fence record %v, want c at epoch %d", r, term.Epoch)
	}

	// The next election counts on from the recorded epoch: no wrap to 0.
	cc.stop()
	testutil.WaitFor(t, 10*time.Second, "b to lead the next epoch", func() bool {
		l := b.e.Leadership()
		return l.Leader && l.Epoch == term.Epoch+1
	})
	if l := a.e.Leadership(); l.LeaderAddr == "evil:666" {
		t.Errorf("a redirects to the forged address: %+v", l)
	}
}

// ZooKeeper is the authority: a rewritten or deleted fence record ends the
// term of the leader it named, without any commit.
func TestElectorFenceRecordChangeEndsTerm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		to   record
	}{
		{"rewritten", record{Epoch: 1, Node: "n1", Addr: "n1:4000"}}, // same content, new version
		{"deleted", record{Missing: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newKafka(t)
			fence := &memFence{}
			n := startNode(t, c, fence, "rewrite", "n1")
			testutil.WaitFor(t, 10*time.Second, "n1 to lead", func() bool { return len(leaders(n)) == 1 })
			term := n.lastTerm()
			fence.set(tc.to)
			select {
			case <-term.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("the term outlived the change of its fence record")
			}
			if !errors.Is(term.Cause(), ErrSuperseded) {
				t.Errorf("Cause() = %v, want ErrSuperseded", term.Cause())
			}
		})
	}
}

// Two live processes with one node id: neither claims (each logs an error
// once), so the next id leads instead.
func TestElectorDuplicateNodeIDRefusesToClaim(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	b := startNode(t, c, fence, "dup", "b")
	c1, c2 := startNode(t, c, fence, "dup", "c"), startNode(t, c, fence, "dup", "c")
	testutil.WaitFor(t, 10*time.Second, "b to lead", func() bool { return len(leaders(b)) == 1 })
	testutil.WaitFor(t, 10*time.Second, "both c to log the duplicate", func() bool {
		return c1.logs.count("error: another live process has this node id") > 0 &&
			c2.logs.count("error: another live process has this node id") > 0
	})
	time.Sleep(3 * testLeaderTTL) // an absence: neither c claims meanwhile
	if got := leaders(b, c1, c2); len(got) != 1 || got[0] != b {
		t.Fatalf("%d leaders, want only b", len(got))
	}
	if n := c1.logs.count("error: another live process has this node id"); n > 3 {
		t.Errorf("c logged the duplicate %d times, want once per occurrence", n)
	}
	if n := c1.fence.calls.Load() + c2.fence.calls.Load(); n != 0 {
		t.Errorf("the duplicates tried %d compare-and-sets, want none", n)
	}
}

// The highest member's compare-and-set keeps failing for a reason other
// than a lost race (an unreadable record): it claims at most once per
// leader timeout, logs each failure with its cause, and a lower member gets
// its turn and leads.
func TestElectorFailingClaimGivesOthersATurn(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a, b := startNode(t, c, fence, "livelock", "a"), startNode(t, c, fence, "livelock", "b")
	cc := startNode(t, c, fence, "livelock", "c")
	unreadable := errors.New(`cluster: fence /fanout/livelock/jobs/leader holds "\x00garbage": invalid character`)
	cc.fence.fail.Store(&unreadable)
	start := time.Now()
	testutil.WaitFor(t, 10*time.Second, "b to lead", func() bool { return len(leaders(b)) == 1 })
	t.Logf("b leads %v after start; c tried %d compare-and-sets", time.Since(start), cc.fence.calls.Load())
	if l := a.e.Leadership(); l.LeaderID != "b" {
		testutil.WaitFor(t, 5*time.Second, "a to follow b", func() bool { return a.e.Leadership().LeaderID == "b" })
	}
	// c goes on trying only while b is not live; bound its attempts by the
	// time elapsed (one per timeout, plus the first).
	elapsed := time.Since(start)
	if n, max := cc.fence.calls.Load(), int32(elapsed/testLeaderTTL)+1; n > max {
		t.Errorf("c tried %d compare-and-sets in %v, want at most %d (one per leader timeout)", n, elapsed, max)
	}
	if cc.logs.count("claiming leadership") == 0 {
		t.Errorf("c did not log why it claims (the leader's silence and the members heard)")
	}
	if n, logged := cc.fence.calls.Load(), int32(cc.logs.count("error: cannot record won epoch", "invalid character")); logged != n {
		t.Errorf("c logged %d failures with their cause for %d failed compare-and-sets", logged, n)
	}
}

// A term ended by its holder (a commit under its fence was refused) ends in
// the election too: the node stops heartbeating as leader at once, without
// leaving, and another member leads on that heartbeat (the others' clocks
// stand still from the end of the term: none of them waits out a leader
// timeout).
func TestElectorTermEndedByItsHolderHandsOver(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	var aClock, bClock stoppableClock
	a, b := startNodeWith(t, c, fence, "ended", "a", withClock(&aClock)), startNodeWith(t, c, fence, "ended", "b", withClock(&bClock))
	cc := startNode(t, c, fence, "ended", "c")
	testutil.WaitFor(t, 10*time.Second, "c to lead", func() bool {
		return len(leaders(cc)) == 1 && a.e.Leadership().LeaderID == "c" && b.e.Leadership().LeaderID == "c"
	})
	term := cc.lastTerm()
	fenced := fmt.Errorf("final commit: %w", offsets.ErrFenced)
	aClock.stop()
	bClock.stop()
	ended := time.Now()
	term.End(fenced)
	if !errors.Is(term.Cause(), offsets.ErrFenced) {
		t.Errorf("Cause() = %v, want the holder's cause", term.Cause())
	}
	testutil.WaitFor(t, 10*time.Second, "another member to lead", func() bool {
		return len(leaders(a, b)) == 1
	})
	t.Logf("another member leads %v after the term was ended by its holder", time.Since(ended))
	if l := cc.e.Leadership(); l.Leader {
		t.Errorf("c still says it leads: %+v", l)
	}
	testutil.WaitFor(t, 5*time.Second, "a to see c as a follower (still a member)", func() bool {
		for _, m := range a.e.Members() {
			if m.NodeID == "c" {
				return m.Role != Role_ROLE_LEADER
			}
		}
		return false
	})
}
