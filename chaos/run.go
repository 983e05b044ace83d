package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// Config configures one run in one assignment mode.
type Config struct {
	Services *Services
	Out      string // this run's directory: logs, results
	Fanout   string // the daemon binary
	Self     string // the chaos binary, run as `chaos client` for the clients
	// Python, when set, is the interpreter of one more acking client on the
	// Python client (Root/clients/python), running Root/chaos/pyclient.py.
	Python string
	Root   string
	Mode   string // leader or spread
	// Store is the daemons' --offset-store: "zookeeper" (the default) or
	// "kafka", with which the daemons get no ZooKeeper and the ZooKeeper
	// faults are not drawn.
	Store      string
	Seed       uint64
	Duration   time.Duration // of the fault phase
	Interval   time.Duration // mean time between fault starts
	Daemons    int
	Clients    int // acking clients, beside the silent one and the nacking one
	Partitions int
	Rate       int // messages produced per second
	AckTimeout time.Duration
	Drain      time.Duration // most time to wait for every record to be acked
	// MaxAttempts is the daemons' --max-attempts, with a dead-letter topic
	// of the run's own (0: none). PoisonShare is the share of the records
	// produced as poison (PoisonPrefix), which every client nacks.
	MaxAttempts int
	PoisonShare float64
	// NackRedeliver is the delay the nacking client asks for in its nacks.
	NackRedeliver time.Duration
}

// Name names the run by its mode and, when not the default, its store:
// "leader", "spread-kafka".
func (c Config) Name() string {
	if k, err := authority.Lookup(c.Store); err == nil && k.Name != authority.Kinds()[0].Name {
		return c.Mode + "-" + k.Name
	}
	return c.Mode
}

// kafkaStore reports whether the daemons' store is not ZooKeeper (then
// they get no ZooKeeper, and no ZooKeeper fault is drawn).
func (c Config) kafkaStore() bool {
	k, err := authority.Lookup(c.Store)
	return err == nil && !k.ZooKeeper
}

// run is the state of one run.
type run struct {
	cfg     Config
	log     *logrus.Entry
	g       actor.Group
	id      string
	topic   string
	dlq     string // the dead-letter topic, "" without one
	daemons []*proc
	clients []*proc

	kafkaProxy    *Proxy   // daemon 0's whole Kafka traffic
	zkProxies     []*Proxy // per daemon
	clientProxies []*Proxy // per daemon, the address it advertises

	admin    sarama.ClusterAdmin
	kclient  sarama.Client
	refresh  atomic.Bool // the producer must refresh the topic's metadata
	produced atomic.Int64

	mu        sync.Mutex // guards the fields below
	faults    []Fault
	samples   []OffsetSample
	committed map[int32]int64
	owners    []OwnerSample
	sent      []Record          // acknowledged by Kafka to the producer
	members   map[string]string // a daemon's advertised address → its role
	leader    string
	svcBusy   bool
	skipped   int
}

