//go:build integration

package integration

// The offsets tool (fanout offsets show and reset) against the real Kafka
// and ZooKeeper, with both offset stores: what show reads matches what a
// daemon committed; a reset of a stopped cluster makes the next daemon
// replay or skip exactly as asked; a running cluster is refused without
// --fence-leader, and with it the leader of a cluster of daemon processes is
// fenced and the next one resumes from the reset. Helpers here are prefixed
// ot.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// otStoreArgs are the flags that name the servers and the store of a
// cluster: --kafka, and --zookeeper or --offset-store kafka.
func otStoreArgs(t testing.TB, kafkaStore bool) []string {
	args := []string{"--kafka", strings.Join(kafkaAddrs(t), ",")}
	if kafkaStore {
		return append(args, "--offset-store", "kafka")
	}
	return append(args, "--zookeeper", strings.Join(zkAddrs(t), ","))
}

// otRun runs the fanout binary with args and stdin (nil: none), and returns
// its exit code and output.
func otRun(t testing.TB, stdin io.Reader, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, procBinary(t), args...)
	cmd.Stdin = stdin
	out, _ := cmd.CombinedOutput()
	t.Logf("fanout %s: exit %d\n%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode(), string(out)
}

// otTool runs fanout offsets <args> against the cluster id on topic.
func otTool(t testing.TB, id, topic string, kafkaStore bool, args ...string) (int, string) {
	t.Helper()
	args = append(append([]string{"offsets"}, args...), "--id", id, "--topic", topic)
	return otRun(t, nil, append(args, otStoreArgs(t, kafkaStore)...)...)
}

// otOpts runs the tool against the cluster of a daemon's options.
func otOpts(t testing.TB, opts fanout.Options, args ...string) (int, string) {
	t.Helper()
	return otTool(t, opts.ID, opts.Topic, opts.OffsetStore == fanout.OffsetStoreKafka, args...)
}

// otShow is the JSON document of fanout offsets show.
type otShow struct {
	Store    string `json:"store"`
	Location string `json:"location"`
	Leader   *struct {
		Node  string `json:"node"`
		Epoch uint64 `json:"epoch"`
	} `json:"leader"`
	Partitions []struct {
		Partition int32  `json:"partition"`
		Committed *int64 `json:"committed"`
		LogStart  int64  `json:"log_start"`
		LogEnd    int64  `json:"log_end"`
		Lag       *int64 `json:"lag"`
	} `json:"partitions"`
	TotalLag int64 `json:"total_lag"`
}

// otShowJSON runs fanout offsets show --json and decodes it.
func otShowJSON(t testing.TB, id, topic string, kafkaStore bool) otShow {
	t.Helper()
	code, out := otTool(t, id, topic, kafkaStore, "show", "--json")
	if code != 0 {
		t.Fatalf("offsets show: exit %d", code)
	}
	var s otShow
	start := strings.Index(out, "{") // after any warning on stderr
	if start < 0 {
		t.Fatalf("offsets show printed no JSON")
	}
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(&s); err != nil {
		t.Fatalf("offsets show --json: %v", err)
	}
	return s
}

// otConsume receives exactly the records of want from c (each once; values
// as produced), acks them, and checks that nothing else comes within a
// second.
func otConsume(t *testing.T, c *client.Client, want map[procPO]string) {
	t.Helper()
	got := map[procPO]bool{}
	for len(got) < len(want) {
		m := recv(t, c, 30*time.Second)
		po := procPO{m.Partition, m.Offset}
		v, ok := want[po]
		switch {
		case !ok:
			t.Fatalf("delivered %v (%s), not among the %d records expected", po, m.Value, len(want))
		case got[po]:
			t.Fatalf("delivered %v twice", po)
		case string(m.Value) != v:
			t.Fatalf("%v has value %q, want %q", po, m.Value, v)
		}
		got[po] = true
		if err := m.Ack(); err != nil {
			t.Fatalf("ack %v: %v", po, err)
		}
	}
	noMessage(t, c, time.Second)
}

