// Package cluster elects the leader among fanout daemons that share an
// --id and --topic. One authority records the leader's epoch, node id and
// address, and a claimant becomes leader only through it: with ZooKeeper,
// a compare-and-set on the fence znode, whose resulting version fences the
// term's offset commits; with the Kafka offset store, a join of the consumer
// group fanout_<id> (kafkastore), whose membership fences them. Either way
// the commits of a deposed leader fail once the record changed (Term.Fence).
// Members publish heartbeats on the one-partition Kafka topic
// fanout_<id>_<topic> and all read it: heartbeats tell who is alive and
// order the claims, never who leads (see vote).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// Defaults of Config.
const (
	DefaultHeartbeat = time.Second
	// topicRetention bounds the heartbeat log: members read at most the
	// last few minutes of it.
	topicRetention = "3600000"
	maxBackoff     = 10 * time.Second
)

// TopicName is the heartbeat topic of fanout instance id on topic.
func TopicName(id, topic string) string { return "fanout_" + id + "_" + topic }

// Config configures an Elector.
type Config struct {
	ID     string // the fanout instance id (--id)
	Topic  string // the consumed topic (--topic)
	NodeID string // this member's node id, unique in the cluster; highest claims first
	Addr   string // this member's advertised client address (host:port)

	Heartbeat     time.Duration // interval between heartbeats; 0 means DefaultHeartbeat
	LeaderTimeout time.Duration // silence after which a member is dead; 0 means 3 × Heartbeat

	// Client is the Kafka client (from kafka.NewConfig); the caller owns
	// it. Its Consumer.MaxWaitTime delays every read of the log on a real
	// broker (seen: the full wait per hop), so keep it near 50-100 ms.
	Client sarama.Client

	// Fencer is the authority that records the leader and fences its
	// term's commits: the fence znode in ZooKeeper (ZooKeeperFencer) or the
	// group of the Kafka offset store (KafkaFencer); required.
	Fencer Fencer

	// Secret, when set, authenticates the heartbeat log: every heartbeat
	// this member publishes carries a MAC made with it (HeartbeatMAC), and
	// records without a valid one are ignored and counted
	// (Unauthenticated). Every member needs the same secret (--cluster-secret).
	Secret []byte

	Logger *logrus.Entry    // nil means the logrus standard logger
	Now    func() time.Time // clock; nil means time.Now

	// Mode is this member's --assignment; MODE_UNSPECIFIED means
	// MODE_LEADER. In MODE_SPREAD the leader assigns the partitions of
	// Topic to the live members of that mode and publishes the assignment
	// (see Assignment), and every member reads the topic's partition count
	// every PartitionRefresh (0 means 10 s).
	Mode             Mode
	Weight           int // this member's capacity in spread mode (--weight); 0 means 1
	PartitionRefresh time.Duration
	// Committed reports whether the group has committed offsets of the
	// topic, as far as this member knows (spread mode). A line of
	// assignments that begins when it has (no assignment in the log: the
	// first leader, or every member was down) gives --initial-offset to no
	// partition: one without a committed offset then starts at the oldest
	// offset. Nil means never committed.
	Committed func() bool

	// Readiness, when set, says whether this member is ready and why (what
	// its /readyz answers); every heartbeat carries it, so that fanout
	// status shows it. It is called by the election loop once per
	// heartbeat: it must not block.
	Readiness func() (ready bool, reason string)

	// OnPause, when set, is told every change of the cluster's delivery
	// pause this member takes (SetPaused, or read from a member's
	// heartbeat), before the snapshot shows it. It is called by the
	// election loop: it must not block.
	OnPause func(Pause)
}

