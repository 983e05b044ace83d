package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// Tests here run the app through runCLI (app_test.go), which keeps two apps
// from setting up at once: urfave/cli's setup writes its package variables.

// testWait bounds every wait of these tests.
const testWait = 20 * time.Second

// runApp runs the fanout app with args and stdin as run does, and returns
// its exit code and output.
func runApp(ctx context.Context, t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut syncBuffer
	code = runAppTo(ctx, stdin, &out, &errOut, args...)
	return code, out.String(), errOut.String()
}

// runAppTo runs the fanout app with args, stdin (nil: none) and outputs as
// run does, and returns its exit code.
func runAppTo(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, args ...string) int {
	app := newApp(stdout, stderr)
	app.Reader = strings.NewReader("")
	if stdin != nil {
		app.Reader = stdin
	}
	err := runCLI(ctx, app, append([]string{"fanout"}, args...))
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fanout:", err)
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// syncBuffer is a bytes.Buffer safe for concurrent use (logs of other
// goroutines may land in it).
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newKfake starts an in-process Kafka with topic "t" of 3 partitions.
func newKfake(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, "t")}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// record is a consumed message.
type record struct {
	partition int32
	key       string // "<nil>" for no key
	value     string
}

// consumeAll returns every message of topic on brokers, by partition and
// offset: it reads each partition up to the high-water mark it has now.
func consumeAll(t *testing.T, brokers []string, topic string) []record {
	t.Helper()
	cfg := kafka.NewConfig("produce-test")
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("sarama client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions: %v", err)
	}
	var out []record
	for _, p := range parts {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("offset of partition %d: %v", p, err)
		}
		if hwm == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("consume partition %d: %v", p, err)
		}
		timeout := time.After(testWait)
		for next := int64(0); next < hwm; {
			select {
			case m := <-pc.Messages():
				key := "<nil>"
				if m.Key != nil {
					key = string(m.Key)
				}
				out = append(out, record{m.Partition, key, string(m.Value)})
				next = m.Offset + 1
			case err := <-pc.Errors():
				t.Fatalf("partition %d: %v", p, err)
			case <-timeout:
				t.Fatalf("partition %d: timed out at %d of %d", p, next, hwm)
			}
		}
		_ = pc.Close()
	}
	return out
}

func TestProduceLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		args  []string
		stdin string
		want  []record // partition -1: any
		// onePartition: every message lands in the same partition.
		onePartition bool
	}{
		{
			name:  "one message per line",
			stdin: "hello\nworld\n",
			want:  []record{{-1, "<nil>", "hello"}, {-1, "<nil>", "world"}},
		},
		{
			name:  "last line without newline, CRLF, empty line",
			stdin: "a\r\n\nb",
			want:  []record{{-1, "<nil>", "a"}, {-1, "<nil>", ""}, {-1, "<nil>", "b"}},
		},
		{
			name:  "key separator splits at the first one",
			args:  []string{"--key-separator", "::"},
			stdin: "k1::v1\nk2::v::2\nno key here\n::empty key\n",
			want: []record{
				{-1, "k1", "v1"}, {-1, "k2", "v::2"}, {-1, "<nil>", "no key here"}, {-1, "", "empty key"},
			},
		},
		{
			name:  "fixed partition",
			args:  []string{"--partition", "2", "--key-separator", "="},
			stdin: "a=1\nb=2\nc=3\n",
			want:  []record{{2, "a", "1"}, {2, "b", "2"}, {2, "c", "3"}},
		},
		{
			name:         "same key same partition",
			args:         []string{"--key-separator", " "},
			stdin:        strings.Repeat("user42 event\n", 20),
			want:         slices.Repeat([]record{{-1, "user42", "event"}}, 20),
			onePartition: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newKfake(t)
			args := append([]string{"produce", "--kafka", c.ListenAddrs()[0], "--topic", "t"}, tt.args...)
			code, stdout, stderr := runApp(context.Background(), t, strings.NewReader(tt.stdin), args...)
			if code != 0 {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
			}
			if want := fmt.Sprintf("produced %d messages", len(tt.want)); !strings.Contains(stdout, want) {
				t.Errorf("summary %q does not say %q", stdout, want)
			}
			got := consumeAll(t, c.ListenAddrs(), "t")
			partitions := map[int32]bool{}
			for i := range got {
				partitions[got[i].partition] = true
			}
			anyPartition := slices.ContainsFunc(tt.want, func(r record) bool { return r.partition == -1 })
			if anyPartition {
				if tt.onePartition && len(partitions) != 1 {
					t.Errorf("one key spread over partitions %v", partitions)
				}
				for i := range got {
					got[i].partition = -1
				}
				// Order is kept only within a partition.
				cmp := func(a, b record) int { return strings.Compare(a.key+"\x00"+a.value, b.key+"\x00"+b.value) }
				slices.SortFunc(got, cmp)
				tt.want = slices.Clone(tt.want)
				slices.SortFunc(tt.want, cmp)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("consumed\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}

func TestProduceSynthetic(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	const n, size = 3000, 64
	before := time.Now()
	code, stdout, stderr := runApp(context.Background(), t, nil,
		"produce", "--kafka", c.ListenAddrs()[0], "--topic", "t", "--count", strconv.Itoa(n), "--size", strconv.Itoa(size))
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{fmt.Sprintf("produced %d messages, %d bytes", n, n*size), "msg/s", "MB/s"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary %q does not contain %q", stdout, want)
		}
	}
	got := consumeAll(t, c.ListenAddrs(), "t")
	if len(got) != n {
		t.Fatalf("consumed %d messages, want %d", len(got), n)
	}
	seen := make([]bool, n)
	for _, r := range got {
		if len(r.value) != size {
			t.Fatalf("value of %d bytes, want %d: %q", len(r.value), size, r.value)
		}
		seq, at, ok := parseSynthetic([]byte(r.value))
		if !ok || seq < 0 || seq >= n || seen[seq] {
			t.Fatalf("bad or repeated synthetic value %q", r.value)
		}
		if at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
			t.Fatalf("value %q: produce time %v not during the test", r.value, at)
		}
		seen[seq] = true
	}
}

func TestProduceCreatesTopicWhereBrokerAllows(t *testing.T) {
	t.Parallel()
	c := newKfake(t, kfake.AllowAutoTopicCreation())
	code, _, stderr := runApp(context.Background(), t, strings.NewReader("x\n"),
		"produce", "--kafka", c.ListenAddrs()[0], "--topic", "fresh")
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	if got := consumeAll(t, c.ListenAddrs(), "fresh"); len(got) != 1 || got[0].value != "x" {
		t.Fatalf("consumed %v", got)
	}
}

func TestProduceFromEnvironment(t *testing.T) {
	c := newKfake(t)
	t.Setenv("FANOUT_KAFKA", c.ListenAddrs()[0])
	t.Setenv("FANOUT_TOPIC", "t")
	code, _, stderr := runApp(context.Background(), t, strings.NewReader("from env\n"), "produce")
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	if got := consumeAll(t, c.ListenAddrs(), "t"); len(got) != 1 || got[0].value != "from env" {
		t.Fatalf("consumed %v", got)
	}
}

func TestProduceFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cluster []kfake.Opt
		failAll bool
		args    []string
		want    []string // in stderr
	}{
		{
			name: "missing topic",
			args: []string{"--topic", "nope"},
			want: []string{"topic does not exist", `"nope"`, "kafka-topics.sh"},
		},
		{
			name: "partition out of range",
			args: []string{"--topic", "t", "--partition", "3"},
			want: []string{"--partition 3", "3 partitions"},
		},
		{
			name:    "broker rejects every message",
			failAll: true,
			args:    []string{"--topic", "t", "--count", "5"},
			want:    []string{"5 of 5 messages failed", "too large"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newKfake(t, tt.cluster...)
			if tt.failAll {
				c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					return failProduce(req.(*kmsg.ProduceRequest), kerr.MessageTooLarge.Code), nil, true
				})
			}
			args := append([]string{"produce", "--kafka", c.ListenAddrs()[0]}, tt.args...)
			code, _, stderr := runApp(context.Background(), t, strings.NewReader(""), args...)
			if code != 1 {
				t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// failProduce answers req with code for every partition.
func failProduce(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		st.TopicID = rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

func TestProduceBadFlagsExitTwo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no topic", []string{"--kafka", "h:1"}, "--topic"},
		{"bad kafka address", []string{"--kafka", "nohost", "--topic", "t"}, "--kafka"},
		{"negative count", []string{"--topic", "t", "--count", "-1"}, "--count"},
		{"size too small", []string{"--topic", "t", "--count", "1", "--size", "8"}, "--size 8"},
		{"size without count", []string{"--topic", "t", "--size", "100"}, "--size"},
		{"key separator with count", []string{"--topic", "t", "--count", "1", "--key-separator", ":"}, "--key-separator"},
		{"negative partition", []string{"--topic", "t", "--partition", "-2"}, "--partition"},
		{"stray argument", []string{"--topic", "t", "hello"}, "hello"},
		{"unknown flag", []string{"--topic", "t", "--bogus"}, "bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runApp(context.Background(), t, strings.NewReader(""), append([]string{"produce"}, tt.args...)...)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tt.want, stderr)
			}
		})
	}
}

func TestSyntheticValue(t *testing.T) {
	t.Parallel()
	at := time.Unix(1700000000, 123456789)
	tests := []struct {
		seq, size int
		wantLen   int
	}{
		{0, 32, 32},
		{7, 100, 100},
		{12345678901, 32, 32},
		{123456789012, 32, 33}, // a header longer than size is kept whole
	}
	for _, tt := range tests {
		v := syntheticValue(tt.seq, at, tt.size)
		if len(v) != tt.wantLen {
			t.Errorf("seq %d size %d: %d bytes %q, want %d", tt.seq, tt.size, len(v), v, tt.wantLen)
		}
		seq, got, ok := parseSynthetic(v)
		if !ok || seq != tt.seq || !got.Equal(at) {
			t.Errorf("parseSynthetic(%q) = %d, %v, %v", v, seq, got, ok)
		}
	}
	for _, bad := range []string{"", "hello", "1 2", "x 2 ", "1 y ", "-1 2 "} {
		if _, _, ok := parseSynthetic([]byte(bad)); ok {
			t.Errorf("parseSynthetic(%q) ok", bad)
		}
	}
}