// otServe starts a daemon of opts, has it deliver exactly want, waits until
// ends is committed, and stops it.
func otServe(t *testing.T, opts fanout.Options, want map[procPO]string, ends map[int32]int64) {
	t.Helper()
	d := startDaemon(t, opts)
	c := dial(t, client.Config{MaxInFlight: 50}, d.addr)
	otConsume(t, c, want)
	testutil.WaitFor(t, 15*time.Second, fmt.Sprintf("offsets %v committed", ends), func() bool {
		return maps.Equal(storeOffsets(t, opts), ends)
	})
	_ = c.Close()
	if err := d.stop(t); err != nil {
		t.Fatalf("daemon stopped with %v", err)
	}
}

// otRecords is the records "<batch>-<p>-<o>" at offsets from..to-1 of each
// partition of parts.
func otRecords(batch string, from, to int64, parts ...int32) map[procPO]string {
	out := map[procPO]string{}
	for _, p := range parts {
		for o := from; o < to; o++ {
			out[procPO{p, o}] = fmt.Sprintf("%s-%d-%d", batch, p, o)
		}
	}
	return out
}

// otProduce produces records of batch at offsets from..to-1 of each
// partition, with timestamp at.
func otProduce(t *testing.T, topic, batch string, from, to int64, at time.Time, parts ...int32) map[procPO]string {
	t.Helper()
	recs := otRecords(batch, from, to, parts...)
	producer := manualProducer(t)
	defer producer.Close()
	for _, p := range parts {
		for o := from; o < to; o++ {
			_, off, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p,
				Value: sarama.StringEncoder(recs[procPO{p, o}]), Timestamp: at})
			if err != nil || off != o {
				t.Fatalf("produce %s to %s/%d: offset %d, %v; want offset %d", recs[procPO{p, o}], topic, p, off, err, o)
			}
		}
	}
	return recs
}

// union merges record sets.
func union(sets ...map[procPO]string) map[procPO]string {
	out := map[procPO]string{}
	for _, s := range sets {
		maps.Copy(out, s)
	}
	return out
}

// only keeps the records of set at or above from[partition].
func only(set map[procPO]string, from map[int32]int64) map[procPO]string {
	out := map[procPO]string{}
	for po, v := range set {
		if po.O >= from[po.P] {
			out[po] = v
		}
	}
	return out
}

// fanout offsets show reads what a running daemon committed, its leader
// record and each partition's log.
func TestOffsetsShow(t *testing.T) { testOffsetsShow(t, daemonOptions) }

// TestOffsetsShow with the Kafka offset store.
func TestOffsetsShowKafkaStore(t *testing.T) { testOffsetsShow(t, ksDaemonOptions) }

