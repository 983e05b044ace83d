package fanout

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// Status returns the daemon's view of its cluster, the console's document:
// the leader and members its election knows, and, while it serves, the
// partitions' offsets, its clients and its message rates.
func (d *Daemon) Status(ctx context.Context) *status.Status {
	now := time.Now()
	snap := d.metricsSnapshot(ctx)
	ready, reason := metrics.Ready(snap, now, d.maxCommitFailing())
	st := &status.Status{
		ID: d.opts.ID, Topic: d.opts.Topic, HeartbeatTopic: cluster.TopicName(d.opts.ID, d.opts.Topic),
		Node: &status.Node{
			NodeID: d.opts.NodeID, Role: nodeRole(snap), Ready: ready, Reason: reason, Serving: snap.Serving,
			InFlight: snap.Stats.InFlight, Buffered: snap.Stats.Buffered, Paused: snap.Stats.Paused,
			Clients: snap.Clients, Time: now,
		},
		Rates: d.rates.Status(),
	}

	if el := d.elector.Load(); el != nil {
		if l := el.Leadership(); l.Known {
			st.Leader = &status.Leader{Node: l.LeaderID, Addr: l.LeaderAddr, Epoch: l.Epoch}
		}
		for _, m := range el.Members() {
			st.Members = append(st.Members, status.Member{
				NodeID: m.NodeID, Addr: m.Addr, Role: status.RoleName(m.Role), Epoch: m.Epoch, LastSeen: m.LastSeen,
			})
		}
	} else if snap.Serving { // alone, without an election (Options.Store)
		addr := d.opts.advertised(d.srv.Addr())
		st.Leader = &status.Leader{Node: d.opts.NodeID, Addr: addr}
		st.Members = []status.Member{{NodeID: d.opts.NodeID, Addr: addr, Role: "leader", LastSeen: now}}
	}

	if !snap.Serving {
		return st
	}
	// In leader mode the serving node owns every partition.
	for _, p := range slices.Sorted(maps.Keys(union(snap.HighWaterMarks, snap.Stats.Committed))) {
		var committed *int64
		if off, ok := snap.Stats.Committed[p]; ok {
			committed = &off
		}
		st.AddPartition(p, snap.HighWaterMarks[p], committed, d.opts.NodeID)
	}
	if disp := d.backend.dispatcher(); disp != nil {
		clients, _ := disp.Clients(ctx)
		st.Clients = d.statusClients(clients)
	}
	return st
}

// statusClients adds what the server knows of each client (its address, when
// it connected) and its ack rate to the dispatcher's snapshot.
func (d *Daemon) statusClients(clients []dispatch.ClientStats) []status.Client {
	sessions := make(map[uint64]status.Client)
	for _, s := range d.srv.Sessions() {
		sessions[s.ID] = status.Client{Addr: s.Remote, ConnectedAt: s.Since}
	}
	out := make([]status.Client, 0, len(clients))
	for _, c := range clients {
		sc := sessions[c.ID] // missing: the connection closed since the snapshot
		sc.ID, sc.Name, sc.Role = c.ID, c.Name, status.ClientRoleWorker
		sc.InFlight, sc.MaxInFlight, sc.Acked = c.InFlight, c.MaxInFlight, c.Acked
		sc.AcksPerSecond = d.rates.ClientRate(c.ID)
		out = append(out, sc)
	}
	slices.SortFunc(out, func(a, b status.Client) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// nodeRole names this node's part in the cluster for the console.
func nodeRole(s metrics.Snapshot) string {
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
