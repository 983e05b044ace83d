//go:build integration

package integration

// Cluster tests: three fanout daemon PROCESSES (the real binary, built once by
// procBinary) with the same --id and --topic elect one leader through their
// heartbeat topic and ZooKeeper fence. Go clients and raw-protocol probes
// check who serves, while a paced stream of sequenced messages flows through
// crashes, graceful handovers, pauses, network cuts and rolling restarts.
// Helpers here are prefixed cl.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
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

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The daemons' timing, as passed on their command lines.
const (
	clHeartbeat     = 200 * time.Millisecond // --cluster-heartbeat
	clLeaderTimeout = time.Second            // --leader-timeout
	clDrainTimeout  = 5 * time.Second        // --drain-timeout
	clPartitions    = 3
	// clFailoverBound is how long the tests wait for a failover (the leader
	// timeout, a claim through the log, the fence CAS, the new leader's
	// start and the clients' reconnect backoff) before they fail: a wait for
	// the event, never a bound the failover must beat, so a generous one
	// for a loaded machine. Failover times are logged, and measured by
	// bin/chaos.
	clFailoverBound = clLeaderTimeout + 30*time.Second
)

// clNode is one daemon process of a cluster; it keeps its node id, port and
// log file across restarts.
type clNode struct {
	n       int
	id      string // --node-id: node-<n>; the highest leads first
	addr    string // --listen and --advertise: 127.0.0.1:<port>
	kafka   string // --kafka
	zk      string // --zookeeper
	logPath string // every incarnation appends here

	args []string // extra flags of this node's command line

	mu     sync.Mutex // guards the fields below
	cmd    *exec.Cmd
	exited chan struct{} // closed once the current incarnation has exited
	exitAt time.Time
}

// clCluster is three (or n) daemons of one --id and --topic.
type clCluster struct {
	t     *testing.T
	id    string
	topic string
	nodes []*clNode

	// The Kafka offset store (clNewKafkaCluster): the daemons get
	// --offset-store kafka and no ZooKeeper, run with env and are watched
	// for ZooKeeper connections.
	kafkaStore bool
	env        []string
	watch      func(pid int)
}

// clNewCluster prepares n daemons of topic (node-1 .. node-n, each on its own
// free port, against the test's Kafka and ZooKeeper) without starting them.
// At cleanup every process still running is killed, the log tails are
// printed if the test failed, and the heartbeat topic is deleted.
func clNewCluster(t *testing.T, topic string, n int) *clCluster {
	t.Helper()
	procBinary(t) // build before any timing starts
	c := &clCluster{t: t, id: uniqueName(t, "svc"), topic: topic}
	dir := t.TempDir()
	if keep := os.Getenv("FANOUT_CLUSTER_TEST_LOGS"); keep != "" { // keep the daemons' logs there
		dir = keep + "/" + unsafeName.ReplaceAllString(t.Name(), "_")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= n; i++ {
		c.nodes = append(c.nodes, &clNode{
			n:       i,
			id:      fmt.Sprintf("node-%d", i),
			addr:    procFreeAddr(t),
			kafka:   strings.Join(kafkaAddrs(t), ","),
			zk:      strings.Join(zkAddrs(t), ","),
			logPath: fmt.Sprintf("%s/node-%d.log", dir, i),
		})
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			nd.kill()
		}
		if t.Failed() {
			for _, nd := range c.nodes {
				t.Logf("%s (%s) log, last 80 lines:\n%s", nd.id, nd.addr, clTail(nd.logPath, 80))
			}
		}
		admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
		if err != nil {
			return
		}
		defer admin.Close()
		_ = admin.DeleteTopic(cluster.TopicName(c.id, c.topic))
	})
	return c
}

// clNewKafkaCluster is clNewCluster with the Kafka offset store: the
// daemons get no ZooKeeper and are watched for any connection to one.
func clNewKafkaCluster(t *testing.T, topic string, n int) *clCluster {
	t.Helper()
	c := clNewCluster(t, topic, n)
	c.kafkaStore = true
	c.env, c.watch = ksNoZooKeeper(t)
	for _, nd := range c.nodes {
		nd.zk = ""
	}
	return c
}

// storeFlags are the flags of a tool (fanout status, offsets) that name the
// cluster's store.
func (c *clCluster) storeFlags() []string {
	if c.kafkaStore {
		return []string{"--offset-store", "kafka"}
	}
	return []string{"--zookeeper", strings.Join(zkAddrs(c.t), ",")}
}

// sessionTimeout is the session timeout of a spread member of the
// cluster's store.
func (c *clCluster) sessionTimeout() time.Duration {
	if c.kafkaStore {
		return skSessionTimeout
	}
	return spSessionTimeout
}

// offsets reads the committed offsets from the cluster's store.
func (c *clCluster) offsets() map[int32]int64 {
	c.t.Helper()
	if c.kafkaStore {
		return ksOffsets(c.t, c.id, c.topic)
	}
	return zkOffsets(c.t, c.id, c.topic)
}

// start runs a new incarnation of nd.
func (c *clCluster) start(nd *clNode) {
	t := c.t
	t.Helper()
	f, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "===== cluster test: starting %s at %s =====\n", nd.id, time.Now().Format(time.RFC3339Nano))
	store := []string{"--zookeeper", nd.zk}
	if c.kafkaStore {
		store = []string{"--offset-store", "kafka"}
	}
	cmd := exec.Command(procBinary(t), append(append([]string{"-v",
		"--id", c.id, "--topic", c.topic, "--kafka", nd.kafka}, store...), append([]string{
		"--listen", nd.addr, "--advertise", nd.addr, "--node-id", nd.id, "--metrics-listen=",
		"--cluster-heartbeat", clHeartbeat.String(), "--leader-timeout", clLeaderTimeout.String(),
		"--commit-interval", "200ms", "--ack-timeout", "3s", "--heartbeat", "500ms",
		"--drain-timeout", clDrainTimeout.String(), "--initial-offset", "oldest"}, nd.args...)...)...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", nd.id, err)
	}
	if c.watch != nil {
		c.watch(cmd.Process.Pid)
	}
	exited := make(chan struct{})
	nd.mu.Lock()
	nd.cmd, nd.exited = cmd, exited
	nd.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		nd.mu.Lock()
		nd.exitAt = time.Now()
		nd.mu.Unlock()
		close(exited)
	}()
}

