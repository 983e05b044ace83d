package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// plan is what one run measures.
type plan struct {
	Quick       bool          `json:"quick"`
	Sizes       []int         `json:"sizes"`          // record sizes, bytes
	Messages    map[int]int   `json:"messages"`       // per size
	Ks          []int         `json:"consumers"`      // clients (C) and share threads (D)
	InFlight    int           `json:"max_in_flight"`  // credit of each fanout client
	Rates       []int         `json:"latency_rates"`  // msg/s
	RateFor     time.Duration `json:"latency_window"` // per rate
	LatencySize int           `json:"latency_size"`
	IdleConns   int           `json:"idle_clients"` // without Scaling: one run of this many
	IdleFor     time.Duration `json:"idle_window"`
	// Scaling is what the scaling measurements run (nil: none).
	Scaling *scalingPlan `json:"scaling,omitempty"`
	// The Python client (P): for each flavor (threads, asyncio) and number
	// of client processes, the first PyMessages messages of each topic
	// (all of them when fewer).
	PyFlavors  []string `json:"python_flavors"`
	PyKs       []int    `json:"python_consumers"`
	PyMessages int      `json:"python_messages"`
	// Spread mode (E): the same topics drained by each number of members,
	// with SpreadClients client processes each connected to every member,
	// with the ZooKeeper store (Members) and the Kafka store (KafkaMembers).
	Members       []int `json:"spread_members"`
	KafkaMembers  []int `json:"spread_members_kafka"`
	SpreadClients int   `json:"spread_clients"`
	// SpreadOnly measures only B (the ceiling) and E, on data of the
	// plan's sizes (--spread).
	SpreadOnly bool `json:"spread_only,omitempty"`
	// ClientsOnly measures only B and the clients (C and the Python
	// client), on data of the plan's sizes (--clients).
	ClientsOnly bool `json:"clients_only,omitempty"`
	// ScalingOnly measures only how the daemon's costs grow (--scaling).
	ScalingOnly bool `json:"scaling_only,omitempty"`
	// ShareKs are D's thread counts (nil: Ks), and ToolsOnce measures A
	// and D (Kafka's own tools) on the first size only: a quick run checks
	// that they work, not what they measure.
	ShareKs   []int `json:"share_threads,omitempty"`
	ToolsOnce bool  `json:"kafka_tools_once,omitempty"`
}

func fullPlan() plan {
	return plan{Sizes: []int{100, 1024}, Messages: map[int]int{100: 2_000_000, 1024: 500_000},
		Ks: []int{1, 4, 16}, InFlight: 1000, Rates: []int{1000, 10000}, RateFor: 10 * time.Second,
		PyFlavors: []string{"threads", "asyncio"}, PyKs: []int{1, 4, 16}, PyMessages: 300_000,
		Scaling: &scalingPlan{Partitions: []int{8, 128, 1024}, PartMessages: 4_000_000, PartSize: 100, PartClients: 4,
			PartIdle: 10 * time.Second, Idle: []int{100, 1000, 10000}, Busy: []int{100, 1000, 10000}, BusyCredit: 10,
			BusyMessages: 1_000_000, BusyTurn: 10},
		LatencySize: 100, IdleConns: 10000, IdleFor: 20 * time.Second, Members: []int{1, 2, 3}, KafkaMembers: []int{1, 2, 3},
		SpreadClients: 4}
}

func quickPlan() plan {
	return plan{Quick: true, Sizes: []int{100, 1024}, Messages: map[int]int{100: 20000, 1024: 20000},
		Ks: []int{1, 4}, InFlight: 1000, Rates: []int{1000}, RateFor: 3 * time.Second,
		PyFlavors: []string{"threads", "asyncio"}, PyKs: []int{1}, PyMessages: 20000,
		Scaling: &scalingPlan{Partitions: []int{8, 64}, PartMessages: 20000, PartSize: 100, PartClients: 4,
			PartIdle: 2 * time.Second, Idle: []int{500}, Busy: []int{50}, BusyCredit: 10, BusyMessages: 20000, BusyTurn: 10},
		LatencySize: 100, IdleConns: 500, IdleFor: 6 * time.Second, Members: []int{1, 2, 3}, KafkaMembers: []int{3},
		SpreadClients: 4, ShareKs: []int{1}, ToolsOnce: true}
}

// env is where the driver finds the servers, the tools and its own binaries.
type env struct {
	kafka, zk string
	libs      string // Kafka jars
	fanout    string // the daemon binary
	self      string // this binary, for worker processes
	python    string // the Python interpreter of the Python client's runs ("": none)
	pyclient  string // bench/pyclient.py
	out       string // bench-results
	runID     string
	perf      bool // profile the daemon and a client with perf during C on the largest size, and the daemon during each partitions run
	admin     sarama.ClusterAdmin
	client    sarama.Client
	topics    []string // created by this run (and the daemons' fanout_<id>_<topic>), deleted at the end
}

