package fanout

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/authtoken"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// Daemon is one fanout process: a client listener, a Kafka client, an
// offset store and, while it leads, a term (source, dispatcher, fence).
type Daemon struct {
	opts    Options
	log     *logrus.Entry
	backend termBackend // the serving term, if any: where the server's calls go
	srv     *server.Server

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
	rates       *console.Rates  // the console's message rates, sampled while the metrics listener runs
	tls         *tlsconf.Server // the client listener's TLS; nil without Options.ClientTLS
	tokens      *authtoken.File // the named client tokens; nil without Options.AuthTokensFile
	recheck     chan struct{}   // capacity 1: the tokens or the client CA changed (watchCredentials)

	clusterView atomic.Pointer[clusterView] // spread mode: the console's reading of every partition
	lastReady   atomic.Pointer[readyState]  // what /readyz answered at the last refresh, for the heartbeats

	ownStatus atomic.Pointer[OwnershipStatus] // spread mode: this member's partitions
	handoffs  atomic.Uint64                   // spread mode: handoffs done
	committed atomic.Bool                     // spread mode: the group has committed offsets, as far as this member knows

	// With --max-attempts, set by Run before any term: the dead-letter
	// producers' client, and the largest record it sends (deadLetterLimit).
	deadClient sarama.Client
	deadLimit  int
}

// New validates opts and returns a Daemon. Nothing runs until Run.
func New(opts Options) (_ *Daemon, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	d := &Daemon{
		opts:      opts,
		log:       opts.Logger.WithFields(logrus.Fields{"id": opts.ID, "topic": opts.Topic}),
		listening: make(chan struct{}),
		ready:     make(chan struct{}),
		recheck:   make(chan struct{}, 1),
		health:    newKafkaHealth(),
	}
	d.collector = metrics.NewCollector(d.metricsSnapshot)
	d.rates = console.NewRates(console.SampleInterval)
	var tlsCfg *tls.Config
	if opts.ClientTLS.Set() {
		if d.tls, err = tlsconf.NewServer(opts.ClientTLS, d.tlsReloaded); err != nil {
			return nil, fmt.Errorf("client listener TLS: %w", err)
		}
		tlsCfg = d.tls.Config()
	}
	var authenticate func([sha256.Size]byte) (string, bool)
	if opts.AuthTokensFile != "" {
		if d.tokens, err = authtoken.Open(opts.AuthTokensFile, d.tokensReloaded); err != nil {
			return nil, err
		}
		authenticate = d.tokens.CheckSum
	}
	var verifyClient func([]*x509.Certificate) error
	if d.tls != nil && d.tls.MutualTLS() {
		verifyClient = d.tls.VerifyClient
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
		Members:        d.members,
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
	return d, nil
}

// Reload re-reads the client listener's certificate, key and client CA and
// the named tokens now, whether or not their files changed (SIGHUP), and
// ends the sessions whose token or certificate they no longer accept (an
// Error UNAUTHORIZED; their deliveries go to other clients at once). The
// files are also re-read when they change (watchCredentials). A file that
// does not load leaves the previous version in force; the outcome is
// logged.
func (d *Daemon) Reload() {
	if d.tls != nil {
		_ = d.tls.Reload()
	}
	if d.tokens != nil {
		_ = d.tokens.Reload()
	}
	d.reauthorize()
}

// credentialsPoll is how often watchCredentials looks for changed files:
// a few stat calls.
const credentialsPoll = time.Second

// watchCredentials re-reads the named tokens and the client listener's TLS
// files when they change (looked for every credentialsPoll), and, after
// every change put in force, ends the sessions whose credentials are no
// longer accepted, until ctx ends. Without named tokens or a client CA it
// returns at once: nothing to revoke.
func (d *Daemon) watchCredentials(ctx context.Context) {
	if d.tokens == nil && (d.tls == nil || !d.tls.MutualTLS()) {
		return
	}
	tick := time.NewTicker(credentialsPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if d.tokens != nil {
				d.tokens.Refresh()
			}
			if d.tls != nil {
				d.tls.Refresh()
			}
		case <-d.recheck:
			d.reauthorize()
		}
	}
}

// reauthorize ends the sessions whose credentials are no longer accepted,
// and logs how many.
func (d *Daemon) reauthorize() {
	if n := d.srv.Reauthorize(); n > 0 {
		d.log.WithField("sessions", n).Warn("client credentials changed: the sessions they no longer accept were ended")
	}
}