// startAll starts every node at once.
func (c *clCluster) startAll() {
	c.t.Helper()
	for _, nd := range c.nodes {
		c.start(nd)
	}
}

// others returns the nodes other than the given ones.
func (c *clCluster) others(skip ...*clNode) []*clNode {
	var out []*clNode
	for _, nd := range c.nodes {
		if !slices.Contains(skip, nd) {
			out = append(out, nd)
		}
	}
	return out
}

// signal sends sig to the running incarnation of nd.
func (nd *clNode) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	nd.mu.Lock()
	cmd := nd.cmd
	nd.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: send %v: %v", nd.id, sig, err)
	}
}

// waitExit waits until the running incarnation has exited and returns its
// exit code and when it exited.
func (nd *clNode) waitExit(t *testing.T, timeout time.Duration) (int, time.Time) {
	t.Helper()
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(timeout):
		t.Fatalf("%s still running %v later", nd.id, timeout)
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return cmd.ProcessState.ExitCode(), nd.exitAt
}

// kill SIGKILLs the running incarnation, if any (a stopped one too), and
// waits for it to exit.
func (nd *clNode) kill() {
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
}

// mark appends a marker line to nd's log (the daemon appends too).
func (nd *clNode) mark(t *testing.T, what string) {
	t.Helper()
	f, err := os.OpenFile(nd.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "===== cluster test: %s =====\n", what)
}

// logAfter returns the lines of nd's log after the last marker line that
// contains marker ("" for the whole log).
func (nd *clNode) logAfter(marker string) []string {
	b, _ := os.ReadFile(nd.logPath)
	lines := strings.Split(string(b), "\n")
	if marker != "" {
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.HasPrefix(lines[i], "===== cluster test: ") && strings.Contains(lines[i], marker) {
				return lines[i+1:]
			}
		}
		return nil
	}
	return lines
}