// deleteTopics removes this run's topics from the shared broker (best effort).
func (e *env) deleteTopics() {
	for _, t := range e.topics {
		if err := e.admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			say("could not delete topic %s: %v", t, err)
		}
	}
}

func runDriver(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	quick := fs.Bool("quick", false, "small data; asserts only that every message arrived")
	spreadOnly := fs.Bool("spread", false, "measure only the plain sarama consumer (B) and spread mode (E)")
	clientsOnly := fs.Bool("clients", false, "measure only the plain sarama consumer (B) and the clients (C, the Python client)")
	scalingOnly := fs.Bool("scaling", false, "measure only how the daemon's costs grow with partitions and clients")
	var e env
	fs.StringVar(&e.kafka, "kafka", "127.0.0.1:9092", "Kafka bootstrap broker")
	fs.StringVar(&e.zk, "zookeeper", "127.0.0.1:2181", "ZooKeeper")
	fs.StringVar(&e.libs, "libs", ".cache/kafka-4.4.0/libs", "Kafka jars (for the perf tools)")
	fs.StringVar(&e.fanout, "fanout", "", "the fanout daemon binary")
	fs.StringVar(&e.python, "python", "", "the Python interpreter for the Python client's runs (with its protobuf)")
	pythonPath := fs.String("python-path", "clients/python/src", "where the Python client's package is (PYTHONPATH)")
	fs.StringVar(&e.pyclient, "pyclient", "bench/pyclient.py", "the Python client's bench worker")
	fs.StringVar(&e.out, "out", "bench-results", "output directory")
	fs.BoolVar(&e.perf, "perf", false, "record perf profiles of the daemon and of one client during C at each K, largest size, and of the daemon during each partitions run")
	messages := fs.Int("messages", 0, "messages per size, and per scaling topic, instead of the plan's (for a profile of a quick run)")
	_ = fs.Parse(args)
	p := fullPlan()
	if *quick {
		p = quickPlan()
	}
	if *messages > 0 {
		for size := range p.Messages {
			p.Messages[size] = *messages
		}
		if p.Scaling != nil {
			p.Scaling.PartMessages, p.Scaling.BusyMessages = *messages, *messages
		}
	}
	p.SpreadOnly, p.ClientsOnly, p.ScalingOnly = *spreadOnly, *clientsOnly, *scalingOnly
	if btoi(*spreadOnly)+btoi(*clientsOnly)+btoi(*scalingOnly) > 1 {
		return errors.New("--spread, --clients and --scaling: at most one")
	}
	var err error
	if e.self, err = os.Executable(); err != nil {
		return err
	}
	if e.fanout == "" {
		return errors.New("--fanout: required")
	}
	if e.python != "" {
		abs, err := filepath.Abs(*pythonPath)
		if err != nil {
			return err
		}
		os.Setenv("PYTHONPATH", abs) // the Python workers' package
	}
	if err := os.MkdirAll(filepath.Join(e.out, "logs"), 0o755); err != nil {
		return err
	}
	e.runID = fmt.Sprintf("%d", time.Now().Unix())

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "bench: %v: stopping what I started\n", s)
		killAll()
		os.Exit(130)
	}()
	defer killAll()

	cfg := kafka.NewConfig("fanout-bench")
	if e.client, err = sarama.NewClient([]string{e.kafka}, cfg); err != nil {
		return fmt.Errorf("kafka at %s: %w", e.kafka, err)
	}
	defer e.client.Close()
	if e.admin, err = sarama.NewClusterAdminFromClient(e.client); err != nil {
		return err
	}

	rep := &report{Plan: p, Started: time.Now().UTC(), LoadBefore: loadavg(), Host: hostInfo()}
	t0 := time.Now()
	err = measure(&e, p, rep)
	killAll() // anything left after a failure, before its topics go
	e.deleteTopics()
	if err != nil {
		return err
	}
	rep.LoadAfter = loadavg()
	rep.WallSeconds = time.Since(t0).Seconds()
	if err := rep.write(e.out); err != nil {
		return err
	}
	say("targets:")
	for _, t := range rep.Targets {
		say("   %s", t.line())
	}
	for _, g := range rep.unmeasured(rep.Targets) {
		say("   %-64s not measured in this run", g)
	}
	say("done in %s: %s/results.md, results.json, throughput.png", time.Since(t0).Round(time.Second), e.out)
	if fails := rep.failures(); len(fails) > 0 {
		return fmt.Errorf("not every message was delivered:\n  %s", strings.Join(fails, "\n  "))
	}
	return nil
}

