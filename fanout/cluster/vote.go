package cluster

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// maxEpochAhead is how far beyond the highest epoch ZooKeeper has shown a
// heartbeat's epoch or claim may be and still be plausible: members read
// ZooKeeper at slightly different moments, never this far apart.
const maxEpochAhead = 3

// maxMembers bounds the node ids a vote keeps. Members leave the map two
// timeouts after their last record, so only forged records (a log written
// without a cluster secret) can fill it; records of further node ids are
// then ignored until some leave.
const maxMembers = 512

// vote is the election logic of one member: it folds the fence record read
// from the authority (ZooKeeper, or the Kafka group; "ZooKeeper" below
// stands for either) and the heartbeat log (in log order, each heartbeat with its
// local receive time) into who leads and when this member must claim. It
// does no I/O and reads no clock; the Elector's loop owns it.
//
// Authority. ZooKeeper alone says who leads: the fence record (epoch, node,
// address) written by the last successful compare-and-set. A follower
// redirects only to the recorded node, and only while that node is live.
// Heartbeats never make a leader; they tell who is alive and order claims.
//
// Liveness uses local receive times only. A member is live while one of its
// heartbeats arrived within timeout. The recorded leader is live while it is
// live and its last heartbeat does not say it stopped leading (a heartbeat
// of another role in the recorded epoch or later, or a leaving one).
//
// Claims. While the recorded leader is not live, the live members (this
// one included), ranked by node id, highest first, claim in turn: rank r
// claims once the vacancy has lasted r timeouts (the bully rule), never
// within the startup grace of one timeout, and only while this member's own
// heartbeats come back (else it has not read what the others said: back
// from a cut, it could take a live leader for dead). Nor does receiving an
// own heartbeat prove that much: one made before a pause of this process
// (SIGSTOP, a starved machine) is read when it runs again, ahead of what the
// others wrote meanwhile. So a silent recorded leader is judged gone only
// once an own heartbeat made at least a timeout after the leader's last
// one was read has come back (the read barrier): everything appended
// before it was read, and the leader was not among it. A claim names the next epoch: the
// highest epoch ZooKeeper has shown, plus one. Epochs come from ZooKeeper
// only, so a heartbeat cannot move them, and at the largest value no member
// claims (they never wrap). The first claim above that epoch read from the
// log is the one being recorded: its claimant alone runs the compare-and-set
// and the others hold back, at most one timeout, until ZooKeeper shows the
// outcome or the claimant gives up.
//
// Turns. A member that stops claiming without becoming leader (its
// compare-and-set failed, or lost), whose claim waited a timeout without an
// outcome, or that stops leading, sits out one timeout: it does not claim
// and does not count in the ranks, so the next member claims at once and a
// member whose compare-and-set keeps failing claims at most once per
// timeout. Every member reads this from the same log, itself included.
//
// Plausibility. A heartbeat whose epoch or claim lies beyond the highest
// epoch ZooKeeper has shown plus maxEpochAhead is not plausible (forged or
// corrupt): it is not observed at all.
//
// Duplicates. A heartbeat with this member's node id but from another
// instance, made after this instance's first own heartbeat was appended
// (its seen position, below, is above that record's offset), means another
// live process has the same node id: this member does not claim until one
// timeout after the last such heartbeat. One made before is an earlier
// incarnation's, or a copy of one: ignored.
//
// Replays. A record is bound to its sender's instance (random per process
// start) by a sequence number that grows with every heartbeat the instance
// publishes, and dated by its seen position: a position of this log the
// sender had reached when it made the record, so the record was made after
// every record below seen was appended. With the cluster secret both are
// under the MAC, and a record appended again later (a replay, or a produce
// retried) keeps them. Each member keeps, per node id, its current
// instance, the highest sequence number read of it and the offset of its
// last record, and takes a record only when
//
//   - it is of the current instance and its sequence number is above the
//     highest read: any copy of a record already read is not;
//   - it is of another instance that was made after the current instance's
//     last record was appended (seen > that offset): the node restarted. An
//     older instance stopped before the newer one started, so each of its
//     records names a position no later than the offset of the newer one's
//     first record, and is ignored however late a copy of it is appended:
//     log order alone says nothing of a replay, the seen position in it does;
//   - it is of a node id not kept, and was made at or after the horizon.
//
// The horizon dates what this member can no longer judge: it starts at the
// offset where reading began (a record made before that belongs to a node
// whose later records, if any, are read), and rises above the last record
// of every member forgotten: members not heard from for two timeouts leave
// the map (maxMembers bounds it meanwhile), and any copy of their records,
// each made before their last one was appended, stays below it for good. So a
// leaving or role record is taken only from a member's current instance,
// and only once; a departed member's records cannot make it live again. A
// live member's genuine record falls below the horizon only when its sender
// had not read a record this member read two timeouts earlier: a sender
// lagging that far does not see its own heartbeats come back either. A
// record whose seen lies beyond its own offset was made for another log
// (the topic was recreated) and is ignored too.
//
// Without the cluster secret a heartbeat without a sequence number (a
// member of a version without it) is dated by its own offset and taken as
// before (last writer wins); with the secret it is ignored (strict), as it
// would leave replays open.
type vote struct {
	self     string
	instance string
	timeout  time.Duration
	start    time.Time // end of the startup grace is start+timeout

	rec      record // the fence record as ZooKeeper last showed it
	recKnown bool   // rec was read at least once
	highest  uint64 // the highest epoch ZooKeeper has shown (records, void CASes): claims go above it

	pend        pending   // the claim being recorded; zero when none
	vacantSince time.Time // first tick that found no live leader; zero while one is live
	ownFirst    int64     // offset of this instance's first own heartbeat read; -1 before it
	ownMade     time.Time // when the last own heartbeat read was made (its SentAtMs; else when it was read)
	dupAt       time.Time // receive time of the last duplicate heartbeat; zero when none

	strict    bool      // heartbeats without a sequence number are ignored (a cluster secret is set)
	horizon   int64     // records made before this log position are ignored (see Replays)
	nextPrune time.Time // when tick next forgets the members not heard from

	members map[string]*member
}

