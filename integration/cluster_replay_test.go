//go:build integration

package integration

// Replays of the heartbeat log: with --cluster-secret every record carries a
// valid MAC forever, so whoever may write to the topic can append recorded
// heartbeats again. Helpers here are prefixed rp.

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// rpRecord returns every record of c's heartbeat topic, oldest first, as
// Kafka holds it now.
func rpRecord(t *testing.T, c *clCluster) []*sarama.ConsumerMessage {
	t.Helper()
	topic := cluster.TopicName(c.id, c.topic)
	client, err := sarama.NewClient(kafkaAddrs(t), kafka.NewConfig("fanout-integration-recorder"))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatalf("end of %s: %v", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatalf("consume %s: %v", topic, err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	for len(out) == 0 || out[len(out)-1].Offset < end-1 {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			t.Fatalf("read %s: %v", topic, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("read %s: %d records, none more after 30 s (end %d)", topic, len(out), end)
		}
	}
	return out
}

// rpReplay appends recs to c's heartbeat topic again, byte for byte: key,
// value and headers (their MAC included).
func rpReplay(t *testing.T, c *clCluster, recs []*sarama.ConsumerMessage) {
	t.Helper()
	p, err := sarama.NewSyncProducer(kafkaAddrs(t), kafka.NewConfig("fanout-integration-replayer"))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, 0, len(recs))
	for _, r := range recs {
		m := &sarama.ProducerMessage{Topic: cluster.TopicName(c.id, c.topic), Key: sarama.ByteEncoder(r.Key),
			Value: sarama.ByteEncoder(r.Value)}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		msgs = append(msgs, m)
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatalf("replay %d heartbeats: %v", len(msgs), err)
	}
}

// rpHeartbeat decodes a heartbeat record.
func rpHeartbeat(t *testing.T, m *sarama.ConsumerMessage) *cluster.Heartbeat {
	t.Helper()
	var hb cluster.Heartbeat
	if err := proto.Unmarshal(m.Value, &hb); err != nil {
		t.Fatalf("heartbeat at offset %d: %v", m.Offset, err)
	}
	return &hb
}

// rpThroughLeaving returns recs up to and including node's last leaving
// heartbeat, failing the test when there is none.
func rpThroughLeaving(t *testing.T, recs []*sarama.ConsumerMessage, node string) []*sarama.ConsumerMessage {
	t.Helper()
	for i := len(recs) - 1; i >= 0; i-- {
		if hb := rpHeartbeat(t, recs[i]); hb.GetNodeId() == node && hb.GetLeaving() {
			return recs[:i+1]
		}
	}
	t.Fatalf("no leaving heartbeat of %s among %d records", node, len(recs))
	return nil
}

// rpOf returns the records of node in recs, its leaving ones left out.
func rpOf(t *testing.T, recs []*sarama.ConsumerMessage, node string) []*sarama.ConsumerMessage {
	t.Helper()
	var out []*sarama.ConsumerMessage
	for _, r := range recs {
		if hb := rpHeartbeat(t, r); hb.GetNodeId() == node && !hb.GetLeaving() {
			out = append(out, r)
		}
	}
	return out
}

// rpSecret gives every node of c the same --cluster-secret-file.
func rpSecret(t *testing.T, c *clCluster) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(file, []byte(randomSecret(t, "cluster-secret-")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		nd.args = append(nd.args, "--cluster-secret-file", file)
	}
}

// rpNothingHappened fails the test when a node logged, after the marker,
// a change of leadership or of the assignment, or took a replayed record of
// its own earlier run for another live process with its node id.
func rpNothingHappened(t *testing.T, nodes []*clNode, marker string) {
	t.Helper()
	for _, nd := range nodes {
		lines := nd.logAfter(marker)
		for _, what := range []string{"leadership term ended", "lost leadership", "won the claim",
			"assignment published", "another live process has this node id"} {
			if got := clGrep(lines, what); len(got) > 0 {
				t.Errorf("%s after %s: %q", nd.id, marker, got)
			}
		}
	}
}

// A leader-mode cluster with --cluster-secret whose leader, node-3, ran
// once before and left: the recorded heartbeat log appended again, all of
// it or node-3's earlier run through its leaving heartbeat, moves neither
// the leader nor its epoch: followers keep redirecting to node-3, which keeps
// welcoming clients, and nobody claims.
func TestClusterReplayedHeartbeatsChangeNothing(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	c := clNewCluster(t, topic, 3)
	rpSecret(t, c)
	top := c.nodes[2]
	c.start(top)
	clWaitLeader(t, []*clNode{top}, 60*time.Second)
	top.signal(t, syscall.SIGTERM)
	if code, _ := top.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM", top.id, code)
	}
	earlier := rpThroughLeaving(t, rpRecord(t, c), top.id)

	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	conn := zkConnect(t)
	epoch, node, _ := electorFence(t, conn, clFencePath(t, c))
	if leader != top || node != top.id || epoch < 2 {
		t.Fatalf("%s leads, the fence record names %s at epoch %d: want %s again, at epoch 2 or later", leader.id, node, epoch, top.id)
	}
	time.Sleep(clLeaderTimeout) // a log with the new run's heartbeats in it
	for _, replay := range []struct {
		name string
		recs []*sarama.ConsumerMessage
	}{
		{"the whole heartbeat log", rpRecord(t, c)},
		{"node-3's earlier run through its leaving heartbeat", earlier},
	} {
		marker := "replay: " + replay.name
		for _, nd := range c.nodes {
			nd.mark(t, marker)
		}
		rpReplay(t, c, replay.recs)
		t.Logf("replayed %s: %d records", replay.name, len(replay.recs))
		// An absence of change: probe for three leader timeouts.
		for end := time.Now().Add(3 * clLeaderTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			for _, nd := range c.nodes {
				a := clHello(nd.addr)
				switch {
				case nd == leader && a.welcome != leader.id:
					t.Fatalf("after %s the leader %s answers %v", replay.name, leader.id, a)
				case nd != leader && (a.redirectTo != leader.addr || a.redirectNode != leader.id):
					t.Fatalf("after %s %s answers %v, want a redirect to %s", replay.name, nd.id, a, leader.id)
				}
			}
		}
		if e, n, _ := electorFence(t, conn, clFencePath(t, c)); e != epoch || n != node {
			t.Fatalf("after %s the fence record names %s at epoch %d, want %s at %d", replay.name, n, e, node, epoch)
		}
		rpNothingHappened(t, c.nodes, marker)
	}
}