func measure(e *env, p plan, rep *report) error {
	if !p.ScalingOnly {
		for _, size := range p.Sizes {
			if err := e.measureSize(p, rep, size); err != nil {
				return err
			}
		}
	}
	if p.SpreadOnly || p.ClientsOnly {
		return nil
	}
	if !p.ScalingOnly {
		for _, rate := range p.Rates {
			ls, err := e.latencyRun(rate, p.RateFor, p.LatencySize)
			if err != nil {
				return err
			}
			rep.Latency = append(rep.Latency, ls...)
		}
	}
	if p.Scaling != nil {
		return e.measureScaling(p, rep) // the idle clients too
	}
	idle, err := e.idleRun(p.IdleConns, p.IdleFor)
	if err != nil {
		return err
	}
	rep.Idle = idle
	return nil
}

// measureSize runs the throughput measurements of one record size on a
// topic of 8 partitions preloaded for them: those of the plan's scope.
func (e *env) measureSize(p plan, rep *report, size int) error {
	n := p.Messages[size]
	topic := fmt.Sprintf("bench-%s-%d", e.runID, size)
	say("== %s: %d messages of %d B on 8 partitions", topic, n, size)
	if err := e.createTopic(topic, 8); err != nil {
		return err
	}
	if err := e.preload(topic, n, size); err != nil {
		return err
	}
	total, err := e.highWater(topic)
	if err != nil {
		return err
	}
	if total != int64(n) {
		return fmt.Errorf("%s holds %d messages after preloading %d", topic, total, n)
	}
	row := func(r Row) {
		r.Size = size
		if r.Expected == 0 {
			r.Expected = int64(n)
		}
		r.finish()
		say("   %-34s %9.0f msg/s %8.1f MB/s", r.label(), r.MsgPerS, r.MBPerS)
		rep.Throughput = append(rep.Throughput, r)
	}
	all := !p.SpreadOnly && !p.ClientsOnly
	tools := all && (!p.ToolsOnce || size == p.Sizes[0])
	if tools {
		a, err := e.consumerPerf(topic, n)
		if err != nil {
			return err
		}
		row(a)
	}
	b, err := e.saramaRun(topic, n)
	if err != nil {
		return err
	}
	row(b)
	if !p.SpreadOnly {
		for _, k := range p.Ks {
			profile := e.perf && size == p.Sizes[len(p.Sizes)-1]
			c, err := e.fanoutRun(topic, n, k, p.InFlight, profile)
			if err != nil {
				return err
			}
			row(c)
		}
	}
	if !p.SpreadOnly {
		for _, flavor := range p.PyFlavors {
			for _, k := range p.PyKs {
				py, err := e.pythonRun(topic, min(n, p.PyMessages), k, p.InFlight, flavor)
				if err != nil {
					return err
				}
				row(py)
			}
		}
	}
	if tools {
		shareKs := p.ShareKs
		if shareKs == nil {
			shareKs = p.Ks
		}
		for _, k := range shareKs {
			d, err := e.sharePerf(topic, n, k)
			if err != nil {
				return err
			}
			row(d)
		}
	}
	if !p.ClientsOnly {
		for _, store := range []struct {
			name    string
			members []int
		}{{"zookeeper", p.Members}, {"kafka", p.KafkaMembers}} {
			for _, m := range store.members {
				sp, err := e.spreadRun(topic, n, m, p.SpreadClients, p.InFlight, store.name)
				if err != nil {
					return err
				}
				row(sp)
			}
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------------- Kafka

func (e *env) createTopic(topic string, partitions int) error {
	err := e.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}, false)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	e.topics = append(e.topics, topic)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = e.client.RefreshMetadata(topic)
		if parts, err := e.client.Partitions(topic); err == nil && len(parts) == partitions {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions not ready after 30 s", topic)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// highWater is the sum of the partitions' newest offsets (the message count
// of a fresh topic).
func (e *env) highWater(topic string) (int64, error) {
	hw, err := e.highWaters(topic)
	var sum int64
	for _, v := range hw {
		sum += v
	}
	return sum, err
}

func (e *env) highWaters(topic string) (map[int32]int64, error) {
	parts, err := e.client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	hw := map[int32]int64{}
	for _, p := range parts {
		o, err := e.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("offset of %s/%d: %w", topic, p, err)
		}
		hw[p] = o
	}
	return hw, nil
}

// java runs one of Kafka's tools and returns its standard output; on failure
// the error carries the tail of its output.
func (e *env) java(timeout time.Duration, class string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append([]string{"-Xmx1g", "-cp", e.libs + "/*", class}, args...)
	cmd := exec.CommandContext(ctx, "java", full...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("java %s: %w", class, err)
	}
	track(cmd)
	err := cmd.Wait()
	untrack(cmd)
	if err != nil {
		return out.String(), fmt.Errorf("java %s %s: %v; output:\n%s", class, strings.Join(args, " "), err, tail(out.String(), 30))
	}
	return out.String(), nil
}

func (e *env) preload(topic string, n, size int) error {
	return e.preloadBatches(topic, n, size, 262144)
}

// preloadBatches is preload with the producer's batches of batch bytes.
func (e *env) preloadBatches(topic string, n, size, batch int) error {
	say("   preloading with ProducerPerformance")
	out, err := e.java(10*time.Minute, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
		"--num-records", strconv.Itoa(n), "--record-size", strconv.Itoa(size), "--throughput", "-1",
		"--producer-props", "bootstrap.servers="+e.kafka, "acks=1", "linger.ms=5", "batch.size="+strconv.Itoa(batch))
	if err != nil {
		return err
	}
	say("   %s", lastLine(out))
	return nil
}

// perfColumns parses the header line and the line after it of a Kafka perf
// tool's output into a map.
func perfColumns(out, firstColumn string) (map[string]string, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, firstColumn) && i+1 < len(lines) {
			keys, vals := strings.Split(l, ","), strings.Split(lines[i+1], ",")
			if len(keys) != len(vals) {
				break
			}
			m := map[string]string{}
			for j := range keys {
				m[strings.TrimSpace(keys[j])] = strings.TrimSpace(vals[j])
			}
			return m, nil
		}
	}
	return nil, fmt.Errorf("no result in the tool's output:\n%s", tail(out, 20))
}

