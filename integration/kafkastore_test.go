//go:build integration

package integration

// Tests of the Kafka offset store (--offset-store kafka) against the real
// Kafka, with no ZooKeeper given to the daemons: each daemon of these tests
// is checked not to connect to one. Helpers here are prefixed ks.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// ksStore returns the Kafka offset store of instance id and topic on the
// test's Kafka (its client closed at cleanup).
func ksStore(t testing.TB, id, topic string) *kafkastore.Store {
	t.Helper()
	client, err := sarama.NewClient(kafkaAddrs(t), kafka.NewConfig("fanout-integration-kafkastore"))
	if err != nil {
		t.Fatalf("sarama.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return kafkastore.New(client, id, topic, 0)
}

// ksOffsets reads the offsets committed for the group fanout_<id>.
func ksOffsets(t testing.TB, id, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got, err := ksStore(t, id, topic).Load(ctx)
	if err != nil {
		t.Fatalf("offsets of group %s: %v", kafkastore.GroupName(id), err)
	}
	return got
}

// storeOffsets reads the committed offsets of a daemon of opts from the
// store its options name.
func storeOffsets(t testing.TB, opts fanout.Options) map[int32]int64 {
	t.Helper()
	if opts.OffsetStore == fanout.OffsetStoreKafka {
		return ksOffsets(t, opts.ID, opts.Topic)
	}
	return zkOffsets(t, opts.ID, opts.Topic)
}

// ksDaemonOptions is daemonOptions with the Kafka offset store and no
// ZooKeeper; the daemon's log is checked, at the end of the test, for any
// sign of a ZooKeeper connection.
func ksDaemonOptions(t testing.TB, topic string) fanout.Options {
	t.Helper()
	opts := daemonOptions(t, topic)
	opts.OffsetStore, opts.ZooKeeper = fanout.OffsetStoreKafka, nil
	logs := procHookLogs(opts.Logger)
	t.Cleanup(func() {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, e := range logs.entries {
			if _, ok := e.Data["zookeeper"]; ok || strings.Contains(strings.ToLower(e.Message), "zookeeper session") {
				t.Errorf("a daemon of the Kafka store logged a ZooKeeper connection: %s %v", e.Message, e.Data)
			}
		}
	})
	return opts
}

// The store's protocol against the real group coordinator: a join replaces
// the member at once (a new member id); the replaced member's commits and
// heartbeats are refused with FENCED_INSTANCE_ID, as offsets.ErrFenced, and
// write nothing; a commit from outside the group is taken only while it is
// empty.
func TestKafkaStoreFencingRealKafka(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	id := uniqueName(t, "svc")
	a, b := ksStore(t, id, topic), ksStore(t, id, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if err := a.Commit(ctx, a.EmptyFence("integration"), map[int32]int64{1: 2}); err != nil {
		t.Fatalf("commit to the empty group: %v", err)
	}
	old, err := a.Join(ctx, kafkastore.Leader{Epoch: 1, Node: "a", Addr: "a:1"})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if err := a.Commit(ctx, offsets.TopicFence(old), map[int32]int64{0: 5}); err != nil {
		t.Fatalf("commit of the member: %v", err)
	}
	if err := a.Commit(ctx, a.EmptyFence("integration"), map[int32]int64{1: 3}); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("commit from outside while a member holds the group: %v, want ErrFenced", err)
	}
	cur, err := b.Join(ctx, kafkastore.Leader{Epoch: 2, Node: "b", Addr: "b:1"})
	if err != nil {
		t.Fatalf("second join: %v", err)
	}
	t.Logf("first member %v, its replacement %v", old, cur)
	err = a.Commit(ctx, offsets.TopicFence(old), map[int32]int64{0: 99})
	if !errors.Is(err, offsets.ErrFenced) || !errors.Is(err, sarama.ErrFencedInstancedId) {
		t.Fatalf("commit of the replaced member: %v, want ErrFenced from FENCED_INSTANCE_ID", err)
	}
	if err := a.Heartbeat(ctx, old); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("heartbeat of the replaced member: %v, want ErrFenced", err)
	}
	if err := b.Commit(ctx, offsets.TopicFence(cur), map[int32]int64{0: 6}); err != nil {
		t.Fatalf("commit of the new member: %v", err)
	}
	if got, err := a.Load(ctx); err != nil || got[0] != 6 || got[1] != 2 {
		t.Fatalf("offsets %v, %v; want 0:6 1:2", got, err)
	}
	d, err := a.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok, err := d.Holder(); !ok || err != nil || h.MemberID != cur.MemberID || h.Leader.Node != "b" {
		t.Fatalf("holder %+v, %v, %v; want %s of node b", h, ok, err, cur.MemberID)
	}
	if err := a.Leave(ctx, old); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("leave of the replaced member: %v, want ErrFenced", err)
	}
	if err := b.Leave(ctx, cur); err != nil {
		t.Fatalf("leave: %v", err)
	}
	if d, err := a.Describe(ctx); err != nil || len(d.Members) != 0 {
		t.Fatalf("after the leave: %+v, %v; want no member", d, err)
	}
}