// credentialsChanged has watchCredentials re-check the sessions; it never
// blocks (the files' readers call it).
func (d *Daemon) credentialsChanged() {
	select {
	case d.recheck <- struct{}{}:
	default:
	}
}

// tlsReloaded logs the outcome of re-reading the listener's TLS files.
func (d *Daemon) tlsReloaded(err error) {
	log := d.log.WithFields(logrus.Fields{"tls_cert": d.opts.ClientTLS.Cert, "tls_client_ca": d.opts.ClientTLS.ClientCA})
	if err != nil {
		log.WithError(err).Error("client TLS files changed but do not load: the previous certificate stays in force")
		return
	}
	log.Info("client TLS files reloaded: new connections use them, sessions whose certificate they no longer accept end")
	d.credentialsChanged()
}

// tokensReloaded logs the outcome of re-reading the named tokens; never a
// token.
func (d *Daemon) tokensReloaded(err error) {
	log := d.log.WithField("auth_tokens_file", d.opts.AuthTokensFile)
	if err != nil {
		log.WithError(err).Error("client tokens file changed but does not load: the previous tokens stay in force")
		return
	}
	log.WithField("tokens", d.tokens.Len()).Info("client tokens file reloaded: new connections use it, sessions whose token it no longer holds end")
	d.credentialsChanged()
}

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

// leadership maps this node's state onto what the server tells clients: it
// welcomes them only while a term serves. A follower redirects to the leader
// the election names; a leader still starting up, or a cluster with no
// leader, tells clients to retry shortly.
func (d *Daemon) leadership() server.Leadership {
	if d.opts.Assignment == AssignmentSpread {
		return d.spreadLeadership()
	}
	if d.backend.serving() != nil {
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
	if l.Leader || !l.Known || l.LeaderID == d.opts.NodeID {
		return none // elected, not serving yet; or resigning; or no leader known
	}
	if l.Mode != cluster.Mode_MODE_LEADER {
		return none // the leader runs spread mode: this member does not serve (the elector says why)
	}
	return server.Leadership{Known: true, LeaderID: l.LeaderID, LeaderAddr: l.LeaderAddr, Epoch: l.Epoch,
		RetryAfter: d.opts.ClusterHeartbeat}
}

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
	close(d.listening)
	stopAccepting := context.AfterFunc(ctx, d.srv.StopAccepting)
	defer stopAccepting()
	credsCtx, stopWatching := context.WithCancel(ctx)
	var watcher actor.Group
	watcher.Go(d.log, "credentials watcher", func() { d.watchCredentials(credsCtx) }, nil)
	defer watcher.Wait()
	defer stopWatching()
	fields := logrus.Fields{"listen": d.srv.Addr().String(), "client_security": d.clientSecurity(), "heartbeat_security": d.heartbeatSecurity(), "node": d.opts.NodeID, "kafka": d.opts.Kafka,
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
			_, err := kafka.TopicPartitions(client, d.opts.Topic)
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
		d.deadLimit = deadLetterLimit(client, d.opts.DeadLetterTopic, d.log)
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
		err = d.newTerm(client, d.opts.Store, d.opts.Store.NewTerm(), d.log).run(ctx, d.markReady)
	} else {
		err = d.runCluster(ctx, client)
	}
	d.log.Info("fanout stopped")
	return err
}