// consumerPerf is (A): Kafka's classic consumer with a fresh group. Its rate
// is the tool's fetch.nMsg.sec (the group join excluded).
func (e *env) consumerPerf(topic string, n int) (Row, error) {
	r := Row{Consumer: "A ConsumerPerformance", K: 1}
	say("   A: ConsumerPerformance")
	out, err := e.java(10*time.Minute, "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", e.kafka,
		"--topic", topic, "--messages", strconv.Itoa(n), "--group", "g-"+topic, "--timeout", "60000")
	if err != nil {
		return r, err
	}
	m, err := perfColumns(out, "start.time")
	if err != nil {
		return r, err
	}
	r.Messages, _ = strconv.ParseInt(m["data.consumed.in.nMsg"], 10, 64)
	ms, _ := strconv.ParseFloat(m["fetch.time.ms"], 64)
	r.Seconds = ms / 1000
	return r, nil
}

// sharePerf is (D): Kafka's share consumer (KIP-932) with k threads in a fresh
// share group. A share group's start-up takes seconds (members join, then
// wait for their assignment; each may get a record first and then stall), so
// the rate is taken after it, as fanout's is taken from the first ack: from
// the first reporting interval with a real share of the records to the end
// (shareSteady). The tool's own figure, start-up included, is kept too.
func (e *env) sharePerf(topic string, n, k int) (Row, error) {
	r := Row{Consumer: "D ShareConsumerPerformance", K: k}
	group := fmt.Sprintf("sg-%s-k%d", topic, k)
	say("   D: ShareConsumerPerformance, %d threads", k)
	if _, err := e.java(2*time.Minute, "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", e.kafka,
		"--alter", "--entity-type", "groups", "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest"); err != nil {
		return r, err
	}
	out, err := e.java(10*time.Minute, "org.apache.kafka.tools.ShareConsumerPerformance", "--bootstrap-server", e.kafka,
		"--topic", topic, "--group", group, "--num-records", strconv.Itoa(n), "--threads", strconv.Itoa(k),
		"--timeout", "60000", "--show-detailed-stats", "--reporting-interval", "500")
	if err != nil {
		return r, err
	}
	_ = os.WriteFile(filepath.Join(e.out, "logs", group+".out"), []byte(out), 0o644)
	return shareSteady(r, out, n)
}

var (
	perfTime      = `(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3})`
	shareInterval = regexp.MustCompile(perfTime + `, ` + perfTime + `, [\d.]+, [\d.]+, [\d.]+, (\d+), \d+ for share consumer`)
	shareSummary  = regexp.MustCompile(`(?m)^` + perfTime + `, ` + perfTime + `, [\d.]+, [\d.]+, [\d.]+, (\d+), (\d+)\s*$`)
)

// perfTimeOf parses the tools' default date format, yyyy-MM-dd HH:mm:ss:SSS.
func perfTimeOf(s string) time.Time {
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		s = s[:i] + "." + s[i+1:]
	}
	t, _ := time.ParseInLocation("2006-01-02 15:04:05.000", s, time.Local)
	return t
}

