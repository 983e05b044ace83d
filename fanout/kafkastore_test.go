package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// lineHook keeps every log line with its fields, for assertions.
type lineHook struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (h *lineHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *lineHook) Fire(e *logrus.Entry) error {
	line, _ := e.String()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, line)
	return nil
}

func (h *lineHook) all() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "")
}

// kafkaGroupStore returns a Store of the group of instance id on c, on a
// client of its own (closed at cleanup).
func kafkaGroupStore(t *testing.T, c *kfake.Cluster, id string) (*kafkastore.Store, sarama.Client) {
	t.Helper()
	kc, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("kafkastore-daemon-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.Close() })
	return kafkastore.New(kc, id, "jobs", 0), kc
}

// With the Kafka offset store the daemon needs no ZooKeeper and asks for
// none: it leads through the group fanout_<id> and commits its acked
// offsets there.
func TestDaemonKafkaOffsetStore(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	log := logrus.New()
	log.SetOutput(discard{})
	hook := &lineHook{}
	log.AddHook(hook)
	opts := Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), OffsetStore: OffsetStoreKafka, NodeID: "n1",
		Listen: "127.0.0.1:0", InitialOffset: "oldest", CommitInterval: 20 * time.Millisecond,
		ClusterHeartbeat: 100 * time.Millisecond, LeaderTimeout: 600 * time.Millisecond,
		Logger: logrus.NewEntry(log),
	}
	if zk := opts.withDefaults().ZooKeeper; len(zk) != 0 {
		t.Fatalf("the Kafka offset store defaults to ZooKeeper servers %v", zk)
	}
	d, done := runDaemon(t, opts)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before serving", err)
	case <-time.After(30 * time.Second):
		t.Fatal("daemon not serving within 30s")
	}
	cl, err := client.Dial(t.Context(), client.Config{Addrs: []string{d.Addr().String()}, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produceTo(t, c.ListenAddrs(), "first")
	select {
	case m := <-cl.Messages():
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
	}
	store, _ := kafkaGroupStore(t, c, "svc")
	defer func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", hook.all())
		}
	}()
	testutil.WaitFor(t, 10*time.Second, "the acked offset committed to group fanout_svc", func() bool {
		got, err := store.Load(context.Background())
		return err == nil && got[0] == 1
	})
	desc, err := store.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h, ok, err := desc.Holder(); !ok || err != nil || h.Leader.Node != "n1" || h.Leader.Addr == "" {
		t.Errorf("the group's member: %+v, %v, %v; want n1 with its address", h, ok, err)
	}
	if logs := strings.ToLower(hook.all()); strings.Contains(logs, "zookeeper=") || strings.Contains(logs, "zookeeper session") {
		t.Errorf("the daemon logged a ZooKeeper connection:\n%s", hook.all())
	}
	if !strings.Contains(hook.all(), "offsets in Kafka, no ZooKeeper") {
		t.Errorf("the start line does not say that offsets are in Kafka:\n%s", hook.all())
	}
}

