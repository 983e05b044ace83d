package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/internal/actor"
)

// loop is the one goroutine that owns the election state of an Elector:
// it reads the heartbeat log, ticks, starts fence CASes and receives their
// outcomes, ends terms and publishes the snapshot. Nothing else touches
// its fields.
type loop struct {
	e        *Elector
	pub      *publisher
	consumer sarama.Consumer
	fenced   chan fenceOutcome // capacity 1: at most one CAS runs

	v              *vote
	pc             sarama.PartitionConsumer // nil while (re)opening
	next           int64                    // offset to read from when reopening
	reopenFailures int                      // failed reopen attempts in a row
	term           *Term                    // the running term, if any
	fencing        uint64                   // epoch whose CAS runs; 0 when none
	attempted      uint64                   // highest epoch whose CAS was started
	claim          uint64                   // epoch this node claims; 0 when none
	left           bool                     // Resign was called: no more heartbeats
	sent           struct {                 // the last published heartbeat's state
		epoch, claim uint64
		role         Role
	}
	seenEpoch  uint64 // the (epoch, leader) last logged
	seenLeader string
}

// fenceOutcome is the result of one fence CAS.
type fenceOutcome struct {
	epoch   uint64
	version int32
	stored  uint64
	session int64 // the ZooKeeper session before the CAS
	err     error
}

// run drives the election until ctx ends.
func (l *loop) run(ctx context.Context) {
	e := l.e
	l.next = e.startOffset()
	if !l.open(ctx) {
		return
	}
	defer func() {
		if l.pc != nil {
			_ = l.pc.Close()
		}
	}()
	now := e.cfg.Now()
	l.v = newVote(e.cfg.NodeID, e.cfg.LeaderTimeout, now) // the startup grace begins
	l.update(now, true)

	ticker := time.NewTicker(e.cfg.Heartbeat)
	defer ticker.Stop()
	for {
		var msgs <-chan *sarama.ConsumerMessage
		var errs <-chan *sarama.ConsumerError
		if l.pc != nil {
			msgs, errs = l.pc.Messages(), l.pc.Errors()
		}
		select {
		case <-ctx.Done():
			l.endTerm(ErrStopped)
			l.publishSnapshot(e.cfg.Now())
			return
		case m, ok := <-msgs:
			if !ok {
				e.log.Warn("heartbeat log consumer stopped; reopening")
				_ = l.pc.Close()
				l.pc = nil
				continue
			}
			l.next = m.Offset + 1
			var hb Heartbeat
			if err := proto.Unmarshal(m.Value, &hb); err != nil {
				e.log.WithError(err).WithField("offset", m.Offset).Warn("heartbeat log: undecodable record skipped")
				continue
			}
			now := e.cfg.Now()
			l.v.observe(&hb, now)
			l.update(now, false)
		case err := <-errs:
			e.log.WithError(err).Warn("heartbeat log consumer")
		case <-ticker.C:
			if l.pc == nil {
				// One attempt per tick, never a blocking retry: the loop
				// must go on ending a term whose heartbeats stopped.
				l.openOnce()
			}
			l.update(e.cfg.Now(), true)
		case o := <-l.fenced:
			l.fenceDone(o)
			l.update(e.cfg.Now(), false)
		case done := <-e.resign:
			l.doResign(done)
		}
	}
}

// open opens the partition consumer at l.next, retrying until ctx ends.
func (l *loop) open(ctx context.Context) bool {
	err := l.e.retry(ctx, "read heartbeat log "+l.e.topic, func(context.Context) error { return l.consume() })
	return err == nil
}

// openOnce makes one attempt to reopen the partition consumer, logging a
// failure now and then.
func (l *loop) openOnce() {
	if err := l.consume(); err != nil {
		if l.reopenFailures%10 == 0 {
			l.e.log.WithError(err).WithField("failures", l.reopenFailures+1).Warn("cannot reopen the heartbeat log; retrying every heartbeat")
		}
		l.reopenFailures++
		return
	}
	l.reopenFailures = 0
}

// consume opens the partition consumer at l.next; an offset out of range
// starts over from the oldest heartbeat.
func (l *loop) consume() error {
	pc, err := l.consumer.ConsumePartition(l.e.topic, 0, l.next)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		l.next = sarama.OffsetOldest
	}
	if err != nil {
		return fmt.Errorf("consume %s/0 at %d: %w", l.e.topic, l.next, err)
	}
	l.pc = pc
	return nil
}

// update brings everything in line with the vote at now: ends a term the log
// no longer supports, starts the fence CAS of a won epoch, decides the
// claim, publishes a heartbeat (always on a tick, else when its content
// changed) and the snapshot.
func (l *loop) update(now time.Time, tick bool) {
	e := l.e
	if l.v.epoch != l.seenEpoch || l.v.leader != l.seenLeader {
		if l.seenLeader != "" {
			e.failover.Add(1)
		}
		l.seenEpoch, l.seenLeader = l.v.epoch, l.v.leader
		e.log.WithFields(logrus.Fields{"epoch": l.v.epoch, "leader": l.v.leader}).Info("leader of epoch established")
	}
	if l.term != nil {
		if cause := l.termEnds(now); cause != nil {
			l.endTerm(cause)
		}
	}
	if l.term == nil && l.fencing == 0 && !l.left && l.v.epoch > l.attempted && l.v.selfLeads(l.v.epoch, now) {
		l.startFence(l.v.epoch)
	}
	l.claim = l.v.tick(now)
	if l.left || l.fencing != 0 || !l.e.fence.connected() {
		// Not while leaving, nor while recording a won epoch, nor without
		// ZooKeeper: such a claim could not become a term, and as the
		// highest live id this node would keep lower ids from claiming.
		l.claim = 0
	}
	if !l.left {
		hb := l.heartbeat(now)
		if tick || hb.Epoch != l.sent.epoch || hb.Role != l.sent.role || hb.ClaimEpoch != l.sent.claim {
			l.sent.epoch, l.sent.role, l.sent.claim = hb.Epoch, hb.Role, hb.ClaimEpoch
			l.pub.send(pubReq{hb: hb})
		}
	}
	l.publishSnapshot(now)
}