// shareSteady reads ShareConsumerPerformance's --show-detailed-stats output:
// per-thread intervals "start, end, MB, MB.sec, nMsg.sec, nMsg, ms for share
// consumer N" (lines of different threads may run together) and the summary.
// The steady period starts with the first interval that carries at least 1%
// of the records and ends at the summary's end time.
func shareSteady(r Row, out string, n int) (Row, error) {
	sum := shareSummary.FindAllStringSubmatch(out, -1)
	if len(sum) == 0 {
		return r, fmt.Errorf("no result in ShareConsumerPerformance's output:\n%s", tail(out, 20))
	}
	last := sum[len(sum)-1]
	start, end := perfTimeOf(last[1]), perfTimeOf(last[2])
	r.Messages, _ = strconv.ParseInt(last[3], 10, 64)
	if ms := end.Sub(start).Seconds(); ms > 0 {
		r.ToolMsgPerS = float64(r.Messages) / ms
	}
	type interval struct {
		start time.Time
		n     int64
	}
	var ivs []interval
	warm := time.Time{}
	for _, m := range shareInterval.FindAllStringSubmatch(out, -1) {
		st := perfTimeOf(m[1])
		c, _ := strconv.ParseInt(m[3], 10, 64)
		ivs = append(ivs, interval{st, c})
		if c*100 >= int64(n) && (warm.IsZero() || st.Before(warm)) {
			warm = st
		}
	}
	if warm.IsZero() { // everything in the last, partial interval: no steady period to see
		r.Seconds = end.Sub(start).Seconds()
		return r, nil
	}
	before := int64(0)
	for _, iv := range ivs {
		if iv.start.Before(warm.Add(-50 * time.Millisecond)) {
			before += iv.n
		}
	}
	r.Seconds = end.Sub(warm).Seconds()
	r.Messages -= before // the rate counts only the steady period's records ...
	r.finish()
	r.Messages += before // ... the row reports them all
	r.Seconds = float64(r.Messages) / r.MsgPerS
	return r, nil
}

// saramaRun is (B): the plain sarama consumer, a separate process.
func (e *env) saramaRun(topic string, n int) (Row, error) {
	r := Row{Consumer: "B sarama", K: 1}
	say("   B: plain sarama consumer")
	w, err := startWorker("sarama", e.self, "sarama", "--kafka", e.kafka, "--topic", topic, "--count", strconv.Itoa(n))
	if err != nil {
		return r, err
	}
	stop := showProgress("B sarama", int64(n), []*worker{w})
	<-w.exited
	stop()
	res, err := w.finish(time.Second)
	if err != nil {
		return r, err
	}
	r.Messages, r.Seconds = res.Messages, float64(res.LastNS-res.FirstNS)/1e9
	r.ClientCPUPerM = (res.CPU - res.ReadyCPU) / float64(max(res.CPUMessages, 1)) * 1e6
	return r, nil
}

// ---------------------------------------------------------------------------------------------------- fanout

// daemon is a fanout daemon process.
type daemon struct {
	id, topic, addr, log string
	metrics              string // host:port of /metrics and /readyz
	cmd                  *exec.Cmd
	exited               chan struct{}
}

func (e *env) startDaemon(id, topic, node string, extra ...string) (*daemon, error) {
	return e.startDaemonZK(id, topic, node, e.zk, extra...)
}