func testOffsetsShow(t *testing.T, options func(testing.TB, string) fanout.Options) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	recs := otProduce(t, topic, "a", 0, 5, time.Now(), 0, 1)
	opts := options(t, topic)
	opts.NodeID = "node-show"
	d := startDaemon(t, opts)
	c := dial(t, client.Config{MaxInFlight: 20}, d.addr)
	for range len(recs) {
		m := recv(t, c, 30*time.Second)
		if m.Partition == 0 || m.Offset < 2 { // partition 1 keeps offsets 2-4 unacked
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[int32]int64{0: 5, 1: 2}
	testutil.WaitFor(t, 15*time.Second, "offsets 0:5 1:2 committed", func() bool { return maps.Equal(storeOffsets(t, opts), want) })

	s := otShowJSON(t, opts.ID, topic, opts.OffsetStore == fanout.OffsetStoreKafka)
	if s.Leader == nil || s.Leader.Node != "node-show" || s.Leader.Epoch == 0 {
		t.Errorf("leader %+v, want node-show at an epoch", s.Leader)
	}
	if wantStore := cmpOr(opts.OffsetStore, fanout.OffsetStoreZooKeeper); s.Store != wantStore {
		t.Errorf("store %q, want %q", s.Store, wantStore)
	}
	if len(s.Partitions) != 2 || s.TotalLag != 3 {
		t.Fatalf("show: %+v, want 2 partitions and a total lag of 3", s)
	}
	for _, p := range s.Partitions {
		if p.Committed == nil || *p.Committed != want[p.Partition] || p.LogStart != 0 || p.LogEnd != 5 || p.Lag == nil || *p.Lag != 5-want[p.Partition] {
			t.Errorf("partition %d: %+v, want committed %d, log [0, 5], lag %d", p.Partition, p, want[p.Partition], 5-want[p.Partition])
		}
	}
	code, out := otOpts(t, opts, "show")
	if code != 0 || !strings.Contains(out, "leader  node-show (epoch") || !strings.Contains(out, "lag     3") {
		t.Errorf("offsets show: exit %d; want the leader and the lag", code)
	}
}

// cmpOr returns a, or b when a is empty.
func cmpOr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// otResetArgs is the reset of a stopped cluster to target, confirmed.
func otResetArgs(target string, extra ...string) []string {
	return append([]string{"reset", "--to", target, "--yes"}, extra...)
}

// otWantReset runs a reset that must succeed and checks the offsets it
// leaves in the store.
func otWantReset(t *testing.T, opts fanout.Options, want map[int32]int64, args ...string) {
	t.Helper()
	code, out := otOpts(t, opts, args...)
	if code != 0 || !strings.Contains(out, "verified") {
		t.Fatalf("offsets %v: exit %d, want 0 and verified", args, code)
	}
	if got := storeOffsets(t, opts); !maps.Equal(got, want) {
		t.Fatalf("after offsets %v the store holds %v, want %v", args, got, want)
	}
}

// A reset of a stopped cluster, then a daemon: to oldest it replays
// everything, to a time between two batches exactly the later batch, to
// explicit offsets exactly from them, one partition to oldest only that one,
// to newest nothing until new records come. Without a terminal and without
// --yes, or with the answer no on a terminal, nothing is written.
func TestOffsetsResetStopped(t *testing.T) { testOffsetsResetStopped(t, daemonOptions) }

// TestOffsetsResetStopped with the Kafka offset store.
func TestOffsetsResetStoppedKafkaStore(t *testing.T) { testOffsetsResetStopped(t, ksDaemonOptions) }

func testOffsetsResetStopped(t *testing.T, options func(testing.TB, string) fanout.Options) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	tA := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	tB := tA.Add(30 * time.Minute)
	a := otProduce(t, topic, "a", 0, 3, tA, 0, 1) // offsets 0-2 of each partition
	b := otProduce(t, topic, "b", 3, 5, tB, 0, 1) // offsets 3-4
	all := union(a, b)
	ends := map[int32]int64{0: 5, 1: 5}
	opts := options(t, topic)
	otServe(t, opts, all, ends)

	// Nobody to confirm: refused, nothing written.
	code, out := otOpts(t, opts, "reset", "--to", "oldest")
	if code != 2 || !strings.Contains(out, "not on a terminal") || !strings.Contains(out, "nothing written") {
		t.Errorf("reset without a terminal and without --yes: exit %d, want 2 and a refusal", code)
	}
	// On a terminal, the answer decides.
	code, out = otTerminal(t, opts, "n\n", "reset", "--to", "oldest")
	if code != 1 || !strings.Contains(out, "[y/N]") || !strings.Contains(out, "not confirmed") {
		t.Errorf("reset answered no on a terminal: exit %d, want 1 after the question", code)
	}
	if got := storeOffsets(t, opts); !maps.Equal(got, ends) {
		t.Fatalf("the refused resets wrote: %v, want %v", got, ends)
	}
	code, out = otTerminal(t, opts, "y\n", "reset", "--to", "oldest")
	if code != 0 || !strings.Contains(out, "[y/N]") || !strings.Contains(out, "verified") {
		t.Fatalf("reset answered yes on a terminal: exit %d, want 0", code)
	}
	if got := storeOffsets(t, opts); !maps.Equal(got, map[int32]int64{0: 0, 1: 0}) {
		t.Fatalf("after the reset to oldest: %v, want 0:0 1:0", got)
	}
	otServe(t, opts, all, ends) // replays everything

	between := tA.Add(15 * time.Minute).Format(time.RFC3339)
	otWantReset(t, opts, map[int32]int64{0: 3, 1: 3}, otResetArgs(between)...)
	otServe(t, opts, b, ends) // exactly the later batch

	otWantReset(t, opts, map[int32]int64{0: 1, 1: 4}, otResetArgs("0=1,1=4")...)
	otServe(t, opts, only(all, map[int32]int64{0: 1, 1: 4}), ends)

	if code, out := otOpts(t, opts, otResetArgs("0=6")...); code != 2 || !strings.Contains(out, "outside its log [0, 5]") {
		t.Errorf("an offset beyond the log end: exit %d, want 2 naming the log", code)
	}
	otWantReset(t, opts, map[int32]int64{0: 5, 1: 0}, otResetArgs("oldest", "--partitions", "1")...)
	otWantReset(t, opts, ends, otResetArgs("newest")...)
	c := otProduce(t, topic, "c", 5, 6, time.Now(), 0, 1)
	otServe(t, opts, c, map[int32]int64{0: 6, 1: 6}) // skipped everything before
}

