package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
)

// maxWarned bounds the node ids whose implausible heartbeats the loop
// remembers having logged.
const maxWarned = 1024

// loop is the one goroutine that owns the election state of an Elector:
// it reads the heartbeat log and the fence watcher's reports, ticks, asks
// the watcher for compare-and-sets, ends terms and publishes the snapshot.
// Nothing else touches its fields.
type loop struct {
	e        *Elector
	pub      *publisher
	consumer sarama.Consumer
	reqs     chan<- fenceReq    // to the fence watcher: CASes (at most one runs) and releases
	reports  <-chan fenceReport // from the fence watcher, in order

	partitionCounts <-chan int32 // the topic's partition count, when it changes (spread mode; nil in leader mode)
	spread          spreadState  // spread mode's assignment (spread.go)

	v              *vote
	pc             sarama.PartitionConsumer // nil while (re)opening
	next           int64                    // offset to read from when reopening
	reopenFailures int                      // failed reopen attempts in a row
	position       int64                    // the next offset after the last record read (where reading began, before)
	logEnd         int64                    // the log's end when reading began: the first heartbeats' seen
	resync         bool                     // reading restarts at the oldest offset: the next record may not follow the last
	caughtUp       bool                     // the log was read up to logEnd (Elector.CaughtUp is closed)
	seq            uint64                   // the sequence number of the last heartbeat published
	term           *Term                    // the running term, if any
	termRec        record                   // the fence record the running term wrote
	fencing        uint64                   // epoch whose CAS runs; 0 when none
	fencedAt       time.Time                // when the last CAS ended: claims read before it are spent
	claim          uint64                   // epoch this node claims; 0 when none
	pause          Pause                    // the cluster's delivery pause in force (pause.go)
	left           bool                     // Resign was called: no more heartbeats
	sent           struct {                 // the last published heartbeat's state
		epoch, claim uint64
		role         Role
		generation   uint64    // of the assignment it carried
		pause        uint64    // the version of the pause it carried
		action       *Action   // the last action it carried
		at           time.Time // when it was made (its SentAtMs)
	}
	seenRec     record // the fence record last logged
	seenKnown   bool
	lastLeader  string                 // the last node the fence record named, for Failovers
	readFailing bool                   // the last read of the fence record failed
	warned      map[string]time.Time   // when an implausible heartbeat of a node was last logged
	storeWarned map[string]OffsetStore // the other store each node was logged keeping its offsets in
	saidUnauth  bool                   // a record without a valid MAC was logged (once per Elector)
	saidOpen    bool                   // the warning that heartbeats are not authenticated was logged
	saidUnbound bool                   // a record without a sequence number was logged (once per Elector)
	saidCrowded time.Time              // when a record ignored for want of room was last logged
}

