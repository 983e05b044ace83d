package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// memoryEnd is a copy end on a MemoryStore, fenced by a term of its own.
func memoryEnd(s *offsets.MemoryStore) offsetEnd {
	return offsetEnd{name: "memory", store: s, fence: func() (offsets.Fence, error) { return s.NewTerm(), nil }}
}

// kafkaEnd is the copy end of the group of store.
func kafkaEnd(s *kafkastore.Store) offsetEnd {
	return offsetEnd{name: "kafka group " + s.Group(), store: s, fence: func() (offsets.Fence, error) { return s.EmptyFence("test"), nil }}
}

// mustCommit commits offs to s under a new term.
func mustCommit(t *testing.T, s *offsets.MemoryStore, offs map[int32]int64) {
	t.Helper()
	if err := s.Commit(context.Background(), s.NewTerm(), offs); err != nil {
		t.Fatal(err)
	}
}

// The copy writes every offset of the source to the destination, reads them
// back and says what it did; the destination's other partitions are kept.
func TestCopyOffsets(t *testing.T) {
	t.Parallel()
	_, group := kfakeGroup(t)
	src := offsets.NewMemoryStore()
	mustCommit(t, src, map[int32]int64{0: 12, 1: 7})
	var out bytes.Buffer
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, &out); err != nil {
		t.Fatal(err)
	}
	got, err := group.Load(t.Context())
	if err != nil || !maps.Equal(got, map[int32]int64{0: 12, 1: 7}) {
		t.Fatalf("the group holds %v, %v; want 0:12 1:7", got, err)
	}
	if !strings.Contains(out.String(), "copied the offsets of 2 partitions") || !strings.Contains(out.String(), "verified") {
		t.Errorf("output:\n%s", out.String())
	}
	t.Logf("output:\n%s", out.String())

	// Back the other way, into a store that holds a partition more.
	dst := offsets.NewMemoryStore()
	mustCommit(t, dst, map[int32]int64{0: 1, 2: 4})
	out.Reset()
	if err := copyOffsets(t.Context(), kafkaEnd(group), memoryEnd(dst), []int32{0, 1, 2}, &out); err != nil {
		t.Fatal(err)
	}
	if got, _ := dst.Load(t.Context()); !maps.Equal(got, map[int32]int64{0: 12, 1: 7, 2: 4}) {
		t.Fatalf("the destination holds %v, want 0:12 1:7 and its own 2:4", got)
	}
	if !strings.Contains(out.String(), "not in the source: kept") {
		t.Errorf("output does not say partition 2 was kept:\n%s", out.String())
	}
}

// lossyStore drops partition 1 from every commit, as a store that wrote
// half would.
type lossyStore struct{ *offsets.MemoryStore }

func (s lossyStore) Commit(ctx context.Context, f offsets.Fence, offs map[int32]int64) error {
	offs = maps.Clone(offs)
	delete(offs, 1)
	return s.MemoryStore.Commit(ctx, f, offs)
}

// The copy refuses what it cannot do whole, and says so: an empty source,
// offsets of partitions the topic lacks, a group a leader holds, and a
// destination that reads back otherwise than written.
func TestCopyOffsetsRefuses(t *testing.T) {
	t.Parallel()
	_, group, client := kfakeGroupClient(t)
	src := offsets.NewMemoryStore()
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer)); !errors.Is(err, errNothingToCopy) {
		t.Errorf("empty source: %v, want errNothingToCopy", err)
	}
	mustCommit(t, src, map[int32]int64{0: 3, 5: 1})
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer)); err == nil ||
		!strings.Contains(err.Error(), "partition 5") {
		t.Errorf("a partition the topic lacks: %v, want an error naming it", err)
	}
	src2 := offsets.NewMemoryStore()
	mustCommit(t, src2, map[int32]int64{0: 3, 1: 2})

	m, err := group.Join(t.Context(), kafkastore.Leader{Epoch: 1, Node: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	err = copyOffsets(t.Context(), memoryEnd(src2), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer))
	if !errors.Is(err, offsets.ErrFenced) || !strings.Contains(err.Error(), "started meanwhile") {
		t.Errorf("copy into a group a leader holds: %v, want a fenced error", err)
	}
	if got, _ := group.Load(t.Context()); len(got) != 0 {
		t.Errorf("the refused copy wrote %v", got)
	}
	err = checkStopped(t.Context(), client, group, "fanout_svc_jobs", time.Minute, time.Now())
	if err == nil || !strings.Contains(err.Error(), "has members (leader;") {
		t.Errorf("checkStopped with a leader in the group: %v, want an error naming it", err)
	}
	if err := group.Leave(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	if err := checkStopped(t.Context(), client, group, "fanout_svc_jobs", time.Minute, time.Now()); err != nil {
		t.Errorf("checkStopped of a stopped cluster: %v", err)
	}

	dst := lossyStore{offsets.NewMemoryStore()}
	err = copyOffsets(t.Context(), memoryEnd(src2), offsetEnd{name: "lossy", store: dst,
		fence: func() (offsets.Fence, error) { return dst.NewTerm(), nil }}, []int32{0, 1}, new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "verify") || !strings.Contains(err.Error(), "partition 1") {
		t.Errorf("a destination that lost a partition: %v, want a failed verification naming it", err)
	}
}

// kfakeProduce produces n records to partition p of topic jobs on the
// in-process Kafka at addr, timestamped at.
func kfakeProduce(t *testing.T, addr string, p int32, n int, at time.Time) {
	t.Helper()
	cfg := kafka.NewConfig("offsets-test")
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	producer, err := sarama.NewSyncProducer([]string{addr}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for range n {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "jobs", Partition: p, Value: sarama.StringEncoder("m"), Timestamp: at}); err != nil {
			t.Fatal(err)
		}
	}
}

