package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

const testSecret = "0123456789abcdef-cluster-secret"

// startSecretNode is startNode with the cluster secret.
func startSecretNode(t *testing.T, c *kfake.Cluster, fence *memFence, id, nodeID, secret string) *node {
	t.Helper()
	nf := &nodeFence{f: fence, path: FencePath(id, "jobs")}
	nf.sid.Store(1)
	cfg := testConfig(t, c, id, nodeID)
	cfg.Secret = []byte(secret)
	n := runNode(t, cfg, func(*Elector) fencer { return nf })
	n.fence = nf
	return n
}

// produceRecord writes a heartbeat record with the given headers.
func produceRecord(t *testing.T, c *kfake.Cluster, id string, hb *Heartbeat, headers ...sarama.RecordHeader) {
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
	msg := &sarama.ProducerMessage{Topic: TopicName(id, "jobs"), Key: sarama.StringEncoder(hb.GetNodeId()),
		Value: sarama.ByteEncoder(b), Headers: headers}
	if _, _, err := p.SendMessage(msg); err != nil {
		t.Fatalf("produce a heartbeat: %v", err)
	}
}

// With a cluster secret, heartbeats without a valid MAC are ignored: the
// leader's forged goodbye (which, read, lets the others depose it) and a
// forged candidate with a foreign address change nothing; they are
// counted, and said once.
func TestElectorWithSecretIgnoresRecordsWithoutAValidMAC(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a := startSecretNode(t, c, fence, "mac", "a", testSecret)
	b := startSecretNode(t, c, fence, "mac", "b", testSecret)
	cc := startSecretNode(t, c, fence, "mac", "c", testSecret)
	testutil.WaitFor(t, 10*time.Second, "c to lead and a and b to follow it", func() bool {
		la, lb := a.e.Leadership(), b.e.Leadership()
		return len(leaders(cc)) == 1 && la.LeaderID == "c" && lb.LeaderID == "c"
	})
	term := cc.lastTerm()

	goodbye := &Heartbeat{NodeId: "c", Addr: "c:4000", Epoch: term.Epoch, Role: Role_ROLE_FOLLOWER, Leaving: true}
	produceRecord(t, c, "mac", goodbye) // no MAC
	wrong := HeartbeatMAC([]byte("another secret, as long as it must be"), TopicName("mac", "jobs"), mustMarshal(t, goodbye))
	produceRecord(t, c, "mac", goodbye, sarama.RecordHeader{Key: []byte(MACHeader), Value: wrong})
	// The right secret over another cluster's topic does not pass either.
	other := HeartbeatMAC([]byte(testSecret), TopicName("other", "jobs"), mustMarshal(t, goodbye))
	produceRecord(t, c, "mac", goodbye, sarama.RecordHeader{Key: []byte(MACHeader), Value: other})
	produceRecord(t, c, "mac", &Heartbeat{NodeId: "zz-forged", Addr: "evil:666", Epoch: term.Epoch,
		ClaimEpoch: term.Epoch + 1, Role: Role_ROLE_CANDIDATE})

	testutil.WaitFor(t, 10*time.Second, "a and b to count the 4 records", func() bool {
		return a.e.Unauthenticated() == 4 && b.e.Unauthenticated() == 4
	})
	time.Sleep(3 * testLeaderTTL) // an absence of change: give it time to happen
	if term.Cause() != nil {
		t.Fatalf("c's term ended: %v", term.Cause())
	}
	for _, n := range []*node{a, b} {
		if l := n.e.Leadership(); !l.Known || l.LeaderID != "c" || l.LeaderAddr != "c:4000" || l.Epoch != term.Epoch {
			t.Errorf("%s: Leadership() = %+v, want c at c:4000 in epoch %d", n.e.cfg.NodeID, l, term.Epoch)
		}
		if got := n.logs.count("error: heartbeat log: someone writes records without a valid MAC"); got != 1 {
			t.Errorf("%s said %d times that records have no valid MAC, want once", n.e.cfg.NodeID, got)
		}
		for _, m := range n.e.Members() {
			if m.NodeID == "zz-forged" {
				t.Errorf("%s counts the forged member: %+v", n.e.cfg.NodeID, m)
			}
		}
	}
	if r := fence.get(); r.Epoch != term.Epoch || r.Node != "c" {
		t.Errorf("fence record %v, want c at epoch %d", r, term.Epoch)
	}
	if a.logs.count("heartbeats are not authenticated") != 0 {
		t.Error("a warns that heartbeats are not authenticated, with a secret")
	}
}

