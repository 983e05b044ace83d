package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// Synthetic messages (produce --count) start with a header "SEQ UNIXNANOS "
// (the sequence number from 0 and the produce time in nanoseconds since the
// Unix epoch, both decimal) and are padded with '.' to --size bytes, so that
// a consumer can check order and gaps and measure end-to-end latency with
// parseSynthetic.
const (
	// minSyntheticSize fits the header of any sequence number below 10^11
	// (UNIXNANOS has 19 digits until the year 2286).
	minSyntheticSize = 32
	syntheticPad     = '.'
)

// Producer batching, tuned for throughput: a batch goes out at 1 MiB or
// 10000 messages, or 10 ms after its first message, whichever comes first.
const (
	produceFlushBytes     = 1 << 20
	produceFlushMessages  = 10000
	produceFlushFrequency = 10 * time.Millisecond
	produceChannelBuffer  = 4096
)

// errTopicMissing marks a topic the brokers neither have nor create.
var errTopicMissing = errors.New("topic does not exist")

func produceCommand() *cli.Command {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return &cli.Command{
		Name:  "produce",
		Usage: "send lines of standard input, or synthetic messages, to a Kafka topic",
		UsageText: "echo hello | fanout produce --kafka 127.0.0.1:9092 --topic user_need\n" +
			"fanout produce --topic user_need --key-separator : < keyed_lines.txt\n" +
			"fanout produce --topic user_need --count 100000 --size 200",
		Description: "Without --count, each line of standard input is one message; with --key-separator SEP the\n" +
			"text before the first SEP of a line is the message key (a line without SEP has no key).\n" +
			"With --count N, N synthetic messages of --size bytes are sent instead; each value starts with\n" +
			"\"SEQ UNIXNANOS \" (sequence number, produce time) so consumers can measure latency.\n" +
			"Progress goes to standard error every --progress; a summary to standard output at the end.\n" +
			"The exit code is 1 if any message failed.",
		Flags: append([]cli.Flag{
			&cli.StringSliceFlag{Name: "kafka", Usage: "Kafka bootstrap brokers host:port (default: Docker link variables KAFKA_*_PORT_9092_TCP_*, else localhost:9092)", EnvVars: env("KAFKA")},
			&cli.StringFlag{Name: "topic", Usage: "the topic to produce to (required)", EnvVars: env("TOPIC")},
			&cli.StringFlag{Name: "key-separator", Usage: "split each line at the first SEP into key and value"},
			&cli.IntFlag{Name: "count", Usage: "send this many synthetic messages instead of reading standard input"},
			&cli.IntFlag{Name: "size", Value: 100, Usage: fmt.Sprintf("bytes per synthetic message (at least %d)", minSyntheticSize)},
			&cli.IntFlag{Name: "partition", Value: -1, Usage: "send every message to this partition (default: by key hash, random without key)"},
			&cli.DurationFlag{Name: "progress", Value: time.Second, Usage: "print progress to standard error this often (0: never)"},
		}, kafkaSecurityFlags()...),
		Action:       produce,
		OnUsageError: commandUsageError,
	}
}

// produceOptions is what the produce command does, from its flags.
type produceOptions struct {
	brokers   []string
	topic     string
	keySep    string
	count     int
	size      int
	partition int32 // -1: any
	progress  time.Duration
	security  kafka.Security
}