// offsets show reads the committed offsets and the leader from the group
// of the Kafka store, and each partition's log from Kafka.
func TestOffsetsShowKafkaStore(t *testing.T) {
	t.Parallel()
	addr, group := kfakeGroup(t)
	kfakeProduce(t, addr, 0, 5, time.Now())
	kfakeProduce(t, addr, 1, 3, time.Now())
	m, err := group.Join(t.Context(), kafkastore.Leader{Epoch: 3, Node: "node-b", Addr: "b:4987"})
	if err != nil {
		t.Fatal(err)
	}
	if err := group.Commit(t.Context(), offsets.TopicFence(m), map[int32]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	args := []string{"offsets", "show", "--offset-store", "kafka", "--kafka", addr, "--id", "svc", "--topic", "jobs", "--timeout", "10s"}
	code, out, errOut := runApp(t.Context(), t, nil, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, errOut)
	}
	var r offsetsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := offsetsReport{ID: "svc", Topic: "jobs", Store: "kafka", StoreFrom: "--offset-store", Location: "fanout_svc", Leader: &status.Leader{Node: "node-b", Addr: "b:4987", Epoch: 3},
		Partitions: []partitionOffsets{{Partition: 0, Committed: i64(2), LogStart: 0, LogEnd: 5, Lag: i64(3)}, {Partition: 1, LogStart: 0, LogEnd: 3}}, TotalLag: 3}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("offsets show --json:\n%s\nwant %+v", out, want)
	}
	code, out, errOut = runApp(t.Context(), t, nil, args...)
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, errOut)
	}
	for _, line := range []string{"store   kafka group fanout_svc (id svc, topic jobs), chosen by --offset-store", "leader  node-b (epoch 3, b:4987)", "0          2          0          5        3", "1          none       0          3        none"} {
		if !strings.Contains(out, line) {
			t.Errorf("offsets show prints no line %q:\n%s", line, out)
		}
	}
}

