package fanout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// Daemon is one fanout process: a client listener, a Kafka client, an
// offset store and, while it leads, a source and a dispatcher.
type Daemon struct {
	opts    Options
	log     *logrus.Entry
	backend switchBackend
	srv     *server.Server

	serving   atomic.Bool // a dispatcher is running: clients are welcome
	elector   atomic.Pointer[cluster.Elector]
	listening chan struct{} // closed once the listener is bound
	ready     chan struct{} // closed once this node first serves clients
	readyOnce sync.Once

	source    atomic.Pointer[kafka.Source] // the running dispatcher's source, for metrics
	collector *metrics.Collector
	metrics   *metrics.Server // nil when Options.MetricsListen is ""; set before listening closes
}

// New validates opts and returns a Daemon. Nothing runs until Run.
func New(opts Options) (*Daemon, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	d := &Daemon{
		opts:      opts,
		log:       opts.Logger.WithFields(logrus.Fields{"id": opts.ID, "topic": opts.Topic}),
		listening: make(chan struct{}),
		ready:     make(chan struct{}),
	}
	d.collector = metrics.NewCollector(d.metricsSnapshot)
	srv, err := server.New(server.Config{
		Listen:       opts.Listen,
		NodeID:       opts.NodeID,
		Topic:        opts.Topic,
		MaxInFlight:  opts.MaxInFlight,
		AckTimeout:   opts.AckTimeout,
		Heartbeat:    opts.Heartbeat,
		Liveness:     opts.Liveness,
		WriteTimeout: opts.WriteTimeout,
		MaxFrameSize: opts.MaxFrameSize,
		MaxClients:   opts.MaxClients,
		AuthToken:    opts.AuthToken,
		Leadership:   d.leadership,
		Logger:       d.log,
	}, &d.backend)
	if err != nil {
		return nil, fmt.Errorf("client server: %w", err)
	}
	d.srv = srv
	return d, nil
}

// Addr returns the client listener's address once Listening is closed.
func (d *Daemon) Addr() net.Addr { return d.srv.Addr() }

// Listening is closed once the client listener is bound.
func (d *Daemon) Listening() <-chan struct{} { return d.listening }

// Ready is closed once the daemon first serves clients: Kafka and the offset
// store are reachable and the dispatcher runs.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Stats returns the dispatcher's counters, or false when no dispatcher runs.
func (d *Daemon) Stats(ctx context.Context) (dispatch.Stats, bool) {
	if disp := d.backend.get(); disp != nil {
		return disp.Stats(ctx)
	}
	return dispatch.Stats{}, false
}

// leadership tells the server whether to welcome clients: only while a
// dispatcher runs. A follower redirects to the leader the election names;
// a leader still starting up, or a cluster with no leader, tells clients to
// retry shortly.
func (d *Daemon) leadership() server.Leadership {
	if d.serving.Load() {
		return server.Leadership{Leader: true}
	}
	// Without a leader, clients retry after about one cluster heartbeat: a
	// handover (the old leader resigned) takes about that long.
	none := server.Leadership{RetryAfter: d.opts.ClusterHeartbeat}
	el := d.elector.Load()
	if el == nil {
		return none
	}
	l := el.Leadership()
	if l.Leader || l.LeaderID == d.opts.NodeID {
		return none // elected, not serving yet; or resigning
	}
	l.RetryAfter = d.opts.ClusterHeartbeat
	return l
}