// otTerminal runs fanout offsets <args> on a terminal (a pty that
// script(1) makes) that is given answer, and returns its exit code and
// output.
func otTerminal(t *testing.T, opts fanout.Options, answer string, args ...string) (int, string) {
	t.Helper()
	args = append(append([]string{procBinary(t), "offsets"}, args...), "--id", opts.ID, "--topic", opts.Topic)
	args = append(args, otStoreArgs(t, opts.OffsetStore == fanout.OffsetStoreKafka)...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Fatalf("script(1), which gives the tool a terminal: %v", err)
	}
	// -e: script exits with the command's code; the log goes nowhere.
	cmd := exec.CommandContext(ctx, script, "-qec", strings.Join(quoted, " "), "/dev/null")
	cmd.Stdin = strings.NewReader(answer)
	out, _ := cmd.CombinedOutput()
	t.Logf("on a terminal answering %q: fanout %s: exit %d\n%s", answer, strings.Join(args[1:], " "), cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode(), string(out)
}

// A reset while a leader serves is refused without --fence-leader, says
// what the flag does and writes nothing; the leader goes on serving and
// committing.
func TestOffsetsResetRefusedWhileLeaderLive(t *testing.T) {
	t.Parallel()
	testOffsetsResetRefusedWhileLeaderLive(t, daemonOptions)
}

// TestOffsetsResetRefusedWhileLeaderLive with the Kafka offset store.
func TestOffsetsResetRefusedWhileLeaderLiveKafkaStore(t *testing.T) {
	t.Parallel()
	testOffsetsResetRefusedWhileLeaderLive(t, ksDaemonOptions)
}

func testOffsetsResetRefusedWhileLeaderLive(t *testing.T, options func(testing.TB, string) fanout.Options) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	a := otProduce(t, topic, "a", 0, 3, time.Now(), 0)
	opts := options(t, topic)
	d := startDaemon(t, opts)
	c := dial(t, client.Config{MaxInFlight: 10}, d.addr)
	otConsume(t, c, a)
	testutil.WaitFor(t, 15*time.Second, "offset 3 committed", func() bool { return storeOffsets(t, opts)[0] == 3 })

	code, out := otOpts(t, opts, otResetArgs("oldest")...)
	if code != 1 || !strings.Contains(out, "--fence-leader resets a running cluster") || !strings.Contains(out, "nothing written") {
		t.Errorf("reset while a leader serves: exit %d, want 1, saying what --fence-leader does", code)
	}
	if runs := regexp.MustCompile(`the cluster runs: heard within \S+ from|the group \S+ has a member`); !runs.MatchString(out) {
		t.Errorf("the refusal does not say why the cluster counts as running")
	}
	if got := storeOffsets(t, opts); got[0] != 3 {
		t.Fatalf("the refused reset wrote: %v", got)
	}
	b := otProduce(t, topic, "b", 3, 4, time.Now(), 0)
	otConsume(t, c, b)
	testutil.WaitFor(t, 15*time.Second, "the leader to go on committing (offset 4)", func() bool { return storeOffsets(t, opts)[0] == 4 })
}

// otToolEpoch is the epoch the reset says it recorded.
var otToolEpoch = regexp.MustCompile(`names fanout-offsets-tool at epoch (\d+)`)

