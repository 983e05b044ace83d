//go:build integration

package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// testDaemon is an in-process fanout daemon against the real servers.
type testDaemon struct {
	*fanout.Daemon
	opts   fanout.Options
	addr   string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// testLogger returns a logger that writes to the test log until the test
// ends, and drops what comes after: a ZooKeeper connection's event logger
// may report its closing after the cleanup that closed it, and a test's log
// may not be written once it has ended.
func testLogger(t testing.TB) *logrus.Entry {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	l := logrus.New()
	l.SetOutput(w)
	l.SetLevel(logrus.InfoLevel)
	return logrus.NewEntry(l)
}

type testWriter struct {
	t     testing.TB
	mu    sync.Mutex // held across t.Logf, so that none is under way once ended is set
	ended bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// daemonOptions returns options for a daemon of topic on the test servers,
// with a fresh service id, listening on a free loopback port.
func daemonOptions(t testing.TB, topic string) fanout.Options {
	return fanout.Options{
		ID:             uniqueName(t, "svc"),
		Topic:          topic,
		Kafka:          kafkaAddrs(t),
		ZooKeeper:      zkAddrs(t),
		Listen:         "127.0.0.1:0",
		InitialOffset:  "oldest",
		CommitInterval: 100 * time.Millisecond,
		DrainTimeout:   5 * time.Second,
		// A fast election: a daemon leads about 1.5 s after it starts.
		ClusterHeartbeat: 200 * time.Millisecond,
		LeaderTimeout:    time.Second,
		Logger:           testLogger(t),
	}
}

// startDaemon runs a daemon with opts until the test ends, and waits until
// it serves clients.
func startDaemon(t testing.TB, opts fanout.Options) *testDaemon {
	t.Helper()
	td := runDaemon(t, opts)
	td.waitServing(t)
	return td
}

// runDaemon runs a daemon with opts until the test ends, and waits until it
// listens.
func runDaemon(t testing.TB, opts fanout.Options) *testDaemon {
	t.Helper()
	d, err := fanout.New(opts)
	if err != nil {
		t.Fatalf("fanout.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	td := &testDaemon{Daemon: d, opts: opts, cancel: cancel, done: make(chan error, 1)}
	go func() { td.done <- d.Run(ctx) }()
	t.Cleanup(func() { td.stop(t) })
	select {
	case <-d.Listening():
	case err := <-td.done:
		t.Fatalf("daemon stopped before listening: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not listening within 60s")
	}
	td.addr = d.Addr().String()
	return td
}

// waitServing waits until the daemon serves clients.
func (d *testDaemon) waitServing(t testing.TB) {
	t.Helper()
	select {
	case <-d.Ready():
	case err := <-d.done:
		t.Fatalf("daemon stopped before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not serving within 60s")
	}
}

// stop shuts the daemon down gracefully and returns Run's error.
func (d *testDaemon) stop(t testing.TB) error {
	d.once.Do(func() {
		d.cancel()
		select {
		case d.err = <-d.done:
		case <-time.After(60 * time.Second):
			t.Error("daemon did not stop within 60s")
		}
	})
	return d.err
}

// stats returns the daemon's dispatcher counters.
func (d *testDaemon) stats(t testing.TB) dispatch.Stats {
	t.Helper()
	s, ok := d.Stats(context.Background())
	if !ok {
		t.Fatal("daemon has no dispatcher")
	}
	return s
}

// dial connects a client to addrs; it is closed at cleanup.
func dial(t testing.TB, cfg client.Config, addrs ...string) *client.Client {
	t.Helper()
	cfg.Addrs = addrs
	if cfg.ClientID == "" {
		cfg.ClientID = t.Name()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("client.Dial(%v): %v", addrs, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// produceSeq produces n messages with values "<prefix>-<i>", message i to
// partition i % partitions, and returns the values.
func produceSeq(t testing.TB, topic, prefix string, n, partitions int) []string {
	t.Helper()
	producer := manualProducer(t)
	defer producer.Close()
	values := make([]string, n)
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range n {
		values[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = &sarama.ProducerMessage{
			Topic:     topic,
			Partition: int32(i % partitions),
			Key:       sarama.StringEncoder(strconv.Itoa(i)),
			Value:     sarama.StringEncoder(values[i]),
		}
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatalf("produce %d messages to %q: %v", n, topic, err)
	}
	return values
}

// recv returns the next message of c, failing the test after timeout.
func recv(t testing.TB, c *client.Client, timeout time.Duration) *client.Message {
	t.Helper()
	select {
	case m, ok := <-c.Messages():
		if !ok {
			t.Fatalf("client closed: %v", c.Err())
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("no message within %v", timeout)
		return nil
	}
}

// noMessage fails the test if c receives a message within d.
func noMessage(t testing.TB, c *client.Client, d time.Duration) {
	t.Helper()
	select {
	case m := <-c.Messages():
		t.Fatalf("unexpected message %s (p%d@%d attempt %d)", m.Value, m.Partition, m.Offset, m.Attempt)
	case <-time.After(d):
	}
}

// zkOffsets reads the committed offsets of service id and topic from
// ZooKeeper, in the layout of Kafka's classic consumers.
func zkOffsets(t testing.TB, id, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
	if err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	defer conn.Close()
	dir := zkstore.OffsetsPath("", id, topic)
	children, _, err := conn.Children(dir)
	if err == zk.ErrNoNode {
		return map[int32]int64{}
	}
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	out := map[int32]int64{}
	for _, c := range children {
		data, _, err := conn.Get(dir + "/" + c)
		if err != nil {
			t.Fatalf("get %s/%s: %v", dir, c, err)
		}
		p, err1 := strconv.ParseInt(c, 10, 32)
		o, err2 := strconv.ParseInt(string(data), 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("znode %s/%s = %q: not a partition and a decimal offset", dir, c, data)
		}
		out[int32(p)] = o
	}
	return out
}
