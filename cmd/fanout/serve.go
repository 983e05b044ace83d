package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// serveFlags are the daemon's flags; each can also be set by its
// environment variable.
func serveFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	flags := []cli.Flag{
		&cli.StringFlag{Name: "id", Usage: "service id: daemons with the same id and topic form a cluster", EnvVars: env("ID")},
		&cli.StringFlag{Name: "topic", Usage: "the Kafka topic to consume, every partition", EnvVars: env("TOPIC")},
		&cli.StringSliceFlag{Name: "kafka", Usage: "Kafka bootstrap brokers host:port (default: Docker link variables KAFKA_*_PORT_9092_TCP_*, else localhost:9092)", EnvVars: env("KAFKA")},
		&cli.StringSliceFlag{Name: "zookeeper", Usage: "ZooKeeper servers host:port, the last may end in /chroot (default: Docker link variables ZK_*_PORT_2181_TCP_*, else localhost:2181; not with --offset-store kafka)", EnvVars: env("ZOOKEEPER")},
		&cli.StringFlag{Name: "offset-store", Value: fanout.OffsetStoreZooKeeper, Usage: "where offsets and the leader record are kept: zookeeper, or kafka (the consumer group fanout_<id>; no ZooKeeper needed)", EnvVars: env("OFFSET_STORE")},
		&cli.StringFlag{Name: "listen", Value: fanout.DefaultListen, Usage: "address for client connections", EnvVars: env("LISTEN")},
		&cli.StringFlag{Name: "metrics-listen", Value: fanout.DefaultMetricsListen, Usage: "address for /metrics, /healthz, /readyz and the web console (empty: disabled)", EnvVars: env("METRICS_LISTEN")},
		&cli.StringFlag{Name: "advertise", Usage: "host:port clients are told to use for this daemon (default: hostname and the listen port)", EnvVars: env("ADVERTISE")},
		&cli.StringFlag{Name: "node-id", Usage: "this daemon's id in the cluster; the highest id is elected first (default: hostname-RANDOM)", EnvVars: env("NODE_ID")},
		&cli.DurationFlag{Name: "ack-timeout", Value: fanout.DefaultAckTimeout, Usage: "redeliver a message not acked within this time", EnvVars: env("ACK_TIMEOUT")},
		&cli.DurationFlag{Name: "heartbeat", Value: fanout.DefaultHeartbeat, Usage: "ping clients this often", EnvVars: env("HEARTBEAT")},
		&cli.IntFlag{Name: "liveness", Value: fanout.DefaultLiveness, Usage: "drop a client silent for this many heartbeats", EnvVars: env("LIVENESS")},
		&cli.DurationFlag{Name: "write-timeout", Value: fanout.DefaultWriteTimeout, Usage: "drop a client that has not read a frame this long after it was queued (slow consumer)", EnvVars: env("WRITE_TIMEOUT")},
		&cli.IntFlag{Name: "max-outbox-bytes", Value: fanout.DefaultMaxOutboxBytes, Usage: "drop a client with more than this many bytes of control frames (pongs) queued and not read", EnvVars: env("MAX_OUTBOX_BYTES")},
		&cli.IntFlag{Name: "max-in-flight", Value: fanout.DefaultMaxInFlight, Usage: "most unacked messages per client (a client may ask for fewer)", EnvVars: env("MAX_IN_FLIGHT")},
		&cli.IntFlag{Name: "max-buffered", Value: fanout.DefaultMaxBuffered, Usage: "messages buffered for clients before fetching pauses", EnvVars: env("MAX_BUFFERED")},
		&cli.IntFlag{Name: "max-buffered-bytes", Value: fanout.DefaultMaxBufferedBytes, Usage: "payload bytes buffered for clients, and fetched bytes the messages not yet acked hold, before fetching pauses", EnvVars: env("MAX_BUFFERED_BYTES")},
		&cli.IntFlag{Name: "max-outstanding", Value: fanout.DefaultMaxOutstanding, Usage: "offsets a partition may hold behind an unacked message (a poison record) before fetching it pauses, until back at half", EnvVars: env("MAX_OUTSTANDING")},
		&cli.IntFlag{Name: "max-frame-size", Value: protocol.DefaultMaxFrameSize, Usage: "largest frame accepted from a client, in bytes", EnvVars: env("MAX_FRAME_SIZE")},
		&cli.IntFlag{Name: "max-clients", Usage: "most connected clients (0: no limit)", EnvVars: env("MAX_CLIENTS")},
		&cli.IntFlag{Name: "max-handshakes", Value: fanout.DefaultMaxHandshakes, Usage: "most connections waiting for their hello; one more closes the one waiting longest", EnvVars: env("MAX_HANDSHAKES")},
		&cli.StringFlag{Name: "auth-token", Usage: "shared secret clients must send in hello", EnvVars: env("AUTH_TOKEN")},
		&cli.StringFlag{Name: "auth-tokens-file", Usage: "file of name:token lines: a client sending one of the tokens is let in and named by it in the logs (beside --auth-token); re-read when it changes", EnvVars: env("AUTH_TOKENS_FILE")},
		&cli.StringFlag{Name: "tls-cert", Usage: "PEM file of the client listener's certificate: clients connect over TLS (1.2 or later); re-read when it changes and on SIGHUP", EnvVars: env("TLS_CERT")},
		&cli.StringFlag{Name: "tls-key", Usage: "PEM file of the --tls-cert certificate's key", EnvVars: env("TLS_KEY")},
		&cli.StringFlag{Name: "tls-client-ca", Usage: "PEM file of the CA that must sign every client's certificate (mutual TLS; needs --tls-cert)", EnvVars: env("TLS_CLIENT_CA")},
		&cli.StringFlag{Name: "initial-offset", Value: fanout.DefaultInitialOffset, Usage: "newest or oldest: where partitions start in a group that has never committed an offset of the topic (later, a partition without one starts at its oldest offset)", EnvVars: env("INITIAL_OFFSET")},
		&cli.StringFlag{Name: "isolation", Value: fanout.DefaultIsolation, Usage: "read_committed (records of aborted transactions are never delivered, those of open ones once committed) or read_uncommitted", EnvVars: env("ISOLATION")},
		&cli.DurationFlag{Name: "commit-interval", Value: fanout.DefaultCommitInterval, Usage: "commit changed offsets to the offset store this often", EnvVars: env("COMMIT_INTERVAL")},
		&cli.DurationFlag{Name: "cluster-heartbeat", Value: fanout.DefaultClusterHeartbeat, Usage: "publish this daemon's heartbeat on fanout_<id>_<topic> this often", EnvVars: env("CLUSTER_HEARTBEAT")},
		&cli.DurationFlag{Name: "leader-timeout", Usage: "elect a new leader after this long without its heartbeat", DefaultText: "3 × --cluster-heartbeat", EnvVars: env("LEADER_TIMEOUT")},
		&cli.DurationFlag{Name: "zookeeper-session-timeout", Value: fanout.DefaultZKSessionTimeout, Usage: "ZooKeeper session timeout; a leader whose offset commits have failed this long steps down", EnvVars: env("ZOOKEEPER_SESSION_TIMEOUT")},
		&cli.DurationFlag{Name: "kafka-session-timeout", Value: fanout.DefaultKafkaSession, Usage: "with --offset-store kafka: session timeout of the memberships of the group fanout_<id> (the leader's; in spread mode every member's); a leader whose offset commits have failed this long steps down", EnvVars: env("KAFKA_SESSION_TIMEOUT")},
		&cli.DurationFlag{Name: "drain-timeout", Value: fanout.DefaultDrainTimeout, Usage: "at shutdown, wait this long for outstanding acks", EnvVars: env("DRAIN_TIMEOUT")},
		&cli.StringFlag{Name: "assignment", Value: fanout.DefaultAssignment, Usage: "leader (the leader serves every partition) or spread (each member serves the partitions assigned to it); the same on every member", EnvVars: env("ASSIGNMENT")},
		&cli.IntFlag{Name: "weight", Value: 1, Usage: "spread mode: this member's share of the partitions is proportional to its weight", EnvVars: env("WEIGHT")},
		&cli.StringFlag{Name: "delivery-log", Usage: "append a line per delivery attempt and its outcome to this file (debugging; never waits for the disk: events that do not fit its queue are dropped and the file says how many)", EnvVars: env("DELIVERY_LOG")},
		&cli.DurationFlag{Name: "handoff-timeout", Value: fanout.DefaultHandoffTimeout, Usage: "spread mode: a partition moving away waits this long for its in-flight messages to be acked", EnvVars: env("HANDOFF_TIMEOUT")},
		metricsTokenFlag(),
		clusterSecretFlag(),
	}
	flags = append(flags, policyFlags()...)
	flags = append(flags, kafkaSecurityFlags()...)
	return append(flags, zookeeperSecurityFlags()...)
}

