package fanout

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// Status returns the daemon's view of its cluster, the console's document:
// the leader, mode and members its election knows, and, while it serves,
// the partitions' offsets, its clients and its message rates. In spread
// mode it shows every partition (read from ZooKeeper and Kafka, see
// clusterView) with its owner, and the assignment.
func (d *Daemon) Status(ctx context.Context) *status.Status {
	now := time.Now()
	snap := d.metricsSnapshot(ctx)
	ready, reason := metrics.Ready(snap, now, d.maxCommitFailing())
	st := &status.Status{
		ID: d.opts.ID, Topic: d.opts.Topic, HeartbeatTopic: cluster.TopicName(d.opts.ID, d.opts.Topic),
		Node: &status.Node{
			NodeID: d.opts.NodeID, Mode: d.opts.Assignment, Role: d.nodeRole(snap), Ready: ready, Reason: reason,
			Serving: snap.Serving, InFlight: snap.Stats.InFlight, Buffered: snap.Stats.Buffered,
			Paused: snap.Stats.Paused, Clients: snap.Clients, Time: now,
		},
		Rates: d.rates.Status(),
	}

	if el := d.elector.Load(); el != nil {
		l := el.Leadership()
		if l.Known || l.Leader {
			st.Mode = cluster.ModeName(l.Mode) // the leader's
		}
		if l.Known {
			st.Leader = &status.Leader{Node: l.LeaderID, Addr: l.LeaderAddr, Epoch: l.Epoch}
		}
		for _, m := range el.Members() {
			st.Members = append(st.Members, status.Member{
				NodeID: m.NodeID, Addr: m.Addr, Role: status.RoleName(m.Role), Epoch: m.Epoch, LastSeen: m.LastSeen,
				Mode: cluster.ModeName(m.Mode),
			})
		}
	} else if snap.Serving { // alone, without an election (Options.Store)
		addr := d.opts.advertised(d.srv.Addr())
		st.Mode = d.opts.Assignment
		st.Leader = &status.Leader{Node: d.opts.NodeID, Addr: addr}
		st.Members = []status.Member{{NodeID: d.opts.NodeID, Addr: addr, Role: "leader", LastSeen: now, Mode: d.opts.Assignment}}
	}

	if d.opts.Assignment == AssignmentSpread {
		d.spreadPartitions(ctx, st, snap)
	} else if snap.Serving {
		addOwnPartitions(st, snap, d.opts.NodeID) // in leader mode the serving node owns every partition
	}
	if !snap.Serving {
		return st
	}
	if disp := d.backend.dispatcher(); disp != nil {
		clients, _ := disp.Clients(ctx)
		st.Clients = d.statusClients(clients)
	}
	return st
}

// addOwnPartitions adds the partitions the serving dispatcher knows, with
// owner as their owner.
func addOwnPartitions(st *status.Status, snap metrics.Snapshot, owner string) {
	for _, p := range slices.Sorted(maps.Keys(union(snap.HighWaterMarks, snap.Stats.Committed))) {
		var committed *int64
		if off, ok := snap.Stats.Committed[p]; ok {
			committed = &off
		}
		st.AddPartition(p, snap.HighWaterMarks[p], committed, owner)
	}
}