// withDefaults returns c with zero values replaced by defaults.
func (c Config) withDefaults() Config {
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.LeaderTimeout <= 0 {
		c.LeaderTimeout = 3 * c.Heartbeat
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Mode == Mode_MODE_UNSPECIFIED {
		c.Mode = Mode_MODE_LEADER
	}
	if c.Weight <= 0 {
		c.Weight = 1
	}
	if c.PartitionRefresh <= 0 {
		c.PartitionRefresh = 10 * time.Second
	}
	return c
}

// validate reports the first invalid field of c.
func (c Config) validate() error {
	switch {
	case c.ID == "" || c.Topic == "" || c.NodeID == "":
		return errors.New("cluster: ID, Topic and NodeID are required")
	case c.Client == nil:
		return errors.New("cluster: a Kafka Client is required")
	case c.LeaderTimeout < 2*c.Heartbeat:
		return fmt.Errorf("cluster: LeaderTimeout %v must be at least twice Heartbeat %v", c.LeaderTimeout, c.Heartbeat)
	}
	return nil
}

// Member is one cluster member as seen through the heartbeat log.
type Member struct {
	NodeID    string
	Addr      string
	Role      Role        // the role of its last heartbeat
	Epoch     uint64      // the epoch of its last heartbeat
	LastSeen  time.Time   // local receive time of its last heartbeat
	Mode      Mode        // its --assignment (MODE_LEADER for a member that does not say)
	Weight    int         // its capacity in spread mode
	Store     OffsetStore // its --offset-store (OFFSET_STORE_UNSPECIFIED for a member that does not say)
	Readiness *Readiness  // what its /readyz answered as of its last heartbeat; nil when it does not say
	Pause     Pause       // the cluster's delivery pause as its last heartbeat says (zero: none)
	// LastAction is the last operator action asked of it, as its last
	// heartbeat says; nil: none.
	LastAction *Action
}

// Leadership is this member's view of who leads the cluster.
type Leadership struct {
	Leader     bool   // this member holds a running term
	Known      bool   // a live leader is known: LeaderID, LeaderAddr and Epoch name it
	LeaderID   string // the leader's node id, when Known
	LeaderAddr string // the leader's advertised client address, when Known
	Epoch      uint64 // the leader's epoch, when Known
	Mode       Mode   // the leader's --assignment, when Known or Leader
}

// snapshot is what the loop publishes for Leadership, Members and
// Assignment.
type snapshot struct {
	leadership Leadership
	members    []Member
	assignment *Assignment // in force for this member; nil when none
	published  *Assignment // the assignment this node publishes as leader
	pause      Pause       // the cluster's delivery pause
}

// Elector takes part in the election of one fanout cluster. Create it with
// New, run it with Run, take leadership terms from Terms.
type Elector struct {
	cfg      Config
	log      *logrus.Entry
	topic    string
	fence    fencer
	sharing  sharing     // how this member's mode shares the topic (Config.Mode)
	store    OffsetStore // where the authority keeps the leader record and the offsets, for the heartbeats
	repair   string      // how an operator fixes an unreadable record of the authority
	instance string      // random per Elector: tells this process's heartbeats from another's with its node id

	terms    chan *Term // capacity 1; the loop replaces an unread, ended term
	resign   chan chan error
	pauses   chan pauseReq // SetPaused's requests
	done     chan struct{} // closed when Run returns
	running  atomic.Bool
	snap     atomic.Pointer[snapshot]
	failover atomic.Uint64
	unauth   atomic.Uint64 // heartbeat records ignored for want of a valid MAC
	routines actor.Group   // goroutines of Run

	// lastAction is the last operator action asked of this member
	// (NoteAction), for its heartbeats; nil before the first.
	lastAction atomic.Pointer[Action]

	changed chan struct{} // capacity 1: the assignment in force changed
}

// New validates cfg and returns an Elector. Nothing runs until Run.
func New(cfg Config) (*Elector, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Fencer == nil {
		return nil, errors.New("cluster: a Fencer is required: the authority that records the leader")
	}
	return newElector(cfg, cfg.Fencer), nil
}

// newElector returns an Elector of the validated cfg that fences with f.
func newElector(cfg Config, f fencer) *Elector {
	e := &Elector{
		cfg:      cfg,
		topic:    TopicName(cfg.ID, cfg.Topic),
		fence:    f,
		sharing:  sharingOf(cfg.Mode),
		instance: fmt.Sprintf("%016x", rand.Uint64()),
		terms:    make(chan *Term, 1),
		changed:  make(chan struct{}, 1),
		resign:   make(chan chan error),
		pauses:   make(chan pauseReq),
		done:     make(chan struct{}),
	}
	e.repair = "fix the record"
	if cfg.Fencer != nil { // tests may fence with a fencer of their own
		e.store, e.repair = cfg.Fencer.offsetStore(), cfg.Fencer.repair()
	}
	e.log = cfg.Logger.WithFields(logrus.Fields{"node": cfg.NodeID, "cluster_topic": e.topic})
	e.snap.Store(&snapshot{})
	return e
}

// Terms delivers each leadership term this node wins, in order. A term may
// already have ended when it is received; at most one runs at a time. The
// channel is closed when Run returns (after ending any running term).
func (e *Elector) Terms() <-chan *Term { return e.terms }

// Leadership is this node's view of the leader. It reads an atomic
// snapshot.
func (e *Elector) Leadership() Leadership { return e.snap.Load().leadership }

// Members lists the members heard from within the last two LeaderTimeouts,
// ordered by node id.
func (e *Elector) Members() []Member { return e.snap.Load().members }

// Assignment returns the assignment in force for this member in spread
// mode: the last one accepted from the leader ZooKeeper records for its
// epoch. It is nil when there is none yet, when this member's own heartbeats
// do not come back (it may be cut off: it must not serve what it cannot
// know it still owns), and when the live leader runs another mode. While no
// leader is live (a failover) the last one accepted stays in force.
func (e *Elector) Assignment() *Assignment { return e.snap.Load().assignment }

// Published returns the assignment this node publishes while it leads in
// spread mode, or nil.
func (e *Elector) Published() *Assignment { return e.snap.Load().published }

// AssignmentChanged receives a value (capacity 1, never closed) whenever
// Assignment may have changed.
func (e *Elector) AssignmentChanged() <-chan struct{} { return e.changed }

// Failovers counts the leader changes this node has seen after the first
// leader it learnt of.
func (e *Elector) Failovers() uint64 { return e.failover.Load() }

// Unauthenticated counts the heartbeat records ignored because they carry
// no valid MAC (Config.Secret); always zero without a secret.
func (e *Elector) Unauthenticated() uint64 { return e.unauth.Load() }

// Resign ends this node's term, if any, publishes a leaving heartbeat and
// waits until Kafka has it (or ctx ends), so that another member takes
// over at once; then this node stops heartbeating. Run keeps reading the
// log until its context ends. Call it after the term's final commit.
func (e *Elector) Resign(ctx context.Context) error {
	if !e.running.Load() {
		return errors.New("cluster: resign: elector is not running")
	}
	published := make(chan error, 1)
	select {
	case e.resign <- published:
	case <-e.done:
		return nil // Run returned: no heartbeats any more
	case <-ctx.Done():
		return fmt.Errorf("cluster: resign: %w", ctx.Err())
	}
	select {
	case err := <-published:
		return err
	case <-ctx.Done():
		return fmt.Errorf("cluster: resign: publish leaving heartbeat: %w", ctx.Err())
	}
}

// Run takes part in the election until ctx ends: it creates the heartbeat
// topic when missing, heartbeats, reads the log and hands won terms to
// Terms. Kafka or ZooKeeper out of reach is logged and retried. It returns
// nil once ctx ends (ending any term with ErrStopped), or an error if called
// twice.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("cluster: Run called twice")
	}
	defer close(e.done)
	defer close(e.terms)
	// Goroutines must be done before terms is closed (LIFO defers).
	defer e.routines.Wait()
	// ZooKeeper calls cannot be cancelled, so Run waits for the fence watcher
	// only up to releaseTimeout: long enough for the release of a resigned
	// term (a Kafka leader leaving its group) to run while the caller's
	// clients are still open; a watcher stuck on an unanswered call returns
	// when the authority answers or the caller closes the connection.
	fenceDone := make(chan struct{})
	defer func() {
		select {
		case <-fenceDone:
		case <-time.After(releaseTimeout):
			e.log.Warn("fence watcher still busy after the election stopped: not waiting for it")
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	reqs, reports := make(chan fenceReq, 2), make(chan fenceReport)
	var detached actor.Group
	detached.Go(e.log, "fence watcher", func() {
		defer close(fenceDone)
		watchFence(ctx, e.fence, e.cfg.NodeID, e.cfg.Addr, e.cfg.Heartbeat, reqs, reports)
	}, nil)
	partitions := e.sharing.watch(ctx, e, &detached) // the topic's partition count, when the mode needs it

	if err := e.retry(ctx, "create heartbeat topic "+e.topic, e.ensureTopic); err != nil {
		return nil
	}
	producer, err := sarama.NewSyncProducerFromClient(e.cfg.Client)
	if err != nil {
		return fmt.Errorf("cluster: heartbeat producer: %w", err)
	}
	pub := newPublisher(producer, e.topic, e.cfg.Secret)
	e.routines.Go(e.log, "heartbeat publisher", func() { pub.run(ctx) }, nil)

	consumer, err := sarama.NewConsumerFromClient(e.cfg.Client)
	if err != nil {
		return fmt.Errorf("cluster: heartbeat consumer: %w", err)
	}
	defer consumer.Close()

	l := &loop{e: e, pub: pub, consumer: consumer, reqs: reqs, reports: reports, partitionCounts: partitions}
	l.run(ctx)
	return nil
}

// ensureTopic creates the heartbeat topic (tolerating that it exists) and
// waits for its partition to have a leader.
func (e *Elector) ensureTopic(ctx context.Context) error {
	// Not closed: closing an admin made from a client closes the client.
	admin, err := sarama.NewClusterAdminFromClient(e.cfg.Client)
	if err != nil {
		return fmt.Errorf("cluster admin: %w", err)
	}
	retention, policy := topicRetention, "delete"
	detail := &sarama.TopicDetail{
		NumPartitions:     1,
		ReplicationFactor: int16(max(1, min(3, len(e.cfg.Client.Brokers())))),
		ConfigEntries:     map[string]*string{"retention.ms": &retention, "cleanup.policy": &policy},
	}
	err = admin.CreateTopic(e.topic, detail, false)
	switch {
	case err == nil:
		e.log.WithField("replication_factor", detail.ReplicationFactor).Info("created heartbeat topic")
	case errors.Is(err, sarama.ErrTopicAlreadyExists):
	default:
		return fmt.Errorf("create topic %s (replication factor %d): %w", e.topic, detail.ReplicationFactor, err)
	}
	if err := e.cfg.Client.RefreshMetadata(e.topic); err != nil {
		return fmt.Errorf("metadata of %s: %w", e.topic, err)
	}
	parts, err := e.cfg.Client.Partitions(e.topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", e.topic, err)
	}
	if len(parts) != 1 {
		return fmt.Errorf("topic %s has %d partitions: the heartbeat log needs exactly 1 (delete the topic to have it recreated)", e.topic, len(parts))
	}
	if _, err := e.cfg.Client.Leader(e.topic, 0); err != nil {
		return fmt.Errorf("leader of %s/0: %w", e.topic, err)
	}
	return ctx.Err()
}

// startOffset returns where reading the log begins, the first record of
// the last max(1 minute, 10 × LeaderTimeout), so that every member reads
// the same recent suffix (the oldest offset when a lookup fails), and the
// log's end before it (0 when unknown).
func (e *Elector) startOffset() (start, end int64) {
	end, err := e.cfg.Client.GetOffset(e.topic, 0, sarama.OffsetNewest)
	if err != nil {
		e.log.WithError(err).Warn("heartbeat log: its end unknown; reading from the oldest")
		return sarama.OffsetOldest, 0
	}
	back := max(time.Minute, 10*e.cfg.LeaderTimeout)
	ms := e.cfg.Now().Add(-back).UnixMilli()
	off, err := e.cfg.Client.GetOffset(e.topic, 0, ms)
	switch {
	case err != nil:
		e.log.WithError(err).Warn("heartbeat log: offset by time unknown; reading from the oldest")
		return sarama.OffsetOldest, end
	case off < 0:
		return end, end // nothing that recent
	}
	return off, end
}

// retry calls fn until it succeeds or ctx ends, backing off from 250 ms to
// maxBackoff and logging each failure. It returns ctx.Err() if ctx ends.
func (e *Elector) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return backoff.Retry(ctx, backoff.Backoff{Min: 250 * time.Millisecond, Max: maxBackoff}, fn,
		func(attempt int, err error, wait time.Duration) {
			e.log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": wait}).Warnf("%s failed; retrying", what)
		})
}