// serveOptions maps the flags and secrets onto fanout.Options (not yet
// validated). The daemon's flags exist at the top level (fanout --id ...)
// and on the serve command (fanout serve --id ...); a flag set at either
// level counts, the command's first. It fails only when a secret cannot be
// read.
func serveOptions(c *cli.Context, environ []string) (fanout.Options, error) {
	at := func(name string) *cli.Context {
		for _, ctx := range c.Lineage() {
			if ctx.IsSet(name) {
				return ctx
			}
		}
		return c
	}
	str := func(name string) string { return at(name).String(name) }
	dur := func(name string) time.Duration { return at(name).Duration(name) }
	num := func(name string) int { return at(name).Int(name) }
	kafkaAddrs, zkAddrs := at("kafka").StringSlice("kafka"), at("zookeeper").StringSlice("zookeeper")
	if len(kafkaAddrs) == 0 {
		kafkaAddrs = linkedAddrs(environ, "KAFKA", 9092)
	}
	if len(zkAddrs) == 0 && usesZooKeeper(str("offset-store")) {
		zkAddrs = linkedAddrs(environ, "ZK", 2181) // no ZooKeeper at all with Kafka's store
	}
	opts := fanout.Options{
		ID:               str("id"),
		Topic:            str("topic"),
		Kafka:            splitAll(kafkaAddrs),
		ZooKeeper:        splitAll(zkAddrs),
		Listen:           str("listen"),
		Advertise:        str("advertise"),
		NodeID:           str("node-id"),
		AckTimeout:       dur("ack-timeout"),
		Heartbeat:        dur("heartbeat"),
		Liveness:         num("liveness"),
		WriteTimeout:     dur("write-timeout"),
		MaxInFlight:      num("max-in-flight"),
		MaxBuffered:      num("max-buffered"),
		MaxBufferedBytes: num("max-buffered-bytes"),
		MaxFrameSize:     num("max-frame-size"),
		MaxClients:       num("max-clients"),
		MaxHandshakes:    num("max-handshakes"),
		MaxOutboxBytes:   num("max-outbox-bytes"),
		AuthToken:        str("auth-token"),
		AuthTokensFile:   str("auth-tokens-file"),
		InitialOffset:    str("initial-offset"),
		CommitInterval:   dur("commit-interval"),
		DrainTimeout:     dur("drain-timeout"),
		ClusterHeartbeat: dur("cluster-heartbeat"),
		LeaderTimeout:    dur("leader-timeout"),
		MetricsListen:    str("metrics-listen"),
		Logger:           logrus.NewEntry(logrus.StandardLogger()),

		OffsetStore:             str("offset-store"),
		ZooKeeperSessionTimeout: dur("zookeeper-session-timeout"),
		KafkaSessionTimeout:     dur("kafka-session-timeout"),
	}
	opts.ClientTLS = tlsconf.ServerFiles{Cert: str("tls-cert"), Key: str("tls-key"), ClientCA: str("tls-client-ca")}
	opts.Isolation = str("isolation")
	opts.MaxOutstanding = num("max-outstanding")
	opts.DeliveryLog = str("delivery-log")
	flags := flagValues{str: str, num: num, boolean: func(name string) bool { return at(name).Bool(name) }}
	if err := policyOptions(&opts, flags); err != nil {
		return fanout.Options{}, err
	}
	var err error
	opts.Assignment, opts.Weight, opts.HandoffTimeout = str("assignment"), num("weight"), dur("handoff-timeout")
	// Security: the flags, and the secrets from the environment or files.
	if opts.KafkaSecurity, err = kafkaSecurity(environ, flags); err != nil {
		return fanout.Options{}, err
	}
	if opts.ZooKeeperSecurity, err = zookeeperSecurity(environ, flags); err != nil {
		return fanout.Options{}, err
	}
	if opts.MetricsToken, err = readSecret(environ, flags, secretMetricsToken); err != nil {
		return fanout.Options{}, err
	}
	if opts.ClusterSecret, err = readSecret(environ, flags, secretCluster); err != nil {
		return fanout.Options{}, err
	}
	return opts, nil
}

