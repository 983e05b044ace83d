package fanout

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// spreadMode is --assignment spread: every member serves the partitions its
// assignment gives it, each fenced alone by the offset store's owners
// (authority.Owners): in stretches, each a pipeline of
// dispatch.AssignedPartitions and the ownership loop that reserves, serves,
// hands over and drops partitions as the assignment and the store say. The
// assignment comes from the leader the election makes (ZooKeeper), or from
// the store itself (the Kafka group's leader and coordinator: then nobody
// is elected).
type spreadMode struct {
	d *Daemon

	claims    atomic.Pointer[claimsRef]       // the member's claims, while it runs; nil before
	view      atomic.Pointer[clusterView]     // the console's reading of every partition; nil outside the cluster
	status    atomic.Pointer[OwnershipStatus] // the ownership loop's status
	handoffs  atomic.Uint64                   // handoffs done since the daemon started
	committed atomic.Bool                     // the group has committed offsets, as far as this member knows
}

// claimsRef holds a member's claims for an atomic pointer.
type claimsRef struct{ authority.Claims }

func newSpreadMode(d *Daemon) mode { return &spreadMode{d: d} }

// prepare has the election know whether the group ever committed: that
// decides where a new line of assignments starts the partitions without a
// committed offset. With a store that assigns the partitions itself, the
// members elect no leader: their heartbeats only say who is alive.
func (m *spreadMode) prepare(ctx context.Context, cfg *cluster.Config, auth authority.Authority) bool {
	cfg.Committed = m.committed.Load
	if owners, ok := auth.Owners(); ok && owners.Assigns() {
		cfg.Fencer = cluster.WithoutLeader(cfg.Fencer)
	}
	err := retry(ctx, m.d.log, "load offsets", m.d.opts.ConnectBackoffMax, func(ctx context.Context) error {
		stored, err := auth.Offsets().Load(ctx)
		if len(stored) > 0 {
			m.committed.Store(true)
		}
		return err
	})
	return err == nil
}