// record is what the authority records of the leader: the content of the
// fence znode (ZooKeeper), or the metadata of the group's member (Kafka).
type record struct {
	Epoch   uint64
	Node    string
	Addr    string
	Version int32  // ZooKeeper: the znode's version
	Member  string // Kafka: the group member id that holds it
	Missing bool   // nobody is recorded: no znode, or a group without a member (Epoch: the highest committed, if known)
	Corrupt bool   // the authority holds something that is not a fence record: nobody leads
}

// String describes the record for logs.
func (r record) String() string {
	switch {
	case r.Missing:
		return "no fence record"
	case r.Corrupt:
		return fmt.Sprintf("an unreadable fence record (version %d)", r.Version)
	case r.Member != "":
		return fmt.Sprintf("epoch %d node %q addr %q member %s", r.Epoch, r.Node, r.Addr, r.Member)
	}
	return fmt.Sprintf("epoch %d node %q addr %q version %d", r.Epoch, r.Node, r.Addr, r.Version)
}

// pending is the claim being recorded in ZooKeeper.
type pending struct {
	node  string
	epoch uint64
	at    time.Time // receive time of the claim
}

// member is what the vote knows of one node from its heartbeats.
type member struct {
	instance  string // the instance whose records are taken (see Replays)
	seq       uint64 // the highest sequence number read of instance; 0 when it sends none
	offset    int64  // log offset of the last record taken
	left      bool   // its instance said it leaves: not live, kept until forgotten
	addr      string
	role      Role
	epoch     uint64
	claim     uint64
	lastSeen  time.Time   // local receive time of the last heartbeat
	benched   time.Time   // sits out until then: its claim failed, or it stopped leading
	mode      Mode        // its --assignment; MODE_LEADER when it does not say
	weight    int         // its capacity in spread mode, at least 1
	store     OffsetStore // its --offset-store; unspecified when it does not say
	readiness *Readiness  // its last heartbeat's; nil when it does not say
	// What its last heartbeat says of the cluster's pause and of its last
	// action; nil when it says nothing.
	pause  *DeliveryPause
	action *OperatorAction
}