// The committed offset is the contiguous acked prefix, with offsets in
// Kafka and no ZooKeeper.
func TestKafkaStoreCommittedOffsetIsContiguousAckedPrefix(t *testing.T) {
	t.Parallel()
	testCommittedOffsetIsContiguousAckedPrefix(t, ksDaemonOptions)
}

// A clean restart redelivers nothing acked, with offsets in Kafka and no
// ZooKeeper.
func TestKafkaStoreCleanRestartRedeliversFromCommittedOffsets(t *testing.T) {
	t.Parallel()
	testCleanRestartRedeliversFromCommittedOffsets(t, ksDaemonOptions)
}

// ksZooKeeperWatch fails the test if the process pid ever has a TCP
// connection to the test's ZooKeeper, sampled every 50 ms until the test
// ends, or if anything connects to a ZooKeeper trap (the address the
// process's Docker link variables name: the default it must not take).
type ksZooKeeperWatch struct {
	mu    sync.Mutex
	found []string
	trap  net.Listener
}

// ksNoZooKeeper returns the environment of a process that must not
// contact ZooKeeper (Docker link variables pointing at a trap), and a
// function that starts watching the process once it runs.
func ksNoZooKeeper(t *testing.T) (env []string, watch func(pid int)) {
	t.Helper()
	trap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &ksZooKeeperWatch{trap: trap}
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			w.add("a connection to the ZooKeeper of the Docker link variables from " + c.RemoteAddr().String())
			_ = c.Close()
		}
	}()
	host, port, _ := net.SplitHostPort(trap.Addr().String())
	env = append(os.Environ(), "ZK_PORT_2181_TCP_ADDR="+host, "ZK_PORT_2181_TCP_PORT="+port)
	var ports []string
	for _, a := range append(zkAddrs(t), trap.Addr().String()) {
		_, p, _ := strings.Cut(strings.SplitN(a, "/", 2)[0], ":")
		if n, err := strconv.Atoi(p); err == nil {
			ports = append(ports, fmt.Sprintf("%04X", n))
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() { close(stop) })
		<-done
		_ = trap.Close()
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, f := range w.found {
			t.Errorf("a daemon of the Kafka store contacted ZooKeeper: %s", f)
		}
	})
	started := make(chan int, 1)
	go func() {
		defer close(done)
		var pids []int
		for {
			select {
			case pid := <-started:
				pids = append(pids, pid)
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, pid := range pids {
				for _, c := range ksConnections(pid, ports) {
					w.add(fmt.Sprintf("process %d: %s", pid, c))
				}
			}
		}
	}()
	return env, func(pid int) { started <- pid }
}

func (w *ksZooKeeperWatch) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.found) < 10 {
		w.found = append(w.found, s)
	}
}

// ksConnections lists the TCP connections of process pid to any of the
// remote ports (upper-case hex, as /proc/net/tcp writes them).
func ksConnections(pid int, ports []string) []string {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil // exited
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, remotePort, _ := strings.Cut(fields[2], ":")
			for _, p := range ports {
				if remotePort == p {
					out = append(out, "a TCP connection to "+fields[2]+" ("+table+")")
				}
			}
		}
		f.Close()
	}
	return out
}

// ksProcArgs are procDaemonArgs with the Kafka offset store and without
// --zookeeper.
func ksProcArgs(t testing.TB, id, topic, addr string, extra ...string) []string {
	args := procDaemonArgs(t, id, topic, addr, append([]string{"--offset-store", "kafka"}, extra...)...)
	for i := range args {
		if args[i] == "--zookeeper" {
			return append(args[:i:i], args[i+2:]...)
		}
	}
	return args
}