// A reset with --fence-leader against a running cluster of three daemon
// processes while three clients consume: the leader's term ends at once (it
// commits nothing after, and stops delivering), the cluster elects a leader
// at the next epoch, which resumes from the reset offsets: every record
// from them on is delivered again, none below them by the new leader, and
// every record is acked in the end.
func TestOffsetsResetFencesLiveCluster(t *testing.T) {
	t.Parallel()
	testOffsetsResetFencesLiveCluster(t, clNewCluster)
}

// TestOffsetsResetFencesLiveCluster with the Kafka offset store.
func TestOffsetsResetFencesLiveClusterKafkaStore(t *testing.T) {
	t.Parallel()
	testOffsetsResetFencesLiveCluster(t, clNewKafkaCluster)
}

func testOffsetsResetFencesLiveCluster(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const n, back = 1500, 100
	c, leader, f := clFlowingClusterOf(t, n, newCluster)

	now := c.offsets()
	to := map[int32]int64{}
	var target []string
	for p := range int32(clPartitions) {
		to[p] = max(0, now[p]-back)
		target = append(target, fmt.Sprintf("%d=%d", p, to[p]))
	}
	leader.mark(t, "reset")
	resetAt := time.Now()
	code, out := otTool(t, c.id, c.topic, c.kafkaStore, "reset", "--to", strings.Join(target, ","), "--yes", "--fence-leader")
	if code != 0 || !strings.Contains(out, "--fence-leader: taking the leader record over") || !strings.Contains(out, "verified") {
		t.Fatalf("reset --fence-leader of a running cluster: exit %d, want 0", code)
	}
	m := otToolEpoch.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the reset does not name the epoch it recorded")
	}
	toolEpoch, _ := strconv.ParseUint(m[1], 10, 64)

	// The old leader's term ends; it sends its clients away and commits
	// nothing from then on.
	testutil.WaitFor(t, 15*time.Second, "the old leader to log that it lost leadership", func() bool {
		return len(clGrep(leader.logAfter("reset"), "lost leadership")) > 0
	})
	var deposedAt time.Time
	testutil.WaitFor(t, 15*time.Second, "the old leader to stop welcoming clients", func() bool {
		deposedAt = time.Now()
		return clHello(leader.addr).welcome == ""
	})
	after := leader.logAfter("reset")
	lost := slices.IndexFunc(after, func(l string) bool { return strings.Contains(l, "lost leadership") })
	if commits := clGrep(after[lost:], `msg="offsets committed"`); len(commits) > 0 {
		t.Errorf("the fenced leader committed after its term ended: %q", commits)
	}
	t.Logf("the old leader %s: %q; refused commits: %d; it stopped welcoming clients %d ms after the reset began",
		leader.id, clGrep(after, "lost leadership"), len(clGrep(after, "fenced")), deposedAt.Sub(resetAt).Milliseconds())

	newLeader := clWaitLeader(t, c.nodes, 30*time.Second)
	s := otShowJSON(t, c.id, c.topic, c.kafkaStore)
	if s.Leader == nil || s.Leader.Node != newLeader.id || s.Leader.Epoch != toolEpoch+1 {
		t.Errorf("leader record after the reset %+v, want %s at epoch %d (the one after the tool's)", s.Leader, newLeader.id, toolEpoch+1)
	}

	// Everything produced gets acked; the committed offsets reach the end.
	select {
	case err := <-f.produced:
		if err != nil {
			t.Fatalf("producer: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("producer not done within 60s")
	}
	f.waitAcked(n, 60*time.Second)
	end := int64(n / clPartitions)
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("committed offsets at %d on every partition", end), func() bool {
		offs := c.offsets()
		for p := range int32(clPartitions) {
			if offs[p] != end {
				return false
			}
		}
		return true
	})

	// The new leader resumed from the reset offsets: from them on, every
	// record came again after the reset, and none below them from it.
	again := map[procPO]bool{}
	lowest := map[int32]int64{}
	for _, rc := range f.rec.all() {
		if !rc.at.After(resetAt) || rc.node == leader.id && rc.at.Before(deposedAt) {
			continue // before the reset, or the old leader's last deliveries
		}
		if rc.node == leader.id && rc.at.After(deposedAt.Add(time.Second)) && newLeader != leader {
			t.Errorf("the fenced leader delivered %+v after it sent its clients away", rc)
		}
		again[procPO{rc.part, rc.off}] = true
		if l, ok := lowest[rc.part]; rc.node == newLeader.id && (!ok || rc.off < l) {
			lowest[rc.part] = rc.off
		}
	}
	for p := range int32(clPartitions) {
		if lowest[p] != to[p] {
			t.Errorf("partition %d: the new leader's lowest delivery is offset %d, want the reset offset %d", p, lowest[p], to[p])
		}
		var missing []int64
		for o := to[p]; o < end; o++ {
			if !again[procPO{p, o}] {
				missing = append(missing, o)
			}
		}
		if len(missing) > 0 {
			t.Errorf("partition %d: %d records at or above the reset offset %d not delivered after the reset, the first %v",
				p, len(missing), to[p], missing[:min(len(missing), 10)])
		}
	}
	f.logDuplicates("after the reset (a replay of " + strconv.Itoa(back) + " records per partition)")
}