// clGrep returns the lines that contain every one of substrs.
func clGrep(lines []string, substrs ...string) []string {
	var out []string
next:
	for _, l := range lines {
		for _, s := range substrs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

// clTail returns the last n lines of the file at path.
func clTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// clAnswer is a daemon's answer to a raw Hello.
type clAnswer struct {
	welcome      string // node id of a Welcome: this node serves clients
	redirectTo   string // leader address of a Redirect
	redirectNode string // leader node id of a Redirect
	code         protocol.ErrorCode
	err          error // an Error frame or an I/O failure
}

func (a clAnswer) String() string {
	switch {
	case a.welcome != "":
		return "Welcome from " + a.welcome
	case a.redirectTo != "":
		return fmt.Sprintf("Redirect to %s (%s)", a.redirectTo, a.redirectNode)
	}
	return fmt.Sprintf("failure: %v", a.err)
}

// clHello opens a raw protocol session with addr: Hello (max_in_flight 1),
// then the answer. A welcomed probe says Goodbye at once; the one message it
// may have been handed is redelivered to another client.
func clHello(addr string) clAnswer {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return clAnswer{err: err}
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	w := protocol.NewWriter(nc, 0)
	err = w.WriteFrame(protocol.HelloFrame(&protocol.Hello{
		ClientId: "cluster-test-probe", ProtocolVersion: protocol.Version, MaxInFlight: 1,
	}))
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return clAnswer{err: err}
	}
	r := protocol.NewReader(nc, 0)
	var f protocol.Frame
	for {
		if err := r.ReadFrame(&f); err != nil {
			return clAnswer{err: err}
		}
		switch b := f.Body.(type) {
		case *protocol.Frame_Welcome:
			_ = w.WriteFrame(protocol.GoodbyeFrame("cluster test probe"))
			_ = w.Flush()
			return clAnswer{welcome: b.Welcome.GetNodeId()}
		case *protocol.Frame_Redirect:
			return clAnswer{redirectTo: b.Redirect.GetLeaderAddress(), redirectNode: b.Redirect.GetLeaderNodeId()}
		case *protocol.Frame_Error:
			return clAnswer{code: b.Error.GetCode(), err: protocol.NewRemoteError(b.Error)}
		}
	}
}

// clWaitLeader waits until exactly one of nodes welcomes clients and every
// other one redirects to its address, and returns it.
func clWaitLeader(t *testing.T, nodes []*clNode, timeout time.Duration) *clNode {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var leader *clNode
		answers := make([]string, len(nodes))
		welcomes := 0
		for i, nd := range nodes {
			a := clHello(nd.addr)
			answers[i] = nd.id + ": " + a.String()
			if a.welcome != "" {
				welcomes++
				if a.welcome == nd.id {
					leader = nd
				}
			}
		}
		if welcomes == 1 && leader != nil {
			agreed := true
			for _, nd := range nodes {
				if nd != leader {
					if a := clHello(nd.addr); a.redirectTo != leader.addr || a.redirectNode != leader.id {
						agreed = false
						answers = append(answers, "then "+nd.id+": "+a.String())
					}
				}
			}
			if agreed {
				return leader
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for exactly one leader that the others redirect to:\n  %s",
				timeout, strings.Join(answers, "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clWatchWelcome probes nodes every 20 ms from now on, in the background,
// until one welcomes a client; the returned function reports when and which
// (zero time until then).
func clWatchWelcome(t *testing.T, nodes []*clNode) func() (time.Time, string) {
	var mu sync.Mutex
	var at time.Time
	var who string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, nd := range nodes {
				if a := clHello(nd.addr); a.welcome != "" {
					mu.Lock()
					at, who = time.Now(), a.welcome
					mu.Unlock()
					return
				}
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
	return func() (time.Time, string) {
		mu.Lock()
		defer mu.Unlock()
		return at, who
	}
}

// clReceipt is one message a consumer received.
type clReceipt struct {
	seq      int // from the value m-<seq>; -1 if it does not parse
	part     int32
	off      int64
	attempt  int
	node     string // node id of the daemon whose session delivered it
	consumer int
	at       time.Time // when the consumer took it
	acked    bool      // Ack returned nil
}

// clRecorder collects the receipts of every consumer of a test.
type clRecorder struct {
	mu       sync.Mutex
	receipts []clReceipt
	acked    map[int]bool
	ackDelay time.Duration // set before the consumers start: how long each holds a message before acking it
}

func (r *clRecorder) add(rc clReceipt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.receipts = append(r.receipts, rc)
	if rc.acked {
		r.acked[rc.seq] = true
	}
}

func (r *clRecorder) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

func (r *clRecorder) all() []clReceipt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.receipts)
}

// firstAfter returns the first receipt taken after t0 from a node other
// than notNode.
func (r *clRecorder) firstAfter(t0 time.Time, notNode string) (clReceipt, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rc := range r.receipts {
		if rc.at.After(t0) && rc.node != notNode {
			return rc, true
		}
	}
	return clReceipt{}, false
}

// duplicates returns, per sequence number received more than once, its
// receipts in the order they were received, and the number of extra
// receipts.
func (r *clRecorder) duplicates() (map[int][]clReceipt, int) {
	by := map[int][]clReceipt{}
	all := r.all()
	slices.SortStableFunc(all, func(a, b clReceipt) int { return a.at.Compare(b.at) })
	for _, rc := range all {
		by[rc.seq] = append(by[rc.seq], rc)
	}
	extra := 0
	for seq, rs := range by {
		if len(rs) < 2 {
			delete(by, seq)
			continue
		}
		extra += len(rs) - 1
	}
	return by, extra
}

// clHook follows a Go client's connection events through its logger.
type clHook struct {
	mu        sync.Mutex
	node      string   // node id of the current session
	connects  []string // node ids of every welcomed session, in order
	redirects []string // "from -> to" of every redirect followed
	events    []clEvent
}

// clEvent is a client's connection event, for the test log.
type clEvent struct {
	at   time.Time
	what string
}

// record notes one event of the client's log: its message and attrs.
func (h *clHook) record(at time.Time, msg string, attrs map[string]any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	what := msg
	for _, k := range []string{"addr", "node", "from", "to", "error"} {
		if v, ok := attrs[k]; ok {
			what += fmt.Sprintf(" %s=%v", k, v)
		}
	}
	h.events = append(h.events, clEvent{at, what})
	switch msg {
	case "connected":
		h.node = fmt.Sprint(attrs["node"])
		h.connects = append(h.connects, h.node)
	case "redirected to the leader":
		h.redirects = append(h.redirects, fmt.Sprintf("%v -> %v", attrs["from"], attrs["to"]))
	}
}

func (h *clHook) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.node
}

// eventsAfter lists the events after t0, with their times relative to it.
func (h *clHook) eventsAfter(t0 time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.events {
		if e.at.After(t0) {
			out = append(out, fmt.Sprintf("+%dms %s", e.at.Sub(t0).Milliseconds(), e.what))
		}
	}
	return out
}

func (h *clHook) logger() *slog.Logger { return slog.New(clHandler{hook: h}) }

// clHandler is the slog.Handler of a Go client's logger: it hands each
// record at Info or above, with the attrs of its logger, to the hook.
type clHandler struct {
	hook  *clHook
	attrs []slog.Attr
}

func (h clHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h clHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := make(map[string]any, len(h.attrs)+r.NumAttrs())
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.Any()
		return true
	})
	h.hook.record(r.Time, r.Message, attrs)
	return nil
}

func (h clHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return clHandler{hook: h.hook, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h clHandler) WithGroup(string) slog.Handler { return h }

// clClientConfig is a Go client that retries quickly, as the tests measure
// failovers through it.
func clClientConfig(name string, hook *clHook) client.Config {
	return client.Config{
		ClientID: name, MaxInFlight: 16, DialTimeout: 2 * time.Second,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Logger: hook.logger(),
	}
}

// clConsumer is a Go client that records and acks every message it gets.
type clConsumer struct {
	hook *clHook
	c    *client.Client
}

// clConsume dials addrs and records every message into rec, acking it
// (rec.ackDelay after receiving it, when set: the receipt is recorded then).
func clConsume(t *testing.T, rec *clRecorder, i int, addrs []string) *clConsumer {
	t.Helper()
	hook := &clHook{}
	c := dial(t, clClientConfig(fmt.Sprintf("cl-consumer-%d", i), hook), addrs...)
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = c.Close()
		<-done
	})
	go func() {
		defer close(done)
		for m := range c.Messages() {
			rc := clReceipt{seq: -1, part: m.Partition, off: m.Offset, attempt: m.Attempt,
				node: hook.current(), consumer: i, at: time.Now()}
			if s, ok := strings.CutPrefix(string(m.Value), "m-"); ok {
				if n, err := strconv.Atoi(s); err == nil {
					rc.seq = n
				}
			}
			if rec.ackDelay > 0 {
				time.AfterFunc(rec.ackDelay, func() {
					rc.acked = m.Ack() == nil
					rec.add(rc)
				})
				continue
			}
			rc.acked = m.Ack() == nil
			rec.add(rc)
		}
	}()
	return &clConsumer{hook: hook, c: c}
}