func parseProduceOptions(c *cli.Context) (produceOptions, error) {
	o := produceOptions{
		brokers:   splitAll(c.StringSlice("kafka")),
		topic:     c.String("topic"),
		keySep:    c.String("key-separator"),
		count:     c.Int("count"),
		size:      c.Int("size"),
		partition: int32(c.Int("partition")),
		progress:  c.Duration("progress"),
	}
	if len(o.brokers) == 0 {
		o.brokers = linkedAddrs(environ(), "KAFKA", 9092)
	}
	if len(o.brokers) == 0 {
		o.brokers = []string{"localhost:9092"}
	}
	var errs []error
	if c.Args().Present() {
		errs = append(errs, fmt.Errorf("unexpected argument %q (messages come from standard input)", c.Args().First()))
	}
	sec, err := kafkaSecurity(environ(), contextValues(c))
	if err == nil {
		err = sec.Validate()
	}
	if err != nil {
		errs = append(errs, err)
	}
	o.security = sec
	if o.topic == "" {
		errs = append(errs, errors.New("--topic: required"))
	}
	for _, b := range o.brokers {
		if err := checkAddr(b); err != nil {
			errs = append(errs, fmt.Errorf("--kafka %q: %w", b, err))
		}
	}
	if o.count < 0 {
		errs = append(errs, fmt.Errorf("--count %d: must not be negative", o.count))
	}
	if c.IsSet("size") && o.count == 0 {
		errs = append(errs, errors.New("--size: only with --count"))
	}
	if o.size < minSyntheticSize {
		errs = append(errs, fmt.Errorf("--size %d: at least %d", o.size, minSyntheticSize))
	}
	if o.count > 0 && o.keySep != "" {
		errs = append(errs, errors.New("--key-separator: only without --count"))
	}
	if c.Int("partition") < -1 || c.Int("partition") > 1<<31-1 {
		errs = append(errs, fmt.Errorf("--partition %d: must not be negative", c.Int("partition")))
	}
	if o.progress < 0 {
		errs = append(errs, fmt.Errorf("--progress %s: must not be negative", o.progress))
	}
	return o, errors.Join(errs...)
}

// checkAddr reports whether a is host:port with both parts.
func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" || port == "" {
		return errors.New("want host:port")
	}
	return nil
}

// produce is the produce command's action.
func produce(c *cli.Context) error {
	o, err := parseProduceOptions(c)
	if err != nil {
		return usageError(err)
	}
	warn(c.App.ErrWriter, o.security.Warnings())
	var src messageSource
	if o.count > 0 {
		src = newSyntheticSource(o.topic, o.count, o.size, time.Now)
	} else {
		src = newLineSource(c.App.Reader, o.topic, o.keySep, produceMaxMessageBytes)
	}
	st, err := runProducer(c.Context, o, src, c.App.ErrWriter)
	if st.started {
		fmt.Fprintln(c.App.Writer, st.summary())
	}
	return err
}

// produceMaxMessageBytes is the largest message produce sends (sarama's and
// Kafka's default limit).
const produceMaxMessageBytes = 1 << 20

// produceStats counts what the producer reported.
type produceStats struct {
	sent    atomic.Int64 // handed to the producer
	acked   atomic.Int64 // acknowledged by Kafka
	bytes   atomic.Int64 // key and value bytes of acked messages
	failed  atomic.Int64
	started bool // the producer ran: the summary is worth printing
	elapsed time.Duration
}

func (s *produceStats) summary() string {
	secs := s.elapsed.Seconds()
	rate, mbps := 0.0, 0.0
	if secs > 0 {
		rate = float64(s.acked.Load()) / secs
		mbps = float64(s.bytes.Load()) / 1e6 / secs
	}
	line := fmt.Sprintf("produced %d messages, %d bytes in %.3f s: %.0f msg/s, %.2f MB/s",
		s.acked.Load(), s.bytes.Load(), secs, rate, mbps)
	if f := s.failed.Load(); f > 0 {
		line += fmt.Sprintf("; %d failed", f)
	}
	return line
}

// messageSource yields the messages to produce. next returns io.EOF after
// the last one, or ctx's error once ctx ends.
type messageSource interface {
	next(ctx context.Context) (*sarama.ProducerMessage, error)
}

