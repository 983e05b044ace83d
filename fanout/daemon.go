package fanout

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// Daemon is one fanout process: a client listener, a Kafka client, an
// offset store (authority), the election and, while it serves, a pipeline
// (source, dispatcher, dead letters), as its mode says.
type Daemon struct {
	opts       Options
	log        *logrus.Entry
	assignment assignment     // --assignment
	mode       mode           // the assignment's: what serving is
	store      authority.Kind // --offset-store
	backend    backend        // the serving pipeline, if any: where the server's calls go
	srv        *server.Server

	elector   atomic.Pointer[cluster.Elector]
	listening chan struct{} // closed once the listener is bound
	ready     chan struct{} // closed once this node first serves clients
	readyOnce sync.Once

	health    *kafkaHealth // the topic's existence and Kafka's answers, for /readyz
	collector *metrics.Collector
	metrics   *metrics.Server // nil when Options.MetricsListen is ""; set before listening closes
	// consoleAddr is the metrics listener's address once it listens, for
	// the server's answer to an HTTP request on the client port.
	consoleAddr atomic.Pointer[string]
	rates       *console.Rates // the console's message rates, sampled while the metrics listener runs
	creds       *credentials   // the client listener's TLS files and named tokens

	lastReady atomic.Pointer[readyState] // what /readyz answered at the last refresh, for the heartbeats

	// With --max-attempts, set by Run before any term: the dead-letter
	// producers' client, and the largest record it sends (deadLetterLimit).
	deadClient sarama.Client
	deadLimit  int

	delivery *deliverylog.Log // --delivery-log, open while Run runs; nil without

	// pause is the switch of the cluster's delivery pause that every
	// dispatcher of the daemon follows (actions.go); local the pause of a
	// daemon leading alone; actionLog its last actions.
	pause     *dispatch.Pause
	local     localPause
	actionLog actionLog
}

// New validates opts and returns a Daemon. Nothing runs until Run.
func New(opts Options) (_ *Daemon, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	a, err := assignmentOf(opts.Assignment)
	if err != nil {
		return nil, err // Validate checked it
	}
	store, err := authority.Lookup(opts.OffsetStore)
	if err != nil {
		return nil, err // Validate checked it
	}
	d := &Daemon{
		opts:       opts,
		assignment: a,
		store:      store,
		log:        opts.Logger.WithFields(logrus.Fields{"id": opts.ID, "topic": opts.Topic}),
		listening:  make(chan struct{}),
		ready:      make(chan struct{}),
		health:     newKafkaHealth(),
		pause:      dispatch.NewPause(),
	}
	d.mode = a.newMode(d)
	d.collector = metrics.NewCollector(d.metricsSnapshot)
	d.rates = console.NewRates(console.SampleInterval)
	if d.creds, err = newCredentials(opts, d.log); err != nil {
		return nil, err
	}
	tlsServer, authenticate, verifyClient := d.creds.serverChecks()
	var tlsCfg *tls.Config
	if tlsServer != nil {
		tlsCfg = tlsServer.Config()
	}
	srv, err := server.New(server.Config{
		Listen:         opts.Listen,
		NodeID:         opts.NodeID,
		Topic:          opts.Topic,
		MaxInFlight:    opts.MaxInFlight,
		AckTimeout:     opts.AckTimeout,
		Heartbeat:      opts.Heartbeat,
		Liveness:       opts.Liveness,
		WriteTimeout:   opts.WriteTimeout,
		MaxFrameSize:   opts.MaxFrameSize,
		MaxClients:     opts.MaxClients,
		MaxHandshakes:  opts.MaxHandshakes,
		MaxOutboxBytes: opts.MaxOutboxBytes,
		AuthToken:      opts.AuthToken,
		TLS:            tlsCfg,
		Authenticate:   authenticate,
		VerifyClient:   verifyClient,
		Leadership:     d.leadership,
		Members:        d.mode.members,
		Logger:         d.log,
		ConsoleAddr: func() string {
			if a := d.consoleAddr.Load(); a != nil {
				return *a
			}
			return ""
		},

		MaxObserverBytes: opts.MaxObserverBytes,
	}, &d.backend)
	if err != nil {
		return nil, fmt.Errorf("client server: %w", err)
	}
	d.srv = srv
	d.creds.reauthorize = srv.Reauthorize
	return d, nil
}