// kill -9 loses nothing with offsets in Kafka and no ZooKeeper.
func TestKafkaStoreKillNineLosesNothing(t *testing.T) {
	t.Parallel()
	env, watch := ksNoZooKeeper(t)
	testKillNineLosesNothing(t, procStoreKafka(env, watch))
}

// procStoreKafka is the procStore of daemons of the Kafka offset store,
// started with env and watched for ZooKeeper connections.
func procStoreKafka(env []string, watch func(pid int)) procStore {
	return procStore{
		args:    ksProcArgs,
		offsets: ksOffsets,
		start: func(t testing.TB, args ...string) *procProcess {
			p := procStartEnv(t, env, args...)
			watch(p.cmd.Process.Pid)
			return p
		},
	}
}

// Three daemons of the Kafka store: the leader's kill -9 is followed by a
// new leader within the leader timeout plus a margin, nothing is lost, and
// only messages at or above the committed offsets come again.
func TestKafkaStoreClusterLeaderCrash(t *testing.T) {
	t.Parallel()
	testClusterLeaderCrash(t, clNewKafkaCluster)
}

// Three daemons of the Kafka store: a leader paused (SIGSTOP) is replaced
// in the group by the next leader's join; resumed (SIGCONT), it is refused
// by the broker (its heartbeat, commit or leave names a membership the
// coordinator no longer has), stops delivering and redirects to the new
// leader; no commit of it is accepted (the epochs in the commits' metadata
// never go back) and nothing is lost.
func TestKafkaStoreClusterPausedLeaderDeposed(t *testing.T) {
	t.Parallel()
	old := testClusterPausedLeaderDeposed(t, clNewKafkaCluster)
	refused := clGrep(old.logAfter("paused"), "registered with a different member.id")
	refused = append(refused, clGrep(old.logAfter("paused"), "is not known in the current generation")...)
	if len(refused) == 0 {
		t.Errorf("the resumed leader logged no refusal by the broker after SIGCONT:\n%s",
			strings.Join(old.logAfter("paused"), "\n"))
	}
	for _, l := range refused {
		t.Logf("refused by the broker: %s", l)
	}
}

// ksKafkaLibs returns the class path of Kafka's own tools: the jars
// bin/services runs the broker from (FANOUT_TEST_KAFKA_LIBS overrides).
func ksKafkaLibs(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("FANOUT_TEST_KAFKA_LIBS"); dir != "" {
		return filepath.Join(dir, "*")
	}
	tools, _ := filepath.Glob(filepath.Join("..", ".cache", "kafka-*", "libs", "kafka-tools-[0-9]*.jar"))
	if len(tools) == 0 {
		t.Fatal("Kafka's jars are missing: run bin/deps (they go to .cache/kafka-<version>/libs), or set FANOUT_TEST_KAFKA_LIBS")
	}
	return filepath.Join(filepath.Dir(tools[len(tools)-1]), "*")
}

// Kafka's own kafka-consumer-groups --describe shows the offsets a daemon
// of the Kafka store committed, the lag, and the leader as the member.
func TestKafkaStoreConsumerGroupsDescribe(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	procProduceTo(t, topic, 0, "a0", "a1", "a2", "a3", "a4")
	procProduceTo(t, topic, 1, "b0", "b1", "b2", "b3")
	d := startDaemon(t, ksDaemonOptions(t, topic))
	c := dial(t, client.Config{MaxInFlight: 20}, d.addr)
	// Ack all of partition 0 and the first two of partition 1.
	for acked := 0; acked < 7; {
		m := recv(t, c, 30*time.Second)
		if m.Partition == 0 || m.Offset < 2 {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			acked++
		}
	}
	testutil.WaitFor(t, 15*time.Second, "offsets 5 and 2 committed", func() bool {
		o := ksOffsets(t, d.opts.ID, topic)
		return o[0] == 5 && o[1] == 2
	})

	group := kafkastore.GroupName(d.opts.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", "-cp", ksKafkaLibs(t), "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
		"--bootstrap-server", strings.Join(kafkaAddrs(t), ","), "--describe", "--group", group)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kafka-consumer-groups --describe: %v\n%s", err, out)
	}
	t.Logf("kafka-consumer-groups --describe --group %s:\n%s", group, out)
	// GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
	want := map[string][3]string{"0": {"5", "5", "0"}, "1": {"2", "4", "2"}}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != group || f[1] != topic {
			continue
		}
		w, ok := want[f[2]]
		if !ok {
			t.Errorf("unexpected partition row: %s", line)
			continue
		}
		if f[3] != w[0] || f[4] != w[1] || f[5] != w[2] {
			t.Errorf("partition %s: current %s, log end %s, lag %s; want %s, %s, %s", f[2], f[3], f[4], f[5], w[0], w[1], w[2])
		}
		if !strings.HasPrefix(f[6], kafkastore.InstanceID+"-") {
			t.Errorf("partition %s: consumer %q, want the leader's membership (%s-...)", f[2], f[6], kafkastore.InstanceID)
		}
		delete(want, f[2])
	}
	if len(want) > 0 {
		t.Errorf("no row for partitions %v", want)
	}
}

