package fanout

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// Status returns the daemon's view of its cluster, the console's document:
// the leader, mode and members its election knows, and, while it serves,
// the partitions' offsets, its clients and its message rates. Which
// partitions it shows is the mode's: in spread mode every partition (read
// from the offset store and Kafka, see clusterView) with its owner, and the
// assignment.
func (d *Daemon) Status(ctx context.Context) *status.Status {
	now := time.Now()
	snap := d.metricsSnapshot(ctx)
	ready, reason := metrics.Ready(snap, now, d.maxCommitFailing())
	st := &status.Status{
		ID: d.opts.ID, Topic: d.opts.Topic, HeartbeatTopic: cluster.TopicName(d.opts.ID, d.opts.Topic),
		Node: &status.Node{
			NodeID: d.opts.NodeID, Mode: d.assignment.name, Role: d.nodeRole(snap), Ready: ready, Reason: reason,
			Serving: snap.Serving, InFlight: snap.Stats.InFlight, Buffered: snap.Stats.Buffered,
			Paused: snap.Stats.Paused, Clients: snap.Clients, Time: now,
			DeliveryPaused: snap.DeliveryPaused, ActionsEnabled: d.opts.MetricsToken != "", Actions: d.actionLog.all(),
		},
		Rates: d.rates.Status(),
		Pause: d.pauseInForce(),
	}
	for _, w := range metrics.Warnings(snap, now, d.maxCommitFailing()) {
		st.Node.Warnings = append(st.Node.Warnings, status.Warning{Kind: w.Kind, Message: w.Message, Unready: w.Unready})
	}

	if el := d.elector.Load(); el != nil {
		l := el.Leadership()
		if l.Known || l.Leader {
			st.Mode = cluster.ModeName(l.Mode) // the leader's
		}
		if l.Known {
			st.Leader = &status.Leader{Node: l.LeaderID, Addr: l.LeaderAddr, Epoch: l.Epoch}
		}
		st.OffsetStore = d.opts.OffsetStore
		for _, m := range el.Members() {
			sm := status.Member{
				NodeID: m.NodeID, Addr: m.Addr, Role: status.RoleName(m.Role), Epoch: m.Epoch, LastSeen: m.LastSeen,
				Mode: cluster.ModeName(m.Mode), OffsetStore: cluster.StoreName(m.Store),
			}
			sm.SetReadiness(m.Readiness)
			sm.Pause = status.PauseOf(m.Pause)
			if m.LastAction != nil {
				sm.LastAction = status.ActionOf(*m.LastAction)
			}
			if m.NodeID == d.opts.NodeID { // this node's own, as of now
				sm.SetReadiness(&cluster.Readiness{Ready: ready, Reason: reason})
				sm.Pause = st.Pause
			}
			st.Members = append(st.Members, sm)
		}
	} else if snap.Serving { // alone, without an election (Options.Store)
		addr := d.opts.advertised(d.srv.Addr())
		st.Mode = d.assignment.name
		st.Leader = &status.Leader{Node: d.opts.NodeID, Addr: addr}
		st.Members = []status.Member{{NodeID: d.opts.NodeID, Addr: addr, Role: "leader", LastSeen: now, Mode: d.assignment.name}}
	}

	d.mode.partitions(ctx, st, snap)
	if !snap.Serving {
		return st
	}
	st.MarkServed(snap.Stats.Held, snap.Stats.Stalled, snap.Stats.DeadLetterPendingBy)
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
		sc.Nacked, sc.TimedOut, sc.DeadLettered, sc.Redelivered, sc.Draining = c.Nacked, c.TimedOut, c.DeadLettered, c.Redelivered, c.Draining
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