// Without a secret, members warn once that heartbeats are not
// authenticated when they hear from another member.
func TestElectorWithoutSecretWarnsOnce(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a, b := startNode(t, c, fence, "open", "a"), startNode(t, c, fence, "open", "b")
	testutil.WaitFor(t, 10*time.Second, "b to lead", func() bool { return len(leaders(b)) == 1 })
	testutil.WaitFor(t, 10*time.Second, "a and b to warn", func() bool {
		return a.logs.count("warning: heartbeats are not authenticated") == 1 &&
			b.logs.count("warning: heartbeats are not authenticated") == 1
	})
	if a.e.Unauthenticated() != 0 {
		t.Errorf("Unauthenticated() = %d without a secret", a.e.Unauthenticated())
	}
}

// A member with another secret is not heard: the members with the right
// one elect among themselves.
func TestElectorMemberWithAnotherSecretIsNotHeard(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	a := startSecretNode(t, c, fence, "mixed", "a", testSecret)
	z := startSecretNode(t, c, fence, "mixed", "z", "a different secret of enough length")
	testutil.WaitFor(t, 10*time.Second, "a to count z's records", func() bool { return a.e.Unauthenticated() > 0 })
	for _, m := range a.e.Members() {
		if m.NodeID == "z" {
			t.Fatalf("a counts z as a member: %+v", m)
		}
	}
	_ = z
}