// The reset's take of the ZooKeeper leader record, against the real
// ZooKeeper: it is written in the same multi as the offsets, and from then
// on the term that held the record cannot commit; a take of a record that
// changed since it was read writes nothing at all (neither the record nor
// any offset, nor the znode of a partition never written before); a take
// for an epoch other than the one read is refused before anything is
// written.
func TestOffsetsTakeZooKeeper(t *testing.T) {
	t.Parallel()
	conn := zkConnect(t)
	chroot := zkChroot(t, conn)
	ctx := context.Background()
	s := zkstore.New(conn, chroot, "svc", "t")
	acl := zkstore.ACL{}
	path := chroot + cluster.FencePath("svc", "t")

	// A term at epoch 1, as a winner records it (the record created at 0).
	if _, err := cluster.IdleFence(conn, chroot, "svc", "t", acl); err != nil {
		t.Fatal(err)
	}
	stat, err := conn.Set(path, []byte(`{"epoch":1,"node":"node-a","addr":"a:1"}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	term := offsets.TopicFence(zkstore.Version{Path: path, Version: stat.Version})
	if err := s.Commit(ctx, term, map[int32]int64{0: 10}); err != nil {
		t.Fatalf("the term's commit: %v", err)
	}

	if _, _, err := cluster.TakeZooKeeper(conn, chroot, "svc", "t", acl, 2); !errors.Is(err, cluster.ErrRecordChanged) {
		t.Fatalf("a take for epoch 2 of a record at 1: %v, want ErrRecordChanged", err)
	}
	stale, _, err := cluster.TakeZooKeeper(conn, chroot, "svc", "t", acl, 1)
	if err != nil {
		t.Fatal(err)
	}
	take, epoch, err := cluster.TakeZooKeeper(conn, chroot, "svc", "t", acl, 1)
	if err != nil || epoch != 2 {
		t.Fatalf("take: epoch %d, %v; want 2", epoch, err)
	}
	if err := s.CommitTaking(ctx, []zkstore.Take{take}, map[int32]int64{0: 3, 1: 4}); err != nil {
		t.Fatalf("the reset's commit: %v", err)
	}
	data, _, err := conn.Get(path)
	if err != nil || string(data) != `{"epoch":2,"node":"fanout-offsets-tool"}` {
		t.Errorf("the record after the take: %s, %v", data, err)
	}
	if err := s.Commit(ctx, term, map[int32]int64{0: 11}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("the old term's commit after the take: %v, want ErrFenced", err)
	}
	// The stale take (read before the record changed) writes nothing.
	err = zkstore.New(conn, chroot, "svc", "t").CommitTaking(ctx, []zkstore.Take{stale}, map[int32]int64{0: 7, 1: 7, 2: 7})
	if !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("a take of a record that changed since it was read: %v, want ErrFenced", err)
	}
	if got := mustLoad(t, zkstore.New(conn, chroot, "svc", "t")); !maps.Equal(got, map[int32]int64{0: 3, 1: 4}) {
		t.Errorf("offsets after the refused take: %v, want the reset's 0:3 1:4 alone", got)
	}
	if data, _, err := conn.Get(path); err != nil || string(data) != `{"epoch":2,"node":"fanout-offsets-tool"}` {
		t.Errorf("the record after the refused take: %s, %v", data, err)
	}
}