// verdict is what observe made of a heartbeat, for the loop to log.
type verdict int

const (
	observed    verdict = iota // folded into the state (or ignored as harmless)
	implausible                // an epoch beyond what ZooKeeper makes plausible: ignored
	duplicate                  // another process with this member's node id
	stale                      // a copy of a record taken, an older instance's, or made before the horizon: ignored
	unbound                    // no sequence number, with the cluster secret: ignored
	crowded                    // a new node id while maxMembers are kept: ignored
)

// newVote returns the vote of node self (this process: instance), starting
// (and starting its grace) at now, reading the log from its oldest record.
func newVote(self, instance string, timeout time.Duration, now time.Time) *vote {
	return &vote{self: self, instance: instance, timeout: timeout, start: now, ownFirst: -1,
		members: map[string]*member{}}
}

// readFrom says that reading the log (re)starts at offset: the horizon is
// set there, and the members' last offsets are kept below it. At the start
// it is where reading begins; later, where it resumed after a gap or after
// the log began again (the topic was recreated), whose offsets say nothing
// of the records read before.
func (v *vote) readFrom(offset int64) {
	v.horizon = offset
	v.ownFirst = min(v.ownFirst, offset-1)
	for _, m := range v.members {
		m.offset = min(m.offset, offset-1)
	}
}

// setRecord takes the fence record ZooKeeper shows now.
func (v *vote) setRecord(r record) {
	v.rec, v.recKnown = r, true
	v.raiseFloor(r.Epoch)
}

// raiseFloor records that epochs up to epoch are taken (a record, or a void
// CAS that read that epoch), so that the next claim is above it.
func (v *vote) raiseFloor(epoch uint64) {
	v.highest = max(v.highest, epoch)
	if v.pend.node != "" && v.pend.epoch <= v.highest {
		v.pend = pending{} // decided: ZooKeeper shows it (or a later one)
	}
}

// plausible reports whether epoch can come from a member that reads the
// same ZooKeeper.
func (v *vote) plausible(epoch uint64) bool {
	return !v.recKnown || epoch <= v.highest || epoch-v.highest <= maxEpochAhead
}

// observe folds one heartbeat, read at offset of the log and received at
// the local time at, into the state. Heartbeats must be observed in log
// order.
func (v *vote) observe(hb *Heartbeat, offset int64, at time.Time) verdict {
	id := hb.GetNodeId()
	if id == "" {
		return observed
	}
	if !v.plausible(hb.GetEpoch()) || !v.plausible(hb.GetClaimEpoch()) {
		return implausible
	}
	seen := hb.GetSeen()
	if hb.GetSeq() == 0 {
		if v.strict {
			return unbound
		}
		seen = offset // a member of a version without it: dated by where it was appended
	}
	if seen > offset || seen < v.horizon {
		return stale
	}
	if id == v.self && hb.GetInstance() != v.instance {
		switch {
		case v.ownFirst < 0:
			return observed // an earlier incarnation, read before this one's first heartbeat: not folded
		case seen <= v.ownFirst:
			return stale // made before this instance's first heartbeat was appended: an earlier incarnation
		}
		v.dupAt = at
		return duplicate
	}
	m := v.members[id]
	switch {
	case m == nil:
		if len(v.members) >= maxMembers && v.prune(at) == 0 {
			return crowded
		}
		if seen < v.horizon { // raised by the members just forgotten
			return stale
		}
		m = &member{instance: hb.GetInstance()}
		v.members[id] = m
	case hb.GetInstance() != m.instance:
		if seen <= m.offset {
			return stale // made before the current instance's last record was appended: an older instance
		}
		m.instance, m.seq = hb.GetInstance(), 0 // the node restarted
	case hb.GetSeq() != 0 && hb.GetSeq() <= m.seq:
		return stale // a copy of a record taken: replayed, or appended twice
	}
	m.seq, m.offset, m.lastSeen, m.left = hb.GetSeq(), offset, at, false
	if id == v.self {
		if v.ownFirst < 0 {
			v.ownFirst = offset
		}
		v.ownMade = at
		if ms := hb.GetSentAtMs(); ms > 0 && time.UnixMilli(ms).Before(at) {
			v.ownMade = time.UnixMilli(ms) // this process's clock: comparable with at
		}
	}
	if hb.GetLeaving() {
		// Forgotten but for what tells its later records from copies of
		// the earlier ones.
		*m = member{instance: m.instance, seq: m.seq, offset: m.offset, lastSeen: at, left: true}
		if v.pend.node == id {
			v.pend = pending{}
		}
		return observed
	}
	leads := hb.GetRole() == Role_ROLE_LEADER
	if !leads && (m.role == Role_ROLE_LEADER || m.claim != 0 && hb.GetClaimEpoch() == 0) {
		m.benched = at.Add(v.timeout) // stopped leading, or stopped claiming without winning
	}
	m.addr, m.role, m.epoch, m.claim = hb.GetAddr(), hb.GetRole(), hb.GetEpoch(), hb.GetClaimEpoch()
	m.mode, m.weight = hb.GetMode(), max(1, int(hb.GetWeight()))
	m.store, m.readiness = hb.GetOffsetStore(), hb.GetReadiness()
	m.pause, m.action = hb.GetPause(), hb.GetLastAction()
	if m.mode == Mode_MODE_UNSPECIFIED {
		m.mode = Mode_MODE_LEADER
	}

	c := hb.GetClaimEpoch()
	switch {
	case c > v.highest && (v.pend.node == "" || c > v.pend.epoch) && !v.sitsOut(id, at):
		v.pend = pending{node: id, epoch: c, at: at} // the first claim for it wins
	case v.pend.node == id && c != v.pend.epoch && !(hb.GetRole() == Role_ROLE_LEADER && hb.GetEpoch() == v.pend.epoch):
		v.pend = pending{} // the claimant gave up
	}
	return observed
}