// spreadPartitions adds spread mode's partitions to st: every partition of
// the topic with its committed offset, high watermark and owner, and the
// assignment in force with each member's owned partitions, lag and
// handoffs, as fanout status shows them. When they cannot be read, it adds
// the partitions this member serves and says why in st.Node.Partial.
func (d *Daemon) spreadPartitions(ctx context.Context, st *status.Status, snap metrics.Snapshot) {
	v := d.clusterView.Load()
	if v == nil {
		return // not in the cluster yet
	}
	read, err := v.get(ctx)
	if err != nil {
		st.Node.Partial = err.Error()
		if snap.Serving {
			addOwnPartitions(st, snap, d.opts.NodeID)
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
	if el := d.elector.Load(); el != nil {
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
// watching the console costs ZooKeeper and Kafka a few requests per
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

// readCluster reads the committed offsets and ownership records of topic
// in ZooKeeper (store, conn under chroot) and the high watermarks in
// Kafka (client): the daemon's reading of what fanout status reads.
func readCluster(ctx context.Context, client sarama.Client, store *zkstore.Store, conn *zk.Conn, chroot string,
	opts Options) (clusterRead, error) {
	var r clusterRead
	var err error
	if r.committed, err = store.Load(ctx); err != nil {
		return r, fmt.Errorf("committed offsets: %w", err)
	}
	if r.owners, _, err = zkstore.ReadOwners(conn, chroot, opts.ID, opts.Topic); err != nil {
		return r, fmt.Errorf("ownership records: %w", err)
	}
	parts, err := client.Partitions(opts.Topic)
	if err != nil {
		return r, fmt.Errorf("partitions of %s: %w", opts.Topic, err)
	}
	r.highWatermarks = make(map[int32]int64, len(parts))
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		hw, err := client.GetOffset(opts.Topic, p, sarama.OffsetNewest)
		if err != nil {
			return r, fmt.Errorf("high watermark of %s/%d: %w", opts.Topic, p, err)
		}
		r.highWatermarks[p] = hw
	}
	return r, nil
}

// statusClients adds what the server knows of each client (its address, when
// it connected) and its ack rate to the dispatcher's snapshot. Weights are
// shown, for every worker, while some worker's weight differs from the
// default: then, and only then, the dispatcher shares by weight.
func (d *Daemon) statusClients(clients []dispatch.ClientStats) []status.Client {
	sessions := make(map[uint64]status.Client)
	for _, s := range d.srv.Sessions() {
		sessions[s.ID] = status.Client{Addr: s.Remote, Identity: s.Identity, ConnectedAt: s.Since}
	}
	weighted := slices.ContainsFunc(clients, func(c dispatch.ClientStats) bool {
		return !c.Observer && c.Weight != protocol.DefaultWeight
	})
	out := make([]status.Client, 0, len(clients))
	for _, c := range clients {
		sc := sessions[c.ID] // missing: the connection closed since the snapshot
		sc.ID, sc.Name, sc.Role = c.ID, c.Name, status.ClientRoleWorker
		if c.Observer {
			sc.Role = status.ClientRoleObserver
		} else if weighted {
			w := uint32(c.Weight)
			sc.Weight = &w
		}
		sc.InFlight, sc.MaxInFlight, sc.Acked = c.InFlight, c.MaxInFlight, c.Acked
		sc.AcksPerSecond = d.rates.ClientRate(c.ID)
		out = append(out, sc)
	}
	slices.SortFunc(out, func(a, b status.Client) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// nodeRole names this node's part in the cluster for the console. In
// spread mode every member serves, and the leader is the member elected to
// compute the assignment.
func (d *Daemon) nodeRole(s metrics.Snapshot) string {
	if el := d.elector.Load(); el != nil && s.Spread {
		if el.Leadership().Leader {
			return "leader"
		}
		return "follower"
	}
	switch {
	case s.Leader:
		return "leader"
	case s.Clustered:
		return "follower"
	default:
		return "starting"
	}
}

// union returns the keys of a and b, as a set.
func union(a, b map[int32]int64) map[int32]struct{} {
	out := make(map[int32]struct{}, len(a))
	for p := range a {
		out[p] = struct{}{}
	}
	for p := range b {
		out[p] = struct{}{}
	}
	return out
}

// sampleRates samples the serving dispatcher's counters into d.rates every
// console.SampleInterval until ctx ends: two requests to the dispatcher per
// sample, nothing per message. Between terms it records zero rates.
func (d *Daemon) sampleRates(ctx context.Context) {
	tick := time.NewTicker(console.SampleInterval)
	defer tick.Stop()
	var last *dispatch.Dispatcher // whose counters the previous sample read
	for {
		disp := d.backend.dispatcher()
		var c console.Counters
		if disp != nil {
			if st, ok := disp.Stats(ctx); ok {
				c.Consumed, c.Delivered, c.Acked = st.Consumed, st.Delivered, st.Acked
				for _, n := range st.Redelivered {
					c.Redelivered += n
				}
				clients, _ := disp.Clients(ctx)
				c.ClientAcks = make(map[uint64]uint64, len(clients))
				for _, cl := range clients {
					c.ClientAcks[cl.ID] = cl.Acked
				}
			} else {
				disp = nil // stopped meanwhile
			}
		}
		d.rates.Sample(time.Now(), c, disp != last || disp == nil)
		last = disp
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