// Reload re-reads the client listener's certificate, key and client CA and
// the named tokens now, whether or not their files changed (SIGHUP), and
// ends the sessions whose token or certificate they no longer accept (an
// Error UNAUTHORIZED; their deliveries go to other clients at once). The
// files are also re-read when they change (credentials.watch). A file that
// does not load leaves the previous version in force; the outcome is
// logged.
func (d *Daemon) Reload() { d.creds.reload() }

// Addr returns the client listener's address once Listening is closed.
func (d *Daemon) Addr() net.Addr { return d.srv.Addr() }

// Listening is closed once the client listener is bound.
func (d *Daemon) Listening() <-chan struct{} { return d.listening }

// Ready is closed once the daemon first serves clients: Kafka and the offset
// store are reachable and the dispatcher runs.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Stats returns the serving term's dispatcher counters, or false when no
// term serves.
func (d *Daemon) Stats(ctx context.Context) (dispatch.Stats, bool) {
	if disp := d.backend.dispatcher(); disp != nil {
		return disp.Stats(ctx)
	}
	return dispatch.Stats{}, false
}

// leadership is what the server tells a client that says Hello now: the
// mode's (a welcome while this node serves, else where the leader is, or
// to retry shortly).
func (d *Daemon) leadership() server.Leadership { return d.mode.leadership() }

// Run serves until ctx ends, then shuts down gracefully: it stops accepting
// clients and fetching, says goodbye to clients, waits up to DrainTimeout
// for outstanding acks, commits, hands leadership over and returns nil.
// Kafka, ZooKeeper or the topic being out of reach is logged and retried
// with backoff; Run returns an error only for what retrying cannot fix (the
// listen address is taken).
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.srv.Start(context.Background()); err != nil {
		return portTaken(err, "--listen")
	}
	defer d.srv.Close()
	stopMetrics, err := d.startMetrics()
	if err != nil {
		return portTaken(err, "--metrics-listen")
	}
	defer stopMetrics()
	if d.opts.DeliveryLog != "" {
		if d.delivery, err = deliverylog.OpenFile(d.opts.DeliveryLog, d.opts.NodeID, d.log); err != nil {
			return err
		}
		// Closed after every term: Run returns once their dispatchers have.
		defer d.delivery.Close()
	}
	close(d.listening)
	stopAccepting := context.AfterFunc(ctx, d.srv.StopAccepting)
	defer stopAccepting()
	credCtx, stopWatching := context.WithCancel(ctx)
	var watcher actor.Group
	watcher.Go(d.log, "credentials watcher", func() { d.creds.watch(credCtx) }, nil)
	defer watcher.Wait()
	defer stopWatching()
	fields := logrus.Fields{"listen": d.srv.Addr().String(), "client_security": d.creds.describe(), "heartbeat_security": d.heartbeatSecurity(), "node": d.opts.NodeID, "kafka": d.opts.Kafka,
		"kafka_security": d.opts.KafkaSecurity.String(), "offset_store": d.opts.OffsetStore}
	if d.opts.usesZooKeeper() {
		fields["zookeeper"], fields["zookeeper_security"] = d.opts.ZooKeeper, d.opts.ZooKeeperSecurity.String()
	}
	d.log.WithFields(fields).
		Info("fanout starting: connecting to " + d.opts.connectsTo())
	for _, w := range d.opts.securityWarnings() {
		d.log.Warn(w)
	}

	// The source's client: the one place its fetches are configured.
	isolation, err := kafka.ParseIsolation(d.opts.Isolation)
	if err != nil {
		return err // Validate checked it
	}
	client, err := d.connectKafka(ctx, "fanout-"+d.opts.NodeID, func(c *sarama.Config) {
		c.Consumer.IsolationLevel = isolation
	})
	if err != nil {
		return nil // ctx ended
	}
	defer client.Close()
	// The topic watch runs until Run returns; nothing joins the cluster
	// (or creates its heartbeat topic) before it has found the topic
	// (awaitTopic).
	watchCtx, stopWatch := context.WithCancel(context.Background())
	var watch actor.Group
	watch.Go(d.log, "topic watch", func() {
		d.health.watch(watchCtx, d.log, min(topicCheckInterval, d.opts.ConnectBackoffMax), func() error {
			parts, err := kafka.TopicPartitions(client, d.opts.Topic)
			if err == nil {
				d.health.setNewest(d.newestUnwatched(client, parts))
			}
			return err
		})
	}, nil)
	defer func() {
		stopWatch()
		watch.Wait()
	}()
	if d.opts.DeadLetterTopic != "" {
		if err := d.checkDeadLetterTopic(ctx, client); err != nil {
			return err
		}
		// The dead letters' client: the one place their producer is
		// configured, its record limit the topic's.
		d.deadLimit = kafka.DeadLetterLimit(client, d.opts.DeadLetterTopic, d.log)
		dead, err := d.connectKafka(ctx, "fanout-dead-letters-"+d.opts.NodeID, func(c *sarama.Config) {
			c.Producer.MaxMessageBytes = d.deadLimit
		})
		if err != nil {
			return nil // ctx ended
		}
		defer dead.Close()
		d.deadClient = dead
	}

	if d.opts.Store != nil {
		// Leading alone: a term of the store's own.
		if !d.awaitTopic(ctx) {
			return nil
		}
		err = d.runTerm(ctx, client, d.opts.Store, d.opts.Store.NewTerm(), d.log)
	} else {
		err = d.runCluster(ctx, client)
	}
	d.log.Info("fanout stopped")
	return err
}