// Run serves until ctx ends, then shuts down gracefully: it stops accepting
// clients and fetching, says goodbye to clients, waits up to DrainTimeout
// for outstanding acks, commits, hands leadership over and returns nil.
// Kafka, ZooKeeper or the topic being out of reach is logged and retried
// with backoff; Run returns an error only for what retrying cannot fix (the
// listen address is taken).
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.srv.Start(context.Background()); err != nil {
		return err
	}
	defer d.srv.Close()
	stopMetrics, err := d.startMetrics()
	if err != nil {
		return err
	}
	defer stopMetrics()
	close(d.listening)
	stopAccepting := context.AfterFunc(ctx, d.srv.StopAccepting)
	defer stopAccepting()
	d.log.WithFields(logrus.Fields{"listen": d.srv.Addr().String(), "node": d.opts.NodeID, "kafka": d.opts.Kafka, "zookeeper": d.opts.ZooKeeper}).
		Info("fanout starting: connecting to Kafka and ZooKeeper")

	client, err := d.connectKafka(ctx, "fanout-"+d.opts.NodeID, nil)
	if err != nil {
		return nil // ctx ended
	}
	defer client.Close()

	if d.opts.Store != nil {
		err = d.lead(ctx, client, d.opts.Store, d.opts.Store.NewTerm())
	} else {
		err = d.runCluster(ctx, client)
	}
	d.log.Info("fanout stopped")
	return err
}

// runCluster connects to ZooKeeper, takes part in the election and leads
// during every term this node wins, until ctx ends.
func (d *Daemon) runCluster(ctx context.Context, client sarama.Client) error {
	servers, chroot, err := zkstore.ParseServers(d.opts.ZooKeeper)
	if err != nil {
		return err
	}
	conn, err := d.connectZooKeeper(ctx, servers)
	if err != nil {
		return nil // ctx ended
	}
	defer conn.Close()
	store := zkstore.New(conn, chroot, d.opts.ID, d.opts.Topic)

	// The election reads its log with short fetch waits, so it gets a client
	// of its own: the source's fetch settings are tuned for throughput.
	elClient, err := d.connectKafka(ctx, "fanout-election-"+d.opts.NodeID, func(c *sarama.Config) {
		c.Consumer.MaxWaitTime = 50 * time.Millisecond
	})
	if err != nil {
		return nil // ctx ended
	}
	defer elClient.Close()
	el, err := cluster.New(cluster.Config{
		ID: d.opts.ID, Topic: d.opts.Topic, NodeID: d.opts.NodeID, Addr: d.opts.advertised(d.srv.Addr()),
		Heartbeat: d.opts.ClusterHeartbeat, LeaderTimeout: d.opts.LeaderTimeout,
		Client: elClient, ZK: conn, Chroot: chroot, Logger: d.log,
	})
	if err != nil {
		return fmt.Errorf("election: %w", err)
	}
	d.elector.Store(el)

	// The election outlives ctx: a leader first drains and commits, then
	// resigns, so that a follower takes over at once.
	elCtx, stopElection := context.WithCancel(context.Background())
	elDone := make(chan error, 1)
	go func() { elDone <- el.Run(elCtx) }()
	defer func() {
		resignCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := el.Resign(resignCtx); err != nil {
			d.log.WithError(err).Warn("resigning from the cluster")
		}
		cancel()
		stopElection()
		if err := <-elDone; err != nil {
			d.log.WithError(err).Warn("election stopped")
		}
	}()

	for {
		var term *cluster.Term
		select {
		case <-ctx.Done():
			return nil
		case err := <-elDone:
			elDone <- err // for the deferred wait
			return fmt.Errorf("election stopped: %w", err)
		case t, ok := <-el.Terms():
			if !ok {
				return nil
			}
			term = t
		}
		d.serveTerm(ctx, client, store, term)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// serveTerm leads for one term: until ctx ends (then it drains and commits
// under the term's fence) or the term ends (then it abandons at once: another
// node owns the offsets).
func (d *Daemon) serveTerm(ctx context.Context, client sarama.Client, store *zkstore.Store, term *cluster.Term) {
	log := d.log.WithField("epoch", term.Epoch)
	log.WithField("fence", term.Fence).Info("elected leader")

	leadCtx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	unhook := context.AfterFunc(ctx, func() { stop(context.Canceled) })
	defer unhook()
	go func() {
		select {
		case <-term.Lost():
			stop(fmt.Errorf("%w: %w", dispatch.ErrAbandon, term.Cause()))
		case <-leadCtx.Done():
		}
	}()

	err := d.lead(leadCtx, client, store, term.Fence)
	switch {
	case err == nil:
		log.Info("leadership term over")
	case errors.Is(err, dispatch.ErrAbandon), errors.Is(err, offsets.ErrFenced):
		log.WithError(err).Warn("lost leadership")
	default:
		log.WithError(err).Error("leading failed")
	}
	d.srv.RedirectAll(d.leadership())
}

// connectKafka returns a client of the Kafka cluster, retrying until ctx
// ends. tune, when set, adjusts the configuration.
func (d *Daemon) connectKafka(ctx context.Context, clientID string, tune func(*sarama.Config)) (sarama.Client, error) {
	cfg := kafka.NewConfig(clientID)
	if tune != nil {
		tune(cfg)
	}
	var client sarama.Client
	err := retry(ctx, d.log.WithField("kafka", d.opts.Kafka), "connect to Kafka", d.opts.ConnectBackoffMax,
		func(ctx context.Context) error {
			c, err := newKafkaClient(ctx, d.opts.Kafka, cfg)
			if err != nil {
				return fmt.Errorf("kafka unreachable at %v: %w", d.opts.Kafka, err)
			}
			client = c
			return nil
		})
	return client, err
}

// newKafkaClient is sarama.NewClient, given up when ctx ends first: with
// kafka.NewConfig's metadata retries an unreachable cluster takes sarama
// about 13 s to report, and a shutdown must not wait for that. A client
// that connects after it was given up is closed.
func newKafkaClient(ctx context.Context, addrs []string, cfg *sarama.Config) (sarama.Client, error) {
	type result struct {
		client sarama.Client
		err    error
	}
	done := make(chan result, 1)
	go func() {
		c, err := sarama.NewClient(addrs, cfg)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.client, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				_ = r.client.Close()
			}
		}()
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
			c, err := zkstore.Connect(attempt, servers, 10*time.Second, d.log)
			if err != nil {
				return err
			}
			conn = c
			return nil
		})
	return conn, err
}