// Run runs cfg: the cluster, the clients, the producer, the faults, the drain
// and the verification. It returns the summary, written to cfg.Out too.
func Run(ctx context.Context, cfg Config, log *logrus.Entry) (*Summary, error) {
	r := &run{cfg: cfg, log: log, id: "chaos-" + cfg.Name(),
		topic: fmt.Sprintf("chaos-%s-%d", cfg.Name(), cfg.Seed), committed: map[int32]int64{}, members: map[string]string{}}
	if cfg.MaxAttempts > 0 {
		r.dlq = r.topic + ".dlq"
	}
	// A fresh directory: the client logs are appended to, and verified whole.
	if err := os.RemoveAll(cfg.Out); err != nil {
		return nil, err
	}
	for _, d := range []string{"daemons", "clients"} {
		if err := os.MkdirAll(filepath.Join(cfg.Out, d), 0o755); err != nil {
			return nil, err
		}
	}
	defer r.g.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer r.stopAll()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	defer r.kclient.Close()
	defer r.admin.Close()

	start := time.Now()
	var prodWG, sampWG actor.Group
	prodCtx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	prodWG.Go(log, "producer", func() { r.produce(prodCtx) }, nil)
	sampCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	sampWG.Go(log, "sampler", func() { r.sample(sampCtx) }, nil)

	// Warm up, then the faults, then a quiet spell with everything healed.
	if !backoff.Sleep(ctx, 5*time.Second) {
		return nil, ctx.Err()
	}
	var without []string
	if cfg.kafkaStore() {
		without = []string{FaultZKRestart, FaultCutZooKeeper}
	}
	plan := Schedule(cfg.Seed, cfg.Duration, cfg.Interval, without...)
	log.WithField("faults", len(plan)).Info("fault phase")
	var faults actor.Group
	t0 := time.Now()
	for i, pl := range plan {
		if !backoff.Sleep(ctx, time.Until(t0.Add(pl.At))) {
			break
		}
		log.Infof("fault %d/%d: %s", i+1, len(plan), pl)
		faults.Go(log, "fault "+pl.Kind, func() { r.inject(ctx, pl) }, nil)
	}
	faults.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, p := range slices.Concat(r.daemons, r.clients) {
		if !p.running() {
			log.Warnf("%s was not running after the faults: restarting it", p.role)
			if err := p.start(); err != nil {
				return nil, err
			}
		}
	}
	backoff.Sleep(ctx, 5*time.Second)
	stopProducer()
	prodWG.Wait()
	log.WithField("produced", r.produced.Load()).Info("producer stopped; draining")
	drained := r.drain(ctx)
	stopSampler()
	sampWG.Wait()
	end := time.Now()
	for _, c := range r.clients {
		c.stop(syscall.SIGTERM, 10*time.Second)
	}
	for _, d := range r.daemons {
		d.stop(syscall.SIGTERM, 30*time.Second)
	}

	msgs, err := r.readTopic(r.topic)
	if err != nil {
		return nil, err
	}
	records := make([]Record, len(msgs))
	for i, m := range msgs {
		records[i] = Record{Partition: m.Partition, Offset: m.Offset, At: m.Timestamp, Value: string(m.Value)}
	}
	var deadLetters []DeadLetter
	if r.dlq != "" {
		msgs, err := r.readTopic(r.dlq)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			deadLetters = append(deadLetters, deadLetterOf(m))
		}
	}
	events, err := readEvents(filepath.Join(cfg.Out, "clients"))
	if err != nil {
		return nil, err
	}
	deliveries, bad, err := readDeliveryLogs(filepath.Join(cfg.Out, "daemons"))
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	in := Input{Records: records, Events: events, Faults: slices.Clone(r.faults), Samples: slices.Clone(r.samples),
		Owners: slices.Clone(r.owners), Members: r.members, Sent: slices.Clone(r.sent), AckTimeout: cfg.AckTimeout,
		Topic: r.topic, DeadLetters: deadLetters, MaxAttempts: cfg.MaxAttempts, NackDelays: map[string]time.Duration{"nacker": cfg.NackRedeliver},
		Deliveries: deliveries, DeliveryLogBad: bad, Liveness: daemonLiveness}
	skipped := r.skipped
	r.mu.Unlock()
	if err := writeInput(filepath.Join(cfg.Out, "input.json"), in); err != nil {
		return nil, err
	}
	res := Verify(in, cfg.Mode == "leader")
	sum := summarize(cfg, in, res, start, end, drained, skipped)
	if err := sum.Write(cfg.Out, in, start, end); err != nil {
		return sum, err
	}
	return sum, nil
}

