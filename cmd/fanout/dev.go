package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
)

// Defaults of the dev command.
const (
	devKafkaListen = "127.0.0.1:9092"
	devTopic       = "user_need"
	devPartitions  = 4
	devID          = "dev"
	// devHeartbeat is the dev daemon's cluster heartbeat: it leads about
	// three of them after it starts.
	devHeartbeat = 250 * time.Millisecond
)

func devCommand() *cli.Command {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return &cli.Command{
		Name:  "dev",
		Usage: "run a complete fanout for development: in-process Kafka, offsets in its consumer group, the daemon",
		UsageText: "fanout dev [--topic user_need] [--partitions 4] [--kafka-listen 127.0.0.1:9092] [--listen :4987]\n" +
			"fanout dev --max-attempts 5 --dead-letter-topic user_need_dlq\n" +
			"go run ./cmd/fanout dev",
		Description: "Starts an in-process Kafka-protocol broker (kfake) with the topic and runs the daemon on it\n" +
			"with the Kafka offset store (--offset-store kafka: offsets and the leader record in the consumer\n" +
			"group fanout_dev of the in-process broker, the code a production daemon runs; not durable: they\n" +
			"are lost when it stops), with service id \"dev\" and partitions without an offset starting at\n" +
			"the oldest message. Nothing else is needed, no ZooKeeper. Once it serves clients it prints how\n" +
			"to produce to it, consume from it and see its offsets. The delivery policies are the daemon's\n" +
			"flags; a --dead-letter-topic is created in the in-process broker.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "kafka-listen", Value: devKafkaListen, Usage: "address of the in-process Kafka broker (port 0: any free port)", EnvVars: env("DEV_KAFKA_LISTEN")},
			&cli.StringFlag{Name: "topic", Value: devTopic, Usage: "the topic to create and consume", EnvVars: env("TOPIC")},
			&cli.IntFlag{Name: "partitions", Value: devPartitions, Usage: "partitions of the topic", EnvVars: env("DEV_PARTITIONS")},
			&cli.StringFlag{Name: "listen", Value: fanout.DefaultListen, Usage: "address for client connections", EnvVars: env("LISTEN")},
			&cli.DurationFlag{Name: "ack-timeout", Value: fanout.DefaultAckTimeout, Usage: "redeliver a message not acked within this time", EnvVars: env("ACK_TIMEOUT")},
			&cli.DurationFlag{Name: "heartbeat", Value: fanout.DefaultHeartbeat, Usage: "ping clients this often", EnvVars: env("HEARTBEAT")},
			&cli.IntFlag{Name: "max-in-flight", Value: fanout.DefaultMaxInFlight, Usage: "most unacked messages per client", EnvVars: env("MAX_IN_FLIGHT")},
			&cli.StringFlag{Name: "metrics-listen", Value: fanout.DefaultMetricsListen, Usage: "address for /metrics, /healthz, /readyz and the web console (empty: disabled)", EnvVars: env("METRICS_LISTEN")},
		}, policyFlags()...),
		Action:       devAction,
		OnUsageError: commandUsageError,
	}
}

// devConfig is what runDev runs, from the dev command's flags.
type devConfig struct {
	KafkaListen string
	Topic       string
	Partitions  int
	Listen      string
	AckTimeout  time.Duration
	Heartbeat   time.Duration
	MaxInFlight int
	// MetricsListen is the address of /metrics, /healthz, /readyz and the
	// console; "" disables them.
	MetricsListen string
	// Policies holds the delivery policies (policyFlags); its other fields
	// are left zero. A DeadLetterTopic is created in the in-process broker.
	Policies fanout.Options
	Log      *logrus.Entry
}

func devAction(c *cli.Context) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	cfg := devConfig{
		KafkaListen: c.String("kafka-listen"),
		Topic:       c.String("topic"),
		Partitions:  c.Int("partitions"),
		Listen:      c.String("listen"),
		AckTimeout:  c.Duration("ack-timeout"),
		Heartbeat:   c.Duration("heartbeat"),
		MaxInFlight: c.Int("max-in-flight"),
		Log:         logrus.NewEntry(logrus.StandardLogger()),
	}
	if err := policyOptions(&cfg.Policies, contextValues(c)); err != nil {
		return usageError(err)
	}
	cfg.MetricsListen = devMetricsListen(c)
	return runDev(c.Context, cfg, c.App.Writer)
}