// lead consumes the topic and serves clients until ctx ends or the store
// refuses a commit under fence.
func (d *Daemon) lead(ctx context.Context, client sarama.Client, store offsets.Store, fence offsets.Fence) error {
	var stored map[int32]int64
	err := retry(ctx, d.log, "load offsets", d.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		stored, err = store.Load(ctx)
		return err
	})
	if err != nil {
		return nil // ctx ended
	}
	initial, err := kafka.ParseInitialOffset(d.opts.InitialOffset)
	if err != nil {
		return err
	}
	src, err := kafka.NewSource(client, kafka.SourceConfig{
		Topic: d.opts.Topic, Initial: initial, Stored: stored, Logger: d.log,
	})
	if err != nil {
		return fmt.Errorf("kafka source: %w", err)
	}
	disp, err := dispatch.New(dispatch.Config{
		AckTimeout:       d.opts.AckTimeout,
		MaxBuffered:      d.opts.MaxBuffered,
		MaxBufferedBytes: d.opts.MaxBufferedBytes,
		CommitInterval:   d.opts.CommitInterval,
		DrainTimeout:     d.opts.DrainTimeout,
		Store:            store,
		Fence:            fence,
		Logger:           d.log,
		Stored:           stored,
		OnCommit:         d.collector.ObserveCommit,
	}, src)
	if err != nil {
		return err
	}

	// The source outlives the dispatcher's drain: it stops only after the
	// dispatcher has returned.
	srcCtx, stopSource := context.WithCancel(context.Background())
	srcDone := make(chan struct{})
	go func() {
		defer close(srcDone)
		_ = retry(srcCtx, d.log, "consume topic "+d.opts.Topic, d.opts.ConnectBackoffMax, src.Run)
	}()
	defer func() {
		stopSource()
		<-srcDone
	}()

	d.backend.set(disp)
	d.source.Store(src)
	d.serving.Store(true)
	d.readyOnce.Do(func() { close(d.ready) })
	d.log.WithField("stored_offsets", stored).Info("serving clients")
	err = disp.Run(ctx)
	d.serving.Store(false)
	d.backend.set(nil)
	d.source.Store(nil)
	if err != nil {
		// The term is lost: send the clients on now, before waiting for the
		// source to stop (a broker out of reach can hold that up).
		d.srv.RedirectAll(d.leadership())
	}
	return err
}