// setup creates the topic and starts the proxies, the daemons and the clients.
func (r *run) setup(ctx context.Context) error {
	cfg := r.cfg
	kcfg, err := kafka.Security{}.Config("chaos")
	if err != nil {
		return err
	}
	kcfg.Producer.Return.Successes = true
	kcfg.Producer.RequiredAcks = sarama.WaitForAll
	kcfg.Producer.Retry.Max = 10
	kcfg.Producer.Partitioner = sarama.NewHashPartitioner
	if r.kclient, err = sarama.NewClient([]string{cfg.Services.Kafka()}, kcfg); err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	if r.admin, err = sarama.NewClusterAdminFromClient(r.kclient); err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	if err := r.admin.CreateTopic(r.topic, &sarama.TopicDetail{NumPartitions: int32(cfg.Partitions), ReplicationFactor: 1}, false); err != nil {
		return fmt.Errorf("create topic %s: %w", r.topic, err)
	}
	if r.dlq != "" {
		// LogAppendTime: a dead letter's timestamp is when it was stored (the
		// daemon gives it the original's), which the verification needs.
		appendTime := "LogAppendTime"
		if err := r.admin.CreateTopic(r.dlq, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: map[string]*string{"message.timestamp.type": &appendTime}}, false); err != nil {
			return fmt.Errorf("create topic %s: %w", r.dlq, err)
		}
	}
	base := cfg.Services.PortBase
	if r.kafkaProxy, err = NewProxy(cfg.Services.KafkaAdvertised(), cfg.Services.KafkaProxied(), r.log); err != nil {
		return err
	}
	var members []string
	for i := range cfg.Daemons {
		listen := fmt.Sprintf("127.0.0.1:%d", base+200+i)
		cp, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", base+210+i), listen, r.log)
		if err != nil {
			return err
		}
		zp, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", base+220+i), cfg.Services.ZooKeeper(), r.log)
		if err != nil {
			return err
		}
		r.clientProxies, r.zkProxies = append(r.clientProxies, cp), append(r.zkProxies, zp)
		members = append(members, cp.Addr())
		kafkaAddr := cfg.Services.Kafka()
		if i == 0 {
			kafkaAddr = cfg.Services.KafkaAdvertised()
		}
		store := []string{"--zookeeper", zp.Addr(), "--zookeeper-session-timeout", "6s"}
		if cfg.kafkaStore() {
			store = []string{"--offset-store", "kafka", "--kafka-session-timeout", "6s"}
		}
		args := append([]string{"--id", r.id, "--topic", r.topic, "--kafka", kafkaAddr,
			"--listen", listen, "--advertise", cp.Addr(), "--node-id", "d" + strconv.Itoa(i),
			"--metrics-listen", "", "--ack-timeout", cfg.AckTimeout.String(), "--heartbeat", "1s",
			"--initial-offset", "oldest", "--commit-interval", "500ms",
			"--delivery-log", filepath.Join(cfg.Out, "daemons", fmt.Sprintf("d%d%s", i, deliveryLogExt))}, store...)
		args = append(args, "--assignment", cfg.Mode)
		if r.dlq != "" {
			args = append(args, "--max-attempts", strconv.Itoa(cfg.MaxAttempts), "--dead-letter-topic", r.dlq)
		}
		r.members[cp.Addr()] = "d" + strconv.Itoa(i)
		r.daemons = append(r.daemons, &proc{role: "d" + strconv.Itoa(i), bin: cfg.Fanout, g: &r.g, lg: r.log,
			args: func(int) []string { return args }, log: filepath.Join(cfg.Out, "daemons", fmt.Sprintf("d%d.log", i))})
	}
	addClient := func(role, mode string, inFlight, workers int, extra ...string) {
		r.clients = append(r.clients, &proc{role: role, bin: cfg.Self, g: &r.g, lg: r.log,
			log: filepath.Join(cfg.Out, "clients", role+".out"),
			args: func(inc int) []string {
				args := []string{"client", "--addrs", strings.Join(members, ","), "--name", fmt.Sprintf("%s.%d", role, inc),
					"--log", filepath.Join(cfg.Out, "clients", role+".log"), "--mode", mode,
					"--seed", strconv.FormatUint(cfg.Seed+uint64(inc)*1000+uint64(len(role)), 10),
					"--max-in-flight", strconv.Itoa(inFlight), "--workers", strconv.Itoa(workers)}
				return append(args, extra...)
			}})
	}
	for i := range cfg.Clients {
		addClient("c"+strconv.Itoa(i), ModeAck, 16, 4)
	}
	if cfg.Python != "" {
		r.clients = append(r.clients, &proc{role: "py0", bin: cfg.Python, g: &r.g, lg: r.log,
			log: filepath.Join(cfg.Out, "clients", "py0.out"),
			env: []string{"PYTHONPATH=" + filepath.Join(cfg.Root, "clients", "python", "src")},
			args: func(inc int) []string {
				return []string{filepath.Join(cfg.Root, "chaos", "pyclient.py"), "--addrs", strings.Join(members, ","),
					"--name", fmt.Sprintf("py0.%d", inc), "--log", filepath.Join(cfg.Out, "clients", "py0.log"),
					"--seed", strconv.FormatUint(cfg.Seed+uint64(inc), 10)}
			}})
	}
	addClient("silent", ModeSilent, 4, 1)
	addClient("nacker", ModeNack, 8, 2, "--nack-redeliver", cfg.NackRedeliver.String())
	for _, p := range slices.Concat(r.daemons, r.clients) {
		if err := p.start(); err != nil {
			return err
		}
	}
	return nil
}

// stopAll ends every process and proxy of the run (at its end or on failure).
func (r *run) stopAll() {
	for _, p := range slices.Concat(r.clients, r.daemons) {
		p.stop(syscall.SIGKILL, time.Second)
	}
	for _, p := range slices.Concat([]*Proxy{r.kafkaProxy}, r.zkProxies, r.clientProxies) {
		if p != nil {
			p.Close()
		}
	}
}