// A term whose commit the group coordinator refuses (another join replaced
// its membership) ends in the election too.
func TestLeadTermEndsItsAuthorityWhenTheCoordinatorRefuses(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	log := logrus.New()
	log.SetOutput(discard{})
	d, err := New(Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), OffsetStore: OffsetStoreKafka,
		Listen: "127.0.0.1:0", InitialOffset: "oldest", CommitInterval: 10 * time.Millisecond,
		Logger: logrus.NewEntry(log),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer d.srv.Close()
	store, kc := kafkaGroupStore(t, c, "svc")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := store.Join(ctx, kafkastore.Leader{Epoch: 1, Node: "me"})
	if err != nil {
		t.Fatal(err)
	}
	auth := &fakeAuthority{lost: make(chan struct{}), ended: make(chan error, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.mode.(*leaderMode).leadTerm(ctx, kc, store, offsets.TopicFence(m), auth, d.log)
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("term not serving within 30s")
	}
	cl, err := client.Dial(ctx, client.Config{Addrs: []string{d.Addr().String()}, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	go func() { // acks whatever comes, so that the term has something to commit
		for m := range cl.Messages() {
			_ = m.Ack()
		}
	}()

	other, _ := kafkaGroupStore(t, c, "svc")
	if _, err := other.Join(ctx, kafkastore.Leader{Epoch: 2, Node: "other"}); err != nil {
		t.Fatal(err)
	}
	produceTo(t, c.ListenAddrs(), "m")
	select {
	case cause := <-auth.ended:
		if !errors.Is(cause, offsets.ErrFenced) {
			t.Fatalf("End(%v), want a cause wrapping ErrFenced", cause)
		}
		t.Logf("the refused term ended: %v", cause)
	case <-time.After(30 * time.Second):
		t.Fatal("the term whose commit was refused did not end in its authority")
	}
	if got, _ := store.Load(ctx); got[0] != 0 {
		t.Fatalf("stored %v: the replaced member's commit went through", got)
	}
}

// discard is an io.Writer that drops everything.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Two daemons of spread mode on the Kafka store share a topic of four
// partitions without ZooKeeper: they elect no leader, the group fanout_svc
// has both as members (static instance ids: their node ids), each serving
// the two partitions its assignment gives it; a client given one address
// receives and acks the messages of all four, whose offsets are committed
// to the group. The one that stops hands its partitions to the other.
func TestSpreadDaemonsOnTheKafkaStore(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "jobs"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	hook := &lineHook{}
	start := func(node string) (*Daemon, context.CancelFunc, <-chan error) {
		log := logrus.New()
		log.SetOutput(discard{})
		log.AddHook(hook)
		return runStoppableDaemon(t, Options{
			ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), OffsetStore: OffsetStoreKafka, Assignment: AssignmentSpread,
			NodeID: node, Listen: "127.0.0.1:0", InitialOffset: "oldest", CommitInterval: 50 * time.Millisecond,
			ClusterHeartbeat: 100 * time.Millisecond, LeaderTimeout: 600 * time.Millisecond,
			KafkaSessionTimeout: 2 * time.Second, HandoffTimeout: time.Second, Logger: logrus.NewEntry(log).WithField("node", node),
		})
	}
	defer func() {
		if t.Failed() {
			t.Logf("daemons' log:\n%s", hook.all())
		}
	}()
	a, _, _ := start("node-a")
	b, stopB, doneB := start("node-b")
	testutil.WaitFor(t, 30*time.Second, "each daemon owning two partitions", func() bool {
		return len(a.Ownership().Owned) == 2 && len(b.Ownership().Owned) == 2
	})
	if a.Ownership().Generation == 0 || a.Ownership().Generation != b.Ownership().Generation {
		t.Errorf("generations %d and %d: want the group's one", a.Ownership().Generation, b.Ownership().Generation)
	}

	cl, err := client.Dial(t.Context(), client.Config{Addrs: []string{a.Addr().String()}, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := kafka.NewConfig("spread-daemon-test")
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(c.ListenAddrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for part := range int32(4) {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "jobs", Partition: part, Value: sarama.StringEncoder(fmt.Sprint(part))}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[int32]bool{}
	for len(got) < 4 {
		select {
		case m := <-cl.Messages():
			got[m.Partition] = true
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("received partitions %v of 4 through one address", got)
		}
	}
	store, _ := kafkaGroupStore(t, c, "svc")
	testutil.WaitFor(t, 10*time.Second, "every acked offset committed to group fanout_svc", func() bool {
		offs, err := store.Load(context.Background())
		return err == nil && len(offs) == 4 && offs[0] == 1 && offs[1] == 1 && offs[2] == 1 && offs[3] == 1
	})
	d, err := store.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var instances []string
	for _, m := range d.Members {
		instances = append(instances, m.InstanceID)
		if len(m.Held) != 2 {
			t.Errorf("member %s holds %v, want two partitions", m.InstanceID, m.Held)
		}
	}
	slices.Sort(instances)
	if d.Mode() != kafkastore.ModeSpread || !slices.Equal(instances, []string{"node-a", "node-b"}) {
		t.Errorf("group: mode %q, members %v; want spread, node-a and node-b", d.Mode(), instances)
	}
	if el := a.elector.Load(); el == nil || el.Leadership().Leader || el.Leadership().Known {
		t.Errorf("an elected leader in spread mode on the Kafka store: %+v", el.Leadership())
	}
	// The console's document, from either member: the mode and the store,
	// the group's assignment (each member with the partitions it holds),
	// and every partition with its offset and its holder.
	for _, dm := range []*Daemon{a, b} {
		st := dm.Status(t.Context())
		if st.Mode != AssignmentSpread || st.OffsetStore != OffsetStoreKafka || st.Assignment == nil || st.Assignment.Epoch != 0 ||
			st.Assignment.Generation != uint64(a.Ownership().Generation) {
			t.Errorf("%s's console: mode %q, store %q, assignment %+v; want spread, kafka, the group's generation %d",
				st.Node.NodeID, st.Mode, st.OffsetStore, st.Assignment, a.Ownership().Generation)
			continue
		}
		owners := map[int32]string{}
		for _, m := range st.Assignment.Members {
			if len(m.Partitions) != 2 || !slices.Equal(m.Partitions, m.Owned) {
				t.Errorf("%s's console: member %s assigned %v, owns %v; want the same two", st.Node.NodeID, m.NodeID, m.Partitions, m.Owned)
			}
			for _, p := range m.Owned {
				owners[p] = m.NodeID
			}
		}
		if len(st.Partitions) != 4 {
			t.Errorf("%s's console shows partitions %+v, want all four", st.Node.NodeID, st.Partitions)
		}
		for _, p := range st.Partitions {
			if p.Owner == "" || p.Owner != owners[p.Partition] || p.Committed == nil || *p.Committed != 1 {
				t.Errorf("%s's console: partition %d owner %q (the assignment says %q), committed %v; want its holder and 1",
					st.Node.NodeID, p.Partition, p.Owner, owners[p.Partition], p.Committed)
			}
		}
	}

	stopB()
	select {
	case err := <-doneB:
		if err != nil {
			t.Fatalf("b stopped: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("b did not stop")
	}
	testutil.WaitFor(t, 30*time.Second, "a owning all four partitions", func() bool { return len(a.Ownership().Owned) == 4 })
	if logs := strings.ToLower(hook.all()); strings.Contains(logs, "zookeeper=") {
		t.Errorf("a daemon logged a ZooKeeper connection:\n%s", hook.all())
	}
}
