package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// sharing is how this member's mode shares the topic in the election
// loop, chosen once by New from Config.Mode (sharingOf): in leader mode
// nothing is shared, the leader serves every partition (leaderSharing); in
// spread mode the leader assigns the partitions to the live members of
// that mode and publishes the assignment in its heartbeats, and every
// member follows the one it accepts from the recorded leader
// (spreadSharing).
type sharing interface {
	// watch starts, in detached, what the mode needs to know of the
	// topic's partitions, and returns where their count arrives when it
	// changes (nil: never).
	watch(ctx context.Context, e *Elector, detached *actor.Group) <-chan int32
	// accept takes the assignment a that heartbeat hb carries.
	accept(l *loop, hb *Heartbeat, a *PartitionAssignment)
	// inForce returns the assignment in force for this member at now (see
	// Elector.Assignment).
	inForce(l *loop, now time.Time) *Assignment
	// lead is called at every update while this member holds a term.
	lead(l *loop, now time.Time)
	// stamp adds the mode's part to this member's heartbeat hb.
	stamp(l *loop, hb *Heartbeat)
}

// sharingOf returns the sharing of mode m: the one place the loop tells
// the modes apart.
func sharingOf(m Mode) sharing {
	if m == Mode_MODE_SPREAD {
		return spreadSharing{}
	}
	return leaderSharing{}
}

// leaderSharing is leader mode's sharing: none.
type leaderSharing struct{}

func (leaderSharing) watch(context.Context, *Elector, *actor.Group) <-chan int32 { return nil }
func (leaderSharing) accept(*loop, *Heartbeat, *PartitionAssignment)             {}
func (leaderSharing) inForce(*loop, time.Time) *Assignment                       { return nil }
func (leaderSharing) lead(*loop, time.Time)                                      {}
func (leaderSharing) stamp(*loop, *Heartbeat)                                    {}

// spreadSharing is spread mode's sharing (the loop's spreadState).
type spreadSharing struct{}

// watch reads the topic's partition count every Config.PartitionRefresh:
// detached, as a metadata request to an unreachable Kafka takes sarama's
// retries to give up.
func (spreadSharing) watch(ctx context.Context, e *Elector, detached *actor.Group) <-chan int32 {
	partitions := make(chan int32)
	detached.Go(e.log, "partition watcher", func() {
		watchPartitions(ctx, e.cfg.Client, e.cfg.Topic, e.cfg.PartitionRefresh, partitions, e.log)
	}, nil)
	return partitions
}

func (spreadSharing) accept(l *loop, hb *Heartbeat, a *PartitionAssignment) {
	l.acceptAssignment(hb, a)
}
func (spreadSharing) inForce(l *loop, now time.Time) *Assignment { return l.inForce(now) }
func (spreadSharing) lead(l *loop, now time.Time)                { l.rebalance(now) }

// stamp adds this member's weight and, while it leads, the assignment it
// publishes for its term.
func (spreadSharing) stamp(l *loop, hb *Heartbeat) {
	hb.Weight = uint32(l.e.cfg.Weight)
	if l.term != nil && l.spread.published != nil && l.spread.published.Epoch == l.term.Epoch {
		hb.Assignment = l.spread.published.proto()
	}
}

// spreadState is the loop's part of spread mode: the assignment accepted
// from the log, the one this node publishes while it leads, and the
// partition count. The loop owns it.
type spreadState struct {
	accepted   *Assignment // the newest accepted from the recorded leader; nil before the first
	published  *Assignment // what this node computed while leading
	partitions int32       // the topic's partition count; 0 while unknown
	mismatch   string      // the leader (node@epoch) whose other mode was last logged
}