// produce writes sequence-numbered records at cfg.Rate until ctx ends.
func (r *run) produce(ctx context.Context) {
	prod, err := sarama.NewSyncProducerFromClient(r.kclient)
	if err != nil {
		r.log.WithError(err).Error("producer")
		return
	}
	defer prod.Close()
	const tick = 20 * time.Millisecond
	perTick := max(1, r.cfg.Rate*int(tick/time.Millisecond)/1000)
	t := time.NewTicker(tick)
	defer t.Stop()
	var seq int64
	var failed int
	poisonEvery := int64(0) // every n-th record is poison
	if r.cfg.PoisonShare > 0 && r.dlq != "" {
		poisonEvery = max(1, int64(1/r.cfg.PoisonShare))
	}
	for {
		select {
		case <-ctx.Done():
			r.log.WithField("failed_sends", failed).Info("producer done")
			return
		case <-t.C:
		}
		if r.refresh.Swap(false) {
			_ = r.kclient.RefreshMetadata(r.topic)
		}
		batch := make([]*sarama.ProducerMessage, perTick)
		for i := range batch {
			seq++
			s := strconv.FormatInt(seq, 10)
			v := s
			if poisonEvery > 0 && seq%poisonEvery == 0 {
				v = PoisonPrefix + s
			}
			batch[i] = &sarama.ProducerMessage{Topic: r.topic, Key: sarama.StringEncoder(s), Value: sarama.StringEncoder(v)}
		}
		// Kafka is the truth: a failed send may still have landed, and the
		// verification reads what the topic holds.
		if err := prod.SendMessages(batch); err != nil {
			failed++
			continue
		}
		r.produced.Add(int64(len(batch)))
		now := time.Now()
		r.mu.Lock()
		for _, m := range batch {
			r.sent = append(r.sent, Record{Partition: m.Partition, Offset: m.Offset, At: now})
		}
		r.mu.Unlock()
	}
}

// sample reads the committed offsets, the leader record and, in spread
// mode, who holds each partition, every 250 ms, from the run's store.
func (r *run) sample(ctx context.Context) {
	opts := fanout.Options{ID: r.id, Topic: r.topic, OffsetStore: r.cfg.Store, Kafka: []string{r.cfg.Services.Kafka()}}
	if !r.cfg.kafkaStore() {
		opts.ZooKeeper = []string{r.cfg.Services.ZooKeeper()}
	}
	var auth authority.Authority
	err := backoff.Retry(ctx, backoff.Backoff{Min: 250 * time.Millisecond, Max: 2 * time.Second}, func(ctx context.Context) error {
		var err error
		auth, err = fanout.OpenAuthority(ctx, opts, r.kclient)
		return err
	}, nil)
	if err != nil {
		r.log.WithError(err).Error("sampler: the offset store")
		return
	}
	defer auth.Close()
	owners, _ := auth.Owners()
	for backoff.Sleep(ctx, 250*time.Millisecond) {
		offs, err := auth.Offsets().Load(ctx)
		at := time.Now()
		if err == nil {
			r.mu.Lock()
			for p, o := range offs {
				r.samples = append(r.samples, OffsetSample{At: at, Partition: p, Offset: o})
				r.committed[p] = o
			}
			r.mu.Unlock()
		}
		if r.cfg.Mode == "spread" && owners != nil {
			held, err := owners.Read(ctx)
			at := time.Now()
			if err == nil {
				r.mu.Lock()
				for p, h := range held.Holders {
					r.owners = append(r.owners, OwnerSample{At: at, Partition: p, Owner: h.Node})
				}
				r.mu.Unlock()
			}
		}
		if l, err := auth.Leader(ctx); err == nil && l != nil {
			r.mu.Lock()
			r.leader = l.Node
			r.mu.Unlock()
		}
	}
}

// drain waits until the committed offsets reach the high-water marks, which
// means every record was acked; false after cfg.Drain.
func (r *run) drain(ctx context.Context) bool {
	deadline := time.Now().Add(r.cfg.Drain)
	for time.Now().Before(deadline) {
		if r.drained() {
			return true
		}
		if !backoff.Sleep(ctx, 500*time.Millisecond) {
			return false
		}
	}
	r.log.Warnf("not drained after %s", r.cfg.Drain)
	return false
}