// run serves the partitions this member's assignment gives it until ctx
// ends, in stretches: a stretch ends early only when its dispatcher stops
// by itself (its commits failed for the store's session timeout); the next
// one begins after a backoff. The election only says who computes the
// assignment.
func (m *spreadMode) run(ctx context.Context, s serveEnv) error {
	d := m.d
	owners, ok := s.auth.Owners()
	if !ok { // Validate refuses it: the assignment needs owners
		return fmt.Errorf("spread mode needs an offset store that keeps the partitions' owners, not %s", s.auth.Kind().Name)
	}
	member := authority.Member{Node: d.opts.NodeID, Addr: d.opts.advertised(d.srv.Addr()), Weight: d.opts.Weight,
		Heartbeat: d.opts.ClusterHeartbeat, Committed: m.committed.Load, Logger: d.log}
	if owners.Assigns() {
		// The store assigns the partitions, not a leader's heartbeat that
		// carries the cluster's pause with it: join once the heartbeats
		// were read up to now, so that a paused cluster's new member
		// serves paused from its first delivery.
		select {
		case <-s.el.CaughtUp():
		case <-ctx.Done():
			return nil
		}
		// The group's membership waits on the whole group (a JoinGroup
		// returns once every member joined): a connection of its own.
		client, err := d.connectKafka(ctx, "fanout-group-"+d.opts.NodeID, func(c *sarama.Config) {
			c.Net.ReadTimeout = max(c.Net.ReadTimeout, d.opts.KafkaSessionTimeout+10*time.Second)
		})
		if err != nil {
			return nil // ctx ended
		}
		defer client.Close()
		member.Client = client
	}
	claims := owners.Member(member, s.el)
	m.claims.Store(&claimsRef{claims})
	defer m.claims.Store(nil)
	defer func() {
		// After every partition's last commit and release: the others
		// take over at once.
		leaveCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := claims.Leave(leaveCtx); err != nil {
			d.log.WithError(err).Warn("leaving the members: the others take this member's partitions over at its session timeout")
		}
	}()
	m.view.Store(newClusterView(func(ctx context.Context) (clusterRead, error) {
		return readCluster(ctx, s.client, s.auth.Offsets(), owners, d.opts.Topic)
	}, console.SampleInterval))
	defer m.view.Store(nil)

	b := backoff.Backoff{Min: 500 * time.Millisecond, Max: d.opts.ConnectBackoffMax, Jitter: true}
	for {
		err := m.stretch(ctx, s, claims)
		if ctx.Err() != nil {
			return nil
		}
		wait := b.Next()
		d.log.WithError(err).WithField("retry_in", wait.Round(time.Millisecond)).
			Error("serving the owned partitions stopped; starting again")
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// stretch serves one stretch: a Manual source, a dispatcher of
// AssignedPartitions, and the ownership loop. It returns nil once ctx ended
// and every partition was handed over, or the dispatcher's error when it
// stopped by itself.
func (m *spreadMode) stretch(ctx context.Context, s serveEnv, claims authority.Claims) error {
	d := m.d
	var own *ownership
	cfg := d.opts.dispatchConfig(dispatch.AssignedPartitions(func(p int32, c offsets.Condition) {
		own.dispatcherLost(p, c)
	}), s.auth.Offsets(), d.log, m.observeCommit)
	cfg.DrainTimeout = d.opts.HandoffTimeout // stopping hands every partition over
	p, err := d.newPipeline(s.client, kafka.SourceConfig{Manual: true}, cfg)
	if err != nil {
		return err
	}
	own, err = newOwnership(d.opts.NodeID, d.opts, d.log, claims, claims, claims, p.src, p.disp, &m.status, &m.handoffs)
	if err != nil {
		return err
	}
	own.onHandoff, own.onMembers, own.onStop = d.collector.ObserveHandoff, d.membersChanged, s.resign
	// No assignment in force (this member's heartbeats do not come back,
	// or the leader runs another mode), and every partition handed over:
	// the clients, whose acks the handoffs awaited, go elsewhere until this
	// member serves again. Sent away at once, each closed connection's
	// deliveries went to the next client about to be closed.
	own.onUnassigned = func() { d.srv.RedirectAll(d.leadership()) }

	dispCtx, stopDisp := context.WithCancel(context.Background())
	p.start(dispCtx)
	defer func() {
		stopDisp()
		p.close()
	}()
	unserve := d.backend.serve(p)
	d.markReady()
	d.log.Info("serving clients: the partitions this member owns")
	own.run(ctx, p.stopped(), stopDisp)
	err = p.wait()
	unserve()
	if ctx.Err() == nil {
		d.srv.RedirectAll(d.leadership())
		if err == nil {
			err = errors.New("the dispatcher stopped")
		}
		return err
	}
	if err != nil {
		d.log.WithError(err).Warn("stopped, not cleanly: messages acked since the last commit are delivered again by the partitions' next owners")
	}
	return nil
}

// observeCommit is the committers' report of one commit: metrics, and that
// the group has committed.
func (m *spreadMode) observeCommit(took time.Duration, err error) {
	m.d.collector.ObserveCommit(took, err)
	if err == nil {
		m.committed.Store(true)
	}
}

// assignment is the assignment in force for this member (its claims'), or
// nil. It never blocks.
func (m *spreadMode) assignment() *cluster.Assignment {
	if c := m.claims.Load(); c != nil {
		return c.Assignment()
	}
	return nil
}

// leadership is a welcome while the member serves under an assignment in
// force (with an elected leader, its mode is the leader's), else to retry
// shortly (a member starting, or one whose mode differs from the leader's:
// it does not serve).
func (m *spreadMode) leadership() server.Leadership {
	if m.d.backend.serving() != nil && m.assignment() != nil {
		return server.Leadership{Leader: true}
	}
	return server.Leadership{RetryAfter: m.d.opts.ClusterHeartbeat}
}

// members lists the advertised addresses of the members that own
// partitions, sorted, with the assignment's epoch and generation as the
// list's version; nil and nil without an assignment in force. It reads the
// claims' snapshot (the elector's, or the group's plan), never blocks.
func (m *spreadMode) members() ([]string, *protocol.MembersVersion) {
	if a := m.assignment(); a != nil {
		return a.Addrs(), &protocol.MembersVersion{Epoch: a.Epoch, Generation: a.Generation}
	}
	return nil, nil
}

// snapshot adds this member's partitions, while it serves.
func (m *spreadMode) snapshot(s *metrics.Snapshot) {
	s.Spread = true
	if st := m.status.Load(); st != nil && s.Serving {
		s.Generation, s.Assigned, s.Owned, s.HandingOff = st.Generation, st.Assigned, st.Owned, st.HandingOff
	}
}

// ownership is this member's partitions, as the ownership loop last
// published them.
func (m *spreadMode) ownership() OwnershipStatus {
	if st := m.status.Load(); st != nil {
		return *st
	}
	return OwnershipStatus{}
}

// partitions adds every partition of the topic with its committed offset,
// high watermark and owner, and the assignment in force with each
// member's owned partitions, lag and handoffs, as fanout status shows them.
// When they cannot be read, it adds the partitions this member serves and
// says why in st.Node.Partial.
func (m *spreadMode) partitions(ctx context.Context, st *status.Status, snap metrics.Snapshot) {
	v := m.view.Load()
	if v == nil {
		return // not in the cluster yet
	}
	read, err := v.get(ctx)
	if err != nil {
		st.Node.Partial = err.Error()
		if snap.Serving {
			addOwnPartitions(st, snap, m.d.opts.NodeID)
		}
		return
	}
	for _, p := range slices.Sorted(maps.Keys(union(read.highWatermarks, read.committed))) {
		var committed *int64
		if off, ok := read.committed[p]; ok {
			committed = &off
		}
		st.AddPartition(p, read.highWatermarks[p], committed, "")
	}
	a := read.holdings.Assignment // the store's, when it assigns
	if a == nil {
		a = m.assignment()
	}
	st.AddSpread(a, read.holdings.Holders)
}

// clusterRead is what spread mode's console shows of the whole topic:
// several members serve its partitions, each knowing only its own.
type clusterRead struct {
	committed, highWatermarks map[int32]int64
	holdings                  authority.Holdings // who holds each partition, as the store says
}

// clusterView reads every partition's committed offset, high watermark
// and holder for the console in spread mode, at most once per
// maxAge: the requests of every open console share one read, so that
// watching the console costs the store and Kafka a few requests per
// console.SampleInterval whatever the number of browsers.
type clusterView struct {
	read   func(ctx context.Context) (clusterRead, error)
	maxAge time.Duration
	now    func() time.Time

	sem  chan struct{} // capacity 1: held during a read and while the fields below are used
	at   time.Time     // when last was read; zero before the first read
	last clusterRead
	err  error
}

// newClusterView returns a view that reads with read, at most once per
// maxAge.
func newClusterView(read func(ctx context.Context) (clusterRead, error), maxAge time.Duration) *clusterView {
	return &clusterView{read: read, maxAge: maxAge, now: time.Now, sem: make(chan struct{}, 1)}
}

// get returns the last read when it is younger than maxAge, else reads
// again. A read cut short by ctx is not kept for the others.
func (v *clusterView) get(ctx context.Context) (clusterRead, error) {
	if err := ctx.Err(); err != nil {
		return clusterRead{}, fmt.Errorf("the partitions' offsets and owners: %w", err)
	}
	select {
	case v.sem <- struct{}{}:
	case <-ctx.Done():
		return clusterRead{}, fmt.Errorf("the partitions' offsets and owners: %w", ctx.Err())
	}
	defer func() { <-v.sem }()
	if !v.at.IsZero() && v.now().Sub(v.at) < v.maxAge {
		return v.last, v.err
	}
	r, err := v.read(ctx)
	if err != nil {
		err = fmt.Errorf("the partitions' offsets and owners: %w", err)
		if ctx.Err() != nil {
			return clusterRead{}, err
		}
	}
	v.last, v.err, v.at = r, err, v.now()
	return r, err
}

// readCluster reads the committed offsets (store) and holders (owners) of
// topic, and its high watermarks in Kafka (client): the daemon's reading of
// what fanout status reads.
func readCluster(ctx context.Context, client sarama.Client, store offsets.Store, owners authority.Owners,
	topic string) (clusterRead, error) {
	var r clusterRead
	var err error
	if r.committed, err = store.Load(ctx); err != nil {
		return r, fmt.Errorf("committed offsets: %w", err)
	}
	if r.holdings, err = owners.Read(ctx); err != nil {
		return r, fmt.Errorf("the partitions' holders: %w", err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return r, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	r.highWatermarks = make(map[int32]int64, len(parts))
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return r, fmt.Errorf("high watermark of %s/%d: %w", topic, p, err)
		}
		r.highWatermarks[p] = hw
	}
	return r, nil
}