// MetricsAddr returns the address of /metrics, /healthz and /readyz once
// Listening is closed, or nil when Options.MetricsListen is "".
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metrics == nil {
		return nil
	}
	return d.metrics.Addr()
}

// startMetrics binds Options.MetricsListen, if set, and serves metrics and
// health checks on it until stop is called.
func (d *Daemon) startMetrics() (stop func(), err error) {
	if d.opts.MetricsListen == "" {
		return func() {}, nil
	}
	ms, err := metrics.Listen(d.opts.MetricsListen, metrics.Handler(metrics.HandlerConfig{
		Collector:        d.collector,
		Snapshot:         d.metricsSnapshot,
		MaxCommitFailing: max(3*d.opts.CommitInterval, 10*time.Second),
	}))
	if err != nil {
		return nil, err
	}
	d.metrics = ms
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := ms.Serve(); err != nil {
			d.log.WithError(err).Error("metrics server stopped")
		}
	}()
	d.log.WithField("metrics", ms.Addr().String()).Info("serving /metrics, /healthz and /readyz")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ms.Shutdown(ctx); err != nil {
			d.log.WithError(err).Warn("stopping the metrics server")
		}
		<-served
	}, nil
}

// metricsSnapshot gathers the daemon's state for metrics and /readyz.
func (d *Daemon) metricsSnapshot(ctx context.Context) metrics.Snapshot {
	var s metrics.Snapshot
	s.Stats, s.Serving = d.Stats(ctx)
	if src := d.source.Load(); src != nil {
		s.HighWaterMarks = src.HighWaterMarks()
	}
	s.Clients = d.srv.Clients()
	if el := d.elector.Load(); el != nil {
		l := el.Leadership()
		s.Clustered = true
		s.Leader = s.Serving || l.Leader
		s.LeaderKnown = l.Known
		s.LeaderID, s.Epoch = l.LeaderID, l.Epoch
		s.Failovers = el.Failovers()
		s.Members = len(el.Members())
	} else if s.Serving { // alone, without an election (Options.Store)
		s.Leader, s.LeaderKnown, s.LeaderID, s.Members = true, true, d.opts.NodeID, 1
	}
	return s
}

// switchBackend forwards the server's calls to the running dispatcher, if
// any. Between dispatchers there is nobody to forward to: a joining client
// is told goodbye and other calls are dropped (their deliveries belong to a
// dispatcher that is gone and are redelivered from the committed offsets).
type switchBackend struct {
	cur atomic.Pointer[dispatch.Dispatcher]
}

var _ dispatch.Backend = (*switchBackend)(nil)

func (b *switchBackend) set(d *dispatch.Dispatcher) { b.cur.Store(d) }
func (b *switchBackend) get() *dispatch.Dispatcher  { return b.cur.Load() }

// Join implements dispatch.Backend.
func (b *switchBackend) Join(id uint64, name string, max int, sink dispatch.ClientSink) {
	if d := b.get(); d != nil {
		d.Join(id, name, max, sink)
		return
	}
	sink.Goodbye("not serving")
}

// Ack implements dispatch.Backend.
func (b *switchBackend) Ack(id uint64, ids []uint64) {
	if d := b.get(); d != nil {
		d.Ack(id, ids)
	}
}

// Nack implements dispatch.Backend.
func (b *switchBackend) Nack(id uint64, ids []uint64) {
	if d := b.get(); d != nil {
		d.Nack(id, ids)
	}
}

// Touch implements dispatch.Backend.
func (b *switchBackend) Touch(id uint64, ids []uint64) {
	if d := b.get(); d != nil {
		d.Touch(id, ids)
	}
}

// Leave implements dispatch.Backend.
func (b *switchBackend) Leave(id uint64, reason dispatch.LeaveReason) {
	if d := b.get(); d != nil {
		d.Leave(id, reason)
	}
}
