package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

func TestChooseStore(t *testing.T) {
	t.Parallel()
	member := func(id, store string) status.Member { return status.Member{NodeID: id, OffsetStore: store} }
	kafkaMembers := []status.Member{member("a", "kafka"), member("b", "kafka"), member("old", "")}
	zkMembers := []status.Member{member("a", "zookeeper")}
	mixed := []status.Member{member("a", "zookeeper"), member("b", "kafka")}
	tests := []struct {
		name         string
		given        string
		zkGiven      bool
		members      []status.Member
		kafkaOffsets bool
		want         string // the store, or the error's text
		from         string
	}{
		{"nobody heard", "", false, nil, false, "zookeeper", "the default: no member heard within 10s says which store it uses; " +
			"--offset-store kafka for a cluster that keeps its offsets in Kafka"},
		{"only older members", "", false, []status.Member{member("old", "")}, false, "zookeeper", "the default: "},
		{"nobody heard, the Kafka group holds offsets", "", false, nil, true,
			"no member heard within 10s says which offset store the cluster uses, and the Kafka group fanout_<id> holds " +
				"offsets of the topic: run this with --offset-store kafka (or --offset-store zookeeper for the offsets in ZooKeeper)", ""},
		{"nobody heard, given", "kafka", false, nil, false, "kafka", "--offset-store"},
		{"members say kafka", "", false, kafkaMembers, false, "kafka", "the members' heartbeats"},
		{"members say zookeeper", "", true, zkMembers, false, "zookeeper", "the members' heartbeats"},
		{"members say kafka, given kafka", "kafka", false, kafkaMembers, false, "kafka", "--offset-store, as the members' heartbeats say"},
		{"members say kafka, given zookeeper", "zookeeper", false, kafkaMembers, false,
			"the members heard within 10s (a, b) keep their offsets in Kafka (the group fanout_<id>), not ZooKeeper: " +
				"run this with --offset-store kafka", ""},
		{"members say kafka, --zookeeper given", "", true, kafkaMembers, false,
			"the members heard within 10s (a, b) keep their offsets in Kafka (the group fanout_<id>), not ZooKeeper: " +
				"run this with --offset-store kafka and without --zookeeper", ""},
		{"members say zookeeper, given kafka", "kafka", false, zkMembers, false,
			"the members heard within 10s (a) keep their offsets in ZooKeeper, not Kafka (the group fanout_<id>): " +
				"run this with --offset-store zookeeper", ""},
		{"members say both", "", false, mixed, false,
			"the members heard within 10s keep their offsets in different stores (a in ZooKeeper; b in Kafka): give every " +
				"member the same --offset-store; to read one store meanwhile, run this with --offset-store zookeeper or " +
				"--offset-store kafka", ""},
		{"members say both, given", "kafka", false, mixed, false, "kafka", "--offset-store (the members heard use both stores)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := chooseStore(tt.given, tt.zkGiven, tt.members, 10*time.Second, tt.kafkaOffsets)
			if tt.from == "" {
				if err == nil || err.Error() != tt.want {
					t.Fatalf("chooseStore = %+v, %v; want the error %q", got, err, tt.want)
				}
				return
			}
			if err != nil || got.store != tt.want || !strings.HasPrefix(got.from, tt.from) {
				t.Fatalf("chooseStore = %+v, %v; want %s chosen by %q", got, err, tt.want, tt.from)
			}
		})
	}
}