// run drives the election until ctx ends.
func (l *loop) run(ctx context.Context) {
	e := l.e
	l.warned, l.storeWarned = map[string]time.Time{}, map[string]OffsetStore{}
	l.next, l.logEnd = e.startOffset()
	l.position = max(l.next, 0) // OffsetOldest: from the log's start
	if !l.open(ctx) {
		return
	}
	defer func() {
		if l.pc != nil {
			_ = l.pc.Close()
		}
	}()
	now := e.cfg.Now()
	l.v = newVote(e.cfg.NodeID, e.instance, e.cfg.LeaderTimeout, now) // the startup grace begins
	l.v.strict = len(e.cfg.Secret) > 0
	l.v.readFrom(l.position)
	l.update(now, true)

	ticker := time.NewTicker(e.cfg.Heartbeat)
	defer ticker.Stop()
	for {
		if !l.caughtUp && l.position >= l.logEnd {
			// Every record up to the log's end at the start was folded
			// (and the snapshot published): the pause they carry is known.
			l.caughtUp = true
			close(e.caughtUp)
		}
		var msgs <-chan *sarama.ConsumerMessage
		var errs <-chan *sarama.ConsumerError
		if l.pc != nil {
			msgs, errs = l.pc.Messages(), l.pc.Errors()
		}
		var ended <-chan struct{} // the running term, ended by its holder (Term.End)
		if l.term != nil {
			ended = l.term.Lost()
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
			l.read(m.Offset)
			if !Authentic(e.cfg.Secret, e.topic, m) {
				l.unauthenticated(m)
				continue
			}
			var hb Heartbeat
			if err := proto.Unmarshal(m.Value, &hb); err != nil {
				e.log.WithError(err).WithField("offset", m.Offset).Warn("heartbeat log: undecodable record skipped")
				continue
			}
			now := e.cfg.Now()
			l.observe(&hb, m.Offset, now)
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
		case r := <-l.reports:
			l.report(r)
			l.update(e.cfg.Now(), false)
		case n := <-l.partitionCounts:
			l.spread.partitions = n
			l.update(e.cfg.Now(), false)
		case <-ended:
			l.endTerm(l.term.Cause())
			l.update(e.cfg.Now(), false) // says at once that it no longer leads
		case done := <-e.resign:
			l.doResign(done)
		case r := <-e.pauses:
			l.askPause(r, e.cfg.Now())
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
		l.next, l.resync = sarama.OffsetOldest, true
	}
	if err != nil {
		return fmt.Errorf("consume %s/0 at %d: %w", l.e.topic, l.next, err)
	}
	l.pc = pc
	return nil
}

// read notes that the record at offset was read. The first record read
// after starting over from the oldest (the log was truncated past the last
// record read, or the topic was recreated) does not follow that one: the
// vote then judges from there (readFrom).
func (l *loop) read(offset int64) {
	if l.resync && offset != l.position {
		l.e.log.WithFields(logrus.Fields{"offset": offset, "expected": l.position}).
			Warn("heartbeat log: reading resumed elsewhere than where it stopped (the topic was truncated or recreated): " +
				"heartbeats made before this offset are ignored from now on")
		l.v.readFrom(offset)
		l.logEnd = 0
	}
	l.resync = false
	l.next, l.position = offset+1, offset+1
}

// stamp gives hb, about to be published, the next sequence number and the
// position of the log this node has reached (see vote, Replays).
func (l *loop) stamp(hb *Heartbeat) {
	l.seq++
	hb.Seq, hb.Seen = l.seq, max(l.position, l.logEnd)
}

// unauthenticated counts a record without a valid MAC and says once,
// clearly, that someone writes such records.
func (l *loop) unauthenticated(m *sarama.ConsumerMessage) {
	n := l.e.unauth.Add(1)
	if l.saidUnauth {
		return
	}
	l.saidUnauth = true
	l.e.log.WithFields(logrus.Fields{"offset": m.Offset, "record_key": string(m.Key), "ignored": n}).
		Error("heartbeat log: someone writes records without a valid MAC to " + l.e.topic + ": ignored (a member " +
			"without --cluster-secret or with another one, or a forger); this is said once, the count is in " +
			"fanout_heartbeats_unauthenticated_total")
}

// observe folds a heartbeat read at offset into the vote and logs what is
// wrong with it.
func (l *loop) observe(hb *Heartbeat, offset int64, now time.Time) {
	if len(l.e.cfg.Secret) == 0 && !l.saidOpen && hb.GetNodeId() != l.e.cfg.NodeID {
		l.saidOpen = true
		l.e.log.WithField("from_node", hb.GetNodeId()).Warn("heartbeats are not authenticated: whoever may write to " +
			l.e.topic + " can disturb the election; give every member the same --cluster-secret")
	}
	wasDuplicated := l.v.duplicated(now)
	switch l.v.observe(hb, offset, now) {
	case implausible:
		// At most once per node and leader timeout: a flood of forged
		// records must not flood the log.
		if last, ok := l.warned[hb.GetNodeId()]; !ok || now.Sub(last) >= l.e.cfg.LeaderTimeout {
			if len(l.warned) >= maxWarned { // forged node ids are many: stay bounded
				clear(l.warned)
			}
			l.warned[hb.GetNodeId()] = now
			l.e.log.WithFields(logrus.Fields{"offset": offset, "from_node": hb.GetNodeId(), "from_addr": hb.GetAddr(),
				"heartbeat_epoch": hb.GetEpoch(), "heartbeat_claim": hb.GetClaimEpoch(), l.e.fence.name() + "_epoch": l.v.highest}).
				Warn("heartbeat log: implausible heartbeat ignored: its epoch is far beyond the one " + l.e.fence.name() + " records (forged or corrupt)")
		}
	case duplicate:
		if !wasDuplicated { // once per occurrence
			l.e.log.WithFields(logrus.Fields{"offset": offset, "other_addr": hb.GetAddr(), "other_instance": hb.GetInstance()}).
				Error("another live process has this node id: not claiming leadership while it is heard from; give every daemon its own --node-id")
		}
	case observed:
		if a := hb.GetAssignment(); a != nil {
			l.e.sharing.accept(l, hb, a)
		}
		if p, ok := PauseOf(hb); ok && hb.GetNodeId() != l.e.cfg.NodeID && l.setPause(p) {
			l.e.log.WithFields(logrus.Fields{"from_node": hb.GetNodeId(), "paused": p.Paused, "version": p.Version,
				"asked_of": p.Action.NodeID, "by": p.Action.By}).Info("the cluster's deliveries are " + pausedWord(p.Paused))
		}
		l.checkStore(hb)
	case stale:
		l.e.log.WithFields(logrus.Fields{"offset": offset, "from_node": hb.GetNodeId(), "from_instance": hb.GetInstance(),
			"seq": hb.GetSeq(), "seen": hb.GetSeen()}).
			Debug("heartbeat log: stale heartbeat ignored (a copy of one read, an older instance's, or made before what this member can judge)")
	case unbound:
		if !l.saidUnbound {
			l.saidUnbound = true
			l.e.log.WithFields(logrus.Fields{"offset": offset, "from_node": hb.GetNodeId()}).
				Warn("heartbeat log: heartbeats without a sequence number are ignored with --cluster-secret (a member of an " +
					"older version, or a replay of its records); this is said once")
		}
	case crowded:
		if now.Sub(l.saidCrowded) >= l.e.cfg.LeaderTimeout {
			l.saidCrowded = now
			l.e.log.WithFields(logrus.Fields{"offset": offset, "from_node": hb.GetNodeId(), "members": maxMembers}).
				Warn("heartbeat log: heartbeat of a new node id ignored: as many members as are kept were heard from " +
					"within two leader timeouts (forged node ids?)")
		}
	}
}

// checkStore logs, once per node (and again after its store changed), a
// member that keeps its offsets and leader record in another store than
// this one: the two authorities record a leader each, and both may
// deliver. Members that do not say are not judged.
func (l *loop) checkStore(hb *Heartbeat) {
	theirs, id := hb.GetOffsetStore(), hb.GetNodeId()
	if theirs == OffsetStore_OFFSET_STORE_UNSPECIFIED || l.e.store == OffsetStore_OFFSET_STORE_UNSPECIFIED ||
		theirs == l.e.store || l.storeWarned[id] == theirs {
		return
	}
	if len(l.storeWarned) >= maxWarned {
		clear(l.storeWarned)
	}
	l.storeWarned[id] = theirs
	l.e.log.WithFields(logrus.Fields{"from_node": id, "from_addr": hb.GetAddr(), "their_offset_store": StoreName(theirs),
		"offset_store": StoreName(l.e.store)}).
		Error("a member of this cluster keeps its offsets in another store: each store records a leader of its own, " +
			"so two leaders may deliver; give every member the same --offset-store")
}

// report takes a report of the fence watcher.
func (l *loop) report(r fenceReport) {
	log := l.e.log
	switch {
	case r.cas != nil:
		l.fenceDone(*r.cas)
	case r.err != nil && !r.rec.Corrupt:
		if !l.readFailing {
			log.WithError(r.err).Warn("cannot read the fence record in " + l.e.fence.name() + "; retrying")
		}
		l.readFailing = true
	default:
		if r.err != nil && r.rec != l.v.rec { // once per occurrence
			log.WithError(r.err).Error("the fence record in " + l.e.fence.name() + " is unreadable: nobody can lead until it is fixed (" + l.e.repair + ")")
		}
		if l.readFailing {
			log.Info("fence record readable again")
		}
		l.readFailing = false
		l.v.setRecord(r.rec)
	}
}

// update brings everything in line with the vote at now: ends a term that
// ZooKeeper or the log no longer supports, starts the fence CAS of this
// node's claim when it is the one being recorded, decides the claim,
// publishes a heartbeat (always on a tick, else when its content changed)
// and the snapshot.
func (l *loop) update(now time.Time, tick bool) {
	e := l.e
	if rec := l.v.rec; l.v.recKnown && (rec != l.seenRec || !l.seenKnown) {
		l.seenRec, l.seenKnown = rec, true
		e.log.WithField("record", rec.String()).Info("fence record in " + e.fence.name())
		if rec.Node != "" && rec.Node != l.lastLeader {
			if l.lastLeader != "" {
				e.failover.Add(1)
			}
			l.lastLeader = rec.Node
		}
	}
	if l.term != nil {
		if cause := l.termEnds(now); cause != nil {
			l.endTerm(cause)
		}
	}
	l.claim = l.v.tick(now)
	if epoch, at, ok := l.v.recording(); ok && at.After(l.fencedAt) && l.term == nil && l.fencing == 0 &&
		!l.left && l.e.fence.connected() {
		l.startFence(epoch)
	}
	switch {
	case l.term != nil:
		l.claim = 0
	case l.fencing != 0:
		l.claim = l.fencing // claimed while it is being recorded
	case l.left || !l.e.fence.connected():
		// Not while leaving, nor without ZooKeeper: such a claim could not
		// become a term, and as the highest live id this node would keep
		// lower ids from claiming.
		l.claim = 0
	}
	if l.claim != 0 && l.claim != l.sent.claim && l.fencing == 0 {
		l.logClaim(now)
	}
	if l.term != nil {
		l.e.sharing.lead(l, now)
	}
	l.checkMode(now)
	if !l.left {
		hb := l.heartbeat(now)
		gen, action := hb.GetAssignment().GetGeneration(), l.e.lastAction.Load()
		// The vote may await an own heartbeat made after a point to judge
		// a silent leader gone (its read barrier): made now, not a tick later.
		barrier, awaited := l.v.barrier(now)
		barrier = barrier.Truncate(time.Millisecond)
		awaited = awaited && !now.Before(barrier) && l.sent.at.Before(barrier)
		if tick || awaited || hb.Epoch != l.sent.epoch || hb.Role != l.sent.role || hb.ClaimEpoch != l.sent.claim || gen != l.sent.generation ||
			l.pause.Version != l.sent.pause || action != l.sent.action {
			l.sent.epoch, l.sent.role, l.sent.claim, l.sent.generation = hb.Epoch, hb.Role, hb.ClaimEpoch, gen
			l.sent.pause, l.sent.action, l.sent.at = l.pause.Version, action, time.UnixMilli(hb.SentAtMs)
			l.stamp(hb)
			l.pub.send(pubReq{hb: hb})
		}
	}
	l.publishSnapshot(now)
}

// logClaim says why this node starts claiming at now: what the vote knew
// of the recorded leader and of the members, so that a claim that deposed a
// live leader can be explained from the logs.
func (l *loop) logClaim(now time.Time) {
	v := l.v
	silent := "never heard from"
	if m := v.members[v.rec.Node]; m != nil {
		silent = now.Sub(m.lastSeen).Round(time.Millisecond).String()
		if m.left {
			silent += " (it left)"
		}
	}
	var heard []string
	for _, m := range v.view(now) {
		heard = append(heard, fmt.Sprintf("%s %s ago (%s)", m.id, now.Sub(m.lastSeen).Round(time.Millisecond),
			strings.ToLower(strings.TrimPrefix(m.role.String(), "ROLE_"))))
	}
	l.e.log.WithFields(logrus.Fields{"epoch": l.claim, "record": v.rec.String(), "leader_silent_for": silent,
		"own_heartbeat_age": now.Sub(v.ownMade).Round(time.Millisecond), "members": strings.Join(heard, ", ")}).
		Info("claiming leadership: the recorded leader is not live")
}

// heartbeat is this node's heartbeat at now.
func (l *loop) heartbeat(now time.Time) *Heartbeat {
	role, epoch := Role_ROLE_FOLLOWER, l.v.highest
	switch {
	case l.term != nil:
		role, epoch = Role_ROLE_LEADER, l.term.Epoch
	case l.claim != 0:
		role = Role_ROLE_CANDIDATE
	}
	hb := &Heartbeat{
		NodeId: l.e.cfg.NodeID, Addr: l.e.cfg.Addr, Epoch: epoch, Role: role,
		ClaimEpoch: l.claim, SentAtMs: now.UnixMilli(), Instance: l.e.instance,
		Mode: l.e.cfg.Mode, OffsetStore: l.e.store,
	}
	if l.e.cfg.Readiness != nil {
		ready, reason := l.e.cfg.Readiness()
		hb.Readiness = &Readiness{Ready: ready, Reason: reason}
	}
	l.e.sharing.stamp(l, hb)
	hb.Pause = l.pause.wire()
	if a := l.e.lastAction.Load(); a != nil {
		hb.LastAction = a.wire()
	}
	return hb
}

// termEnds returns why the running term must end at now, or nil.
func (l *loop) termEnds(now time.Time) error {
	t := l.term
	switch {
	case l.v.rec != l.termRec:
		return fmt.Errorf("epoch %d: %s now shows %v: %w", t.Epoch, l.e.fence.name(), l.v.rec, ErrSuperseded)
	case l.e.fence.session() != t.session:
		return fmt.Errorf("epoch %d: session %#x: %w", t.Epoch, t.session, ErrSessionExpired)
	case !l.v.live(l.e.cfg.NodeID, now):
		return fmt.Errorf("epoch %d: no own heartbeat for %v: %w", t.Epoch, l.e.cfg.LeaderTimeout, ErrCutOff)
	}
	return nil
}

// endTerm ends the running term, if any, with cause, and asks the fence
// watcher to release what the term holds at the authority. This node then
// sits out a timeout, so that another member takes over.
func (l *loop) endTerm(cause error) {
	if l.term == nil {
		return
	}
	l.v.bench(l.e.cfg.NodeID, l.e.cfg.Now())
	l.term.finish(cause)
	level := logrus.WarnLevel
	if errors.Is(cause, ErrResigned) {
		level = logrus.InfoLevel // a shutdown or handover: nothing went wrong
	}
	l.e.log.WithError(cause).WithField("epoch", l.term.Epoch).Log(level, "leadership term ended")
	l.term = nil
	select { // never blocks: a release is queued at most once per CAS
	case l.reqs <- fenceReq{release: true, rec: l.termRec}:
	default:
		l.e.log.Warn("release of the ended term not queued: the authority lets it expire")
	}
}

// startFence asks the fence watcher to record epoch with the authority.
func (l *loop) startFence(epoch uint64) {
	l.fencing = epoch
	l.e.log.WithField("epoch", epoch).Info("won the claim; recording the epoch in " + l.e.fence.name())
	l.reqs <- fenceReq{epoch: epoch} // never blocks: capacity 2, only sent while no CAS runs, and a release before it at most
}

// fenceDone takes the outcome of a fence CAS: a term, or a failed claim.
func (l *loop) fenceDone(o fenceOutcome) {
	l.fencing, l.fencedAt = 0, l.e.cfg.Now()
	log := l.e.log.WithField("epoch", o.epoch)
	switch {
	case errors.Is(o.err, errVoid):
		// Lost the race, or behind on the epoch: the next claim is above
		// what ZooKeeper holds.
		log.WithError(o.err).Warn("won epoch is void; staying follower")
		l.v.raiseFloor(o.stored)
		l.v.giveUp(o.epoch, l.fencedAt, false)
	case o.err != nil:
		// Not a lost race (an unreadable record, no permission, ...):
		// claiming again at once would only fail again and keep the
		// lower ids from their turn.
		log.WithError(o.err).WithField("retry_in", l.e.cfg.LeaderTimeout).
			Error("cannot record won epoch in " + l.e.fence.name() + "; staying follower, not claiming for a leader timeout")
		l.v.giveUp(o.epoch, l.fencedAt, true)
	default:
		l.v.setRecord(o.rec)
		if l.left {
			log.Warn("epoch recorded in " + l.e.fence.name() + " after resigning; staying out")
			select {
			case l.reqs <- fenceReq{release: true, rec: o.rec}:
			default:
			}
			return
		}
		l.term = newTerm(o.epoch, o.rec, o.fence, o.session)
		l.termRec = o.rec
		log.WithField("fence", o.fence.String()).Info("leading")
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
	epoch := l.v.highest
	if l.term != nil {
		epoch = l.term.Epoch
	}
	l.endTerm(fmt.Errorf("epoch %d: %w", epoch, ErrResigned))
	l.left, l.claim = true, 0
	hb := l.heartbeat(now)
	hb.Leaving = true
	l.stamp(hb)
	l.pub.send(pubReq{hb: hb, done: done})
	l.publishSnapshot(now)
	l.e.log.Info("resigned: leaving heartbeat sent")
}

// publishSnapshot stores the Leadership and Members views of now.
func (l *loop) publishSnapshot(now time.Time) {
	s := &snapshot{}
	switch rec := l.v.rec; {
	case l.term != nil:
		s.leadership = Leadership{Leader: true, LeaderAddr: l.e.cfg.Addr, LeaderID: l.e.cfg.NodeID,
			Epoch: l.term.Epoch, Known: true, Mode: l.e.cfg.Mode}
	case l.v.leaderLive(now) && rec.Node != l.e.cfg.NodeID:
		s.leadership = Leadership{LeaderAddr: rec.Addr, LeaderID: rec.Node, Epoch: rec.Epoch, Known: true,
			Mode: l.v.members[rec.Node].mode}
	}
	for _, m := range l.v.view(now) {
		mm := Member{NodeID: m.id, Addr: m.addr, Role: m.role, Epoch: m.epoch, LastSeen: m.lastSeen,
			Mode: m.mode, Weight: m.weight, Store: m.store, Readiness: m.readiness}
		hb := &Heartbeat{Pause: m.pause, LastAction: m.action}
		mm.Pause, _ = PauseOf(hb)
		if a, ok := LastActionOf(hb); ok {
			mm.LastAction = &a
		}
		s.members = append(s.members, mm)
	}
	s.assignment = l.e.sharing.inForce(l, now)
	s.pause = l.pause
	if l.term != nil {
		s.published = l.spread.published
	}
	old := l.e.snap.Swap(s)
	if old.assignment != s.assignment {
		select {
		case l.e.changed <- struct{}{}:
		default:
		}
	}
}