// runProducer sends every message of src and waits for Kafka to acknowledge
// or fail each. It stops early when ctx ends: what was sent is flushed, and
// an unfinished --count is an error, an unfinished standard input is not
// (Ctrl-C ends it as Ctrl-D would).
func runProducer(ctx context.Context, o produceOptions, src messageSource, progress io.Writer) (*produceStats, error) {
	st := &produceStats{}
	start := time.Now()
	defer func() { st.elapsed = time.Since(start) }()

	cfg, err := o.security.Config("fanout-produce")
	if err != nil {
		return st, err
	}
	cfg.Producer.Flush.Bytes = produceFlushBytes
	cfg.Producer.Flush.Messages = produceFlushMessages
	cfg.Producer.Flush.Frequency = produceFlushFrequency
	cfg.Producer.Compression = sarama.CompressionNone
	cfg.Producer.MaxMessageBytes = produceMaxMessageBytes
	cfg.ChannelBufferSize = produceChannelBuffer
	// Unlike the daemon (which must not create the topic it consumes),
	// produce asks for a missing topic to be created, as Kafka's console
	// producer does; brokers do so only with auto.create.topics.enable.
	cfg.Metadata.AllowAutoTopicCreation = true
	if o.partition >= 0 {
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
	}

	client, err := sarama.NewClient(o.brokers, cfg)
	if err != nil {
		return st, fmt.Errorf("connect to Kafka: %w", kafka.DescribeError(o.brokers, o.security, err))
	}
	defer client.Close()
	if err := checkTopic(client, o.topic, o.partition); err != nil {
		return st, err
	}
	p, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		return st, fmt.Errorf("producer: %w", err)
	}

	st.started = true

	// Count what comes back until the producer closes both channels.
	var firstErr atomic.Pointer[error]
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		succ, errs := p.Successes(), p.Errors()
		for succ != nil || errs != nil {
			select {
			case m, ok := <-succ:
				if !ok {
					succ = nil
					continue
				}
				st.acked.Add(1)
				st.bytes.Add(int64(encLen(m.Key) + encLen(m.Value)))
			case pe, ok := <-errs:
				if !ok {
					errs = nil
					continue
				}
				st.failed.Add(1)
				err := error(pe)
				firstErr.CompareAndSwap(nil, &err)
			}
		}
	}()

	stopProgress := startProgress(o.progress, st, progress)
	feedErr := feed(ctx, p, src, o, st)
	p.AsyncClose()
	<-counted
	stopProgress()

	if feedErr != nil {
		return st, feedErr
	}
	if f := st.failed.Load(); f > 0 {
		return st, fmt.Errorf("%d of %d messages failed, the first: %w", f, st.sent.Load(), *firstErr.Load())
	}
	return st, nil
}

// feed hands src's messages to p until src ends, fails or ctx ends.
func feed(ctx context.Context, p sarama.AsyncProducer, src messageSource, o produceOptions, st *produceStats) error {
	for {
		if ctx.Err() != nil {
			if o.count > 0 {
				return fmt.Errorf("interrupted after %d of %d messages", st.sent.Load(), o.count)
			}
			return nil
		}
		m, err := src.next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if ctx.Err() != nil {
			continue // reported above
		}
		if err != nil {
			return err
		}
		if o.partition >= 0 {
			m.Partition = o.partition
		}
		select {
		case p.Input() <- m:
			st.sent.Add(1)
		case <-ctx.Done():
		}
	}
}

// startProgress prints a progress line to w every interval until stop is
// called. An interval of 0 prints nothing.
func startProgress(interval time.Duration, st *produceStats, w io.Writer) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		start, lastN, lastAt := time.Now(), int64(0), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := st.acked.Load()
				rate := float64(n-lastN) / now.Sub(lastAt).Seconds()
				fmt.Fprintf(w, "produce: %d messages, %.1f MB, %.0f msg/s (%s)\n",
					n, float64(st.bytes.Load())/1e6, rate, now.Sub(start).Round(time.Second))
				lastN, lastAt = n, now
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// checkTopic fails fast, with advice, when the brokers neither have topic
// nor create it on request, and then waits (with the client's metadata
// retries) until every partition has a leader. partition, when not -1, must
// exist.
func checkTopic(client sarama.Client, topic string, partition int32) error {
	b := client.LeastLoadedBroker()
	if b == nil {
		return errors.New("no Kafka broker reachable")
	}
	req := sarama.NewMetadataRequest(client.Config().Version, []string{topic})
	req.AllowAutoTopicCreation = client.Config().Metadata.AllowAutoTopicCreation
	resp, err := b.GetMetadata(req)
	if err != nil {
		return fmt.Errorf("metadata of topic %q from %s: %w", topic, b.Addr(), err)
	}
	for _, t := range resp.Topics {
		if t.Name == topic && errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition) {
			return fmt.Errorf("%w: %q on %s, and the brokers do not create topics on demand "+
				"(auto.create.topics.enable=false): create it, e.g. "+
				"kafka-topics.sh --bootstrap-server %s --create --topic %s --partitions 8",
				errTopicMissing, topic, b.Addr(), b.Addr(), topic)
		}
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return fmt.Errorf("partitions of topic %q: %w", topic, err)
	}
	if partition >= 0 && int(partition) >= len(parts) {
		return fmt.Errorf("--partition %d: topic %q has %d partitions (0..%d)", partition, topic, len(parts), len(parts)-1)
	}
	return nil
}