// runCluster opens the offset store, takes part in the election and leads
// during every term this node wins, until ctx ends.
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
	store, authority, closeStore, err := d.openStore(ctx, elClient)
	if err != nil || store == nil {
		return err // nil: ctx ended
	}
	defer closeStore()
	// Every member, follower or not, waits for the topic: none of them
	// joins the election (and creates fanout_<id>_<topic>) for a topic
	// that does not exist.
	if !d.awaitTopic(ctx) {
		return nil
	}
	cfg := authority
	cfg.ID, cfg.Topic, cfg.NodeID, cfg.Addr = d.opts.ID, d.opts.Topic, d.opts.NodeID, d.opts.advertised(d.srv.Addr())
	cfg.Heartbeat, cfg.LeaderTimeout, cfg.Client, cfg.Logger = d.opts.ClusterHeartbeat, d.opts.LeaderTimeout, elClient, d.log
	if d.opts.ClusterSecret != "" {
		cfg.Secret = []byte(d.opts.ClusterSecret)
	}
	cfg.Mode, cfg.Weight, cfg.Committed = cluster.Mode_MODE_LEADER, d.opts.Weight, d.committed.Load
	if d.opts.Assignment == AssignmentSpread {
		cfg.Mode = cluster.Mode_MODE_SPREAD
		// Whether the group ever committed decides where a new line of
		// assignments starts the partitions without a committed offset.
		err := retry(ctx, d.log, "load offsets", d.opts.ConnectBackoffMax, func(ctx context.Context) error {
			stored, err := store.Load(ctx)
			if len(stored) > 0 {
				d.committed.Store(true)
			}
			return err
		})
		if err != nil {
			return nil // ctx ended
		}
	}
	cfg.Readiness = d.heartbeatReadiness
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

	if d.opts.Assignment == AssignmentSpread {
		// Every member serves the partitions its assignment gives it; the
		// election only says who computes the assignment. Spread mode keeps
		// its ownership records in ZooKeeper (Validate refuses it with the
		// Kafka store).
		zs, ok := store.(*zkstore.Store)
		if !ok {
			return fmt.Errorf("spread mode needs the ZooKeeper offset store, not %T", store)
		}
		owners := zkstore.NewOwners(authority.ZK, authority.Chroot, d.opts.ID, d.opts.Topic, d.opts.NodeID,
			d.opts.advertised(d.srv.Addr()), authority.ACL)
		d.clusterView.Store(newClusterView(func(ctx context.Context) (clusterRead, error) {
			return readCluster(ctx, client, zs, authority.ZK, authority.Chroot, d.opts)
		}, console.SampleInterval))
		defer d.clusterView.Store(nil)
		return d.runSpread(ctx, client, zs, spreadDeps{assign: el, records: owners, loader: zs, resign: resign})
	}

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

// openStore opens the offset store Options.OffsetStore names, and the
// election's authority that fences it: the consumer group fanout_<id> in
// Kafka, through client (no ZooKeeper is contacted); or a ZooKeeper session,
// with the fence znode. It returns a nil store when ctx ends first, and
// close, which releases what it opened.
func (d *Daemon) openStore(ctx context.Context, client sarama.Client) (offsets.Store, cluster.Config, func(), error) {
	if d.opts.OffsetStore == OffsetStoreKafka {
		store := kafkastore.New(client, d.opts.ID, d.opts.Topic, d.opts.KafkaSessionTimeout)
		return store, cluster.Config{Group: store}, func() {}, nil
	}
	servers, chroot, err := zkstore.ParseServers(d.opts.ZooKeeper)
	if err != nil {
		return nil, cluster.Config{}, nil, err
	}
	conn, err := d.connectZooKeeper(ctx, servers)
	if err != nil {
		return nil, cluster.Config{}, nil, nil // ctx ended
	}
	store := zkstore.New(conn, chroot, d.opts.ID, d.opts.Topic)
	acl := d.opts.ZooKeeperSecurity.ACL(chroot)
	store.SetACL(acl)
	acl.WarnOpen(conn, d.log, store.Path(), store.ProgressPath(), chroot+cluster.FencePath(d.opts.ID, d.opts.Topic),
		zkstore.OwnersPath(chroot, d.opts.ID, d.opts.Topic))
	return store, cluster.Config{ZK: conn, Chroot: chroot, ACL: acl}, conn.Close, nil
}

// authority is where a term's fence came from: the election's term
// (*cluster.Term). It ends the term when it is lost, and is told when the
// term cannot go on.
type authority interface {
	Lost() <-chan struct{} // closed when the term ends
	Cause() error          // why it ended; nil while it runs
	End(cause error)       // the term cannot go on: let another member lead
}

var _ authority = (*cluster.Term)(nil)

// serveTerm leads for one term of the election.
func (d *Daemon) serveTerm(ctx context.Context, client sarama.Client, store offsets.Store, ct *cluster.Term) {
	log := d.log.WithField("epoch", ct.Epoch)
	log.WithField("fence", ct.Fence).Info("elected leader")
	d.leadTerm(ctx, client, store, ct.Fence, ct, log)
}

