package cluster

import (
	"slices"
	"time"
)

// vote is the pure election logic of one member: it folds the heartbeat log
// (in log order, each with its local receive time) into the state (epoch,
// leader) and decides when this member must claim the next epoch. It does no
// I/O and reads no clock; the Elector's loop owns it.
//
// The (epoch, leader) state depends only on the log, so every member that
// reads the same log suffix agrees on it:
//   - the first claim for an epoch greater than the current one wins it;
//     later claims for that epoch (or lower ones) lose;
//   - a leader heartbeat (role leader, epoch E >= current) from X establishes
//     X at E: only the winner of E's ZooKeeper CAS sends one, so it is
//     authoritative, and a member that started reading after the claim
//     learns the leader from it.
//
// Liveness uses local receive times only. The leader is live while it is
// not gone (it left, or said it follows in its own epoch, or this node
// stepped down) and a claim or leader heartbeat of it arrived within
// timeout. When the leader is not live, the live members (this one
// included) ranked by node id, highest first, claim in turn: rank r claims
// once the vacancy has lasted r timeouts (the bully rule), and never within
// the startup grace of one timeout.
type vote struct {
	self    string
	timeout time.Duration
	start   time.Time // end of the startup grace is start+timeout

	epoch      uint64
	leader     string    // "" when no leader is known
	leaderAddr string    // the leader's advertised address
	leaderSeen time.Time // receive time of the leader's last claim or leader heartbeat
	leaderGone bool      // the leader of epoch left, abdicated or stepped down
	floor      uint64    // an epoch known to be taken (ZooKeeper said so): claim above it

	vacantSince time.Time // first tick that found no live leader; zero while one is live
	established uint64    // number of (epoch, leader) changes seen

	members map[string]*member
}

// member is what the vote knows of one node from its heartbeats.
type member struct {
	addr     string
	role     Role
	epoch    uint64
	lastSeen time.Time // local receive time of the last heartbeat
}

// newVote returns the vote of node self, starting (and starting its grace)
// at now.
func newVote(self string, timeout time.Duration, now time.Time) *vote {
	return &vote{self: self, timeout: timeout, start: now, members: map[string]*member{}}
}

// observe folds one heartbeat, received at the local time at, into the
// state. Heartbeats must be observed in log order.
func (v *vote) observe(hb *Heartbeat, at time.Time) {
	id := hb.GetNodeId()
	if id == "" {
		return
	}
	if hb.GetLeaving() {
		delete(v.members, id)
	} else {
		m := v.members[id]
		if m == nil {
			m = &member{}
			v.members[id] = m
		}
		m.addr, m.role, m.epoch, m.lastSeen = hb.GetAddr(), hb.GetRole(), hb.GetEpoch(), at
	}

	if c := hb.GetClaimEpoch(); c > v.epoch {
		v.establish(c, id, hb.GetAddr(), at)
	}
	switch e := hb.GetEpoch(); {
	case hb.GetRole() == Role_ROLE_LEADER && e > v.epoch:
		v.establish(e, id, hb.GetAddr(), at)
	case hb.GetRole() == Role_ROLE_LEADER && e == v.epoch:
		if id != v.leader {
			// Authoritative (see the type comment); a member that began
			// reading after the winning claim may have taken a losing one.
			v.establish(e, id, hb.GetAddr(), at)
		}
		v.leaderSeen = at
	case e == v.epoch && id == v.leader && hb.GetRole() == Role_ROLE_FOLLOWER:
		v.leaderGone = true // its ZooKeeper CAS failed, or it stepped down
	}
	if id == v.leader && hb.GetLeaving() {
		v.leaderGone = true
	}
}

// establish makes leader the leader of epoch as of at.
func (v *vote) establish(epoch uint64, leader, addr string, at time.Time) {
	v.epoch, v.leader, v.leaderAddr, v.leaderSeen, v.leaderGone = epoch, leader, addr, at, false
	v.established++
}

// abdicate records that this node, leader of epoch, stepped down: its
// leadership of epoch is over whatever heartbeats of it still arrive.
func (v *vote) abdicate(epoch uint64) {
	if v.epoch == epoch && v.leader == v.self {
		v.leaderGone = true
	}
}

// raiseFloor records that epochs up to epoch are taken (a void ZooKeeper
// CAS read that epoch), so that the next claim is above it.
func (v *vote) raiseFloor(epoch uint64) { v.floor = max(v.floor, epoch) }

// leaderLive reports whether a leader is known and live at now.
func (v *vote) leaderLive(now time.Time) bool {
	return v.leader != "" && !v.leaderGone && now.Sub(v.leaderSeen) < v.timeout
}

// live reports whether node id (not this node) is live at now.
func (v *vote) live(id string, now time.Time) bool {
	m := v.members[id]
	return m != nil && now.Sub(m.lastSeen) < v.timeout
}

// rank is this node's position among the live members ordered by node id,
// highest first (0: this node is the highest).
func (v *vote) rank(now time.Time) int {
	r := 0
	for id := range v.members {
		if id > v.self && v.live(id, now) {
			r++
		}
	}
	return r
}

// tick advances the vacancy clock to now and returns the epoch this node
// must claim, or 0 when it must not claim.
func (v *vote) tick(now time.Time) (claim uint64) {
	if v.leaderLive(now) {
		v.vacantSince = time.Time{}
		return 0
	}
	if v.vacantSince.IsZero() {
		v.vacantSince = now
	}
	graceEnd := v.start.Add(v.timeout)
	if now.Before(graceEnd) {
		return 0 // startup grace: learn the current leader from the log first
	}
	since := v.vacantSince
	if since.Before(graceEnd) {
		since = graceEnd // ranks wait their turn from the end of the grace
	}
	if now.Sub(since) < time.Duration(v.rank(now))*v.timeout {
		return 0
	}
	return max(v.epoch, v.floor) + 1
}

// selfLeads reports whether the log makes this node the live leader of
// epoch at now.
func (v *vote) selfLeads(epoch uint64, now time.Time) bool {
	return v.epoch == epoch && v.leader == v.self && v.leaderLive(now)
}

// memberView is one row of Elector.Members.
type memberView struct {
	id string
	member
}

// view lists the members seen within the last 2 timeouts, by node id.
func (v *vote) view(now time.Time) []memberView {
	out := make([]memberView, 0, len(v.members))
	for id, m := range v.members {
		if now.Sub(m.lastSeen) < 2*v.timeout {
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