// policyFlags are the flags of the delivery policies, the same for the
// daemon and fanout dev.
func policyFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return []cli.Flag{
		&cli.IntFlag{Name: "max-attempts", Usage: "produce a message whose delivery failed this many times (ack timeout, nack, client gone) to --dead-letter-topic instead of delivering it again (0: unlimited)", EnvVars: env("MAX_ATTEMPTS")},
		&cli.StringFlag{Name: "dead-letter-topic", Usage: "the topic that takes the messages that failed --max-attempts times (it must exist, or see --create-dead-letter-topic)", EnvVars: env("DEAD_LETTER_TOPIC")},
		&cli.BoolFlag{Name: "create-dead-letter-topic", Usage: "create --dead-letter-topic at start when it does not exist, with as many partitions as --topic and the replication factor the cluster gives new topics", EnvVars: env("CREATE_DEAD_LETTER_TOPIC")},
		&cli.StringFlag{Name: "retry-backoff", Value: fanout.DefaultRetryBackoff, Usage: "`MIN,MAX`: wait MIN·2^(failures-1), at most MAX, with jitter, before redelivering after a timeout, a nack without a delay or a client gone (off: at once; a nack's own delay wins)", EnvVars: env("RETRY_BACKOFF")},
		&cli.StringFlag{Name: "ordering", Value: fanout.DefaultOrdering, Usage: "none, or key: a key's messages go out one at a time, in offset order", EnvVars: env("ORDERING")},
		&cli.IntFlag{Name: "deliveries-per-turn", Value: fanout.DefaultDeliveriesPerTurn, Usage: "messages a client takes in its round-robin turn, at most (up to its credit): more carries several in one frame and one ack when clients outnumber the messages at hand, for less CPU, at the cost of a coarser balance", EnvVars: env("DELIVERIES_PER_TURN")},
		&cli.IntFlag{Name: "max-observer-bytes", Value: fanout.DefaultMaxObserverBytes, Usage: "drop an observer with more than this many bytes of copies queued and not written", EnvVars: env("MAX_OBSERVER_BYTES")},
	}
}

