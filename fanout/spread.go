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
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// spreadMode is --assignment spread: the leader the election makes
// assigns the partitions to the live members, and every member serves the
// partitions its assignment gives it, each fenced alone by the offset
// store's ownership records (authority.Owners): in stretches, each a
// pipeline of dispatch.AssignedPartitions and the ownership loop that
// reserves, serves, hands over and drops partitions as the assignment and
// the records say.
type spreadMode struct {
	d *Daemon

	view      atomic.Pointer[clusterView]     // the console's reading of every partition; nil outside the cluster
	status    atomic.Pointer[OwnershipStatus] // the ownership loop's status
	handoffs  atomic.Uint64                   // handoffs done since the daemon started
	committed atomic.Bool                     // the group has committed offsets, as far as this member knows
}

func newSpreadMode(d *Daemon) mode { return &spreadMode{d: d} }

// prepare has the election know whether the group ever committed: that
// decides where a new line of assignments starts the partitions without a
// committed offset.
func (m *spreadMode) prepare(ctx context.Context, cfg *cluster.Config, auth authority.Authority) bool {
	cfg.Committed = m.committed.Load
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
	claims := owners.Member(d.opts.NodeID, d.opts.advertised(d.srv.Addr()), s.el)
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

// leadership is a welcome while the member serves under an assignment in
// force (its mode is the leader's), else to retry shortly (a member
// starting, or one whose mode differs from the leader's: it does not
// serve).
func (m *spreadMode) leadership() server.Leadership {
	if m.d.backend.serving() != nil {
		if el := m.d.elector.Load(); el != nil && el.Assignment() != nil {
			return server.Leadership{Leader: true}
		}
	}
	return server.Leadership{RetryAfter: m.d.opts.ClusterHeartbeat}
}

// members lists the advertised addresses of the members that own
// partitions, sorted, with the assignment's epoch and generation as the
// list's version; nil and nil without an assignment in force. It reads the
// elector's snapshot, never blocks.
func (m *spreadMode) members() ([]string, *protocol.MembersVersion) {
	if el := m.d.elector.Load(); el != nil {
		if a := el.Assignment(); a != nil {
			return a.Addrs(), &protocol.MembersVersion{Epoch: a.Epoch, Generation: a.Generation}
		}
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
	var a *cluster.Assignment
	if el := m.d.elector.Load(); el != nil {
		a = el.Assignment()
	}
	st.AddSpread(a, read.owners)
}

// clusterRead is what spread mode's console shows of the whole topic:
// several members serve its partitions, each knowing only its own.
type clusterRead struct {
	committed, highWatermarks map[int32]int64
	owners                    map[int32]zkstore.OwnerState // the ownership records
}

// clusterView reads every partition's committed offset, high watermark
// and ownership record for the console in spread mode, at most once per
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

// readCluster reads the committed offsets (store) and ownership records
// (owners) of topic, and its high watermarks in Kafka (client): the
// daemon's reading of what fanout status reads.
func readCluster(ctx context.Context, client sarama.Client, store offsets.Store, owners authority.Owners,
	topic string) (clusterRead, error) {
	var r clusterRead
	var err error
	if r.committed, err = store.Load(ctx); err != nil {
		return r, fmt.Errorf("committed offsets: %w", err)
	}
	if r.owners, err = owners.Read(ctx); err != nil {
		return r, fmt.Errorf("ownership records: %w", err)
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