// clProduce produces n messages "m-<i>", message i to partition
// i % partitions, in batches spread evenly over about `over`.
func clProduce(ctx context.Context, brokers []string, topic string, n, partitions int, over time.Duration) error {
	cfg := kafka.NewConfig("fanout-cluster-producer")
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	const batch = 15
	tick := time.NewTicker(over / time.Duration((n+batch-1)/batch))
	defer tick.Stop()
	for i := 0; i < n; i += batch {
		var msgs []*sarama.ProducerMessage
		for j := i; j < min(i+batch, n); j++ {
			msgs = append(msgs, &sarama.ProducerMessage{
				Topic: topic, Partition: int32(j % partitions),
				Key: sarama.StringEncoder(strconv.Itoa(j)), Value: sarama.StringEncoder("m-" + strconv.Itoa(j)),
			})
		}
		if err := p.SendMessages(msgs); err != nil {
			return fmt.Errorf("produce messages %d..%d: %w", i, i+len(msgs)-1, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// clOffsetWatch polls the committed offsets every 100 ms and records any
// that goes backwards; in Kafka also any commit whose metadata names an
// older epoch than one seen before (a deposed leader's commit accepted).
type clOffsetWatch struct {
	mu        sync.Mutex
	last      map[int32]int64
	backwards []string
	epoch     uint64 // the highest epoch seen in the commits' metadata
}

// watchOffsets starts a clOffsetWatch of the cluster's store.
func (c *clCluster) watchOffsets() *clOffsetWatch {
	c.t.Helper()
	if c.kafkaStore {
		return clWatchKafkaOffsets(c.t, c.id, c.topic)
	}
	return clWatchOffsets(c.t, c.id, c.topic)
}

// clWatchKafkaOffsets polls the offsets of the group fanout_<id>.
func clWatchKafkaOffsets(t *testing.T, id, topic string) *clOffsetWatch {
	t.Helper()
	store := ksStore(t, id, topic)
	w := &clOffsetWatch{last: map[int32]int64{}}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			committed, err := store.Committed(ctx)
			cancel()
			if err == nil {
				offs := make(map[int32]int64, len(committed))
				for p, cm := range committed {
					offs[p] = cm.Offset
					if info, ok := kafkastore.ParseCommitInfo(cm.Metadata); ok {
						w.mu.Lock()
						if info.Epoch < w.epoch {
							w.backwards = append(w.backwards, fmt.Sprintf("partition %d: committed by epoch %d (node %s) after epoch %d",
								p, info.Epoch, info.Node, w.epoch))
						}
						w.epoch = max(w.epoch, info.Epoch)
						w.mu.Unlock()
					}
				}
				w.observe(offs)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return w
}

// clWatchOffsets polls the offsets in ZooKeeper.
func clWatchOffsets(t *testing.T, id, topic string) *clOffsetWatch {
	t.Helper()
	servers, chroot, err := zkstore.ParseServers(zkAddrs(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	conn, err := zkstore.Connect(ctx, servers, 10*time.Second, logrus.NewEntry(quiet))
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	w := &clOffsetWatch{last: map[int32]int64{}}
	dir := zkstore.OffsetsPath(chroot, id, topic)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			w.poll(conn, dir)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		conn.Close()
	})
	return w
}

func (w *clOffsetWatch) poll(conn *zk.Conn, dir string) {
	children, _, err := conn.Children(dir)
	if err != nil {
		return
	}
	offs := map[int32]int64{}
	for _, c := range children {
		data, _, err := conn.Get(dir + "/" + c)
		if err != nil {
			continue
		}
		p, err1 := strconv.ParseInt(c, 10, 32)
		o, err2 := strconv.ParseInt(string(data), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		offs[int32(p)] = o
	}
	w.observe(offs)
}

// observe records the offsets read, and any that went backwards.
func (w *clOffsetWatch) observe(offs map[int32]int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, o := range offs {
		if last, ok := w.last[p]; ok && o < last {
			w.backwards = append(w.backwards, fmt.Sprintf("partition %d: %d after %d", p, o, last))
		}
		w.last[p] = o
	}
}

func (w *clOffsetWatch) latest() map[int32]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int32]int64, len(w.last))
	for p, o := range w.last {
		out[p] = o
	}
	return out
}

// clFlow is a paced stream of n sequenced messages over the partitions of
// the topic, consumed by Go clients (three given every daemon's address,
// or one per daemon given its address alone).
type clFlow struct {
	t         *testing.T
	c         *clCluster
	n         int
	rec       *clRecorder
	consumers []*clConsumer
	produced  chan error
	watch     *clOffsetWatch

	partitions int // of the topic: message i goes to partition i % partitions
}

// clStartFlow starts three consumers (each given all addresses, starting
// with a different one) and a producer of n messages over about `over`.
func clStartFlow(t *testing.T, c *clCluster, n int, over time.Duration) *clFlow {
	t.Helper()
	var addrs [][]string
	for i := range 3 {
		var a []string
		for j := range c.nodes {
			a = append(a, c.nodes[(i+j)%len(c.nodes)].addr)
		}
		addrs = append(addrs, a)
	}
	return clStartFlowOn(t, c, n, clPartitions, over, addrs, 0)
}

// clStartFlowOn is clStartFlow over partitions partitions, with a consumer
// given each list of addresses, each holding every message ackDelay before
// it acks it.
func clStartFlowOn(t *testing.T, c *clCluster, n, partitions int, over time.Duration, addrs [][]string, ackDelay time.Duration) *clFlow {
	t.Helper()
	f := &clFlow{t: t, c: c, n: n, partitions: partitions, rec: &clRecorder{acked: map[int]bool{}, ackDelay: ackDelay},
		produced: make(chan error, 1)}
	f.watch = c.watchOffsets()
	for i, a := range addrs {
		f.consumers = append(f.consumers, clConsume(t, f.rec, i, a))
	}
	ctx, cancel := context.WithCancel(context.Background())
	brokers := kafkaAddrs(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.produced <- clProduce(ctx, brokers, c.topic, n, partitions, over)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return f
}

// waitAcked waits until k distinct messages were acked.
func (f *clFlow) waitAcked(k int, timeout time.Duration) {
	f.t.Helper()
	testutil.WaitFor(f.t, timeout, fmt.Sprintf("%d messages acked", k), func() bool { return f.rec.ackedCount() >= k })
}

// waitFirstAfter waits for the first message taken after t0 from a daemon
// other than notNode.
func (f *clFlow) waitFirstAfter(t0 time.Time, notNode string, timeout time.Duration) clReceipt {
	f.t.Helper()
	var rc clReceipt
	testutil.WaitFor(f.t, timeout, "a message from a daemon other than "+notNode, func() bool {
		var ok bool
		rc, ok = f.rec.firstAfter(t0, notNode)
		return ok
	})
	return rc
}

// finish waits until everything was produced, every sequence number acked
// and the committed offsets reached the end of every partition; then it
// checks that every receipt is the record its sequence number names and
// that the committed offsets never went backwards.
func (f *clFlow) finish(timeout time.Duration) {
	t := f.t
	t.Helper()
	select {
	case err := <-f.produced:
		if err != nil {
			t.Fatalf("producer: %v", err)
		}
	case <-time.After(timeout):
		t.Fatalf("producer not done within %v", timeout)
	}
	deadline := time.Now().Add(timeout)
	for f.rec.ackedCount() < f.n {
		if time.Now().After(deadline) {
			var missing []int
			f.rec.mu.Lock()
			for i := 0; i < f.n && len(missing) < 20; i++ {
				if !f.rec.acked[i] {
					missing = append(missing, i)
				}
			}
			f.rec.mu.Unlock()
			t.Fatalf("after %v only %d of %d messages acked; first missing: %v", timeout, f.rec.ackedCount(), f.n, missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := int64(f.n / f.partitions)
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("committed offsets at %d on every partition", want), func() bool {
		offs := f.watch.latest()
		for p := range int32(f.partitions) {
			if offs[p] != want {
				return false
			}
		}
		return true
	})
	for _, rc := range f.rec.all() {
		if rc.seq < 0 || rc.seq >= f.n || rc.part != int32(rc.seq%f.partitions) || rc.off != int64(rc.seq/f.partitions) {
			t.Errorf("receipt %+v is not the record of its sequence number (m-<i> is at partition i%%%d, offset i/%d)",
				rc, f.partitions, f.partitions)
		}
	}
	f.watch.mu.Lock()
	defer f.watch.mu.Unlock()
	if len(f.watch.backwards) > 0 {
		t.Errorf("committed offsets went backwards: %v", f.watch.backwards)
	}
}

// logDuplicates logs how many messages were received more than once.
func (f *clFlow) logDuplicates(what string) {
	f.t.Helper()
	dups, extra := f.rec.duplicates()
	f.t.Logf("duplicates %s: %d extra deliveries of %d sequence numbers (%d receipts for %d messages)",
		what, extra, len(dups), len(f.rec.all()), f.n)
}

// 1. Three daemons elect exactly one leader; a client given only a
// follower's address is redirected and served by the leader the redirect
// names.
func TestClusterOneLeaderRedirects(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	if leader.id != "node-3" {
		t.Errorf("leader is %s; the highest node id, node-3, is elected first", leader.id)
	}
	follower := c.others(leader)[0]

	hook := &clHook{}
	cl := dial(t, clClientConfig("cl-follower-only", hook), follower.addr)
	const n = 30
	produceSeq(t, topic, "m", n, clPartitions)
	seen := map[string]bool{}
	for len(seen) < n {
		m := recv(t, cl, 30*time.Second)
		seen[string(m.Value)] = true
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	hook.mu.Lock()
	redirects, connects := slices.Clone(hook.redirects), slices.Clone(hook.connects)
	hook.mu.Unlock()
	if want := []string{follower.addr + " -> " + leader.addr}; !slices.Equal(redirects, want) {
		t.Errorf("redirects followed: %q, want %q", redirects, want)
	}
	if want := []string{leader.id}; !slices.Equal(connects, want) {
		t.Errorf("sessions welcomed by %q, want %q (the leader the redirect named)", connects, want)
	}
	testutil.WaitFor(t, 30*time.Second, "the acks committed to the end of every partition", func() bool {
		offs := zkOffsets(t, c.id, topic)
		return offs[0] == n/clPartitions && offs[1] == n/clPartitions && offs[2] == n/clPartitions
	})
	if again := clWaitLeader(t, c.nodes, 30*time.Second); again != leader {
		t.Errorf("leader changed from %s to %s without a failure", leader.id, again.id)
	}
}

// clDeliveredBy counts the receipts from node after since, and reports each
// one after stopped (with format, given the receipt) as an error.
func clDeliveredBy(t *testing.T, f *clFlow, node *clNode, since, stopped time.Time, format string) int {
	t.Helper()
	n := 0
	for _, rc := range f.rec.all() {
		if rc.node == node.id && rc.at.After(since) {
			n++
			if rc.at.After(stopped) {
				t.Errorf(format, rc)
			}
		}
	}
	return n
}

// clFlowingCluster starts three daemons of a new topic, waits for their
// leader, and starts n sequenced messages over about 6 s with three
// consumers; it returns once a third of them are acked.
func clFlowingCluster(t *testing.T, n int) (*clCluster, *clNode, *clFlow) {
	t.Helper()
	return clFlowingClusterOf(t, n, clNewCluster)
}

// clFlowingClusterOf is clFlowingCluster with the cluster newCluster
// prepares (clNewCluster, clNewKafkaCluster).
func clFlowingClusterOf(t *testing.T, n int, newCluster func(*testing.T, string, int) *clCluster) (*clCluster, *clNode, *clFlow) {
	t.Helper()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := newCluster(t, topic, 3)
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	f := clStartFlow(t, c, n, 6*time.Second)
	f.waitAcked(n/3, 60*time.Second)
	return c, leader, f
}

// 2. kill -9 of the leader while three clients consume: a follower takes
// over within the leader timeout plus a margin; nothing is lost; only
// messages at or above the committed offsets come again.
func TestClusterLeaderCrash(t *testing.T) {
	t.Parallel()
	testClusterLeaderCrash(t, clNewCluster)
}

// testClusterLeaderCrash is the test, with the cluster newCluster prepares.
func testClusterLeaderCrash(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const n = 1500
	c, leader, f := clFlowingClusterOf(t, n, newCluster)

	serving := clWatchWelcome(t, c.others(leader))
	killed := time.Now()
	leader.signal(t, syscall.SIGKILL)
	committed := c.offsets()
	readAt := time.Now()
	leader.waitExit(t, 10*time.Second)

	first := f.waitFirstAfter(killed, leader.id, 30*time.Second)
	failover := first.at.Sub(killed)
	at, who := serving()
	t.Logf("failover after crash: %d ms to the first message (from %s); %s welcomed clients after %d ms; "+
		"committed offsets at the kill %v (read in %d ms)",
		failover.Milliseconds(), first.node, who, at.Sub(killed).Milliseconds(), committed, readAt.Sub(killed).Milliseconds())
	if !readAt.Before(first.at) {
		t.Fatalf("committed offsets read after the new leader served: cannot tell what may come again")
	}

	f.finish(60 * time.Second)
	if l := clWaitLeader(t, c.others(leader), 30*time.Second); l.id != first.node {
		t.Errorf("the survivors agree on %s, but %s served the first message after the crash", l.id, first.node)
	}
	dups, _ := f.rec.duplicates()
	for seq, rs := range dups {
		if rs[0].off < committed[rs[0].part] {
			t.Errorf("m-%d (partition %d offset %d, below the committed %d) delivered %d times: %+v",
				seq, rs[0].part, rs[0].off, committed[rs[0].part], len(rs), rs)
		}
	}
	f.logDuplicates("after crash")
}

// 3. SIGTERM of the leader hands over at once: it drains, commits and says
// it leaves, so a follower serves well within a leader timeout after it
// exits, and no acked message is delivered again.
func TestClusterGracefulHandover(t *testing.T) {
	t.Parallel()
	const n = 1500
	c, leader, f := clFlowingCluster(t, n)

	serving := clWatchWelcome(t, c.others(leader))
	termAt := time.Now()
	leader.signal(t, syscall.SIGTERM)
	code, exitAt := leader.waitExit(t, clDrainTimeout+20*time.Second)
	if code != 0 {
		t.Errorf("leader exited with code %d after SIGTERM, want 0", code)
	}
	first := f.waitFirstAfter(termAt, leader.id, 30*time.Second)
	handover, stopped := first.at.Sub(termAt), exitAt.Sub(termAt)
	at, who := serving()
	t.Logf("handover after SIGTERM: %d ms to the first message (from %s); %s welcomed clients after %d ms; "+
		"the old leader drained, committed, resigned and exited after %d ms",
		handover.Milliseconds(), first.node, who, at.Sub(termAt).Milliseconds(), stopped.Milliseconds())
	for i, cons := range f.consumers {
		t.Logf("consumer %d after SIGTERM:\n  %s", i, strings.Join(cons.hook.eventsAfter(termAt), "\n  "))
	}
	// The followers take over on the leaving heartbeat rather than after a
	// leader timeout of silence: that the old leader sends it is checked
	// here, that a follower claims on it (and not on silence) by the
	// elector's tests, whose claimants' clocks stand still.
	if lines := clGrep(leader.logAfter(""), "resigned: leaving heartbeat sent"); len(lines) == 0 {
		t.Errorf("the old leader did not log its leaving heartbeat")
	}
	if at.IsZero() {
		t.Errorf("no follower welcomed clients after SIGTERM")
	}

	f.finish(60 * time.Second)
	dups, _ := f.rec.duplicates()
	for seq, rs := range dups {
		for i, rc := range rs[:len(rs)-1] {
			if rc.acked {
				t.Errorf("m-%d acked (%+v) and then delivered again: %+v", seq, rc, rs[i+1:])
				break
			}
		}
	}
	f.logDuplicates("after graceful handover")
}

var clCommittedLine = regexp.MustCompile(`msg="offsets committed" .*offsets="?map\[([^\]]*)\]`)

// 4. A leader paused (SIGSTOP) for three leader timeouts is deposed: a
// follower serves; resumed, the old leader learns it lost, commits nothing
// and serves nobody; nothing is lost and the committed offsets never go
// backwards.
func TestClusterPausedLeaderDeposed(t *testing.T) {
	t.Parallel()
	testClusterPausedLeaderDeposed(t, clNewCluster)
}

// testClusterPausedLeaderDeposed is the test, with the cluster newCluster
// prepares.
func testClusterPausedLeaderDeposed(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) *clNode {
	const n = 1500
	c, leader, f := clFlowingClusterOf(t, n, newCluster)

	serving := clWatchWelcome(t, c.others(leader))
	stopAt := time.Now()
	leader.signal(t, syscall.SIGSTOP)
	atStop := c.offsets()
	leader.mark(t, "paused") // whatever the daemon logs from here on, it did after SIGCONT

	first := f.waitFirstAfter(stopAt, leader.id, 30*time.Second)
	at, who := serving()
	t.Logf("failover after pause: %d ms to the first message (from %s); %s welcomed clients after %d ms",
		first.at.Sub(stopAt).Milliseconds(), first.node, who, at.Sub(stopAt).Milliseconds())
	newLeader := clWaitLeader(t, c.others(leader), 30*time.Second)
	// The pause lasts three leader timeouts (an absence: nothing to wait for).
	time.Sleep(time.Until(stopAt.Add(3 * clLeaderTimeout)))
	contAt := time.Now()
	leader.signal(t, syscall.SIGCONT)

	testutil.WaitFor(t, 15*time.Second, "the resumed leader to log that it lost leadership", func() bool {
		return len(clGrep(leader.logAfter("paused"), "lost leadership")) > 0
	})
	var deposedAt time.Time
	testutil.WaitFor(t, 15*time.Second, "the resumed leader to redirect to "+newLeader.id, func() bool {
		a := clHello(leader.addr)
		deposedAt = time.Now()
		return a.redirectTo == newLeader.addr
	})
	t.Logf("the resumed leader redirected to %s %d ms after SIGCONT; it says: %q", newLeader.id,
		deposedAt.Sub(contAt).Milliseconds(), clGrep(leader.logAfter("paused"), "lost leadership"))

	f.finish(60 * time.Second)
	zombie := clDeliveredBy(t, f, leader, contAt, deposedAt, "the deposed leader delivered %+v after it redirected clients away")
	t.Logf("messages the resumed old leader delivered after SIGCONT: %d", zombie)
	// A commit the daemon logs after the pause is one made after SIGCONT,
	// unless the pause fell between a commit and its log line (then it
	// names exactly the offsets read at the pause).
	for _, line := range clGrep(leader.logAfter("paused"), `msg="offsets committed"`) {
		m := clCommittedLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("the deposed leader committed after SIGCONT (offsets not parsed): %s", line)
			continue
		}
		same := true
		for _, po := range strings.Fields(m[1]) {
			p, o, _ := strings.Cut(po, ":")
			pi, _ := strconv.Atoi(p)
			oi, _ := strconv.ParseInt(o, 10, 64)
			same = same && atStop[int32(pi)] == oi
		}
		if !same {
			t.Errorf("the deposed leader committed after SIGCONT: %s", line)
		}
	}
	fenced := clGrep(leader.logAfter("paused"), "fenced")
	t.Logf("fenced commit attempts of the deposed leader: %d", len(fenced))
	// Its clients end up at the new leader (one may still wait out a
	// NO_LEADER retry from the resumed node).
	testutil.WaitFor(t, 15*time.Second, "every consumer connected to "+newLeader.id, func() bool {
		for _, cons := range f.consumers {
			if cons.hook.current() != newLeader.id {
				return false
			}
		}
		return true
	})
	if l := clWaitLeader(t, c.nodes, 30*time.Second); l != newLeader {
		t.Errorf("leader is %s after the old one resumed, want %s", l.id, newLeader.id)
	}
	f.logDuplicates("after pause")
	return leader
}

// clProxy is a TCP proxy the test can cut: Cut closes every proxied
// connection and closes new ones at once until Restore.
type clProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex // guards the fields below
	cut   bool
	conns map[net.Conn]bool
}

// clStartProxy proxies listen to target until the test ends.
func clStartProxy(t *testing.T, listen, target string) *clProxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("proxy listen on %s: %v", listen, err)
	}
	p := &clProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(nc)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		p.Cut()
	})
	return p
}

func (p *clProxy) addr() string { return p.ln.Addr().String() }

// track adds nc to the live connections, or reports false while cut.
func (p *clProxy) track(nc net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[nc] = true
	return true
}

func (p *clProxy) serve(in net.Conn) {
	if !p.track(in) {
		_ = in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil || !p.track(out) {
		_ = in.Close()
		if out != nil {
			_ = out.Close()
		}
		return
	}
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	go pipe(out, in)
	pipe(in, out)
}

// Cut closes every proxied connection and refuses new ones.
func (p *clProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	for nc := range conns {
		_ = nc.Close()
	}
}

// Restore proxies new connections again.
func (p *clProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// clEnvPort returns the port in the environment variable name, or def.
func clEnvPort(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// clProxiedKafka returns the broker's PROXIED listener and the address it
// advertises (bin/services), failing the test when the broker has none.
func clProxiedKafka(t *testing.T) (listener, advertised string) {
	t.Helper()
	listener = fmt.Sprintf("127.0.0.1:%d", clEnvPort("FANOUT_KAFKA_PROXIED_PORT", 9094))
	advertised = fmt.Sprintf("127.0.0.1:%d", clEnvPort("FANOUT_KAFKA_PROXIED_ADVERTISED_PORT", 9095))
	hint := "bin/services gives Kafka a PROXIED listener on FANOUT_KAFKA_PROXIED_PORT (9094) advertising " +
		"FANOUT_KAFKA_PROXIED_ADVERTISED_PORT (9095); Kafka started before that change lacks it: " +
		"restart the services (bin/services stop && bin/services start)"
	cfg := kafka.NewConfig("fanout-integration-proxied-check")
	cfg.Metadata.Retry.Max = 1
	cfg.Net.DialTimeout = 3 * time.Second
	c, err := sarama.NewClient([]string{listener}, cfg)
	if err != nil {
		t.Fatalf("no Kafka listener on %s (%v): %s", listener, err, hint)
	}
	defer c.Close()
	var addrs []string
	for _, b := range c.Brokers() {
		addrs = append(addrs, b.Addr())
	}
	if !slices.Equal(addrs, []string{advertised}) {
		t.Fatalf("Kafka on %s advertises brokers %v, want [%s]: %s", listener, addrs, advertised, hint)
	}
	return listener, advertised
}

// 5. A leader cut off from Kafka and ZooKeeper (all its traffic runs through
// proxies that the test cuts) fences itself when its own heartbeats stop
// coming back; the others elect a new leader; restored, it rejoins as a
// follower; nothing is lost.
func TestClusterLeaderCutOff(t *testing.T) {
	t.Parallel()
	const n = 1500
	kafkaListener, kafkaAdvertised := clProxiedKafka(t)
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	victim := c.nodes[2] // node-3: the highest id, started first, leads
	kp := clStartProxy(t, kafkaAdvertised, kafkaListener)
	zkServers := zkAddrs(t)
	zkHost, chroot, _ := strings.Cut(zkServers[0], "/")
	if chroot != "" {
		chroot = "/" + chroot
	}
	zp := clStartProxy(t, "127.0.0.1:0", zkHost)
	victim.kafka, victim.zk = kp.addr(), zp.addr()+chroot

	c.start(victim)
	clWaitLeader(t, []*clNode{victim}, 60*time.Second)
	c.start(c.nodes[0])
	c.start(c.nodes[1])
	if l := clWaitLeader(t, c.nodes, 60*time.Second); l != victim {
		t.Fatalf("leader is %s, want the proxied %s", l.id, victim.id)
	}
	f := clStartFlow(t, c, n, 6*time.Second)
	f.waitAcked(n/3, 60*time.Second)

	serving := clWatchWelcome(t, c.others(victim))
	cutAt := time.Now()
	kp.Cut()
	zp.Cut()
	first := f.waitFirstAfter(cutAt, victim.id, 30*time.Second)
	at, who := serving()
	t.Logf("failover after cut-off: %d ms to the first message (from %s); %s welcomed clients after %d ms",
		first.at.Sub(cutAt).Milliseconds(), first.node, who, at.Sub(cutAt).Milliseconds())
	newLeader := clWaitLeader(t, c.others(victim), 30*time.Second)

	// It fenced itself: its own heartbeats stopped coming back, it
	// abandoned its dispatcher and welcomes nobody.
	testutil.WaitFor(t, 15*time.Second, victim.id+" to log that it lost leadership", func() bool {
		return len(clGrep(victim.logAfter(""), "lost leadership")) > 0
	})
	lost := clGrep(victim.logAfter(""), "lost leadership")
	if len(clGrep(lost, "own heartbeats not seen")) == 0 {
		t.Errorf("the cut-off leader lost leadership for another reason than its own heartbeats missing: %q", lost)
	}
	var fencedAt time.Time
	testutil.WaitFor(t, 15*time.Second, victim.id+" to stop welcoming clients", func() bool {
		a := clHello(victim.addr)
		fencedAt = time.Now()
		return a.welcome == "" && a.err != nil
	})
	t.Logf("%s fenced itself: %q; it did not welcome a client %d ms after the cut",
		victim.id, lost, fencedAt.Sub(cutAt).Milliseconds())
	for i, cons := range f.consumers {
		t.Logf("consumer %d after the cut:\n  %s", i, strings.Join(cons.hook.eventsAfter(cutAt), "\n  "))
	}
	victim.mark(t, "restoring")
	kp.Restore()
	zp.Restore()
	testutil.WaitFor(t, 30*time.Second, victim.id+" to rejoin as a follower of "+newLeader.id, func() bool {
		return clHello(victim.addr).redirectTo == newLeader.addr
	})

	f.finish(60 * time.Second)
	late := clDeliveredBy(t, f, victim, cutAt, fencedAt, "the cut-off leader delivered %+v after it stopped welcoming clients")
	t.Logf("messages the cut-off leader delivered after the cut: %d", late)
	if lines := clGrep(victim.logAfter("restoring"), `msg="offsets committed"`); len(lines) > 0 {
		t.Errorf("the deposed leader committed after it was reconnected: %q", lines)
	}
	if l := clWaitLeader(t, c.nodes, 30*time.Second); l != newLeader {
		t.Errorf("leader is %s after the cut-off node rejoined, want %s", l.id, newLeader.id)
	}
	f.logDuplicates("after cut-off")
}

// 6. A rolling restart of all three daemons (SIGTERM, exit, start again
// with the same node id and port, wait for one agreed leader) while
// messages flow loses nothing.
func TestClusterRollingRestart(t *testing.T) {
	t.Parallel()
	const n = 1500
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	c.startAll()
	clWaitLeader(t, c.nodes, 60*time.Second)
	f := clStartFlow(t, c, n, 8*time.Second)
	f.waitAcked(n/10, 60*time.Second)

	for _, nd := range c.nodes {
		start := time.Now()
		nd.signal(t, syscall.SIGTERM)
		if code, _ := nd.waitExit(t, clDrainTimeout+20*time.Second); code != 0 {
			t.Errorf("%s exited with code %d after SIGTERM, want 0", nd.id, code)
		}
		c.start(nd)
		leader := clWaitLeader(t, c.nodes, 60*time.Second)
		t.Logf("restarted %s in %d ms; leader %s; %d of %d messages acked",
			nd.id, time.Since(start).Milliseconds(), leader.id, f.rec.ackedCount(), n)
	}
	f.finish(60 * time.Second)
	f.logDuplicates("after rolling restart")
}