func (r *run) drained() bool {
	if err := r.kclient.RefreshMetadata(r.topic); err != nil {
		return false
	}
	parts, err := r.kclient.Partitions(r.topic)
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range parts {
		hw, err := r.kclient.GetOffset(r.topic, p, sarama.OffsetNewest)
		if err != nil || r.committed[p] < hw {
			return false
		}
	}
	return true
}

// deadLetterOf reads a record of the dead-letter topic.
func deadLetterOf(m *sarama.ConsumerMessage) DeadLetter {
	dl := DeadLetter{At: m.Timestamp, Offset: -1, Value: string(m.Value)}
	var p, o int64 = -1, -1
	for _, h := range m.Headers {
		var err error
		switch string(h.Key) {
		case kafka.HeaderDeadLetterTopic:
			dl.Topic = string(h.Value)
		case kafka.HeaderDeadLetterPartition:
			if p, err = strconv.ParseInt(string(h.Value), 10, 32); err != nil {
				p = -1
			}
		case kafka.HeaderDeadLetterOffset:
			if o, err = strconv.ParseInt(string(h.Value), 10, 64); err != nil {
				o = -1
			}
		}
	}
	if p >= 0 && o >= 0 {
		dl.Partition, dl.Offset = int32(p), o
	}
	return dl
}

// readTopic reads every record of a topic.
func (r *run) readTopic(topic string) ([]*sarama.ConsumerMessage, error) {
	if err := r.kclient.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := r.kclient.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(r.kclient)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	var out []*sarama.ConsumerMessage
	for _, p := range parts {
		hw, err := r.kclient.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("high-water mark of %s/%d: %w", topic, p, err)
		}
		oldest, err := r.kclient.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("oldest offset of %s/%d: %w", topic, p, err)
		}
		if hw <= oldest {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, oldest)
		if err != nil {
			return nil, fmt.Errorf("read %s/%d: %w", topic, p, err)
		}
		timeout := time.After(time.Minute)
	read:
		for {
			select {
			case m := <-pc.Messages():
				out = append(out, m)
				if m.Offset+1 >= hw {
					break read
				}
			case <-timeout:
				pc.Close()
				return nil, fmt.Errorf("read %s/%d: timed out before offset %d", topic, p, hw)
			}
		}
		pc.Close()
	}
	return out, nil
}

// writeInput keeps what the verification read from Kafka and the run
// (records, faults, offset samples) beside the client logs, so that a run
// can be verified again (chaos verify) after its servers are gone.
func writeInput(name string, in Input) error {
	saved := in
	saved.Events = nil // in the client logs
	b, err := json.Marshal(saved)
	if err != nil {
		return err
	}
	return os.WriteFile(name, b, 0o644)
}

// VerifyDir verifies again, with this code, the run whose results are in
// dir, and rewrites its summary and timeline: a run of a long soak is not
// lost to a fix of the verification.
func VerifyDir(dir string) (*Summary, error) {
	var in Input
	var sum Summary
	for name, v := range map[string]any{"input.json": &in, "summary.json": &sum} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", dir, name, err)
		}
	}
	var err error
	if in.Events, err = readEvents(filepath.Join(dir, "clients")); err != nil {
		return nil, err
	}
	if in.Deliveries, in.DeliveryLogBad, err = readDeliveryLogs(filepath.Join(dir, "daemons")); err != nil {
		return nil, err
	}
	start := sum.Started
	end := start.Add(time.Duration(sum.Seconds * float64(time.Second)))
	cfg := Config{Mode: sum.Mode, Store: sum.Store, Seed: sum.Seed, Daemons: sum.Daemons, Clients: sum.Clients - 2, Rate: sum.Rate}
	res := Verify(in, sum.Mode == "leader")
	out := summarize(cfg, in, res, start, end, sum.Drained, sum.Skipped)
	out.Command, out.Clients = sum.Command, sum.Clients
	return out, out.Write(dir, in, start, end)
}

// readEvents reads every client log of dir.
func readEvents(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	var out []Event
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		evs, err := ParseEvents(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, evs...)
	}
	return out, nil
}

// deliveryLogExt ends the name of a daemon's delivery log (--delivery-log),
// d0.delivery.log for d0, in the run's daemons directory.
const deliveryLogExt = ".delivery.log"

// daemonLiveness is the daemons' client liveness window: --heartbeat 1s
// (given below) × --liveness 2 (the default).
const daemonLiveness = 2 * time.Second