// giveUp records that this member's compare-and-set for epoch failed at
// now; sitOut makes it sit out a timeout before claiming again.
func (v *vote) giveUp(epoch uint64, now time.Time, sitOut bool) {
	if v.pend.node == v.self && v.pend.epoch == epoch {
		v.pend = pending{}
	}
	if sitOut {
		v.bench(v.self, now)
	}
}

// bench makes member id sit out one timeout from now.
func (v *vote) bench(id string, now time.Time) {
	if m := v.members[id]; m != nil {
		m.benched = now.Add(v.timeout)
	}
}

// sitsOut reports whether member id sits out its turn at now.
func (v *vote) sitsOut(id string, now time.Time) bool {
	m := v.members[id]
	return m != nil && now.Before(m.benched)
}

// live reports whether node id has a heartbeat within timeout of now and
// has not left.
func (v *vote) live(id string, now time.Time) bool {
	m := v.members[id]
	return m != nil && !m.left && now.Sub(m.lastSeen) < v.timeout
}

// retention is how long a member is kept after its last record: the
// window of view.
func (v *vote) retention() time.Duration { return 2 * v.timeout }

// prune forgets the members whose last record was received retention or
// more before now, raising the horizon above their last records, and returns
// how many it forgot.
func (v *vote) prune(now time.Time) int {
	n := 0
	for id, m := range v.members {
		if now.Sub(m.lastSeen) >= v.retention() {
			v.horizon = max(v.horizon, m.offset+1)
			delete(v.members, id)
			n++
		}
	}
	return n
}

// leaderLive reports whether the recorded leader is live at now.
func (v *vote) leaderLive(now time.Time) bool {
	if !v.recKnown || v.rec.Missing || v.rec.Corrupt || v.rec.Node == "" || !v.live(v.rec.Node, now) {
		return false
	}
	m := v.members[v.rec.Node]
	return m.role == Role_ROLE_LEADER || m.epoch < v.rec.Epoch
}

// expire drops the pending claim when its claimant is gone or it has waited
// a timeout without ZooKeeper showing its outcome.
func (v *vote) expire(now time.Time) {
	if v.pend.node == "" {
		return
	}
	if !v.live(v.pend.node, now) || now.Sub(v.pend.at) >= v.timeout {
		v.bench(v.pend.node, now)
		v.pend = pending{}
	}
}