// acceptAssignment takes the assignment a carried by heartbeat hb if it
// comes from the leader that ZooKeeper records, for the epoch it records,
// and is newer than the one accepted; anything else is ignored. Without
// Config.Secret heartbeats are not authenticated, and a writer of the log
// can forge the leader's (with it, the loop drops them before they get
// here). The leader repeats its assignment in every
// heartbeat, so one read before the record is known is accepted later.
func (l *loop) acceptAssignment(hb *Heartbeat, a *PartitionAssignment) {
	rec := l.v.rec
	switch {
	case !l.v.recKnown || rec.Missing || rec.Corrupt || rec.Node == "":
		return
	case hb.GetRole() != Role_ROLE_LEADER || hb.GetNodeId() != rec.Node || hb.GetEpoch() != rec.Epoch || a.GetEpoch() != rec.Epoch:
		return
	}
	if acc := l.spread.accepted; acc != nil &&
		(a.GetEpoch() < acc.Epoch || a.GetEpoch() == acc.Epoch && a.GetGeneration() <= acc.Generation) {
		return
	}
	next := fromProto(a)
	l.spread.accepted = next
	l.e.log.WithFields(logrus.Fields{"generation": next.Generation, "epoch": next.Epoch, "partitions": next.Partitions,
		"mine": next.Of(l.e.cfg.NodeID), "assignment": next.String()}).Info("assignment accepted")
}

// inForce returns the assignment in force for this member at now (see
// Elector.Assignment).
func (l *loop) inForce(now time.Time) *Assignment {
	if !l.v.live(l.e.cfg.NodeID, now) {
		return nil
	}
	if rec := l.v.rec; l.v.leaderLive(now) && l.v.members[rec.Node].mode != l.e.cfg.Mode {
		return nil
	}
	return l.spread.accepted
}

// checkMode logs, once per leader and epoch, that the live leader runs
// another mode than this member: then this member does not serve.
func (l *loop) checkMode(now time.Time) {
	rec := l.v.rec
	if !l.v.leaderLive(now) || rec.Node == l.e.cfg.NodeID {
		return
	}
	leader := l.v.members[rec.Node].mode
	if leader == l.e.cfg.Mode {
		l.spread.mismatch = ""
		return
	}
	if key := fmt.Sprintf("%s@%d", rec.Node, rec.Epoch); key != l.spread.mismatch {
		l.spread.mismatch = key
		l.e.log.WithFields(logrus.Fields{"leader": rec.Node, "epoch": rec.Epoch, "leader_assignment": modeName(leader),
			"assignment": modeName(l.e.cfg.Mode)}).
			Error("the leader runs another --assignment than this member: this member does not serve; run every member of a cluster with the same --assignment")
	}
}

// rebalance computes, as the leader of a spread cluster, the assignment of
// the live members of that mode: sticky to the one this node publishes in
// this term, else to the last accepted from the log (a new leader keeps the
// assignment of the members still alive). It publishes a new generation
// when the owners change, or in a new term.
func (l *loop) rebalance(now time.Time) {
	epoch := l.term.Epoch
	base := l.spread.published
	if base == nil || base.Epoch != epoch {
		base = l.spread.accepted
	}
	n := l.spread.partitions
	if n <= 0 {
		if base == nil {
			return // the partition count is not known yet
		}
		n = base.Partitions
	}
	var cands []candidate
	self := false
	for id, m := range l.v.members {
		if l.v.live(id, now) && m.mode == l.e.cfg.Mode {
			cands = append(cands, candidate{id: id, addr: m.addr, weight: m.weight})
			self = self || id == l.e.cfg.NodeID
		}
	}
	if !self {
		cands = append(cands, candidate{id: l.e.cfg.NodeID, addr: l.e.cfg.Addr, weight: l.e.cfg.Weight})
	}
	owned := assign(base.owned(), cands, n)
	next := &Assignment{Epoch: epoch, Partitions: n}
	switch {
	case base != nil:
		next.InitialPartitions = base.InitialPartitions
	case l.e.cfg.Committed == nil || !l.e.cfg.Committed():
		next.InitialPartitions = n // a new line in a group that never committed
	}
	slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.id, b.id) })
	for _, c := range cands {
		next.Owners = append(next.Owners, Owner{NodeID: c.id, Addr: c.addr, Partitions: owned[c.id]})
	}
	if base != nil && base.Epoch == epoch && base.sameOwners(next) {
		return
	}
	for _, a := range []*Assignment{base, l.spread.accepted, l.spread.published} {
		if a != nil {
			next.Generation = max(next.Generation, a.Generation)
		}
	}
	next.Generation++
	l.spread.published = next
	l.e.log.WithFields(logrus.Fields{"generation": next.Generation, "epoch": epoch, "partitions": n,
		"members": len(cands), "assignment": next.String()}).Info("assignment published")
}