// runDev runs the in-process broker and the daemon until ctx ends, then
// stops both gracefully. Once the daemon serves clients it prints to stdout
// how to use it.
func runDev(ctx context.Context, cfg devConfig, stdout io.Writer) error {
	if cfg.Partitions < 1 || cfg.Partitions > 1<<20 {
		return usageError(fmt.Errorf("--partitions %d: between 1 and %d", cfg.Partitions, 1<<20))
	}
	if err := checkAddr(cfg.KafkaListen); err != nil {
		return usageError(fmt.Errorf("--kafka-listen %q: %w", cfg.KafkaListen, err))
	}
	if cfg.Log == nil {
		cfg.Log = logrus.NewEntry(logrus.StandardLogger())
	}
	log := cfg.Log.WithField("mode", "dev")
	log.Warn("offsets are kept in the in-process Kafka (group fanout_" + devID + "): they are not durable and are lost when fanout dev stops")
	// Validate the rest (topic name, listen address, durations) before the
	// broker starts; the broker's address is known once it listens. The
	// daemon runs as in production with --offset-store kafka: it is elected
	// through the heartbeat topic and the group fanout_dev, and commits
	// there.
	opts := cfg.Policies
	opts.ID = devID
	opts.Topic = cfg.Topic
	opts.OffsetStore = fanout.OffsetStoreKafka
	opts.Listen = cfg.Listen
	opts.NodeID = devID
	opts.AckTimeout = cfg.AckTimeout
	opts.Heartbeat = cfg.Heartbeat
	opts.MaxInFlight = cfg.MaxInFlight
	opts.MetricsListen = cfg.MetricsListen
	opts.InitialOffset = "oldest"
	opts.ClusterHeartbeat = devHeartbeat
	opts.Logger = cfg.Log
	// The in-process broker starts empty: the daemon creates the
	// dead-letter topic in it, as a production daemon does when asked.
	opts.CreateDeadLetterTopic = opts.DeadLetterTopic != ""
	if err := opts.Validate(); err != nil {
		return usageError(err)
	}

	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(int32(cfg.Partitions), cfg.Topic),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return listenAdvertised(network, cfg.KafkaListen)
		}),
	)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("in-process Kafka on %s: %w: is a Kafka broker (or another fanout dev) running on this host? "+
				"Give fanout dev another --kafka-listen (127.0.0.1:0: any free port), or stop the process that holds the port",
				cfg.KafkaListen, err)
		}
		return fmt.Errorf("in-process Kafka on %s: %w", cfg.KafkaListen, err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	if len(addrs) == 0 {
		return errDevNoBroker
	}
	kafkaAddr := addrs[0]
	log.WithFields(logrus.Fields{"kafka": kafkaAddr, "topic": cfg.Topic, "partitions": cfg.Partitions}).
		Info("in-process Kafka started")

	opts.Kafka = []string{kafkaAddr}
	d, err := fanout.New(opts)
	if err != nil {
		return usageError(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	select {
	case <-d.Ready():
		printDevHints(stdout, kafkaAddr, cfg.Topic, dialable(d.Addr()))
	case err := <-runErr:
		return err
	}
	return <-runErr
}

// devMetricsListen returns --metrics-listen. Left at its default, a port
// already taken (another fanout, a node exporter) only disables metrics, so
// that fanout dev still starts; an address given explicitly must be free.
func devMetricsListen(c *cli.Context) string {
	addr := c.String("metrics-listen")
	if addr == "" || c.IsSet("metrics-listen") {
		return addr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logrus.WithError(err).Warnf("metrics disabled: %s is taken (set --metrics-listen to choose another address)", addr)
		return ""
	}
	ln.Close()
	return addr
}

// printDevHints tells the user how to produce to the dev broker and consume
// from the daemon.
func printDevHints(w io.Writer, kafkaAddr, topic, daemonAddr string) {
	self := "fanout"
	if _, err := exec.LookPath("fanout"); err != nil {
		self = "go run ./cmd/fanout"
	}
	fmt.Fprintf(w, "fanout dev is ready: Kafka at %s (topic %s), clients connect to %s\n", kafkaAddr, topic, daemonAddr)
	fmt.Fprintf(w, "produce:  echo hello | %s produce --kafka %s --topic %s\n", self, kafkaAddr, topic)
	fmt.Fprintf(w, "consume:  %s tail --connect %s\n", self, daemonAddr)
	fmt.Fprintf(w, "offsets:  %s status --offset-store kafka --kafka %s --id %s --topic %s\n", self, kafkaAddr, devID, topic)
}

// dialable turns a listener address into one a local client can dial: an
// unspecified host (":4987", "0.0.0.0:4987", "[::]:4987") becomes
// 127.0.0.1.
func dialable(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// listenAdvertised listens on addr. kfake advertises its listener's
// address to clients, so an unspecified host is reported as 127.0.0.1,
// which clients can dial.
func listenAdvertised(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &advertisedListener{Listener: ln, addr: &advertisedAddr{network: ln.Addr().Network(), s: dialable(ln.Addr())}}, nil
}

// advertisedListener is a listener that reports a dialable address.
type advertisedListener struct {
	net.Listener
	addr net.Addr
}

// Addr returns the dialable address.
func (l *advertisedListener) Addr() net.Addr { return l.addr }

// advertisedAddr is a net.Addr of a fixed string.
type advertisedAddr struct{ network, s string }

// Network returns the address's network.
func (a *advertisedAddr) Network() string { return a.network }

// String returns the address.
func (a *advertisedAddr) String() string { return a.s }

// errDevNoBroker is returned when kfake reports no listener.
var errDevNoBroker = errors.New("in-process Kafka has no listener")
