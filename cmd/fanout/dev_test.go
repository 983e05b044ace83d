package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// devHints are the commands fanout dev prints once it is ready, split into
// arguments after the program ("fanout" or "go run ./cmd/fanout").
type devHints struct {
	produce []string // produce --kafka ADDR --topic TOPIC
	connect string   // the daemon address of the tail hint
	status  []string // status --offset-store kafka --kafka ADDR --id dev --topic TOPIC
}

// readDevHints reads dev's standard output up to the offsets hint, then
// discards the rest in the background.
func readDevHints(t *testing.T, r io.Reader) devHints {
	t.Helper()
	var h devHints
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "produce:"):
			_, cmd, ok := strings.Cut(line, "| ")
			if !ok {
				t.Fatalf("produce hint without a pipe: %q", line)
			}
			h.produce = hintArgs(t, cmd)
		case strings.HasPrefix(line, "consume:"):
			args := hintArgs(t, strings.TrimPrefix(line, "consume:"))
			if len(args) != 3 || args[0] != "tail" || args[1] != "--connect" {
				t.Fatalf("consume hint %q: want tail --connect ADDR", line)
			}
			h.connect = args[2]
		case strings.HasPrefix(line, "offsets:"):
			h.status = hintArgs(t, strings.TrimPrefix(line, "offsets:"))
			go func() { _, _ = io.Copy(io.Discard, r) }()
			if h.produce == nil || h.connect == "" {
				t.Fatal("no produce and consume hints before the offsets hint")
			}
			return h
		}
	}
	t.Fatalf("dev output ended without hints: %v", sc.Err())
	return h
}

