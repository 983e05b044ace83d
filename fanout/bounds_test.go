package fanout

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

const testWait = 15 * time.Second

// startDevDaemon runs a whole daemon against an in-process Kafka (kfake)
// with one partition of topic and an in-memory offset store, until the test
// ends. It returns the daemon, the Kafka addresses and the log hook.
func startDevDaemon(t *testing.T, topic string) (*Daemon, []string, *logtest.Hook) {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(kc.Close)
	logger, hook := logtest.NewNullLogger()
	d, err := New(Options{
		ID: "bounds", Topic: topic, Kafka: kc.ListenAddrs(), Store: offsets.NewMemoryStore(),
		Listen: "127.0.0.1:0", InitialOffset: "oldest", Logger: logrus.NewEntry(logger),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(testWait):
			t.Error("daemon did not stop")
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("daemon stopped: %v", err)
	case <-time.After(testWait):
		t.Fatal("daemon not ready")
	}
	return d, kc.ListenAddrs(), hook
}

// produceValues produces one record per value to partition 0 of topic.
func produceValues(t *testing.T, addrs []string, topic string, values ...[]byte) {
	t.Helper()
	cfg := kafka.NewConfig("bounds-test")
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(addrs, cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	for _, v := range values {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(v)}); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

func dialClient(t *testing.T, d *Daemon, maxFrame int) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{d.Addr().String()}, MaxFrameSize: maxFrame})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func next(t *testing.T, c *client.Client) *client.Message {
	t.Helper()
	select {
	case m, ok := <-c.Messages():
		if !ok {
			t.Fatalf("client stopped: %v", c.Err())
		}
		return m
	case <-time.After(testWait):
		t.Fatal("no message")
		return nil
	}
}

// A record larger than a client announces it accepts is not sent to it: it
// waits, with a warning and a metric, while the records behind it flow, and
// goes to the first client that announces a large enough limit. Before
// clients announced their limit, the record went to the small client, which
// dropped the connection and got it again, forever.
func TestOversizedRecordWaitsForAClientThatTakesIt(t *testing.T) {
	t.Parallel()
	const topic = "sized"
	d, addrs, logs := startDevDaemon(t, topic)
	big := bytes.Repeat([]byte("B"), 20<<10)
	produceValues(t, addrs, topic, []byte("s0"), big, []byte("s1"), []byte("s2"))

	small := dialClient(t, d, 8<<10)
	for _, want := range []string{"s0", "s1", "s2"} {
		m := next(t, small)
		if string(m.Value) != want || m.Attempt != 1 {
			t.Fatalf("small client got %.10q attempt %d, want %q attempt 1", m.Value, m.Attempt, want)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, testWait, "the big record counted as too large", func() bool {
		st, ok := d.Stats(context.Background())
		return ok && st.TooLarge == 1 && st.Acked == 3
	})
	warned := false
	for _, e := range logs.AllEntries() {
		if e.Level == logrus.WarnLevel && e.Data["offset"] == int64(1) && e.Data["largest_client_limit"] == 8<<10 {
			warned = true
		}
	}
	if !warned {
		t.Error("no warning naming the waiting record and the largest client limit")
	}
	if small.Err() != nil {
		t.Fatalf("small client stopped: %v", small.Err())
	}

	large := dialClient(t, d, 64<<10)
	m := next(t, large)
	if !bytes.Equal(m.Value, big) || m.Offset != 1 || m.Attempt != 1 {
		t.Fatalf("large client got offset %d attempt %d (%d bytes), want the 20 KiB record at offset 1, attempt 1", m.Offset, m.Attempt, len(m.Value))
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, testWait, "offset 4 committed", func() bool {
		st, ok := d.Stats(context.Background())
		return ok && st.Committed[0] == 4 && st.TooLarge == 0
	})
}