// startDaemonZK is startDaemon with the daemon's ZooKeeper at zk.
func (e *env) startDaemonZK(id, topic, node, zk string, extra ...string) (*daemon, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	metricsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	d := &daemon{id: id, topic: topic, addr: fmt.Sprintf("127.0.0.1:%d", port),
		metrics: fmt.Sprintf("127.0.0.1:%d", metricsPort),
		log:     filepath.Join(e.out, "logs", id+"-"+node+".log"), exited: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	args := []string{"--id", id, "--topic", topic, "--kafka", e.kafka,
		"--listen", d.addr, "--advertise", d.addr, "--node-id", node, "--initial-offset", "oldest",
		"--metrics-listen", d.metrics}
	if !slices.Contains(extra, "--offset-store") { // the Kafka store needs no ZooKeeper
		args = append(args, "--zookeeper", zk)
	}
	args = append(args, extra...)
	if !slices.Contains(e.topics, "fanout_"+id+"_"+topic) {
		e.topics = append(e.topics, "fanout_"+id+"_"+topic) // the daemons' heartbeat topic
	}
	d.cmd = exec.Command(e.fanout, args...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", e.fanout, err)
	}
	track(d.cmd)
	go func() {
		_ = d.cmd.Wait()
		untrack(d.cmd)
		f.Close()
		close(d.exited)
	}()
	// Ready once it leads and serves (the log line of fanout/daemon.go).
	deadline := time.Now().Add(90 * time.Second)
	for {
		b, _ := os.ReadFile(d.log)
		if strings.Contains(string(b), "serving clients") {
			return d, nil
		}
		select {
		case <-d.exited:
			b, _ = os.ReadFile(d.log)
			return nil, fmt.Errorf("daemon %s exited during startup (%v); %s:\n%s", id, d.cmd.ProcessState, d.log, tail(string(b), 30))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("daemon %s not serving after 90 s; %s:\n%s", id, d.log, tail(string(b), 30))
		}
	}
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// stop sends SIGTERM (the daemon drains and commits) and waits, then kills.
func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// fanoutRun is (C): the daemon and k client processes (the Go client) that
// ack every message. The rate counts acked messages from the first ack to
// the last (of any client). After the daemon's shutdown commit, every
// partition's committed offset in ZooKeeper must be its high-water mark:
// every message was acked.
func (e *env) fanoutRun(topic string, n, k, inFlight int, profile bool) (Row, error) {
	return e.clientsRun(topic, n, k, profile, clientKind{consumer: "C fanout", id: "k", all: true,
		argv: func(addr string) (string, []string) {
			return e.self, []string{"client", "--addr", addr, "--max-in-flight", strconv.Itoa(inFlight)}
		}})
}

// pythonRun is (P): the daemon and k processes of the Python client, of
// flavor threads or asyncio, each acking every message, until count
// messages are acked (the Python client is slower: the run takes the first
// count messages of the topic, not necessarily all).
func (e *env) pythonRun(topic string, count, k, inFlight int, flavor string) (Row, error) {
	if e.python == "" {
		return Row{}, errors.New("the Python client's runs need --python and --python-path")
	}
	return e.clientsRun(topic, count, k, false, clientKind{consumer: "P python " + flavor, id: "py-" + flavor + "-k",
		argv: func(addr string) (string, []string) {
			return e.python, []string{e.pyclient, "--addr", addr, "--flavor", flavor, "--max-in-flight", strconv.Itoa(inFlight)}
		}})
}

// clientKind is what clientsRun starts: the row's consumer, the daemon id's
// suffix (before K), the command of one client process and whether the
// clients drain the topic (all: every committed offset is checked).
type clientKind struct {
	consumer, id string
	argv         func(addr string) (cmd string, args []string)
	all          bool
}

// clientsRun runs a daemon and k client processes of kind until n messages
// are acked, and measures the daemon's and the clients' CPU per message.
// The clients' CPU counts from each one's connection to its last sample
// (Result.CPU), over the messages it had acked then.
func (e *env) clientsRun(topic string, n, k int, profile bool, kind clientKind) (Row, error) {
	r := Row{Consumer: kind.consumer, K: k, Expected: int64(n)}
	id := fmt.Sprintf("%s-%s%d", topic, kind.id, k)
	say("   %s: fanout daemon + %d client processes", kind.consumer, k)
	d, err := e.startDaemon(id, topic, "bench")
	if err != nil {
		return r, err
	}
	defer d.stop()
	cpu0, err := cpuSeconds(d.pid())
	if err != nil {
		return r, err
	}
	if profile {
		stopPerf, err := e.perfRecord(d.pid(), d.id)
		if err != nil {
			return r, err
		}
		defer stopPerf()
	}
	var ws []*worker
	for i := range k {
		cmd, args := kind.argv(d.addr)
		w, err := startWorker(fmt.Sprintf("client %d", i), cmd, args...)
		if err != nil {
			return r, err
		}
		ws = append(ws, w)
		if profile && i == 0 {
			stopPerf, err := e.perfRecord(w.cmd.Process.Pid, d.id+"-client")
			if err != nil {
				return r, err
			}
			defer stopPerf()
		}
	}
	busy0, total0 := machineCPU()
	t0 := time.Now()
	stop := showProgress(fmt.Sprintf("%s K=%d", kind.consumer, k), int64(n), ws)
	err = waitSum(ws, int64(n), 5*time.Minute)
	stop()
	cpu1, _ := cpuSeconds(d.pid())
	busy1, total1 := machineCPU()
	r.MachineBusyPct = float64(busy1-busy0) / float64(max(total1-total0, 1)) * 100
	r.DaemonCores = (cpu1 - cpu0) / time.Since(t0).Seconds()
	_, hwm, _ := memMB(d.pid())
	var first, last, cpuMessages int64
	var clientCPU float64
	for _, w := range ws {
		res, ferr := w.finish(30 * time.Second)
		if ferr != nil {
			err = errors.Join(err, ferr)
			continue
		}
		r.Messages += res.Messages
		r.Redelivered += res.Redelivered
		clientCPU += res.CPU - res.ReadyCPU
		cpuMessages += res.CPUMessages
		if res.Messages > 0 {
			if first == 0 || res.FirstNS < first {
				first = res.FirstNS
			}
			last = max(last, res.LastNS)
		}
	}
	if err != nil {
		return r, fmt.Errorf("%w\n(daemon log: %s)", err, d.log)
	}
	r.Seconds = float64(last-first) / 1e9
	r.DaemonCPUPerM = (cpu1 - cpu0) / float64(max(r.Messages, 1)) * 1e6
	r.DaemonPeakRSSMB = hwm
	r.ClientCPUPerM = clientCPU / float64(max(cpuMessages, 1)) * 1e6
	d.stop()
	if kind.all {
		r.Committed, err = e.committedAll(id, topic, "zookeeper")
	}
	return r, err
}

// perfRecord samples the stacks of process pid with perf until the returned
// stop is called; the profile goes to <out>/perf-<name>.data (read it with
// perf report -i ... --no-children).
func (e *env) perfRecord(pid int, name string) (stop func(), err error) {
	out := filepath.Join(e.out, "perf-"+name+".data")
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(pid), "-o", out)
	logf, err := os.Create(filepath.Join(e.out, "logs", "perf-"+name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("perf: %w", err)
	}
	track(cmd)
	say("   recording a perf profile of %s to %s", name, out)
	time.Sleep(500 * time.Millisecond)
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		untrack(cmd)
		logf.Close()
	}, nil
}

// waitSum waits until the workers' progress adds up to n, or one exits, or
// the timeout passes.
func waitSum(ws []*worker, n int64, timeout time.Duration) error {
	return waitSumEach(ws, n, timeout, nil)
}

// waitSumEach is waitSum calling each (when not nil) with the sum at every
// look, about every 20 ms.
func waitSumEach(ws []*worker, n int64, timeout time.Duration, each func(sum int64)) error {
	deadline := time.Now().Add(timeout)
	for {
		var sum int64
		for _, w := range ws {
			sum += w.progress.Load()
			select {
			case <-w.exited:
				return fmt.Errorf("%s exited early: %v; its stderr:\n%s", w.name, w.err, w.stderr.String())
			default:
			}
		}
		if each != nil {
			each(sum)
		}
		if sum >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d messages after %s", sum, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------------------------------- latency

// latencyRun produces at a fixed rate into a fresh topic while a fanout client
// (through a daemon) and a plain sarama consumer both read it, and reports the
// produce-to-receipt latency of each.
func (e *env) latencyRun(rate int, window time.Duration, size int) ([]Latency, error) {
	topic := fmt.Sprintf("lat-%s-%d", e.runID, rate)
	n := int(float64(rate) * window.Seconds())
	say("== latency at %d msg/s for %s (%d messages of %d B): fanout (1 client) and plain sarama", rate, window, n, size)
	if err := e.createTopic(topic, 8); err != nil {
		return nil, err
	}
	d, err := e.startDaemon(topic, topic, "bench")
	if err != nil {
		return nil, err
	}
	defer d.stop()
	fc, err := startWorker("latency client", e.self, "client", "--addr", d.addr, "--latency")
	if err != nil {
		return nil, err
	}
	sc, err := startWorker("latency sarama", e.self, "sarama", "--kafka", e.kafka, "--topic", topic,
		"--count", strconv.Itoa(n), "--latency")
	if err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second) // both consumers connected and fetching
	stop := showProgress(fmt.Sprintf("latency %d/s", rate), int64(n), []*worker{fc})
	perr := e.producePaced(topic, n, rate, size)
	werr := waitSum([]*worker{fc}, int64(n), 60*time.Second)
	stop()
	<-sc.exited
	fres, ferr := fc.finish(30 * time.Second)
	sres, serr := sc.finish(time.Second)
	if err := errors.Join(perr, werr, ferr, serr); err != nil {
		return nil, err
	}
	out := []Latency{latencyOf(rate, "B sarama", int64(n), sres), latencyOf(rate, "C fanout", int64(n), fres)}
	for _, l := range out {
		say("   %-10s p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  (%d of %d)", l.Consumer, l.P50, l.P99, l.P999, l.Messages, l.Expected)
	}
	return out, nil
}

// producePaced sends n synthetic messages ("SEQ UNIXNANOS ...", stamped when
// sent) at rate per second, in 1 ms steps.
func (e *env) producePaced(topic string, n, rate, size int) error {
	cfg := kafka.NewConfig("fanout-bench-producer")
	cfg.Producer.RequiredAcks = sarama.WaitForLocal
	p, err := sarama.NewAsyncProducer([]string{e.kafka}, cfg)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		var first error
		for range p.Successes() {
		}
		done <- first
	}()
	errs := make(chan error, 1)
	go func() {
		var first error
		for pe := range p.Errors() {
			if first == nil {
				first = pe
			}
		}
		errs <- first
	}()
	start := time.Now()
	for seq := 0; seq < n; {
		due := min(n, int(time.Since(start).Seconds()*float64(rate))+1)
		for ; seq < due; seq++ {
			p.Input() <- &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(syntheticValue(seq, time.Now(), size))}
		}
		time.Sleep(time.Millisecond)
	}
	p.AsyncClose()
	<-done
	return <-errs
}