// hintArgs strips the program from a hinted command line.
func hintArgs(t *testing.T, cmd string) []string {
	t.Helper()
	cmd = strings.TrimSpace(cmd)
	for _, prog := range []string{"go run ./cmd/fanout ", "fanout "} {
		if rest, ok := strings.CutPrefix(cmd, prog); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("hint %q does not start with the fanout program", cmd)
	return nil
}

// receive returns the next message of c, failing after testWait.
func receive(t *testing.T, c *client.Client) *client.Message {
	t.Helper()
	select {
	case m, ok := <-c.Messages():
		if !ok {
			t.Fatalf("client stopped: %v", c.Err())
		}
		return m
	case <-time.After(testWait):
		t.Fatal("no message within", testWait)
		return nil
	}
}

// devRun is a fanout dev started by a test: its hints, and stop, which ends
// it as SIGINT would and fails the test unless it stops cleanly.
type devRun struct {
	devHints
	stop func()
}

// startDevApp runs fanout dev through the app with args (on free ports
// unless args say otherwise) until stop or the test's end; stderr gets its
// output.
func startDevApp(t *testing.T, stderr io.Writer, args ...string) devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, outW := io.Pipe()
	exit := make(chan int, 1)
	go func() {
		defer outW.Close()
		exit <- runAppTo(ctx, nil, outW, stderr, append([]string{"dev", "--kafka-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"}, args...)...)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case code := <-exit:
				if code != 0 {
					t.Errorf("dev exit code %d after cancel", code)
				}
			case <-time.After(testWait):
				t.Error("dev did not stop after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return devRun{readDevHints(t, out), stop}
}

// startDev runs runDev with cfg (its log discarded unless cfg.Log is set)
// until stop or the test's end.
func startDev(t *testing.T, cfg devConfig) devRun {
	t.Helper()
	if cfg.Log == nil {
		log := logrus.New()
		log.SetOutput(io.Discard)
		cfg.Log = logrus.NewEntry(log)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		defer outW.Close()
		done <- runDev(ctx, cfg, outW)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("runDev: %v", err)
				}
			case <-time.After(testWait):
				t.Error("dev did not stop after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return devRun{readDevHints(t, out), stop}
}

// TestDevCommand runs fanout dev through the app on free ports, follows its
// produce hint with the produce command, consumes what it hints with the
// client library, and stops it as SIGINT would.
func TestDevCommand(t *testing.T) {
	ctx := context.Background()
	var stderr syncBuffer
	h := startDevApp(t, &stderr, "--topic", "dev_topic", "--partitions", "2", "--ack-timeout", "20s")
	if !strings.Contains(stderr.String(), "not durable") {
		t.Errorf("no warning that offsets are not durable:\n%s", stderr.String())
	}

	// The app's flag parsing above happened before its hints: running a
	// second app now does not race on urfave/cli's global flags.
	code, summary, errOut := runApp(ctx, t, strings.NewReader("k=hello\n"), append(h.produce, "--key-separator", "=")...)
	if code != 0 {
		t.Fatalf("produce as hinted %v: exit code %d\n%s", h.produce, code, errOut)
	}
	if !strings.Contains(summary, "produced 1 messages") {
		t.Errorf("produce summary %q", summary)
	}

	c, err := client.Dial(ctx, client.Config{Addrs: []string{h.connect}, NoReconnect: true})
	if err != nil {
		t.Fatalf("dial %s: %v", h.connect, err)
	}
	m := receive(t, c)
	if string(m.Key) != "k" || string(m.Value) != "hello" || m.Attempt != 1 {
		t.Fatalf("got key %q value %q attempt %d, want k, hello, 1", m.Key, m.Value, m.Attempt)
	}
	if err := m.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close (flushes the ack): %v", err)
	}
	h.stop()
}

// TestDevCommitsAckedOffsets runs dev, which keeps its offsets in the
// in-process Kafka's group fanout_dev through the Kafka offset store: an
// acked message's offset is committed there, as status (hinted) shows.
func TestDevCommitsAckedOffsets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := logrus.New()
	var logs syncBuffer
	log.Out = &logs
	h := startDev(t, devConfig{
		KafkaListen: "127.0.0.1:0", Listen: "127.0.0.1:0", Topic: "t", Partitions: 1,
		AckTimeout: 20 * time.Second, Heartbeat: time.Second, MaxInFlight: 10,
		Log: logrus.NewEntry(log),
	})
	// The dev mode has no ZooKeeper, and its first log line says so.
	if got := logs.String(); !strings.Contains(got, "connecting to Kafka (offsets in Kafka, no ZooKeeper)") {
		t.Errorf("dev's start log does not say it runs without ZooKeeper:\n%s", got)
	}
	if code, _, errOut := runApp(ctx, t, strings.NewReader("first\nsecond\n"), h.produce...); code != 0 {
		t.Fatalf("produce: exit code %d\n%s", code, errOut)
	}
	c, err := client.Dial(ctx, client.Config{Addrs: []string{h.connect}, MaxInFlight: 10})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	m1, m2 := receive(t, c), receive(t, c)
	if string(m1.Value) != "first" || string(m2.Value) != "second" || m1.Offset != 0 || m2.Offset != 1 {
		t.Fatalf("got %q@%d, %q@%d", m1.Value, m1.Offset, m2.Value, m2.Offset)
	}
	// Only the acked prefix is committed: acking the second message alone
	// commits nothing, then acking the first commits both.
	if err := m2.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := m1.Ack(); err != nil {
		t.Fatalf("ack: %v", err)
	}
	deadline := time.Now().Add(testWait)
	for {
		// On a loaded machine the dev daemon's term may end (its own
		// heartbeats late) and the next term deliver both again: ack them.
		for drained := false; !drained; {
			select {
			case m := <-c.Messages():
				if m != nil {
					_ = m.Ack()
				}
			default:
				drained = true
			}
		}
		code, out, errOut := runApp(ctx, t, nil, append(h.status, "--json")...)
		if code != 0 {
			t.Fatalf("status as hinted %v: exit code %d\n%s", h.status, code, errOut)
		}
		var st status.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Partitions) == 1 && st.Partitions[0].Committed != nil && *st.Partitions[0].Committed == 2 {
			if st.Leader == nil || st.Leader.Node != devID {
				t.Errorf("status names leader %+v, want %s", st.Leader, devID)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %s, want partition 0 committed at 2", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Without --offset-store kafka, status learns the store from the dev
	// daemon's heartbeats (it used to read whatever ZooKeeper answered on
	// localhost:2181 and print no leader beside a live one).
	var args []string
	for i := 0; i < len(h.status); i++ {
		if h.status[i] == "--offset-store" {
			i++
			continue
		}
		args = append(args, h.status[i])
	}
	code, doc, errOut := runApp(ctx, t, nil, append(args, "--json")...)
	var st status.Status
	if err := json.Unmarshal([]byte(doc), &st); code != 0 || err != nil {
		t.Fatalf("status %v: exit code %d, %v\n%s%s", args, code, err, doc, errOut)
	}
	if st.OffsetStore != "kafka" || st.StoreFrom != "the members' heartbeats" || st.Leader == nil || st.Leader.Node != devID ||
		len(st.Partitions) != 1 || st.Partitions[0].Committed == nil || *st.Partitions[0].Committed != 2 {
		t.Errorf("status %v without --offset-store:\n%s", args, doc)
	}

	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	before := len(logs.String())
	h.stop()
	// A clean stop (as Ctrl-C) warns of nothing.
	for _, line := range strings.Split(logs.String()[before:], "\n") {
		if strings.Contains(line, "level=warning") || strings.Contains(line, "level=error") {
			t.Errorf("logged at stop: %s", line)
		}
	}
}

func TestDevBadFlags(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no partitions", []string{"--partitions", "0"}, 2, "--partitions"},
		{"bad kafka listen", []string{"--kafka-listen", "9092"}, 2, "--kafka-listen"},
		{"bad topic", []string{"--topic", "a/b"}, 2, "--topic"},
		{"bad ack timeout", []string{"--ack-timeout=-1s"}, 2, "--ack-timeout"},
		{"bad listen", []string{"--listen", "nope"}, 2, "--listen"},
		{"stray argument", []string{"extra"}, 2, "extra"},
		{"kafka port taken", []string{"--kafka-listen", taken.Addr().String(), "--listen", "127.0.0.1:0"}, 1, "Give fanout dev another --kafka-listen"},
		{"listen port taken", []string{"--kafka-listen", "127.0.0.1:0", "--listen", taken.Addr().String()}, 1, "its own --listen"},
		{"metrics port taken", []string{"--kafka-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--metrics-listen", taken.Addr().String()}, 1, "its own --metrics-listen"},
		{"dead-letter topic without max attempts", []string{"--dead-letter-topic", "dlq"}, 2, "--max-attempts"},
		{"bad retry backoff", []string{"--retry-backoff", "1s,2x"}, 2, "--retry-backoff"},
		{"bad ordering", []string{"--ordering", "fifo"}, 2, "--ordering"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runApp(context.Background(), t, nil, append([]string{"dev"}, tt.args...)...)
			if code != tt.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, tt.code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tt.want, stderr)
			}
			if strings.Contains(stderr, "fanout: fanout") {
				t.Errorf("a doubled prefix:\n%s", stderr)
			}
		})
	}
}