func mustMarshal(t *testing.T, hb *Heartbeat) []byte {
	t.Helper()
	b, err := proto.Marshal(hb)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// In spread mode, with the cluster secret, a heartbeat forged in the
// recorded leader's name, for its epoch, carrying an assignment that gives
// every partition to a foreign address, is not accepted: without the MAC
// it would be (the leader's own heartbeats are all the proof there is).
func TestSpreadWithSecretIgnoresAForgedLeaderAssignment(t *testing.T) {
	t.Parallel()
	c := newSpreadKafka(t, 4)
	fence := &memFence{}
	spread := func(cfg *Config) {
		cfg.Mode, cfg.PartitionRefresh, cfg.Secret = Mode_MODE_SPREAD, 100*time.Millisecond, []byte(testSecret)
	}
	a, b := startNodeWith(t, c, fence, "spm", "a", spread), startNodeWith(t, c, fence, "spm", "b", spread)
	var real *Assignment
	testutil.WaitFor(t, 15*time.Second, "a and b to agree", func() bool {
		real = agreed(a, b)
		return real != nil && len(real.Owners) == 2
	})
	rec := fence.get()
	produceRecord(t, c, "spm", &Heartbeat{NodeId: rec.Node, Addr: rec.Addr, Epoch: rec.Epoch, Role: Role_ROLE_LEADER,
		Mode: Mode_MODE_SPREAD, Instance: "forger",
		Assignment: &PartitionAssignment{Epoch: rec.Epoch, Generation: real.Generation + 100, Partitions: 4,
			Owners: []*PartitionOwner{{NodeId: "zz", Addr: "evil:666", Partitions: []int32{0, 1, 2, 3}}}}})
	testutil.WaitFor(t, 10*time.Second, "a and b to ignore the forged record", func() bool {
		return a.e.Unauthenticated() == 1 && b.e.Unauthenticated() == 1
	})
	deadline := time.Now().Add(2 * time.Second) // many heartbeats after the forged one
	for time.Now().Before(deadline) {
		for _, n := range []*node{a, b} {
			if got := n.e.Assignment(); got == nil || got.Generation >= real.Generation+100 || slices.Contains(got.Addrs(), "evil:666") {
				t.Fatalf("%s accepted a forged assignment: %+v", n.e.cfg.NodeID, got)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The MAC covers what binds a heartbeat to its sender and dates it: a
// record whose instance, sequence number or position was changed does not
// pass with the original's MAC, so a replay cannot be made to look new.
func TestHeartbeatMACCoversTheBinding(t *testing.T) {
	t.Parallel()
	topic := TopicName("mac", "jobs")
	hb := &Heartbeat{NodeId: "c", Addr: "c:4000", Instance: "c-1", Seq: 7, Seen: 40, Role: Role_ROLE_LEADER, Epoch: 3}
	mac := HeartbeatMAC([]byte(testSecret), topic, mustMarshal(t, hb))
	record := func(h *Heartbeat) *sarama.ConsumerMessage {
		return &sarama.ConsumerMessage{Value: mustMarshal(t, h), Headers: []*sarama.RecordHeader{{Key: []byte(MACHeader), Value: mac}}}
	}
	if !Authentic([]byte(testSecret), topic, record(hb)) {
		t.Fatal("the original record does not pass")
	}
	for name, change := range map[string]func(*Heartbeat){
		"instance": func(h *Heartbeat) { h.Instance = "c-2" },
		"seq":      func(h *Heartbeat) { h.Seq++ },
		"seen":     func(h *Heartbeat) { h.Seen += 100 },
	} {
		h := proto.CloneOf(hb)
		change(h)
		if Authentic([]byte(testSecret), topic, record(h)) {
			t.Errorf("a record with another %s passes with the original's MAC", name)
		}
	}
}

// recordedHeartbeats returns every record of instance id's heartbeat log
// on c, oldest first.
func recordedHeartbeats(t *testing.T, c *kfake.Cluster, id string) []*sarama.ConsumerMessage {
	t.Helper()
	client := newKafkaClient(t, c)
	topic := TopicName(id, "jobs")
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	for len(out) == 0 || out[len(out)-1].Offset < end-1 {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d records of %s read, none more (end %d)", len(out), topic, end)
		}
	}
	return out
}

// In spread mode, with the cluster secret, a member that left is given no
// partition when its recorded heartbeats (MACs and all) are written again:
// the leader does not take it for live, and nothing is published.
func TestSpreadWithSecretReplayedDepartedMemberGetsNothing(t *testing.T) {
	t.Parallel()
	c := newSpreadKafka(t, 6)
	fence := &memFence{}
	spread := func(cfg *Config) {
		cfg.Mode, cfg.PartitionRefresh, cfg.Secret = Mode_MODE_SPREAD, 100*time.Millisecond, []byte(testSecret)
	}
	a := startNodeWith(t, c, fence, "spr", "a", spread)
	b, cc := startNodeWith(t, c, fence, "spr", "b", spread), startNodeWith(t, c, fence, "spr", "c", spread)
	testutil.WaitFor(t, 15*time.Second, "a, b and c to agree", func() bool {
		got := agreed(a, b, cc)
		return got != nil && len(got.Owners) == 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.e.Resign(ctx); err != nil {
		t.Fatalf("a resigns: %v", err)
	}
	a.stop()
	var two *Assignment
	testutil.WaitFor(t, 15*time.Second, "b and c to agree without a", func() bool {
		two = agreed(b, cc)
		return two != nil && len(two.Owners) == 2
	})
	var replay []*sarama.ConsumerMessage
	for _, m := range recordedHeartbeats(t, c, "spr") {
		var hb Heartbeat
		if err := proto.Unmarshal(m.Value, &hb); err != nil {
			t.Fatal(err)
		}
		if hb.GetNodeId() == "a" && !hb.GetLeaving() {
			replay = append(replay, m)
		}
	}
	p, err := sarama.NewSyncProducerFromClient(newKafkaClient(t, c))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, m := range replay {
		msg := &sarama.ProducerMessage{Topic: TopicName("spr", "jobs"), Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value)}
		for _, h := range m.Headers {
			msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		if _, _, err := p.SendMessage(msg); err != nil {
			t.Fatal(err)
		}
	}
	// An absence of change: watch for three leader timeouts after the replay.
	for end := time.Now().Add(3 * testLeaderTTL); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, n := range []*node{b, cc} {
			if got := n.e.Assignment(); got == nil || got.Generation != two.Generation || len(got.Of("a")) > 0 {
				t.Fatalf("%s has %v in force after a's %d heartbeats were replayed, want generation %d: %v",
					n.e.cfg.NodeID, got, len(replay), two.Generation, two)
			}
			for _, m := range n.e.Members() {
				if m.NodeID == "a" {
					t.Fatalf("%s counts the departed a: %+v", n.e.cfg.NodeID, m)
				}
			}
		}
	}
}