// publisher sends heartbeats from one goroutine, one at a time: a newer
// heartbeat replaces one not yet sent.
type publisher struct {
	producer sarama.SyncProducer
	topic    string
	secret   []byte      // when set, each record carries the MAC of its value
	next     chan pubReq // capacity 1; only the loop sends
}

// pubReq is one heartbeat to send; done, if not nil, gets the result.
type pubReq struct {
	hb   *Heartbeat
	done chan<- error
}

func newPublisher(p sarama.SyncProducer, topic string, secret []byte) *publisher {
	return &publisher{producer: p, topic: topic, secret: secret, next: make(chan pubReq, 1)}
}

// send queues r, replacing a queued request that was not sent yet (whose
// done, if any, gets an error). Only one goroutine may call it.
func (p *publisher) send(r pubReq) {
	select {
	case p.next <- r:
		return
	default:
	}
	select {
	case old := <-p.next:
		if old.done != nil {
			old.done <- errors.New("cluster: heartbeat replaced by a newer one")
		}
	default:
	}
	p.next <- r
}

// run sends queued heartbeats until ctx ends, then closes the producer.
func (p *publisher) run(ctx context.Context) {
	defer p.producer.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-p.next:
			err := p.publish(r.hb)
			if r.done != nil {
				r.done <- err
			}
		}
	}
}

// publish produces hb synchronously (acks from the client's config).
func (p *publisher) publish(hb *Heartbeat) error {
	b, err := proto.Marshal(hb)
	if err != nil {
		return fmt.Errorf("cluster: encode heartbeat: %w", err)
	}
	msg := &sarama.ProducerMessage{Topic: p.topic, Key: sarama.StringEncoder(hb.GetNodeId()), Value: sarama.ByteEncoder(b)}
	if len(p.secret) > 0 {
		msg.Headers = []sarama.RecordHeader{{Key: []byte(MACHeader), Value: HeartbeatMAC(p.secret, p.topic, b)}}
	}
	_, _, err = p.producer.SendMessage(msg)
	if err != nil {
		return fmt.Errorf("cluster: publish heartbeat to %s: %w", p.topic, err)
	}
	return nil
}