// readDeliveryLogs reads the daemons' delivery logs of dir, by node id (the
// file's name), and the number of lines that could not be read.
func readDeliveryLogs(dir string) (map[string][]deliverylog.Event, int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"+deliveryLogExt))
	if err != nil {
		return nil, 0, err
	}
	out := map[string][]deliverylog.Event{}
	bad := 0
	for _, name := range files {
		evs, n, err := deliverylog.ReadFile(name)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		out[strings.TrimSuffix(filepath.Base(name), deliveryLogExt)] = evs
		bad += n
	}
	return out, bad, nil
}

// record appends a fault that has ended.
func (r *run) record(f Fault) {
	f.End = time.Now()
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
	r.log.Infof("healed: %s %s after %s", f.Kind, f.Target, f.End.Sub(f.Start).Round(time.Millisecond))
}

func (r *run) skip(pl Planned, why string) {
	r.mu.Lock()
	r.skipped++
	r.mu.Unlock()
	r.log.Infof("skipped %s: %s", pl, why)
}

// pick claims a process among ps: the leader for Pick -1 when free, else the
// Pick-th free one.
func (r *run) pick(ps []*proc, pick int) *proc {
	r.mu.Lock()
	leader := r.leader
	r.mu.Unlock()
	if pick < 0 {
		for _, p := range ps {
			if p.role == leader && p.claim() {
				return p
			}
		}
		pick = 0
	}
	for i := range ps {
		p := ps[(pick+i)%len(ps)]
		if p.claim() {
			return p
		}
	}
	return nil
}

// inject applies one planned fault and heals it.
func (r *run) inject(ctx context.Context, pl Planned) {
	f := Fault{Kind: pl.Kind, Start: time.Now()}
	switch pl.Kind {
	case FaultDaemonKill, FaultDaemonTerm, FaultDaemonStop, FaultClientKill, FaultClientTerm, FaultClientStop:
		ps := r.daemons
		if clientFault(pl.Kind) {
			ps = r.clients
		}
		p := r.pick(ps, pl.Pick)
		if p == nil {
			r.skip(pl, "every target is held by another fault")
			return
		}
		defer p.release()
		r.mu.Lock()
		f.Target, f.Leader = p.role, p.role == r.leader && daemonFault(pl.Kind)
		r.mu.Unlock()
		f.Start = time.Now()
		switch pl.Kind {
		case FaultDaemonStop, FaultClientStop:
			p.signal(syscall.SIGSTOP)
			backoff.Sleep(ctx, pl.Duration)
			p.signal(syscall.SIGCONT)
		default:
			sig := syscall.SIGKILL
			if pl.Kind == FaultDaemonTerm || pl.Kind == FaultClientTerm {
				sig = syscall.SIGTERM
			}
			p.stop(sig, 30*time.Second)
			backoff.Sleep(ctx, pl.Duration)
			if err := p.start(); err != nil {
				r.log.WithError(err).Error("restart")
			}
		}
	case FaultKafkaRestart, FaultZKRestart:
		name := "kafka"
		if pl.Kind == FaultZKRestart {
			name = "zookeeper"
		}
		r.mu.Lock()
		busy := r.svcBusy
		r.svcBusy = true
		r.mu.Unlock()
		if busy {
			r.skip(pl, "a server restart is under way")
			return
		}
		defer func() { r.mu.Lock(); r.svcBusy = false; r.mu.Unlock() }()
		f.Target = name
		if err := r.cfg.Services.Restart(ctx, name, pl.Pick%2 == 0); err != nil {
			r.log.WithError(err).Error("server restart")
		}
	case FaultCutKafka, FaultCutZooKeeper, FaultCutClients:
		px, i := r.kafkaProxy, 0
		switch pl.Kind {
		case FaultCutZooKeeper:
			i = pl.Pick % len(r.zkProxies)
			px = r.zkProxies[i]
		case FaultCutClients:
			i = pl.Pick % len(r.clientProxies)
			px = r.clientProxies[i]
		}
		f.Target = "d" + strconv.Itoa(i)
		r.mu.Lock()
		f.Leader = f.Target == r.leader
		r.mu.Unlock()
		px.Cut()
		backoff.Sleep(ctx, pl.Duration)
		px.Heal()
	case FaultAddPartitions:
		f.Target = r.topic
		parts, err := r.kclient.Partitions(r.topic)
		if err == nil {
			err = r.admin.CreatePartitions(r.topic, int32(len(parts)+2), nil, false)
		}
		if err != nil && !errors.Is(err, sarama.ErrInvalidPartitions) {
			r.log.WithError(err).Error("add partitions")
			return
		}
		r.refresh.Store(true)
	}
	r.record(f)
}
