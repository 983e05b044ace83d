package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

func TestWriteStatus(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	i64 := func(v int64) *int64 { return &v }
	yes, no := true, false
	tests := []struct {
		name string
		st   status.Status
		want string
	}{
		{
			name: "leader, two members, one partition without offset",
			st: status.Status{
				ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t", Mode: "leader",
				OffsetStore: "kafka", StoreFrom: "the members' heartbeats",
				Leader: &status.Leader{Node: "node-b", Addr: "10.0.0.2:4987", Epoch: 3},
				Members: []status.Member{
					{NodeID: "node-a", Addr: "10.0.0.1:4987", Role: "follower", Epoch: 3, LastSeen: now.Add(-400 * time.Millisecond),
						OffsetStore: "kafka", Ready: &yes, Reason: "follower: leader node-b (epoch 3)"},
					{NodeID: "node-b", Addr: "10.0.0.2:4987", Role: "leader", Epoch: 3, LastSeen: now.Add(-1200 * time.Millisecond),
						OffsetStore: "kafka", Ready: &no, Reason: "leader: no partition of topic t consumed: 0 of 2 open (the log says why)"},
					{NodeID: "node-c", Addr: "10.0.0.3:4987", Role: "follower", Epoch: 3, LastSeen: now.Add(-2 * time.Second)},
				},
				Partitions: []status.Partition{
					{Partition: 0, Committed: i64(1200), HighWatermark: 1250, Lag: i64(50)},
					{Partition: 1, HighWatermark: 7},
				},
				TotalLag: 50,
			},
			want: `cluster  fanout_svc_t (id svc, topic t)
store    kafka (group fanout_svc), chosen by the members' heartbeats
mode     leader
leader   node-b (epoch 3, 10.0.0.2:4987)
lag      50

MEMBER  ADDR           ROLE      EPOCH  STORE    LAST HEARTBEAT  READY
node-a  10.0.0.1:4987  follower  3      kafka    400ms ago       yes
node-b  10.0.0.2:4987  leader    3      kafka    1.2s ago        no: leader: no partition of topic t consumed: 0 of 2 open (the log says why)
node-c  10.0.0.3:4987  follower  3      unknown  2s ago          unknown

PARTITION  COMMITTED  HIGH WATERMARK  LAG
0          1200       1250            50
1          none       7               none
`,
		},
		{
			name: "paused, a member drained a client",
			st: status.Status{
				ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t", Mode: "leader",
				Leader: &status.Leader{Node: "node-b", Addr: "10.0.0.2:4987", Epoch: 3},
				Members: []status.Member{
					{NodeID: "node-a", Addr: "10.0.0.1:4987", Role: "follower", Epoch: 3, LastSeen: now.Add(-time.Second),
						LastAction: &status.Action{Kind: "pause", By: "alice from 10.9.9.9:5000", At: now.Add(-90 * time.Second), Node: "node-a"}},
					{NodeID: "node-b", Addr: "10.0.0.2:4987", Role: "leader", Epoch: 3, LastSeen: now.Add(-time.Second),
						LastAction: &status.Action{Kind: "drain-client", Target: "w1", By: "bob from 10.9.9.8:6000", At: now.Add(-10 * time.Second), Node: "node-b"}},
				},
				Pause: &status.Pause{Paused: true, Version: 4, Node: "node-a", By: "alice from 10.9.9.9:5000", At: now.Add(-90 * time.Second)},
			},
			want: `cluster   fanout_svc_t (id svc, topic t)
mode      leader
leader    node-b (epoch 3, 10.0.0.2:4987)
lag       0
delivery  paused by alice from 10.9.9.9:5000 1m30s ago (asked of node-a, version 4)

MEMBER  ADDR           ROLE      EPOCH  STORE    LAST HEARTBEAT  READY
node-a  10.0.0.1:4987  follower  3      unknown  1s ago          unknown
node-b  10.0.0.2:4987  leader    3      unknown  1s ago          unknown

MEMBER  LAST ACTION      BY                        WHEN
node-a  pause            alice from 10.9.9.9:5000  1m30s ago
node-b  drain-client w1  bob from 10.9.9.8:6000    10s ago

PARTITION  COMMITTED  HIGH WATERMARK  LAG
`,
		},
		{
			name: "nothing in ZooKeeper, no heartbeats",
			st: status.Status{
				ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
				Partitions: []status.Partition{{Partition: 0, HighWatermark: 0}},
			},
			want: `cluster  fanout_svc_t (id svc, topic t)
mode     unknown
leader   none
lag      0

MEMBER  ADDR  ROLE  EPOCH  STORE  LAST HEARTBEAT  READY
none

PARTITION  COMMITTED  HIGH WATERMARK  LAG
0          none       0               none
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := writeStatus(&buf, &tt.st, now); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tt.want {
				t.Errorf("writeStatus:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestStatusCommandErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"missing id", []string{"status", "--topic", "t"}, 2, "--id"},
		{"bad kafka address", []string{"status", "--id", "s", "--topic", "t", "--kafka", "nohost"}, 2, "--kafka"},
		{"kafka unreachable", []string{"status", "--id", "s", "--topic", "t", "--kafka", "127.0.0.1:1",
			"--zookeeper", "127.0.0.1:1", "--timeout", "300ms"}, 1, "kafka unreachable at 127.0.0.1:1"},
		{"zookeeper unreachable", []string{"status", "--id", "svc", "--topic", "jobs", "--kafka", kfakeAddr(t),
			"--zookeeper", "127.0.0.1:1", "--timeout", "300ms"}, 1,
			"connect: connection refused) (a cluster that keeps its offsets in Kafka: --offset-store kafka)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runApp(t.Context(), t, nil, tt.args...)
			if code != tt.wantCode || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, tt.wantCode, tt.wantErr)
			}
		})
	}
}

// In spread mode status shows each member's partitions (assigned, owned in
// the records) and lag, and the partitions on their way to another member.
func TestSpreadStatus(t *testing.T) {
	t.Parallel()
	i64 := func(v int64) *int64 { return &v }
	a := &cluster.Assignment{Epoch: 4, Generation: 9, Partitions: 6, Owners: []cluster.Owner{
		{NodeID: "node-a", Addr: "h:1", Partitions: []int32{0, 1, 2}},
		{NodeID: "node-b", Addr: "h:2", Partitions: []int32{3, 4, 5}},
	}}
	owners := map[int32]status.Holder{
		0: {Node: "node-a", Live: true},
		1: {Node: "node-a", Live: true},
		2: {Node: "node-b", Live: true}, // handing over to node-a
		3: {Node: "node-b", Live: true},
		4: {Node: ""},       // released
		5: {Node: "node-c"}, // crashed
	}
	st := status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
		Leader: &status.Leader{Node: "node-b", Addr: "h:2", Epoch: 4}}
	st.AddPartition(0, 12, i64(10), "")
	st.AddPartition(1, 10, i64(10), "")
	st.AddPartition(2, 10, i64(5), "")
	st.AddPartition(3, 4, i64(1), "")
	st.AddPartition(4, 7, nil, "")
	st.AddPartition(5, 1, i64(0), "")
	st.AddSpread(a, owners)
	var buf bytes.Buffer
	if err := writeStatus(&buf, &st, time.Now()); err != nil {
		t.Fatal(err)
	}
	want := `cluster  fanout_svc_t (id svc, topic t)
mode     spread
leader   node-b (epoch 4, h:2)
lag      11

MEMBER  ADDR  ROLE  EPOCH  STORE  LAST HEARTBEAT  READY
none

ASSIGNED TO (generation 9, epoch 4)  ADDR  PARTITIONS  OWNED  LAG
node-a                               h:1   0-2         0-1    7
node-b                               h:2   3-5         3      4

HANDOFF  FROM    TO      STATE
2        node-b  node-a  held by node-b: handing over
4        none    node-b  released: waiting for node-b
5        node-c  node-b  node-c's session is gone: waiting for node-b

PARTITION  COMMITTED  HIGH WATERMARK  LAG   OWNER
0          10         12              2     node-a
1          10         10              0     node-a
2          5          10              5     node-b
3          1          4               3     node-b
4          none       7               none  none
5          0          1               1     none
`
	if got := buf.String(); got != want {
		t.Errorf("writeStatus:\n%s\nwant:\n%s", got, want)
	}
	b, err := json.Marshal(st.Assignment)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); !strings.Contains(got, `{"node_id":"node-a","addr":"h:1","partitions":[0,1,2],"owned":[0,1],"lag":7}`) {
		t.Errorf("assignment JSON %s", got)
	}
}

// kfakeAddr starts an in-process Kafka with topic "jobs" of two partitions
// and returns its address.
func kfakeAddr(t *testing.T) string {
	t.Helper()
	addr, _ := kfakeGroup(t)
	return addr
}

// kfakeGroup starts an in-process Kafka with topic "jobs" of two partitions
// and returns its address and a store of the group of instance "svc".
func kfakeGroup(t *testing.T) (string, *kafkastore.Store) {
	t.Helper()
	addr, store, _ := kfakeGroupClient(t)
	return addr, store
}

// kfakeGroupClient is kfakeGroup, with the store's client.
func kfakeGroupClient(t *testing.T) (string, *kafkastore.Store, sarama.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	client, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("status-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return c.ListenAddrs()[0], kafkastore.New(client, "svc", "jobs", 0), client
}

// With --offset-store kafka, status reads the leader and the committed
// offsets from the group fanout_<id>, and needs no ZooKeeper.
func TestStatusKafkaOffsetStore(t *testing.T) {
	t.Parallel()
	addr, store := kfakeGroup(t)
	m, err := store.Join(t.Context(), kafkastore.Leader{Epoch: 3, Node: "node-b", Addr: "b:4987"})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(t.Context(), offsets.TopicFence(m), map[int32]int64{1: 0}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runApp(t.Context(), t, nil, "status", "--offset-store", "kafka", "--kafka", addr,
		"--id", "svc", "--topic", "jobs", "--json", "--timeout", "10s")
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, errOut)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if st.Leader == nil || *st.Leader != (status.Leader{Node: "node-b", Addr: "b:4987", Epoch: 3}) {
		t.Errorf("leader %+v, want node-b at b:4987 in epoch 3", st.Leader)
	}
	if len(st.Partitions) != 2 || st.Partitions[0].Committed != nil || st.Partitions[1].Committed == nil || *st.Partitions[1].Committed != 0 {
		t.Errorf("partitions %s, want 0 without an offset and 1 at 0", out)
	}
	code, _, errOut = runApp(t.Context(), t, nil, "status", "--offset-store", "kafka", "--kafka", addr,
		"--zookeeper", "zk:2181", "--id", "svc", "--topic", "jobs")
	if code != 2 || !strings.Contains(errOut, "not used with --offset-store kafka") {
		t.Errorf("--zookeeper with the Kafka store: exit %d, %q; want 2 and why", code, errOut)
	}
}

// With the cluster secret, status lists only the members whose heartbeats
// carry a valid MAC, and says how many records it ignored.
func TestStatusIgnoresHeartbeatsWithoutAValidMAC(t *testing.T) {
	t.Parallel()
	addr, _, client := kfakeGroupClient(t)
	const secret = "a cluster secret of enough length"
	topic := cluster.TopicName("svc", "jobs")
	write := heartbeatWriter(t, client)
	write(&cluster.Heartbeat{NodeId: "node-a", Addr: "a:4987", Role: cluster.Role_ROLE_LEADER, Epoch: 1}, func(b []byte) []sarama.RecordHeader {
		return []sarama.RecordHeader{{Key: []byte(cluster.MACHeader), Value: cluster.HeartbeatMAC([]byte(secret), topic, b)}}
	})
	write(&cluster.Heartbeat{NodeId: "zz-forged", Addr: "evil:666", Role: cluster.Role_ROLE_LEADER, Epoch: 9}, nil)
	code, out, errOut := runApp(t.Context(), t, nil, "status", "--offset-store", "kafka", "--kafka", addr,
		"--id", "svc", "--topic", "jobs", "--json", "--timeout", "10s", "--cluster-secret-file", writeSecret(t, secret+"\n"))
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, errOut)
	}
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(st.Members) != 1 || st.Members[0].NodeID != "node-a" || st.Unauthenticated != 1 {
		t.Errorf("members %+v, %d ignored; want node-a alone and 1 ignored", st.Members, st.Unauthenticated)
	}
	var buf bytes.Buffer
	if err := writeStatus(&buf, &st, time.Now()); err != nil || !strings.Contains(buf.String(), "1 heartbeat records without a valid MAC ignored") {
		t.Errorf("status text does not warn of the ignored record (%v):\n%s", err, buf.String())
	}
}