// encLen is e's length, 0 for nil.
func encLen(e sarama.Encoder) int {
	if e == nil {
		return 0
	}
	return e.Length()
}

// lineSource yields one message per line of r. A goroutine reads r, so
// that next returns when ctx ends even while a read blocks (a terminal);
// that goroutine then ends with the read, or with the process.
type lineSource struct {
	topic    string
	sep      []byte
	r        io.Reader
	maxBytes int
	lines    chan []byte
	err      error // why lines was closed; read after it is
}

func newLineSource(r io.Reader, topic, sep string, maxBytes int) *lineSource {
	s := &lineSource{topic: topic, r: r, maxBytes: maxBytes}
	if sep != "" {
		s.sep = []byte(sep)
	}
	return s
}

// read sends each line of s.r to s.lines until the input ends or ctx ends.
func (s *lineSource) read(ctx context.Context) {
	defer close(s.lines)
	sc := bufio.NewScanner(s.r)
	sc.Buffer(make([]byte, 0, 64<<10), s.maxBytes)
	for sc.Scan() {
		select {
		case s.lines <- bytes.Clone(sc.Bytes()):
		case <-ctx.Done():
			return
		}
	}
	if err := sc.Err(); err != nil {
		s.err = fmt.Errorf("read standard input: %w", err)
	}
}

func (s *lineSource) next(ctx context.Context) (*sarama.ProducerMessage, error) {
	if s.lines == nil {
		s.lines = make(chan []byte, 256)
		go s.read(ctx)
	}
	var line []byte
	select {
	case l, ok := <-s.lines:
		if !ok {
			if s.err != nil {
				return nil, s.err
			}
			return nil, io.EOF
		}
		line = l
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m := &sarama.ProducerMessage{Topic: s.topic}
	if s.sep != nil {
		if k, v, ok := bytes.Cut(line, s.sep); ok {
			m.Key = sarama.ByteEncoder(k)
			line = v
		}
	}
	m.Value = sarama.ByteEncoder(line)
	return m, nil
}

// syntheticSource yields count messages of size bytes with a header.
type syntheticSource struct {
	topic       string
	count, size int
	seq         int
	now         func() time.Time
}

func newSyntheticSource(topic string, count, size int, now func() time.Time) *syntheticSource {
	return &syntheticSource{topic: topic, count: count, size: size, now: now}
}

func (s *syntheticSource) next(context.Context) (*sarama.ProducerMessage, error) {
	if s.seq >= s.count {
		return nil, io.EOF
	}
	v := syntheticValue(s.seq, s.now(), s.size)
	s.seq++
	return &sarama.ProducerMessage{Topic: s.topic, Value: sarama.ByteEncoder(v)}, nil
}

// syntheticValue is "SEQ UNIXNANOS " padded with '.' to size bytes (never
// shorter than the header).
func syntheticValue(seq int, at time.Time, size int) []byte {
	v := make([]byte, 0, size)
	v = strconv.AppendInt(v, int64(seq), 10)
	v = append(v, ' ')
	v = strconv.AppendInt(v, at.UnixNano(), 10)
	v = append(v, ' ')
	for len(v) < size {
		v = append(v, syntheticPad)
	}
	return v
}

// parseSynthetic reads the sequence number and produce time from a value
// made by syntheticValue; ok is false for any other value.
func parseSynthetic(v []byte) (seq int, at time.Time, ok bool) {
	s, rest, ok1 := bytes.Cut(v, []byte{' '})
	ns, _, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 {
		return 0, time.Time{}, false
	}
	n, err1 := strconv.Atoi(string(s))
	t, err2 := strconv.ParseInt(string(ns), 10, 64)
	if err1 != nil || err2 != nil || n < 0 {
		return 0, time.Time{}, false
	}
	return n, time.Unix(0, t), true
}