// String describes the assignment for logs: "node-1:0-3 node-2:4,6".
func (a *Assignment) String() string {
	if a == nil {
		return "none"
	}
	var b strings.Builder
	for i, o := range a.Owners {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(o.NodeID)
		b.WriteByte(':')
		b.WriteString(PartitionRanges(o.Partitions))
	}
	return b.String()
}

// PartitionRanges writes ascending partitions compactly: "0-3,6"; "-"
// for none.
func PartitionRanges(ps []int32) string { return kafkastore.Ranges(ps) }

// proto returns a's wire form.
func (a *Assignment) proto() *PartitionAssignment {
	out := &PartitionAssignment{Epoch: a.Epoch, Generation: a.Generation, Partitions: a.Partitions, InitialPartitions: a.InitialPartitions}
	for _, o := range a.Owners {
		out.Owners = append(out.Owners, &PartitionOwner{NodeId: o.NodeID, Addr: o.Addr, Partitions: o.Partitions})
	}
	return out
}

// AssignmentOf returns the assignment a heartbeat carries, or nil. Check
// first that the heartbeat comes from the leader ZooKeeper records, for its
// epoch: heartbeats are not authenticated.
func AssignmentOf(hb *Heartbeat) *Assignment {
	if hb.GetAssignment() == nil {
		return nil
	}
	return fromProto(hb.GetAssignment())
}

// fromProto returns the assignment of its wire form, owners ordered by node
// id and partitions ascending, whatever the sender did.
func fromProto(a *PartitionAssignment) *Assignment {
	out := &Assignment{Epoch: a.GetEpoch(), Generation: a.GetGeneration(), Partitions: a.GetPartitions(),
		InitialPartitions: a.GetInitialPartitions()}
	for _, o := range a.GetOwners() {
		ps := slices.Clone(o.GetPartitions())
		slices.Sort(ps)
		out.Owners = append(out.Owners, Owner{NodeID: o.GetNodeId(), Addr: o.GetAddr(), Partitions: ps})
	}
	slices.SortFunc(out.Owners, func(a, b Owner) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

// StoreName is an OffsetStore as --offset-store names it: "zookeeper",
// "kafka"; "" for OFFSET_STORE_UNSPECIFIED (a member that does not say).
func StoreName(s OffsetStore) string {
	if s == OffsetStore_OFFSET_STORE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "OFFSET_STORE_"))
}

// ModeName is a Mode in lower case without its prefix, as --assignment
// takes it: "leader", "spread".
func ModeName(m Mode) string { return modeName(m) }

func modeName(m Mode) string {
	if m == Mode_MODE_UNSPECIFIED {
		m = Mode_MODE_LEADER
	}
	return strings.ToLower(strings.TrimPrefix(m.String(), "MODE_"))
}

// watchPartitions reads topic's partition count every interval and sends it
// on out when it changes, until ctx ends. A failed read is retried at the
// next interval (the source says why the topic is out of reach).
func watchPartitions(ctx context.Context, client sarama.Client, topic string, every time.Duration,
	out chan<- int32, log *logrus.Entry) {
	last := int32(-1)
	for {
		err := client.RefreshMetadata(topic)
		var parts []int32
		if err == nil {
			parts, err = client.Partitions(topic)
		}
		if err != nil {
			log.WithError(err).WithField("topic", topic).Debug("partition count unknown")
		} else if n := int32(len(parts)); n != last {
			select {
			case out <- n:
				last = n
			case <-ctx.Done():
				return
			}
		}
		if !backoff.Sleep(ctx, every) {
			return
		}
	}
}