// ksCopy runs fanout offsets copy from one store to the other for instance
// id and returns its exit code and output.
func ksCopy(t *testing.T, from, to, id, topic string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, procBinary(t), "offsets", "copy", "--from", from, "--to", to, "--id", id, "--topic", topic,
		"--kafka", strings.Join(kafkaAddrs(t), ","), "--zookeeper", strings.Join(zkAddrs(t), ","))
	out, _ := cmd.CombinedOutput()
	t.Logf("fanout offsets copy --from %s --to %s: exit %d\n%s", from, to, cmd.ProcessState.ExitCode(), out)
	return cmd.ProcessState.ExitCode(), string(out)
}

// Migration: fanout offsets copy moves a cluster's offsets from ZooKeeper
// to Kafka and back. It refuses while a daemon runs; after the copy a
// daemon of the other store resumes exactly where the first one stopped.
func TestKafkaStoreOffsetsCopy(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	produceSeq(t, topic, "m", 6, 2) // 3 per partition
	zkOpts := daemonOptions(t, topic)
	d1 := startDaemon(t, zkOpts)
	c1 := dial(t, client.Config{MaxInFlight: 10}, d1.addr)
	for range 6 {
		if err := recv(t, c1, 30*time.Second).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "offsets 3 and 3 committed to ZooKeeper", func() bool {
		o := zkOffsets(t, zkOpts.ID, topic)
		return o[0] == 3 && o[1] == 3
	})
	if code, out := ksCopy(t, "zookeeper", "kafka", zkOpts.ID, topic); code != 1 || !strings.Contains(out, "the cluster runs") {
		t.Fatalf("copy while a daemon runs: exit %d, want 1 and a refusal naming the running cluster", code)
	}
	if got := ksOffsets(t, zkOpts.ID, topic); len(got) != 0 {
		t.Fatalf("the refused copy wrote %v", got)
	}
	_ = c1.Close()
	if err := d1.stop(t); err != nil {
		t.Fatal(err)
	}

	if code, out := ksCopy(t, "zookeeper", "kafka", zkOpts.ID, topic); code != 0 || !strings.Contains(out, "verified") {
		t.Fatalf("copy of a stopped cluster: exit %d, want 0", code)
	}
	if got := ksOffsets(t, zkOpts.ID, topic); got[0] != 3 || got[1] != 3 {
		t.Fatalf("offsets in Kafka after the copy: %v, want 0:3 1:3", got)
	}

	produceSeq(t, topic, "n", 2, 2) // offset 3 of each partition
	ksOpts := ksDaemonOptions(t, topic)
	ksOpts.ID = zkOpts.ID
	d2 := startDaemon(t, ksOpts)
	c2 := dial(t, client.Config{MaxInFlight: 10}, d2.addr)
	for range 2 {
		m := recv(t, c2, 30*time.Second)
		if m.Offset != 3 || !strings.HasPrefix(string(m.Value), "n-") {
			t.Fatalf("the Kafka-store daemon delivered p%d@%d (%s), want only the new offset 3 of each partition", m.Partition, m.Offset, m.Value)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	noMessage(t, c2, time.Second)
	testutil.WaitFor(t, 15*time.Second, "offsets 4 and 4 committed to Kafka", func() bool {
		o := ksOffsets(t, zkOpts.ID, topic)
		return o[0] == 4 && o[1] == 4
	})
	_ = c2.Close()
	if err := d2.stop(t); err != nil {
		t.Fatal(err)
	}

	if code, _ := ksCopy(t, "kafka", "zookeeper", zkOpts.ID, topic); code != 0 {
		t.Fatalf("copy back: exit %d, want 0", code)
	}
	if got := zkOffsets(t, zkOpts.ID, topic); got[0] != 4 || got[1] != 4 {
		t.Fatalf("offsets in ZooKeeper after the copy back: %v, want 0:4 1:4", got)
	}
}