// heartbeatWriter creates the heartbeat topic of instance svc on topic jobs
// and returns a function that writes hb to it with a plain producer, as
// members (or anybody who may write to it) do; headers, when set, makes the
// record's headers from its value.
func heartbeatWriter(t *testing.T, client sarama.Client) func(hb *cluster.Heartbeat, headers func(value []byte) []sarama.RecordHeader) {
	t.Helper()
	topic := cluster.TopicName("svc", "jobs")
	admin, err := sarama.NewClusterAdminFromClient(client) // not closed: that would close the client
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return func(hb *cluster.Heartbeat, headers func([]byte) []sarama.RecordHeader) {
		t.Helper()
		b, err := proto.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		msg := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(b)}
		if headers != nil {
			msg.Headers = headers(b)
		}
		if _, _, err := p.SendMessage(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// produceHeartbeats writes hbs with a heartbeatWriter.
func produceHeartbeats(t *testing.T, client sarama.Client, hbs ...*cluster.Heartbeat) {
	t.Helper()
	write := heartbeatWriter(t, client)
	for _, hb := range hbs {
		write(hb, nil)
	}
}

// Against a cluster whose members say they keep offsets in Kafka, status
// and offsets show read the Kafka store without --offset-store (and show
// each member's store and readiness), and refuse --offset-store zookeeper
// or --zookeeper with a message that names --offset-store kafka.
func TestToolsLearnTheStoreFromTheHeartbeats(t *testing.T) {
	t.Parallel()
	addr, store, client := kfakeGroupClient(t)
	m, err := store.Join(t.Context(), kafkastore.Leader{Epoch: 2, Node: "node-b", Addr: "b:4987"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(t.Context(), offsets.TopicFence(m), map[int32]int64{0: 0}); err != nil {
		t.Fatal(err)
	}
	produceHeartbeats(t, client,
		&cluster.Heartbeat{NodeId: "node-a", Addr: "a:4987", Role: cluster.Role_ROLE_FOLLOWER, Epoch: 2,
			OffsetStore: cluster.OffsetStore_OFFSET_STORE_KAFKA, Readiness: &cluster.Readiness{Ready: true, Reason: "follower: leader node-b (epoch 2)"}},
		&cluster.Heartbeat{NodeId: "node-b", Addr: "b:4987", Role: cluster.Role_ROLE_LEADER, Epoch: 2,
			OffsetStore: cluster.OffsetStore_OFFSET_STORE_KAFKA, Readiness: &cluster.Readiness{Reason: "leader: no partition of topic jobs consumed"}})
	base := []string{"--kafka", addr, "--id", "svc", "--topic", "jobs", "--timeout", "10s"}

	code, out, errOut := runApp(t.Context(), t, nil, append([]string{"status", "--json"}, base...)...)
	if code != 0 {
		t.Fatalf("status: exit code %d:\n%s", code, errOut)
	}
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
			Reason      string `json:"reason"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if st.OffsetStore != "kafka" || st.StoreFrom != "the members' heartbeats" || st.Leader == nil || st.Leader.Node != "node-b" {
		t.Errorf("status without --offset-store: %s", out)
	}
	if len(st.Members) != 2 || st.Members[1].OffsetStore != "kafka" || st.Members[1].Ready == nil || *st.Members[1].Ready ||
		st.Members[1].Reason != "leader: no partition of topic jobs consumed" {
		t.Errorf("status members: %s", out)
	}
	code, out, errOut = runApp(t.Context(), t, nil, append([]string{"status"}, base...)...)
	if code != 0 || !strings.Contains(out, "store    kafka (group fanout_svc), chosen by the members' heartbeats") ||
		!strings.Contains(out, "no: leader: no partition of topic jobs consumed") {
		t.Errorf("status: exit %d:\n%s%s", code, out, errOut)
	}

	code, out, errOut = runApp(t.Context(), t, nil, append([]string{"offsets", "show", "--json"}, base...)...)
	if code != 0 {
		t.Fatalf("offsets show: exit code %d:\n%s", code, errOut)
	}
	var r offsetsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if r.Store != "kafka" || r.StoreFrom != "the members' heartbeats" || r.Leader == nil || r.Leader.Node != "node-b" ||
		len(r.Partitions) != 2 || r.Partitions[0].Committed == nil {
		t.Errorf("offsets show without --offset-store: %s", out)
	}

	for _, args := range [][]string{
		{"status", "--offset-store", "zookeeper"},
		{"status", "--zookeeper", "127.0.0.1:2181"},
		{"offsets", "show", "--offset-store", "zookeeper"},
		{"offsets", "reset", "--offset-store", "zookeeper", "--to", "oldest", "--yes"},
	} {
		code, _, errOut = runApp(t.Context(), t, nil, append(args, base...)...)
		if code != 2 || !strings.Contains(errOut, "keep their offsets in Kafka") || !strings.Contains(errOut, "run this with --offset-store kafka") {
			t.Errorf("%v against members of the Kafka store: exit %d, %q; want 2 naming --offset-store kafka", args, code, errOut)
		}
	}
}

// With no member heard and offsets in the Kafka group, status refuses to
// guess, naming --offset-store kafka.
func TestToolsRefuseToGuessTheStore(t *testing.T) {
	t.Parallel()
	addr, store := kfakeGroup(t)
	if err := store.Commit(t.Context(), store.EmptyFence("test"), map[int32]int64{1: 0}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runApp(t.Context(), t, nil, "status", "--kafka", addr, "--id", "svc", "--topic", "jobs", "--timeout", "10s")
	if code != 2 || !strings.Contains(errOut, "the Kafka group fanout_<id> holds offsets of the topic: run this with --offset-store kafka") {
		t.Errorf("exit %d, %q; want 2 naming --offset-store kafka", code, errOut)
	}
}