// runCluster opens the offset store, takes part in the election and
// serves as the mode says, until ctx ends.
func (d *Daemon) runCluster(ctx context.Context, client sarama.Client) error {
	// The election reads its log with short fetch waits, so it gets a client
	// of its own: the source's fetch settings are tuned for throughput.
	elClient, err := d.connectKafka(ctx, "fanout-election-"+d.opts.NodeID, func(c *sarama.Config) {
		c.Consumer.MaxWaitTime = 50 * time.Millisecond
	})
	if err != nil {
		return nil // ctx ended
	}
	defer elClient.Close()
	auth, err := d.openAuthority(ctx, elClient)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer auth.Close()
	// Every member, follower or not, waits for the topic: none of them
	// joins the election (and creates fanout_<id>_<topic>) for a topic
	// that does not exist.
	if !d.awaitTopic(ctx) {
		return nil
	}
	cfg := cluster.Config{
		ID: d.opts.ID, Topic: d.opts.Topic, NodeID: d.opts.NodeID, Addr: d.opts.advertised(d.srv.Addr()),
		Heartbeat: d.opts.ClusterHeartbeat, LeaderTimeout: d.opts.LeaderTimeout, Client: elClient, Logger: d.log,
		Fencer: auth.Fencer(d.log), Mode: d.assignment.cluster, Weight: d.opts.Weight, Readiness: d.heartbeatReadiness,
		OnPause: d.onPause,
	}
	if d.opts.ClusterSecret != "" {
		cfg.Secret = []byte(d.opts.ClusterSecret)
	}
	if !d.mode.prepare(ctx, &cfg, auth) {
		return nil // ctx ended
	}
	el, err := cluster.New(cfg)
	if err != nil {
		return fmt.Errorf("election: %w", err)
	}
	d.elector.Store(el)
	d.refreshReadiness(ctx) // before the first heartbeat

	// The election outlives ctx: a leader first drains and commits, then
	// resigns, so that a follower takes over at once.
	elCtx, stopElection := context.WithCancel(context.Background())
	elDone := make(chan error, 1)
	var routines actor.Group
	routines.Go(d.log, "election", func() { elDone <- el.Run(elCtx) }, nil)
	routines.Go(d.log, "readiness", func() {
		ticker := time.NewTicker(d.opts.ClusterHeartbeat)
		defer ticker.Stop()
		for {
			select {
			case <-elCtx.Done():
				return
			case <-ticker.C:
				d.refreshReadiness(elCtx)
			}
		}
	}, nil)
	defer routines.Wait()
	resign := sync.OnceFunc(func() {
		resignCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := el.Resign(resignCtx); err != nil {
			d.log.WithError(err).Warn("resigning from the cluster")
		}
		cancel()
	})
	defer func() {
		resign()
		stopElection()
		if err := <-elDone; err != nil {
			d.log.WithError(err).Warn("election stopped")
		}
	}()
	return d.mode.run(ctx, serveEnv{client: client, auth: auth, el: el, elDone: elDone, resign: resign})
}