// rank is this node's position among the live members ordered by node id,
// highest first (0: this node is the highest).
func (v *vote) rank(now time.Time) int {
	r := 0
	for id := range v.members {
		if id > v.self && v.live(id, now) && !v.sitsOut(id, now) {
			r++
		}
	}
	return r
}

// tick advances the vacancy clock to now and returns the epoch this node
// must claim, or 0 when it must not claim.
func (v *vote) tick(now time.Time) (claim uint64) {
	if !now.Before(v.nextPrune) {
		v.prune(now)
		v.nextPrune = now.Add(v.timeout / 2)
	}
	v.expire(now)
	if v.leaderLive(now) {
		v.vacantSince = time.Time{}
		return 0
	}
	if v.vacantSince.IsZero() {
		v.vacantSince = now
	}
	graceEnd := v.start.Add(v.timeout)
	switch {
	case now.Before(graceEnd), !v.recKnown, !v.live(v.self, now):
		// Learn the recorded leader and the live members first: a member
		// whose own heartbeats do not come back (starting, or back from a
		// cut) has not read what the others said meanwhile.
		return 0
	case !v.barrierPassed():
		return 0 // the leader's silence is not yet proven by the log (see Claims)
	case v.pend.node == v.self:
		return v.pend.epoch // keep claiming while it is being recorded
	case v.pend.node != "":
		return 0
	case v.duplicated(now), v.sitsOut(v.self, now), v.highest == math.MaxUint64:
		return 0
	}
	since := v.vacantSince
	if since.Before(graceEnd) {
		since = graceEnd // ranks wait their turn from the end of the grace
	}
	if now.Sub(since) < time.Duration(v.rank(now))*v.timeout {
		return 0
	}
	return v.highest + 1
}

// duplicated reports whether another process with this node id was heard
// from within timeout of now.
func (v *vote) duplicated(now time.Time) bool {
	return !v.dupAt.IsZero() && now.Sub(v.dupAt) < v.timeout
}

// recording reports whether this node's claim is the one being recorded,
// its epoch and when it was read.
func (v *vote) recording() (epoch uint64, at time.Time, ok bool) {
	return v.pend.epoch, v.pend.at, v.pend.node == v.self
}

// memberView is one row of Elector.Members.
type memberView struct {
	id string
	member
}

// view lists the members seen within the last 2 timeouts that have not
// left, by node id.
func (v *vote) view(now time.Time) []memberView {
	out := make([]memberView, 0, len(v.members))
	for id, m := range v.members {
		if !m.left && now.Sub(m.lastSeen) < v.retention() {
			out = append(out, memberView{id, *m})
		}
	}
	slices.SortFunc(out, func(a, b memberView) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	return out
}

// barrier returns the time at or after which this member must make a
// heartbeat whose return proves the recorded leader's silence (see Claims),
// and whether one is awaited: the loop then publishes one at once instead of
// at its next tick.
func (v *vote) barrier(now time.Time) (time.Time, bool) {
	if v.leaderLive(now) || v.barrierPassed() {
		return time.Time{}, false
	}
	return v.barrierAt(), true
}

// barrierPassed reports whether an own heartbeat made at or after barrierAt
// was read: true when the recorded leader is not a member heard from (not
// read since the horizon, or it left) or its last heartbeat says it stopped
// leading, which need no such proof.
func (v *vote) barrierPassed() bool {
	at := v.barrierAt()
	return at.IsZero() || !v.ownMade.Before(at.Truncate(time.Millisecond))
}

// barrierAt is a timeout after the recorded leader's last heartbeat was
// read, while that heartbeat says it leads; zero otherwise.
func (v *vote) barrierAt() time.Time {
	if !v.recKnown || v.rec.Missing || v.rec.Corrupt || v.rec.Node == "" {
		return time.Time{}
	}
	m := v.members[v.rec.Node]
	if m == nil || m.left || !(m.role == Role_ROLE_LEADER || m.epoch < v.rec.Epoch) {
		return time.Time{}
	}
	return m.lastSeen.Add(v.timeout)
}