// leadTerm serves a term under fence until ctx ends (then it drains and
// commits under the fence) or the term ends (then it abandons at once:
// another node owns the offsets). When the term cannot go on (a commit under
// its fence was refused, leading failed), it tells auth, so that the
// election hands leadership over instead of keeping a leader that serves
// nobody.
func (d *Daemon) leadTerm(ctx context.Context, client sarama.Client, store offsets.Store, fence offsets.Fence,
	auth authority, log *logrus.Entry) {
	termCtx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	unhook := context.AfterFunc(ctx, func() { stop(context.Canceled) })
	defer unhook()
	var watch actor.Group
	watchDone := make(chan struct{})
	watch.Go(log, "term watch", func() {
		select {
		case <-auth.Lost():
			stop(fmt.Errorf("%w: %w", dispatch.ErrAbandon, auth.Cause()))
		case <-watchDone:
		}
	}, nil)
	defer watch.Wait()
	defer close(watchDone)

	err := d.newTerm(client, store, fence, log).run(termCtx, d.markReady)
	switch {
	case err == nil:
		log.Info("leadership term over")
	case errors.Is(err, dispatch.ErrAbandon), errors.Is(err, offsets.ErrFenced), errors.Is(err, dispatch.ErrCommitsFailing):
		log.WithError(err).Warn("lost leadership")
	default:
		log.WithError(err).Error("leading failed")
	}
	if err != nil {
		auth.End(err) // a no-op when the authority ended it
	}
	d.srv.RedirectAll(d.leadership())
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
			err := checkDeadLetterTopic(client, d.opts.DeadLetterTopic)
			if errors.Is(err, errDeadLetterTopicMissing) && d.opts.CreateDeadLetterTopic {
				n, cerr := createDeadLetterTopic(client, d.opts.DeadLetterTopic, d.opts.Topic)
				if errors.Is(cerr, errDeadLetterTopic) {
					unusable = cerr
					return nil
				}
				if cerr != nil {
					return cerr
				}
				if n > 0 {
					log.WithField("partitions", n).Info("created the dead-letter topic (the cluster's default replication factor)")
				}
				if err = checkDeadLetterTopic(client, d.opts.DeadLetterTopic); errors.Is(err, errDeadLetterTopicMissing) {
					return fmt.Errorf("dead-letter topic %q: created, not yet in the cluster's metadata", d.opts.DeadLetterTopic)
				}
			}
			if errors.Is(err, errDeadLetterTopic) {
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

// observeCommit is the committer's report of one commit: metrics, and that
// the group has committed.
func (d *Daemon) observeCommit(took time.Duration, err error) {
	d.collector.ObserveCommit(took, err)
	if err == nil {
		d.committed.Store(true)
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
			c, err := newKafkaClient(ctx, d.opts.Kafka, cfg)
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
	}))
	if err != nil {
		return nil, err
	}
	d.metrics = ms
	addr := ms.Addr().String()
	d.consoleAddr.Store(&addr)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := ms.Serve(); err != nil {
			d.log.WithError(err).Error("metrics server stopped")
		}
	}()
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
		<-served
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
	if t := d.backend.serving(); t != nil {
		s.HighWaterMarks = t.src.HighWaterMarks()
		s.Partitions = len(t.src.Partitions())
		if t.dead != nil {
			s.DeadLetterTopic, s.DeadLetterFailingSince = t.dead.topic, t.dead.FailingSince()
			s.DeadLetterRefused, s.DeadLetterRefusedError = t.dead.Refused()
			s.DeadLetterValuesOmitted = t.dead.ValuesOmitted()
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
	if d.opts.Assignment == AssignmentSpread {
		s.Spread = true
		if st := d.ownStatus.Load(); st != nil && s.Serving {
			s.Generation, s.Assigned, s.Owned, s.HandingOff = st.Generation, st.Assigned, st.Owned, st.HandingOff
		}
	}
	return s
}

// clientSecurity describes the client listener's protection for the
// first log line; never a secret.
func (d *Daemon) clientSecurity() string {
	s := "plain text"
	switch {
	case d.tls != nil && d.tls.MutualTLS():
		s = "mutual TLS"
	case d.tls != nil:
		s = "TLS"
	}
	if d.opts.AuthToken != "" {
		s += ", auth token"
	}
	if d.tokens != nil {
		s += fmt.Sprintf(", %d named tokens", d.tokens.Len())
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
func (d *Daemon) Ownership() OwnershipStatus {
	if st := d.ownStatus.Load(); st != nil {
		return *st
	}
	return OwnershipStatus{}
}

// portTaken adds a hint to a listen error caused by a port in use: several
// daemons on one host need a --listen and a --metrics-listen each.
func portTaken(err error, flag string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: is another fanout daemon running on this host? Give each daemon its own %s "+
		"(see the README's cluster section), or stop the process that holds the port", err, flag)
}