// openAuthority opens the offset store Options.OffsetStore names, and the
// election's authority that fences it: the consumer group fanout_<id> in
// Kafka, through client (no ZooKeeper is contacted); or a ZooKeeper
// session, retried until ctx ends. Close it when done.
func (d *Daemon) openAuthority(ctx context.Context, client sarama.Client) (authority.Authority, error) {
	cfg := d.opts.authorityConfig(client)
	cfg.ConnectZooKeeper, cfg.Logger = d.connectZooKeeper, d.log
	return authority.Open(ctx, d.store, cfg)
}

// checkDeadLetterTopic checks, before this node serves, that the dead-letter
// topic exists and may be used, and creates it when it does not and
// Options.CreateDeadLetterTopic asks for it: an error that says what to fix
// when it cannot be used; nil once it can, or when ctx ends (Kafka out of
// reach is retried).
func (d *Daemon) checkDeadLetterTopic(ctx context.Context, client sarama.Client) error {
	var unusable error
	log := d.log.WithField("dead_letter_topic", d.opts.DeadLetterTopic)
	err := retry(ctx, log, "check the dead-letter topic", d.opts.ConnectBackoffMax,
		func(context.Context) error {
			err := kafka.CheckDeadLetterTopic(client, d.opts.DeadLetterTopic)
			if errors.Is(err, kafka.ErrDeadLetterTopicMissing) && d.opts.CreateDeadLetterTopic {
				n, cerr := kafka.CreateDeadLetterTopic(client, d.opts.DeadLetterTopic, d.opts.Topic)
				if errors.Is(cerr, kafka.ErrDeadLetterTopic) {
					unusable = cerr
					return nil
				}
				if cerr != nil {
					return cerr
				}
				if n > 0 {
					log.WithField("partitions", n).Info("created the dead-letter topic (the cluster's default replication factor)")
				}
				if err = kafka.CheckDeadLetterTopic(client, d.opts.DeadLetterTopic); errors.Is(err, kafka.ErrDeadLetterTopicMissing) {
					return fmt.Errorf("dead-letter topic %q: created, not yet in the cluster's metadata", d.opts.DeadLetterTopic)
				}
			}
			if errors.Is(err, kafka.ErrDeadLetterTopic) {
				unusable = err
				return nil
			}
			return err
		})
	if err != nil {
		return nil // ctx ended
	}
	return unusable
}

// awaitTopic waits until the topic watch has found the topic (true), or
// ctx ends (false).
func (d *Daemon) awaitTopic(ctx context.Context) bool {
	select {
	case <-d.health.Found():
		return true
	case <-ctx.Done():
		return false
	}
}

// markReady closes Ready, once.
func (d *Daemon) markReady() { d.readyOnce.Do(func() { close(d.ready) }) }

