package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// soloDaemon runs a daemon that leads alone on store, against an in-process
// Kafka with topic "jobs" of one partition, until the test ends. It returns
// the daemon, the broker's addresses and Run's result. tune, when given,
// adjusts the options.
func soloDaemon(t *testing.T, store *offsets.MemoryStore, tune ...func(*Options)) (*Daemon, []string, <-chan error) {
	t.Helper()
	return soloDaemonOn(t, newJobsCluster(t), store, tune...)
}

// newJobsCluster returns an in-process Kafka with topic "jobs" of one
// partition, closed when the test ends.
func newJobsCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// soloDaemonOn is soloDaemon on the in-process Kafka c, which has topic
// "jobs".
func soloDaemonOn(t *testing.T, c *kfake.Cluster, store *offsets.MemoryStore, tune ...func(*Options)) (*Daemon, []string, <-chan error) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	opts := Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), Store: store,
		Listen: "127.0.0.1:0", InitialOffset: "oldest", CommitInterval: 10 * time.Millisecond,
		Logger: logrus.NewEntry(log),
	}
	for _, f := range tune {
		f(&opts)
	}
	d, done := runDaemon(t, opts)
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("daemon not serving within 30s")
	}
	return d, c.ListenAddrs(), done
}

// runDaemon runs a daemon of opts until the test ends (then it stops it,
// waiting up to 30 s) and returns it with Run's result.
func runDaemon(t *testing.T, opts Options) (*Daemon, <-chan error) {
	t.Helper()
	d, _, done := runStoppableDaemon(t, opts)
	return d, done
}

// runStoppableDaemon is runDaemon, with stop, which ends Run's context
// before the test ends.
func runStoppableDaemon(t *testing.T, opts Options) (d *Daemon, stop context.CancelFunc, done <-chan error) {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	result, stopped := make(chan error, 1), make(chan struct{})
	go func() {
		result <- d.Run(ctx)
		close(stopped)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			t.Error("daemon did not stop")
		}
	})
	return d, cancel, result
}

// produceTo produces value to partition 0 of jobs.
func produceTo(t *testing.T, brokers []string, value string) {
	t.Helper()
	cfg := kafka.NewConfig("daemon-test")
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "jobs", Value: sarama.StringEncoder(value)}); err != nil {
		t.Fatal(err)
	}
}

// A term's commits carry its fence: once another term of the store began,
// the daemon's next commit is refused, it stops serving and Run reports it.
func TestDaemonTermStopsWhenItsFenceNoLongerHolds(t *testing.T) {
	t.Parallel()
	store := offsets.NewMemoryStore()
	d, brokers, done := soloDaemon(t, store)
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{d.Addr().String()}, MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	next := func() *client.Message {
		t.Helper()
		select {
		case m := <-c.Messages():
			return m
		case <-time.After(30 * time.Second):
			t.Fatal("no message within 30s")
			return nil
		}
	}
	produceTo(t, brokers, "first")
	if err := next().Ack(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the first offset committed", func() bool {
		got, _ := store.Load(context.Background())
		return got[0] == 1
	})

	store.NewTerm() // another term began: this daemon's fence no longer holds
	produceTo(t, brokers, "second")
	if err := next().Ack(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, offsets.ErrFenced) {
			t.Fatalf("Run = %v, want ErrFenced", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon went on serving under a fence that no longer holds")
	}
	if got, _ := store.Load(context.Background()); got[0] != 1 {
		t.Fatalf("stored %v: the deposed term committed", got)
	}
	if _, ok := d.Stats(context.Background()); ok {
		t.Error("a dispatcher still serves after the term was fenced")
	}
}

// fakeAuthority is a term's authority that records End.
type fakeAuthority struct {
	lost  chan struct{}
	ended chan error // capacity 1: the cause given to End
}

func (a *fakeAuthority) Lost() <-chan struct{} { return a.lost }
func (a *fakeAuthority) Cause() error          { return nil }
func (a *fakeAuthority) End(cause error) {
	select {
	case a.ended <- cause:
	default:
	}
}

// A term whose commit is refused ends in the election too: leadTerm tells
// its authority, so that another member leads instead of nobody.
func TestLeadTermEndsItsAuthorityWhenFenced(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	log := logrus.New()
	log.SetOutput(io.Discard)
	store := offsets.NewMemoryStore()
	d, err := New(Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), Store: store,
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
	kc, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("lead-term-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	auth := &fakeAuthority{lost: make(chan struct{}), ended: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.mode.(*leaderMode).leadTerm(ctx, kc, store, store.NewTerm(), auth, d.log)
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
	store.NewTerm() // another term began: this one's fence no longer holds
	produceTo(t, c.ListenAddrs(), "m")
	select {
	case cause := <-auth.ended:
		if !errors.Is(cause, offsets.ErrFenced) {
			t.Fatalf("End(%v), want a cause wrapping ErrFenced", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced term did not end in its authority")
	}
}

// A client with the batch API acks a whole batch in one call, by one range:
// the daemon settles it (the serving term's dispatcher, through the
// server's backend) and commits past it.
func TestDaemonSettlesTheRangesOfABatch(t *testing.T) {
	t.Parallel()
	store := offsets.NewMemoryStore()
	d, brokers, _ := soloDaemon(t, store)
	for i := range 5 {
		produceTo(t, brokers, fmt.Sprint("m", i))
	}
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{d.Addr().String()}, MaxInFlight: 10, Batches: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for got := 0; got < 5; {
		select {
		case b := <-c.Batches():
			got += len(b.Messages)
			if err := b.Ack(); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of 5 messages within 30s", got)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every offset committed", func() bool {
		got, _ := store.Load(context.Background())
		return got[0] == 5
	})
	st, _ := d.Stats(context.Background())
	if st.Acked != 5 || st.UnknownAcks != 0 {
		t.Fatalf("acked %d, unknown %d", st.Acked, st.UnknownAcks)
	}
}

// With --delivery-log the daemon appends, from its start, a line per
// delivery and its outcome, the client named as it said in its Hello; the
// delivery id is the one the client sees.
func TestDaemonWritesItsDeliveryLog(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "d.delivery.log")
	store := offsets.NewMemoryStore()
	d, brokers, _ := soloDaemon(t, store, func(o *Options) { o.DeliveryLog, o.NodeID = path, "n1" })
	produceTo(t, brokers, "m0")
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{d.Addr().String()}, ClientID: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var m *client.Message
	select {
	case m = <-c.Messages():
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	var evs []deliverylog.Event
	testutil.WaitFor(t, 10*time.Second, "the ack in the delivery log", func() bool {
		evs, _, _ = deliverylog.ReadFile(path)
		return len(evs) > 0 && evs[len(evs)-1].Kind == deliverylog.Ack
	})
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind.String())
	}
	// The client's join and the partition's start come in either order.
	if len(kinds) != 6 || !slices.Equal(kinds[:2], []string{"open", "start"}) || !slices.Equal(kinds[4:], []string{"deliver", "ack"}) ||
		!slices.Contains(kinds[2:4], "join") || !slices.Contains(kinds[2:4], "restart") || evs[0].Detail[:8] != "node=n1," {
		t.Fatalf("delivery log events %v (open: %q)", kinds, evs[0].Detail)
	}
	for _, e := range evs[4:] {
		if e.ID != m.DeliveryID || e.Client != "worker-1" || e.Partition != 0 || e.Offset != 0 || e.Attempt != 1 {
			t.Fatalf("%v names %d/%d, delivery %d of %q; the client got delivery %d", e.Kind, e.Partition, e.Offset, e.ID, e.Client, m.DeliveryID)
		}
	}
}