// policyOptions sets the delivery policies of opts from policyFlags.
func policyOptions(opts *fanout.Options, flags flagValues) error {
	opts.MaxAttempts = flags.num("max-attempts")
	opts.DeadLetterTopic = flags.str("dead-letter-topic")
	opts.CreateDeadLetterTopic = flags.boolean("create-dead-letter-topic")
	opts.Ordering = flags.str("ordering")
	opts.DeliveriesPerTurn = flags.num("deliveries-per-turn")
	opts.MaxObserverBytes = flags.num("max-observer-bytes")
	var err error
	opts.RetryBackoffMin, opts.RetryBackoffMax, err = fanout.ParseRetryBackoff(flags.str("retry-backoff"))
	return err
}

// serve runs the daemon until SIGINT or SIGTERM.
func serve(c *cli.Context) error {
	if c.Args().Present() {
		arg := c.Args().First()
		var names []string
		for _, cmd := range c.App.Commands {
			names = append(names, cmd.Names()...)
		}
		if near := nearest(arg, names); near != "" {
			return usageError(fmt.Errorf("unknown command %q: did you mean %s? (commands: %s)", arg, near, commandNames(c)))
		}
		return usageError(fmt.Errorf("unexpected argument %q (flags start with --; commands: %s)", arg, commandNames(c)))
	}
	opts, err := serveOptions(c, environ())
	if err != nil {
		return usageError(err)
	}
	d, err := fanout.New(opts)
	if err != nil {
		return usageError(err)
	}
	ctx, stop := context.WithCancel(c.Context)
	defer stop()
	var routines actor.Group
	defer routines.Wait()
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	routines.Go(opts.Logger, "SIGHUP", func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				d.Reload() // the daemon logs the outcome
			}
		}
	}, nil)
	return d.Run(ctx)
}