// connectKafka returns a client of the Kafka cluster, retrying until ctx
// ends. tune, when set, adjusts the configuration.
func (d *Daemon) connectKafka(ctx context.Context, clientID string, tune func(*sarama.Config)) (sarama.Client, error) {
	var client sarama.Client
	err := retry(ctx, d.log.WithField("kafka", d.opts.Kafka), "connect to Kafka", d.opts.ConnectBackoffMax,
		func(ctx context.Context) error {
			cfg, err := d.opts.KafkaSecurity.Config(clientID)
			if err != nil {
				return err
			}
			if tune != nil {
				tune(cfg)
			}
			c, err := newKafkaClient(ctx, d.opts.Kafka, cfg, d.log)
			if err != nil {
				err = kafka.DescribeError(d.opts.Kafka, d.opts.KafkaSecurity, err)
				if ctx.Err() == nil {
					d.health.connected(err)
				}
				return err
			}
			d.health.connected(nil)
			client = c
			return nil
		})
	return client, err
}

// newKafkaClient is sarama.NewClient, given up when ctx ends first: with
// kafka.NewConfig's metadata retries an unreachable cluster takes sarama
// about 13 s to report, and a shutdown must not wait for that. A client
// that connects after it was given up is closed. Its goroutine is
// detached: nobody waits for a connection given up.
func newKafkaClient(ctx context.Context, addrs []string, cfg *sarama.Config, log *logrus.Entry) (sarama.Client, error) {
	type result struct {
		client sarama.Client
		err    error
	}
	done := make(chan result) // unbuffered: a result nobody takes is the connector's to close
	given := make(chan struct{})
	var detached actor.Group
	detached.Go(log, "kafka connect", func() {
		c, err := sarama.NewClient(addrs, cfg)
		select {
		case done <- result{c, err}:
		case <-given:
			if err == nil {
				_ = c.Close()
			}
		}
	}, nil)
	select {
	case r := <-done:
		return r.client, r.err
	case <-ctx.Done():
		close(given)
		return nil, ctx.Err()
	}
}

// connectZooKeeper returns a ZooKeeper session, retrying until ctx ends.
func (d *Daemon) connectZooKeeper(ctx context.Context, servers []string) (*zk.Conn, error) {
	var conn *zk.Conn
	err := retry(ctx, d.log.WithField("zookeeper", d.opts.ZooKeeper), "connect to ZooKeeper", d.opts.ConnectBackoffMax,
		func(ctx context.Context) error {
			attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			c, err := d.opts.ZooKeeperSecurity.Connect(attempt, servers, d.opts.ZooKeeperSessionTimeout, d.log)
			if err != nil {
				return err
			}
			conn = c
			return nil
		})
	return conn, err
}

// MetricsAddr returns the address of /metrics, /healthz, /readyz and the
// console once Listening is closed, or nil when Options.MetricsListen is "".
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metrics == nil {
		return nil
	}
	return d.metrics.Addr()
}

// startMetrics binds Options.MetricsListen, if set, and serves metrics,
// health checks and the console on it, and samples the console's rates,
// until stop is called.
func (d *Daemon) startMetrics() (stop func(), err error) {
	if d.opts.MetricsListen == "" {
		return func() {}, nil
	}
	ms, err := metrics.Listen(d.opts.MetricsListen, metrics.Handler(metrics.HandlerConfig{
		Collector:        d.collector,
		Snapshot:         d.metricsSnapshot,
		MaxCommitFailing: d.maxCommitFailing(),
		Token:            d.opts.MetricsToken,
		Console:          console.Handler(console.Config{Status: d.Status}),
		Actions:          console.Actions(d.actions()),
	}))
	if err != nil {
		return nil, err
	}
	d.metrics = ms
	addr := ms.Addr().String()
	d.consoleAddr.Store(&addr)
	var served actor.Group
	served.Go(d.log, "metrics server", func() {
		if err := ms.Serve(); err != nil {
			d.log.WithError(err).Error("metrics server stopped")
		}
	}, nil)
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	var sampler actor.Group
	sampler.Go(d.log, "rate sampler", func() { d.sampleRates(sampleCtx) }, nil)
	d.log.WithField("metrics", ms.Addr().String()).Info("serving /metrics, /healthz, /readyz and the console at /")
	return func() {
		stopSampling()
		sampler.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ms.Shutdown(ctx); err != nil {
			d.log.WithError(err).Warn("stopping the metrics server")
		}
		served.Wait()
	}, nil
}