// A spread-mode cluster with --cluster-secret: its leader, node-3, ran once
// before and left, and node-1 has left since. The recorded heartbeat log
// appended again (node-1's heartbeats, node-3's earlier run through its
// leaving heartbeat, or all of it) moves neither the leader nor its epoch,
// gives the departed node-1 no partition and moves no ownership record.
func TestSpreadReplayedHeartbeatsChangeNothing(t *testing.T) {
	t.Parallel()
	const partitions = 6
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := spNewCluster(t, topic, 3)
	rpSecret(t, c)
	conn := spZK(t)
	top, gone := c.nodes[2], c.nodes[0]
	c.start(top)
	spWaitOwned(t, conn, c, []*clNode{top}, partitions, 60*time.Second)
	top.signal(t, syscall.SIGTERM)
	if code, _ := top.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM", top.id, code)
	}
	earlier := rpThroughLeaving(t, rpRecord(t, c), top.id)

	c.startAll()
	spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	gone.signal(t, syscall.SIGTERM)
	if code, _ := gone.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM", gone.id, code)
	}
	live := c.others(gone)
	owned := spWaitOwned(t, conn, c, live, partitions, 60*time.Second)
	epoch, node, _ := electorFence(t, conn, clFencePath(t, c))
	if node != top.id || epoch < 2 {
		t.Fatalf("the fence record names %s at epoch %d: want %s again, at epoch 2 or later", node, epoch, top.id)
	}
	all := rpRecord(t, c)
	for _, replay := range []struct {
		name string
		recs []*sarama.ConsumerMessage
	}{
		{"node-1's heartbeats without its leaving one", rpOf(t, all, gone.id)},
		{"node-3's earlier run through its leaving heartbeat", earlier},
		{"the whole heartbeat log", all},
	} {
		marker := "replay: " + replay.name
		for _, nd := range live {
			nd.mark(t, marker)
		}
		rpReplay(t, c, replay.recs)
		t.Logf("replayed %s: %d records", replay.name, len(replay.recs))
		// An absence of change: sample for three leader timeouts.
		for end := time.Now().Add(3 * clLeaderTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if now := spOwners(t, conn, c); !maps.EqualFunc(now, owned, slices.Equal) {
				t.Fatalf("after %s the ownership records moved: %v, were %v", replay.name, now, owned)
			}
		}
		if e, n, _ := electorFence(t, conn, clFencePath(t, c)); e != epoch || n != node {
			t.Fatalf("after %s the fence record names %s at epoch %d, want %s at %d", replay.name, n, e, node, epoch)
		}
		rpNothingHappened(t, live, marker)
	}
	testutil.WaitFor(t, 10*time.Second, "a client welcomed by every live member", func() bool {
		for _, nd := range live {
			if a := clHello(nd.addr); a.welcome != nd.id {
				return false
			}
		}
		return true
	})
}