func TestDialable(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{":4987", "127.0.0.1:4987"},
		{"0.0.0.0:4987", "127.0.0.1:4987"},
		{"[::]:4987", "127.0.0.1:4987"},
		{"10.1.2.3:4987", "10.1.2.3:4987"},
		{"[::1]:4987", "[::1]:4987"},
		{"localhost:4987", "localhost:4987"},
	}
	for _, tt := range tests {
		if got := dialable(&advertisedAddr{"tcp", tt.in}); got != tt.want {
			t.Errorf("dialable(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestDevProduceThenTail follows both hints of fanout dev through the app:
// produce a line, then tail prints it.
func TestDevProduceThenTail(t *testing.T) {
	t.Parallel()
	if newApp(io.Discard, io.Discard).Command("tail") == nil {
		t.Skip("the tail command is not registered in main.go yet")
	}
	ctx := context.Background()
	h := startDevApp(t, io.Discard)
	if code, _, errOut := runApp(ctx, t, strings.NewReader("hello tail\n"), h.produce...); code != 0 {
		t.Fatalf("produce: exit code %d\n%s", code, errOut)
	}
	code, printed, errOut := runApp(ctx, t, nil, "tail", "--connect", h.connect, "--count", "1")
	if code != 0 || !strings.Contains(printed, "hello tail") {
		t.Fatalf("tail as hinted: exit code %d, printed %q\n%s", code, printed, errOut)
	}
	h.stop()
}

// TestDevDefaultsDoNotSpinAPoisonRecord runs fanout dev with its default
// flags and one tail that gives every message back at once (--no-ack
// --nack-delay 0), as a handler failing on a poison record does, and
// counts its deliveries of one record over 10 seconds. Without a retry
// backoff it went round tens of thousands of times; with the default one
// (1s doubling: deliveries at about 0, 1, 3, 7 s, jittered into the upper
// half of each wait) at most 5 fit. The bound leaves room for a new term on
// a loaded machine, which may deliver at once (a delay begun since the last commit is not stored); it is a
// bound on the count, not on time.
func TestDevDefaultsDoNotSpinAPoisonRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startDev(t, devConfig{
		KafkaListen: "127.0.0.1:0", Listen: "127.0.0.1:0", Topic: "t", Partitions: 1,
		AckTimeout: fanout.DefaultAckTimeout, Heartbeat: fanout.DefaultHeartbeat, MaxInFlight: fanout.DefaultMaxInFlight,
	})
	if code, _, errOut := runApp(ctx, t, strings.NewReader("poison\n"), h.produce...); code != 0 {
		t.Fatalf("produce: exit code %d\n%s", code, errOut)
	}
	tailCtx, stopTail := context.WithTimeout(ctx, 10*time.Second)
	defer stopTail()
	code, printed, errOut := runApp(tailCtx, t, nil, "tail", "--connect", h.connect, "--no-ack", "--nack-delay", "0", "--meta")
	if code != 0 {
		t.Fatalf("tail: exit code %d\n%s", code, errOut)
	}
	deliveries := strings.Count(printed, "poison")
	if deliveries < 1 || deliveries > 8 {
		t.Fatalf("one record nacked at once was delivered %d times in 10 s, want 1 to 8:\n%s", deliveries, printed)
	}
	t.Logf("%d deliveries in 10 s:\n%s", deliveries, printed)
	h.stop()
}

// TestDevDeadLetters runs fanout dev with the delivery-policy flags: the
// dead-letter topic is created in the in-process broker, and a record
// nacked --max-attempts times lands there.
func TestDevDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startDevApp(t, io.Discard, "--metrics-listen", "", "--topic", "jobs", "--partitions", "3",
		"--max-attempts", "2", "--dead-letter-topic", "jobs_dlq", "--retry-backoff", "10ms,20ms", "--ordering", "key")
	if code, _, errOut := runApp(ctx, t, strings.NewReader("k=poison\n"), append(h.produce, "--key-separator", "=")...); code != 0 {
		t.Fatalf("produce: exit code %d\n%s", code, errOut)
	}
	c, err := client.Dial(ctx, client.Config{Addrs: []string{h.connect}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	for attempt := 1; attempt <= 2; attempt++ {
		m := receive(t, c)
		if string(m.Value) != "poison" || m.Attempt != attempt {
			t.Fatalf("got %q attempt %d, want poison attempt %d", m.Value, m.Attempt, attempt)
		}
		if err := m.NackWith(0, "cannot parse"); err != nil {
			t.Fatal(err)
		}
	}

	kafkaAddr := h.produce[slices.Index(h.produce, "--kafka")+1]
	kc, err := sarama.NewClient([]string{kafkaAddr}, kafka.NewConfig("dev-dlq-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if parts, err := kc.Partitions("jobs_dlq"); err != nil || len(parts) != 3 {
		t.Fatalf("dead-letter topic partitions %v, %v; want 3, as the topic", parts, err)
	}
	// The partition the dead letter went to: the one that holds a record.
	held := int32(-1)
	testutil.WaitFor(t, testWait, "the dead letter", func() bool {
		for p := range int32(3) {
			if n, err := kc.GetOffset("jobs_dlq", p, sarama.OffsetNewest); err == nil && n > 0 {
				held = p
				return true
			}
		}
		return false
	})
	consumer, err := sarama.NewConsumerFromClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition("jobs_dlq", held, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case got := <-pc.Messages():
		if string(got.Key) != "k" || string(got.Value) != "poison" {
			t.Fatalf("dead letter %q=%q, want k=poison", got.Key, got.Value)
		}
	case <-time.After(testWait):
		t.Fatal("the dead letter not read")
	}
	h.stop()
}

// TestDevTailTellsNullKeysFromEmptyOnes: through the broker, the daemon and
// the client, a record without a key prints "key": null in tail --json, one
// with an empty key "".
func TestDevTailTellsNullKeysFromEmptyOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := startDev(t, devConfig{
		KafkaListen: "127.0.0.1:0", Listen: "127.0.0.1:0", Topic: "t", Partitions: 1,
		AckTimeout: 20 * time.Second, Heartbeat: time.Second, MaxInFlight: 10,
	})
	if code, _, errOut := runApp(ctx, t, strings.NewReader("k=one\n=two\nthree\n"), append(h.produce, "--key-separator", "=")...); code != 0 {
		t.Fatalf("produce: exit code %d\n%s", code, errOut)
	}
	code, printed, errOut := runApp(ctx, t, nil, "tail", "--connect", h.connect, "--count", "3", "--json")
	if code != 0 {
		t.Fatalf("tail: exit code %d\n%s", code, errOut)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(printed), "\n") {
		var rec struct {
			Key   json.RawMessage `json:"key"`
			Value string          `json:"value"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got = append(got, fmt.Sprintf("%s=%s", rec.Key, rec.Value))
	}
	if want := []string{`"k"=one`, `""=two`, `null=three`}; !slices.Equal(got, want) {
		t.Errorf("tail --json keys and values %q, want %q", got, want)
	}
	h.stop()
}