// maxCommitFailing is how long a leader's commits may fail before /readyz
// (and the console) report it unready.
func (d *Daemon) maxCommitFailing() time.Duration {
	return max(3*d.opts.CommitInterval, 10*time.Second)
}

// metricsSnapshot gathers the daemon's state for metrics and /readyz.
func (d *Daemon) metricsSnapshot(ctx context.Context) metrics.Snapshot {
	var s metrics.Snapshot
	s.Stats, s.Serving = d.Stats(ctx)
	s.Topic = d.opts.Topic
	d.health.fill(&s)
	if p := d.backend.serving(); p != nil {
		s.HighWaterMarks = p.src.HighWaterMarks()
		d.health.fillNewest(&s)
		s.Partitions = len(p.src.Partitions())
		if p.dead != nil {
			s.DeadLetterTopic, s.DeadLetterFailingSince = p.dead.Topic(), p.dead.FailingSince()
			s.DeadLetterRefused, s.DeadLetterRefusedError = p.dead.Refused()
			s.DeadLetterValuesOmitted = p.dead.ValuesOmitted()
		}
	}
	s.Clients = d.srv.Clients()
	ss := d.srv.Stats()
	s.Handshaking = ss.Handshaking
	s.ClientsByIdentity = ss.Identities
	s.ConnectionsClosed = make(map[string]uint64, len(ss.Closed))
	for i, n := range ss.Closed {
		s.ConnectionsClosed[server.CloseReasons[i]] = n
	}
	if el := d.elector.Load(); el != nil {
		l := el.Leadership()
		s.Clustered = true
		s.Leader = s.Serving || l.Leader
		s.LeaderKnown = l.Known
		s.LeaderID, s.Epoch = l.LeaderID, l.Epoch
		s.Failovers = el.Failovers()
		s.UnauthenticatedHeartbeats = el.Unauthenticated()
		s.Members = len(el.Members())
	} else if s.Serving { // alone, without an election (Options.Store)
		s.Leader, s.LeaderKnown, s.LeaderID, s.Members = true, true, d.opts.NodeID, 1
	}
	d.mode.snapshot(&s)
	if s.DeliveryPaused = d.pause.On(); s.DeliveryPaused {
		if p := d.pauseInForce(); p != nil {
			s.PausedBy = p.By + " at " + p.At.Format(time.RFC3339)
		}
	}
	return s
}

// heartbeatSecurity describes the heartbeat log's protection for the first
// log line; never the secret.
func (d *Daemon) heartbeatSecurity() string {
	if d.opts.ClusterSecret != "" {
		return "MAC (--cluster-secret)"
	}
	return "none"
}

// Ownership returns this member's partitions in spread mode (the zero
// status in leader mode, or before the member serves).
func (d *Daemon) Ownership() OwnershipStatus { return d.mode.ownership() }

// membersChanged is the one place the daemon tells the server that the
// members owning partitions changed (the server pushes the new list to the
// clients that asked for it). Without an assignment in force the clients
// are sent away (to retry: this member does not serve) once its partitions
// were handed over: see spreadMode.stretch.
func (d *Daemon) membersChanged([]string) { d.srv.MembersChanged() }

// portTaken adds a hint to a listen error caused by a port in use: several
// daemons on one host need a --listen and a --metrics-listen each.
func portTaken(err error, flag string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: is another fanout daemon running on this host? Give each daemon its own %s "+
		"(see the README's cluster section), or stop the process that holds the port", err, flag)
}