// offsets reset with the Kafka store: to oldest, a time and explicit
// offsets while no leader runs; refused without a terminal and without
// --yes, for offsets outside the log, and while a leader holds the group
// without --fence-leader; with it, the leader's membership is fenced.
// Every write leaves the group empty and names the tool's epoch.
func TestOffsetsResetKafkaStore(t *testing.T) {
	t.Parallel()
	addr, group := kfakeGroup(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	t1 := t0.Add(time.Minute)
	kfakeProduce(t, addr, 0, 3, t0) // offsets 0-2
	kfakeProduce(t, addr, 0, 2, t1) // offsets 3-4
	kfakeProduce(t, addr, 1, 4, t1) // offsets 0-3
	reset := func(args ...string) (int, string) {
		t.Helper()
		code, out, errOut := runApp(t.Context(), t, nil, append([]string{"offsets", "reset", "--offset-store", "kafka", "--kafka", addr,
			"--id", "svc", "--topic", "jobs", "--timeout", "10s"}, args...)...)
		t.Logf("offsets reset %q: exit %d\n%s%s", args, code, out, errOut)
		return code, out + errOut
	}
	committed := func() map[int32]int64 {
		t.Helper()
		got, err := group.Load(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	empty := func() {
		t.Helper()
		d, err := group.Describe(t.Context())
		if err != nil || len(d.Members) != 0 {
			t.Errorf("the group after the reset: %+v, %v; want no member", d, err)
		}
	}

	if code, out := reset("--to", "oldest"); code != 2 || !strings.Contains(out, "not on a terminal") || !strings.Contains(out, "nothing written") {
		t.Errorf("without a terminal and without --yes: exit %d, want 2 and a refusal", code)
	}
	if got := committed(); len(got) != 0 {
		t.Fatalf("the refused reset wrote %v", got)
	}
	if code, out := reset("--to", "oldest", "--yes"); code != 0 || !strings.Contains(out, "verified") {
		t.Fatalf("reset to oldest: exit %d", code)
	}
	if got := committed(); !maps.Equal(got, map[int32]int64{0: 0, 1: 0}) {
		t.Errorf("after the reset to oldest: %v, want 0:0 1:0", got)
	}
	empty()
	if code, _ := reset("--to", t1.Add(-time.Second).Format(time.RFC3339Nano), "--partitions", "0", "--yes"); code != 0 {
		t.Fatalf("reset to a time: exit %d", code)
	}
	if got := committed(); !maps.Equal(got, map[int32]int64{0: 3, 1: 0}) {
		t.Errorf("after the reset of partition 0 to a time between the batches: %v, want 0:3 1:0", got)
	}
	if code, out := reset("--to", "0=6", "--yes"); code != 2 || !strings.Contains(out, "outside its log [0, 5]") {
		t.Errorf("an offset beyond the log end: exit %d, want 2 naming the log", code)
	}
	if code, out := reset("--to", "0=3,1=0", "--yes"); code != 0 || !strings.Contains(out, "nothing to change") {
		t.Errorf("a reset to where the offsets are: exit %d, want 0 and nothing to change", code)
	}
	epoch, err := group.LastEpoch(t.Context())
	if err != nil || epoch != 2 {
		t.Errorf("the last epoch after two resets: %d, %v; want 2 (one per reset that wrote)", epoch, err)
	}

	m, err := group.Join(t.Context(), kafkastore.Leader{Epoch: 7, Node: "node-b", Addr: "b:4987"})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := reset("--to", "newest", "--yes"); code != 1 || !strings.Contains(out, "has members (node-b;") || !strings.Contains(out, "--fence-leader") {
		t.Errorf("while a leader holds the group: exit %d, want 1, naming it and --fence-leader", code)
	}
	if got := committed(); !maps.Equal(got, map[int32]int64{0: 3, 1: 0}) {
		t.Fatalf("the refused reset wrote: %v", got)
	}
	if code, out := reset("--to", "newest", "--yes", "--fence-leader"); code != 0 || !strings.Contains(out, "epoch 8") {
		t.Fatalf("--fence-leader: exit %d, want 0 naming the tool's epoch 8", code)
	}
	if got := committed(); !maps.Equal(got, map[int32]int64{0: 5, 1: 4}) {
		t.Errorf("after the reset to newest: %v, want 0:5 1:4", got)
	}
	if err := group.Commit(t.Context(), offsets.TopicFence(m), map[int32]int64{0: 1}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("the fenced leader's commit: %v, want ErrFenced", err)
	}
	empty()
}

// A cluster heard running in spread mode is never reset, even with
// --fence-leader: its members commit under their own partitions' ownership
// records, which taking the leader record over does not fence.
func TestOffsetsResetRefusesARunningSpreadCluster(t *testing.T) {
	t.Parallel()
	addr, _ := kfakeGroup(t)
	kfakeProduce(t, addr, 0, 3, time.Now())
	admin, err := sarama.NewClusterAdmin([]string{addr}, kafka.NewConfig("offsets-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	hbTopic := cluster.TopicName("svc", "jobs")
	if err := admin.CreateTopic(hbTopic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	hb, err := proto.Marshal(&cluster.Heartbeat{NodeId: "node-a", Addr: "a:4987", Role: cluster.Role_ROLE_FOLLOWER,
		Mode: cluster.Mode_MODE_SPREAD})
	if err != nil {
		t.Fatal(err)
	}
	producer, err := sarama.NewSyncProducer([]string{addr}, kafka.NewConfig("offsets-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: hbTopic, Value: sarama.ByteEncoder(hb), Timestamp: time.Now()}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runApp(t.Context(), t, nil, "offsets", "reset", "--offset-store", "kafka", "--kafka", addr,
		"--id", "svc", "--topic", "jobs", "--to", "newest", "--yes", "--fence-leader")
	if code != 1 || !strings.Contains(errOut, "spread mode") || !strings.Contains(errOut, "nothing written") {
		t.Errorf("reset --fence-leader of a running spread cluster: exit %d, stderr %q; want 1, spread mode, nothing written\n%s", code, errOut, out)
	}
}
