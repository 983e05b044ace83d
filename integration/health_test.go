//go:build integration

package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// healthDaemon is a daemon process started by a health test, with its
// metrics address.
type healthDaemon struct {
	p       *procProcess
	metrics string
	node    string
}

// startHealthDaemon starts a daemon of id on topic with a metrics listener.
func startHealthDaemon(t *testing.T, id, topic, node string) healthDaemon {
	t.Helper()
	metrics := procFreeAddr(t)
	args := procDaemonArgs(t, id, topic, procFreeAddr(t), "--node-id", node)
	args[slices.Index(args, "--metrics-listen")+1] = metrics
	return healthDaemon{p: procStart(t, args...), metrics: metrics, node: node}
}

// readyz returns the status and body of the daemon's /readyz; 0 and the
// error while nothing answers (the process is starting).
func (d healthDaemon) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + d.metrics + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// healthcheck runs fanout healthcheck against the daemon and returns its
// exit code and output.
func (d healthDaemon) healthcheck(t *testing.T) (int, string) {
	t.Helper()
	out, err := exec.Command(procBinary(t), "healthcheck", "--metrics-listen", d.metrics).CombinedOutput()
	if err == nil {
		return 0, string(out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("fanout healthcheck: %v", err)
	return -1, ""
}

// apiNode returns the readiness in the daemon's /api/status document.
func (d healthDaemon) apiNode(t *testing.T) (bool, string) {
	t.Helper()
	code, body, _ := testutil.HTTPGet(t, "http://"+d.metrics+"/api/status", "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/status = %d %q", code, body)
	}
	var doc struct {
		Node struct {
			Ready  bool   `json:"ready"`
			Reason string `json:"reason"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("/api/status: %v: %q", err, body)
	}
	return doc.Node.Ready, doc.Node.Reason
}

// topicExists reports whether Kafka knows topic.
func topicExists(t *testing.T, topic string) bool {
	t.Helper()
	client := newClient(t)
	if err := client.RefreshMetadata(); err != nil {
		t.Fatalf("metadata: %v", err)
	}
	topics, err := client.Topics()
	if err != nil {
		t.Fatalf("topics: %v", err)
	}
	return slices.Contains(topics, topic)
}

// Two daemons (a cluster) started on a topic that does not exist are not
// ready and say why, in /readyz, fanout healthcheck and the console's
// document; they create no heartbeat topic meanwhile. Once the topic is
// created they become ready by themselves, the leader and the follower.
func TestHealthMissingTopicNotReadyUntilCreated(t *testing.T) {
	t.Parallel()
	id, topic := uniqueName(t, "svc"), uniqueName(t, "missing")
	a := startHealthDaemon(t, id, topic, "a")
	b := startHealthDaemon(t, id, topic, "b")
	notFound := "topic " + topic + " not found"

	for _, d := range []healthDaemon{a, b} {
		var code int
		var body string
		testutil.WaitFor(t, 60*time.Second, d.node+"'s /readyz naming the missing topic", func() bool {
			code, body = d.readyz(t)
			return strings.Contains(body, notFound) || d.p.exited()
		})
		if d.p.exited() {
			t.Fatalf("%s exited with the topic missing", d.node)
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("%s: /readyz = %d %q, want 503", d.node, code, body)
		}
	}
	// Several election rounds later (the heartbeat is 200 ms, the leader
	// timeout 1 s), still not ready: nobody took the cluster's lead on a
	// topic that does not exist.
	time.Sleep(3 * time.Second)
	for _, d := range []healthDaemon{a, b} {
		if code, body := d.readyz(t); code != http.StatusServiceUnavailable || !strings.Contains(body, notFound) {
			t.Errorf("%s: /readyz = %d %q, want 503 naming the missing topic", d.node, code, body)
		}
		if code, out := d.healthcheck(t); code != 1 || !strings.Contains(out, notFound) {
			t.Errorf("%s: fanout healthcheck exited %d: %q; want 1 naming the missing topic", d.node, code, out)
		}
		if ready, reason := d.apiNode(t); ready || !strings.Contains(reason, notFound) {
			t.Errorf("%s: /api/status node ready %v, reason %q; want not ready naming the missing topic", d.node, ready, reason)
		}
	}
	heartbeats := cluster.TopicName(id, topic)
	if topicExists(t, heartbeats) {
		t.Errorf("heartbeat topic %s created for a topic that does not exist", heartbeats)
	}
	if out, err := exec.Command(procBinary(t), "status", "--id", id, "--topic", topic,
		"--kafka", strings.Join(kafkaAddrs(t), ","), "--zookeeper", strings.Join(zkAddrs(t), ",")).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), topic) || !strings.Contains(string(out), "does not exist") {
		t.Errorf("fanout status with the topic missing: %v: %q; want an error naming the missing topic", err, out)
	}

	createTopic(t, topic, 2)
	for _, d := range []healthDaemon{a, b} {
		var code int
		var body string
		testutil.WaitFor(t, 90*time.Second, d.node+" ready once the topic exists", func() bool {
			code, body = d.readyz(t)
			return code == http.StatusOK
		})
		t.Logf("%s: %d %q", d.node, code, body)
		if code, out := d.healthcheck(t); code != 0 {
			t.Errorf("%s: fanout healthcheck exited %d: %q; want 0", d.node, code, out)
		}
	}
	// One leader, one follower that names it.
	_, ba := a.readyz(t)
	_, bb := b.readyz(t)
	roles := []string{ba, bb}
	slices.Sort(roles)
	if !strings.HasPrefix(roles[0], "follower: leader ") || roles[1] != "leader: serving" {
		t.Errorf("/readyz once ready: %q; want a leader serving and a follower naming it", roles)
	}
	if !topicExists(t, heartbeats) {
		t.Errorf("heartbeat topic %s not created once the topic exists", heartbeats)
	}
}

// runTool runs the fanout binary with args and returns its exit code and
// output.
func runTool(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(procBinary(t), args...).CombinedOutput()
	if err == nil {
		return 0, string(out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("fanout %v: %v", args, err)
	return -1, ""
}

// A daemon of the Kafka offset store runs; fanout status and offsets show
// without --offset-store find its store from its heartbeats (its leader and
// its committed offsets, beside the member table), and refuse
// --offset-store zookeeper, naming --offset-store kafka, rather than read
// the ZooKeeper given (a real one, holding nothing of this cluster).
func TestToolsFindTheKafkaStoreOfARunningCluster(t *testing.T) {
	t.Parallel()
	id, topic := uniqueName(t, "svc"), uniqueName(t, "jobs")
	createTopic(t, topic, 2)
	produce(t, topic, &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("one")})
	addr := procFreeAddr(t)
	p := procStart(t, ksProcArgs(t, id, topic, addr, "--node-id", "k1")...)
	c := procDial(t, client.Config{MaxInFlight: 10}, addr)
	select {
	case m := <-c.Messages():
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no message from the daemon:\n%s", p.output())
	}
	kafkaFlag := strings.Join(kafkaAddrs(t), ",")
	base := []string{"--kafka", kafkaFlag, "--id", id, "--topic", topic}

	var st struct {
		OffsetStore string `json:"offset_store"`
		StoreFrom   string `json:"offset_store_from"`
		Leader      *struct {
			Node string `json:"node"`
		} `json:"leader"`
		Members []struct {
			NodeID      string `json:"node_id"`
			OffsetStore string `json:"offset_store"`
			Ready       *bool  `json:"ready"`
		} `json:"members"`
		Partitions []struct {
			Committed *int64 `json:"committed"`
		} `json:"partitions"`
	}
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the last fanout status --json:\n%s", last)
		}
	}()
	testutil.WaitFor(t, 30*time.Second, "fanout status to show the leader, ready, and the acked offset committed", func() bool {
		code, out := runTool(t, append([]string{"status", "--json"}, base...)...)
		last = out
		if code != 0 {
			t.Fatalf("fanout status --json: exit %d: %s", code, out)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("fanout status --json: %v: %q", err, out)
		}
		committed := int64(0)
		for _, p := range st.Partitions {
			if p.Committed != nil {
				committed += *p.Committed
			}
		}
		return len(st.Members) == 1 && st.Members[0].Ready != nil && *st.Members[0].Ready && len(st.Partitions) == 2 && committed == 1
	})
	if st.OffsetStore != "kafka" || st.StoreFrom != "the members' heartbeats" || st.Leader == nil || st.Leader.Node != "k1" ||
		st.Members[0].OffsetStore != "kafka" {
		t.Errorf("fanout status without --offset-store: store %q chosen by %q, leader %+v, members %+v; want the Kafka store and k1",
			st.OffsetStore, st.StoreFrom, st.Leader, st.Members)
	}
	code, out := runTool(t, append([]string{"status"}, base...)...)
	for _, line := range []string{"store    kafka (group fanout_" + id + "), chosen by the members' heartbeats", "leader   k1 (epoch "} {
		if code != 0 || !strings.Contains(out, line) {
			t.Errorf("fanout status: exit %d, no line %q:\n%s", code, line, out)
		}
	}
	code, out = runTool(t, append([]string{"offsets", "show"}, base...)...)
	if code != 0 || !strings.Contains(out, "kafka group fanout_"+id) || !strings.Contains(out, "leader  k1 (epoch ") {
		t.Errorf("fanout offsets show: exit %d:\n%s", code, out)
	}

	zk := strings.Join(zkAddrs(t), ",")
	for _, args := range [][]string{
		{"status", "--offset-store", "zookeeper", "--zookeeper", zk},
		{"status", "--zookeeper", zk},
		{"offsets", "show", "--offset-store", "zookeeper", "--zookeeper", zk},
	} {
		code, out := runTool(t, append(args, base...)...)
		if code != 2 || !strings.Contains(out, "run this with --offset-store kafka") {
			t.Errorf("fanout %v against the Kafka store: exit %d: %q; want 2 naming --offset-store kafka", args, code, out)
		}
	}
}

// A daemon of the ZooKeeper store runs: status without --offset-store reads
// ZooKeeper as the heartbeats say, and --offset-store kafka is refused,
// naming --offset-store zookeeper.
func TestToolsFindTheZooKeeperStoreOfARunningCluster(t *testing.T) {
	t.Parallel()
	id, topic := uniqueName(t, "svc"), uniqueName(t, "jobs")
	createTopic(t, topic, 1)
	addr := procFreeAddr(t)
	p := procStart(t, procDaemonArgs(t, id, topic, addr, "--node-id", "z1")...)
	procDial(t, client.Config{MaxInFlight: 10}, addr)
	base := []string{"--kafka", strings.Join(kafkaAddrs(t), ","), "--zookeeper", strings.Join(zkAddrs(t), ","), "--id", id, "--topic", topic}
	var out string
	testutil.WaitFor(t, 30*time.Second, "fanout status to name the leader z1", func() bool {
		var code int
		code, out = runTool(t, append([]string{"status"}, base...)...)
		return code == 0 && strings.Contains(out, "leader   z1 (epoch ") || p.exited()
	})
	if !strings.Contains(out, "store    zookeeper, chosen by the members' heartbeats") {
		t.Errorf("fanout status:\n%s", out)
	}
	code, out := runTool(t, "status", "--offset-store", "kafka", "--kafka", base[1], "--id", id, "--topic", topic)
	if code != 2 || !strings.Contains(out, "run this with --offset-store zookeeper") {
		t.Errorf("fanout status --offset-store kafka against the ZooKeeper store: exit %d: %q; want 2 naming --offset-store zookeeper", code, out)
	}
}