func latencyOf(rate int, consumer string, expected int64, r Result) Latency {
	l := Latency{Rate: rate, Consumer: consumer, Expected: expected, Messages: int64(len(r.LatencyUS))}
	v := slices.Clone(r.LatencyUS)
	slices.Sort(v)
	q := func(f float64) float64 {
		if len(v) == 0 {
			return 0
		}
		return float64(v[min(len(v)-1, int(f*float64(len(v))))]) / 1000
	}
	l.P50, l.P99, l.P999, l.Max = q(0.5), q(0.99), q(0.999), q(1)
	return l
}

// ---------------------------------------------------------------------------------------------------- idle

// idleRun connects conns idle clients (one process) to a daemon on an empty
// topic and reports the daemon's memory and CPU.
func (e *env) idleRun(conns int, window time.Duration) (*Idle, error) {
	topic := fmt.Sprintf("idle-%s-%d", e.runID, conns)
	say("== %d idle clients (one process, raw connections answering pings)", conns)
	if err := e.createTopic(topic, 8); err != nil {
		return nil, err
	}
	d, err := e.startDaemon(topic, topic, "bench")
	if err != nil {
		return nil, err
	}
	defer d.stop()
	res := &Idle{Clients: conns, WindowSeconds: window.Seconds()}
	res.RSSBeforeMB, _, _ = memMB(d.pid())
	w, err := startWorker("idle", e.self, "idle", "--addr", d.addr, "--conns", strconv.Itoa(conns))
	if err != nil {
		return nil, err
	}
	stop := showProgress("idle connect", int64(conns), []*worker{w})
	select {
	case line := <-w.events:
		stop()
		say("   %s", line)
	case <-w.exited:
		stop()
		return nil, fmt.Errorf("idle worker exited: %v\n%s", w.err, w.stderr.String())
	case <-time.After(5 * time.Minute):
		stop()
		return nil, fmt.Errorf("idle clients not connected after 5 min\n%s", w.stderr.String())
	}
	cpu0, _ := cpuSeconds(d.pid())
	say("   holding for %s (the daemon pings each client every 5 s)", window)
	time.Sleep(window)
	cpu1, _ := cpuSeconds(d.pid())
	res.RSSMB, res.PeakRSSMB, _ = memMB(d.pid())
	res.CPUPercent = (cpu1 - cpu0) / window.Seconds() * 100
	r, err := w.finish(time.Minute)
	if err != nil {
		return nil, err
	}
	res.Connected = r.Connected
	say("   daemon RSS %.1f MB (peak %.1f MB, %.1f MB before), CPU %.1f%%, %d of %d clients stayed connected",
		res.RSSMB, res.PeakRSSMB, res.RSSBeforeMB, res.CPUPercent, res.Connected, conns)
	return res, nil
}

// ---------------------------------------------------------------------------------------------------- helpers

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// showProgress prints the workers' summed progress every second until stop.
func showProgress(what string, n int64, ws []*worker) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var sum int64
				for _, w := range ws {
					sum += w.progress.Load()
				}
				say("   ... %s: %d/%d (%d/s)", what, sum, n, sum-last)
				last = sum
			}
		}
	}()
	return func() { close(done); <-exited }
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func lastLine(s string) string { return tail(s, 1) }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

var memTotal = regexp.MustCompile(`MemTotal:\s+(\d+) kB`)

func hostInfo() string {
	b, _ := os.ReadFile("/proc/meminfo")
	gb := 0.0
	if m := memTotal.FindSubmatch(b); m != nil {
		kb, _ := strconv.ParseFloat(string(m[1]), 64)
		gb = kb / 1024 / 1024
	}
	return fmt.Sprintf("%d CPUs, %.0f GiB RAM, %s, %s", runtime.NumCPU(), gb, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

func jsonDecode(b []byte, v any) error { return json.Unmarshal(b, v) }

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