// heartbeat is this node's heartbeat at now.
func (l *loop) heartbeat(now time.Time) *Heartbeat {
	role := Role_ROLE_FOLLOWER
	switch {
	case l.term != nil:
		role = Role_ROLE_LEADER
	case l.fencing != 0 || l.claim != 0:
		role = Role_ROLE_CANDIDATE
	}
	return &Heartbeat{
		NodeId: l.e.cfg.NodeID, Addr: l.e.cfg.Addr, Epoch: l.v.epoch, Role: role,
		ClaimEpoch: l.claim, SentAtMs: now.UnixMilli(),
	}
}

// termEnds returns why the running term must end at now, or nil.
func (l *loop) termEnds(now time.Time) error {
	t := l.term
	switch {
	case l.v.epoch > t.Epoch:
		return fmt.Errorf("epoch %d: node %q established epoch %d: %w", t.Epoch, l.v.leader, l.v.epoch, ErrSuperseded)
	case l.e.fence.session() != t.session:
		return fmt.Errorf("epoch %d: session %#x: %w", t.Epoch, t.session, ErrSessionExpired)
	case !l.v.selfLeads(t.Epoch, now):
		return fmt.Errorf("epoch %d: no own leader heartbeat for %v: %w", t.Epoch, l.e.cfg.LeaderTimeout, ErrCutOff)
	}
	return nil
}

// endTerm ends the running term, if any, with cause.
func (l *loop) endTerm(cause error) {
	if l.term == nil {
		return
	}
	l.term.finish(cause)
	l.v.abdicate(l.term.Epoch)
	l.e.log.WithError(cause).WithField("epoch", l.term.Epoch).Warn("leadership term ended")
	l.term = nil
}

// startFence starts the CAS that records epoch in ZooKeeper, off the loop.
// ZooKeeper calls cannot be cancelled, so Run does not wait for it: it ends
// when ZooKeeper answers or the caller closes the connection.
func (l *loop) startFence(epoch uint64) {
	l.fencing, l.attempted = epoch, epoch
	e, out := l.e, l.fenced
	e.log.WithField("epoch", epoch).Info("won the claim; recording the epoch in zookeeper")
	// Not waited for by Run (e.routines): see above.
	var detached actor.Group
	detached.Go(e.log, "fence", func() {
		o := fenceOutcome{epoch: epoch, session: e.fence.session()}
		o.version, o.stored, o.err = e.fence.fence(epoch, e.cfg.NodeID, e.cfg.Addr)
		out <- o
	}, nil)
}

// fenceDone takes the outcome of a fence CAS: a term, or a void win.
func (l *loop) fenceDone(o fenceOutcome) {
	l.fencing = 0
	log := l.e.log.WithField("epoch", o.epoch)
	now := l.e.cfg.Now()
	switch {
	case errors.Is(o.err, errVoid):
		log.WithError(o.err).Warn("won epoch is void; staying follower")
		l.v.raiseFloor(o.stored)
		l.v.abdicate(o.epoch)
	case o.err != nil:
		log.WithError(o.err).Error("cannot record won epoch in zookeeper; staying follower")
		l.v.abdicate(o.epoch)
	case l.left || !l.v.selfLeads(o.epoch, now):
		log.Warn("epoch recorded in zookeeper but no longer won; staying follower")
		l.v.abdicate(o.epoch)
	default:
		l.term = newTerm(o.epoch, l.e.fencePath, o.version, o.session)
		log.WithField("fence_version", o.version).Info("leading")
		select { // only this goroutine sends; an unread term has ended
		case l.e.terms <- l.term:
		default:
			select { // the daemon may have taken it meanwhile
			case <-l.e.terms:
			default:
			}
			l.e.terms <- l.term
		}
	}
}

// doResign ends the term, stops heartbeating and publishes a leaving
// heartbeat whose result goes to done.
func (l *loop) doResign(done chan<- error) {
	now := l.e.cfg.Now()
	l.endTerm(fmt.Errorf("epoch %d: %w", l.v.epoch, ErrResigned))
	l.left, l.claim = true, 0
	hb := l.heartbeat(now)
	hb.Leaving = true
	l.pub.send(pubReq{hb: hb, done: done})
	l.publishSnapshot(now)
	l.e.log.Info("resigned: leaving heartbeat sent")
}

// publishSnapshot stores the Leadership and Members views of now.
func (l *loop) publishSnapshot(now time.Time) {
	s := &snapshot{}
	switch {
	case l.term != nil:
		s.leadership = Leadership{Leader: true, LeaderAddr: l.e.cfg.Addr, LeaderID: l.e.cfg.NodeID,
			Epoch: l.term.Epoch, Known: true}
	case l.v.leaderLive(now) && l.v.leader != l.e.cfg.NodeID:
		s.leadership = Leadership{LeaderAddr: l.v.leaderAddr, LeaderID: l.v.leader, Epoch: l.v.epoch, Known: true}
	}
	for _, m := range l.v.view(now) {
		s.members = append(s.members, Member{NodeID: m.id, Addr: m.addr, Role: m.role, Epoch: m.epoch, LastSeen: m.lastSeen})
	}
	l.e.snap.Store(s)
}
