package cluster

import (
	"math"
	"sync/atomic"
	"testing"
	"time"
)

const testTimeout = 3 * time.Second

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testInstance is the instance of every vote of these tests.
const testInstance = "i1"

// beat is a heartbeat of node id in epoch with role.
func beat(id string, epoch uint64, role Role) *Heartbeat {
	return &Heartbeat{NodeId: id, Addr: id + ":4000", Epoch: epoch, Role: role, Instance: testInstance}
}

// follower, leader and claim are heartbeat shorthands.
func follower(id string, epoch uint64) *Heartbeat { return beat(id, epoch, Role_ROLE_FOLLOWER) }
func leader(id string, epoch uint64) *Heartbeat   { return beat(id, epoch, Role_ROLE_LEADER) }
func claim(id string, epoch, c uint64) *Heartbeat {
	hb := beat(id, epoch, Role_ROLE_CANDIDATE)
	hb.ClaimEpoch = c
	return hb
}
func leaving(hb *Heartbeat) *Heartbeat { hb.Leaving = true; return hb }

// logEnd is the offset of the last heartbeat fed to a vote by feed (all
// tests share it: each vote sees offsets that grow).
var logEnd atomic.Int64

// feed has v observe hb at the next offset of the log, received at at.
func feed(v *vote, hb *Heartbeat, at time.Time) verdict { return v.observe(hb, logEnd.Add(1), at) }

// rec is a fence record of epoch led by node.
func rec(epoch uint64, node string) *record {
	return &record{Epoch: epoch, Node: node, Addr: node + ":4000", Version: int32(epoch)}
}

// step is one scripted event of a vote test: at the offset from t0, take
// the fence record (if any), observe hbs (in log order), then, if tick,
// tick and compare the claim.
type step struct {
	at        time.Duration
	rec       *record
	hbs       []*Heartbeat
	tick      bool
	wantClaim uint64
}

// every returns steps observing the heartbeats made by mk at each second
// in [from, to).
func every(from, to time.Duration, mk func() []*Heartbeat) []step {
	var out []step
	for at := from; at < to; at += time.Second {
		out = append(out, step{at: at, hbs: mk()})
	}
	return out
}

func hbs(h ...*Heartbeat) func() []*Heartbeat { return func() []*Heartbeat { return h } }

func concat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestVote(t *testing.T) {
	t.Parallel()
	s := time.Second
	tests := []struct {
		name       string
		self       string
		steps      []step
		wantLeader string // the live recorded leader at the last step; "" for none
	}{
		{
			name: "alone: waits out the grace, claims epoch 1, keeps claiming until ZooKeeper records it",
			self: "a",
			steps: []step{
				{at: 0, rec: rec(0, ""), tick: true},
				{at: 2 * s, hbs: []*Heartbeat{follower("a", 0)}, tick: true},
				{at: 3 * s, tick: true, wantClaim: 1},
				{at: 3*s + 10*time.Millisecond, hbs: []*Heartbeat{claim("a", 0, 1)}, tick: true, wantClaim: 1},
				{at: 3*s + 20*time.Millisecond, rec: rec(1, "a"), tick: true},
				{at: 4 * s, hbs: []*Heartbeat{leader("a", 1)}, tick: true},
			},
			wantLeader: "a",
		},
		{
			name:  "without the fence record no claim",
			self:  "a",
			steps: concat(every(0, 10*s, hbs(follower("a", 0))), []step{{at: 10 * s, tick: true}}),
		},
		{
			name: "three nodes: the highest id c claims",
			self: "c",
			steps: concat([]step{{at: 0, rec: rec(0, "")}}, every(0, 3*s, hbs(follower("a", 0), follower("b", 0), follower("c", 0))),
				[]step{{at: 3 * s, tick: true, wantClaim: 1}}),
		},
		{
			name: "three nodes: b does not claim while c's claim is being recorded, and follows the record",
			self: "b",
			steps: concat([]step{{at: 0, rec: rec(0, "")}}, every(0, 3*s, hbs(follower("a", 0), follower("b", 0), follower("c", 0))),
				[]step{
					{at: 3 * s, tick: true},
					{at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1)}, tick: true},
					{at: 5 * s, hbs: []*Heartbeat{claim("c", 0, 1)}, tick: true},
					{at: 5 * s, rec: rec(1, "c"), hbs: []*Heartbeat{leader("c", 1)}, tick: true},
				}),
			wantLeader: "c",
		},
		{
			name: "a claim ZooKeeper never records expires after a timeout: the next member claims",
			self: "b",
			steps: concat([]step{{at: 0, rec: rec(0, "")}},
				every(0, 9*s, hbs(follower("a", 0), follower("b", 0))),
				every(3*s, 9*s, hbs(claim("c", 0, 1))),
				[]step{
					{at: 3 * s, tick: true},
					{at: 6*s - time.Millisecond, tick: true},
					{at: 6 * s, tick: true, wantClaim: 1},
				}),
		},
		{
			name: "simultaneous claims: the first in the log is recorded (seen by the loser c)",
			self: "c",
			steps: []step{
				{at: 4 * s, rec: rec(0, ""), hbs: []*Heartbeat{follower("b", 0), claim("b", 0, 1), claim("c", 0, 1)}, tick: true},
			},
		},
		{
			name: "recorded leader c stops heartbeating: b claims after the timeout, not before",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(1, "c")}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				every(5*s, 9*s, hbs(follower("a", 1), follower("b", 1))),
				[]step{{at: 7*s - time.Millisecond, tick: true}, {at: 7 * s, tick: true, wantClaim: 2}}),
		},
		{
			name: "recorded leader c stops heartbeating: a waits a second timeout for b",
			self: "a",
			steps: concat(
				[]step{{at: 0, rec: rec(1, "c")}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				every(5*s, 11*s, hbs(follower("a", 1), follower("b", 1))),
				[]step{{at: 7 * s, tick: true}, {at: 10*s - time.Millisecond, tick: true}, {at: 10 * s, tick: true, wantClaim: 2}}),
		},
		{
			name: "recorded leader leaves: b claims at once",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(1, "c")}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				[]step{{at: 5 * s, hbs: []*Heartbeat{leaving(leader("c", 1))}, tick: true, wantClaim: 2}}),
		},
		{
			name: "late node z (highest id) learns the leader from ZooKeeper and does not claim",
			self: "z",
			steps: concat(
				[]step{{at: 0, rec: rec(5, "c")}},
				every(0, 6*s, hbs(follower("a", 5), leader("c", 5))),
				[]step{{at: 6 * s, tick: true}}),
			wantLeader: "c",
		},
		{
			name: "leader heartbeats do not make a leader: only the record does",
			self: "a",
			steps: concat(
				[]step{{at: 0, rec: rec(3, "c")}},
				every(0, 6*s, hbs(follower("a", 3), leader("b", 3), leader("b", 4), follower("c", 3))),
				[]step{{at: 6 * s, tick: true}}), // c says it follows in 3: no live leader; b outranks a
		},
		{
			name: "the recorded node is no member: vacancy",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(7, "gone")}},
				every(0, 4*s, hbs(follower("a", 7), follower("b", 7))),
				[]step{{at: 4 * s, tick: true, wantClaim: 8}}),
		},
		{
			name: "the fence record deleted: claims stay above the epoch ZooKeeper showed before",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(7, "c")}}, // c is dead
				every(0, 4*s, hbs(follower("a", 7), follower("b", 7))),
				[]step{{at: 4 * s, rec: &record{Missing: true}, tick: true, wantClaim: 8}}),
		},
		{
			name: "a forged heartbeat with a huge epoch and a foreign address changes nothing",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(4, "c")}},
				every(0, 6*s, hbs(follower("a", 4), follower("b", 4), leader("c", 4))),
				[]step{
					{at: 5 * s, hbs: []*Heartbeat{
						{NodeId: "zz-forged", Addr: "evil:666", Epoch: math.MaxUint64, Role: Role_ROLE_LEADER},
						{NodeId: "c", Addr: "evil:666", Epoch: 1 << 62, Role: Role_ROLE_FOLLOWER, ClaimEpoch: 1 << 62},
					}, tick: true},
				}),
			wantLeader: "c",
		},
		{
			name: "epochs never wrap: at the largest epoch nobody claims",
			self: "a",
			steps: concat(
				[]step{{at: 0, rec: &record{Epoch: math.MaxUint64, Node: "gone"}}},
				every(0, 5*s, hbs(follower("a", math.MaxUint64))),
				[]step{{at: 5 * s, tick: true}}),
		},
		{
			name: "the epoch before the largest can still be claimed",
			self: "a",
			steps: concat(
				[]step{{at: 0, rec: &record{Epoch: math.MaxUint64 - 1, Node: "gone"}}},
				every(0, 5*s, hbs(follower("a", math.MaxUint64-1))),
				[]step{{at: 5 * s, tick: true, wantClaim: math.MaxUint64}}),
		},
		{
			name: "back from a cut, no claim before its own heartbeats come back (it has not read the others yet)",
			self: "c",
			steps: concat(
				[]step{{at: 0, rec: rec(1, "c")}},
				every(0, 3*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				[]step{
					{at: 5 * s, tick: true}, // cut off: nobody heard
					{at: 8 * s, tick: true},
					{at: 8 * s, rec: rec(2, "b"), hbs: []*Heartbeat{leader("b", 2), follower("a", 2), follower("c", 2)}, tick: true},
				}),
			wantLeader: "b",
		},
		{
			name: "c's claim fails (it stops claiming without leading): c sits out a timeout, b claims at once",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(0, "")}},
				every(0, 6*s, hbs(follower("a", 0), follower("b", 0))),
				every(0, 3*s, hbs(follower("c", 0))),
				[]step{
					{at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1)}, tick: true},
					{at: 3*s + 100*time.Millisecond, hbs: []*Heartbeat{follower("c", 0)}, tick: true, wantClaim: 1},
				}),
		},
		{
			name: "c's claim waits a timeout without an outcome: c sits out a timeout, b claims",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(0, "")}},
				every(0, 9*s, hbs(follower("a", 0), follower("b", 0))),
				every(3*s, 9*s, hbs(claim("c", 0, 1))),
				[]step{
					{at: 3 * s, tick: true},
					{at: 6*s - time.Millisecond, tick: true},
					{at: 6 * s, tick: true, wantClaim: 1},
					{at: 7 * s, tick: true, wantClaim: 1}, // c's later claims are not the pending one while it sits out
				}),
		},
		{
			name: "the leader c stops leading (its term was fenced): c sits out, b claims at once",
			self: "b",
			steps: concat(
				[]step{{at: 0, rec: rec(1, "c")}},
				every(0, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				[]step{{at: 5*s + 100*time.Millisecond, hbs: []*Heartbeat{follower("c", 1)}, tick: true, wantClaim: 2}}),
		},
		{
			name: "a leaving member no longer outranks",
			self: "a",
			steps: concat(
				[]step{{at: 0, rec: rec(0, "")}},
				every(0, 3*s, hbs(follower("a", 0), follower("b", 0))),
				[]step{{at: 3 * s, hbs: []*Heartbeat{leaving(follower("b", 0))}, tick: true, wantClaim: 1}}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newVote(tc.self, testInstance, testTimeout, t0)
			steps := sortSteps(tc.steps)
			var now time.Time
			for i, st := range steps {
				now = t0.Add(st.at)
				if st.rec != nil {
					v.setRecord(*st.rec)
				}
				for _, hb := range st.hbs {
					feed(v, hb, now)
				}
				if st.tick {
					if got := v.tick(now); got != st.wantClaim {
						t.Fatalf("step %d (at %v): tick() = claim %d, want %d (record %v, pending %+v)",
							i, st.at, got, st.wantClaim, v.rec, v.pend)
					}
				}
			}
			var got string
			if v.leaderLive(now) {
				got = v.rec.Node
			}
			if got != tc.wantLeader {
				t.Errorf("end: live leader %q, want %q (record %v)", got, tc.wantLeader, v.rec)
			}
		})
	}
}

// sortSteps orders steps by time, keeping script order within an instant
// except that observations come before ticks.
func sortSteps(steps []step) []step {
	out := make([]step, 0, len(steps))
	for _, st := range steps {
		i := len(out)
		for i > 0 && (out[i-1].at > st.at || (out[i-1].at == st.at && out[i-1].tick && !st.tick)) {
			i--
		}
		out = append(out, step{})
		copy(out[i+1:], out[i:])
		out[i] = st
	}
	return out
}

func TestVoteImplausibleHeartbeatsAreNotObserved(t *testing.T) {
	t.Parallel()
	v := newVote("a", testInstance, testTimeout, t0)
	forged := &Heartbeat{NodeId: "zz", Addr: "evil:1", Epoch: 1 << 40, Role: Role_ROLE_LEADER}
	if got := feed(v, forged, t0); got != observed {
		t.Errorf("before ZooKeeper was read: verdict %v, want observed (nothing to judge by)", got)
	}
	v.setRecord(*rec(10, "c"))
	for _, tc := range []struct {
		hb   *Heartbeat
		want verdict
	}{
		{follower("b", 10+maxEpochAhead), observed},
		{claim("b", 10, 11), observed},
		{follower("b", 10+maxEpochAhead+1), implausible},
		{claim("b", 10, 1<<63), implausible},
		{&Heartbeat{NodeId: "zz", Epoch: math.MaxUint64, Role: Role_ROLE_LEADER}, implausible},
	} {
		if got := feed(v, tc.hb, t0); got != tc.want {
			t.Errorf("observe(epoch %d claim %d) = %v, want %v", tc.hb.Epoch, tc.hb.ClaimEpoch, got, tc.want)
		}
	}
}

// Another process with this member's node id, heard after this member's
// own first heartbeat, keeps it from claiming for a timeout; heartbeats of
// an earlier incarnation read before it do not.
func TestVoteDuplicateNodeIDRefusesToClaim(t *testing.T) {
	t.Parallel()
	s := time.Second
	v := newVote("c", testInstance, testTimeout, t0)
	v.setRecord(*rec(0, ""))
	old := follower("c", 0)
	old.Instance = "earlier"
	if got := feed(v, old, t0); got != observed {
		t.Fatalf("an earlier incarnation's heartbeat before our own: %v, want observed", got)
	}
	feed(v, follower("c", 0), t0)
	other := follower("c", 0)
	other.Instance = "other"
	other.Addr = "elsewhere:4000"
	for at := time.Duration(0); at <= 4*s; at += s {
		if got := feed(v, other, t0.Add(at)); got != duplicate {
			t.Fatalf("another instance at %v: verdict %v, want duplicate", at, got)
		}
		feed(v, follower("c", 0), t0.Add(at))
		if got := v.tick(t0.Add(at)); got != 0 {
			t.Fatalf("claimed %d at %v while another process has this node id", got, at)
		}
	}
	// The other process stops: a timeout after its last heartbeat, c claims.
	if got := v.tick(t0.Add(7*s - time.Millisecond)); got != 0 {
		t.Fatalf("claimed %d within a timeout of the duplicate", got)
	}
	feed(v, follower("c", 0), t0.Add(7*s))
	if got := v.tick(t0.Add(7 * s)); got != 1 {
		t.Fatalf("tick a timeout after the duplicate stopped = %d, want 1", got)
	}
}

// TestVoteSimulatedCluster runs three votes over one shared log and one
// fence record with a fake clock: the highest id is recorded as leader, only
// one compare-and-set wins each epoch, and after the leader dies the next
// highest is recorded with epoch 2 within about a timeout.
func TestVoteSimulatedCluster(t *testing.T) {
	t.Parallel()
	ids := []string{"a", "b", "c"}
	votes := map[string]*vote{}
	read := map[string]int{} // log position each node has read
	alive := map[string]bool{}
	zk := record{}
	for _, id := range ids {
		votes[id] = newVote(id, testInstance, testTimeout, t0)
		votes[id].setRecord(zk)
		alive[id] = true
	}
	var log []*Heartbeat
	const tickEvery = 500 * time.Millisecond
	now := t0
	run := func(until time.Duration) {
		for ; now.Before(t0.Add(until)); now = now.Add(tickEvery) {
			for _, id := range ids { // each live node ticks, records its claim if it is the pending one, and heartbeats
				if !alive[id] {
					continue
				}
				v := votes[id]
				c := v.tick(now)
				if e, _, ok := v.recording(); ok && zk.Epoch < e {
					zk = record{Epoch: e, Node: id, Addr: id + ":4000", Version: zk.Version + 1} // the CAS
				}
				hb := follower(id, v.highest)
				switch {
				case zk.Node == id: // its term
					hb = leader(id, zk.Epoch)
				case c != 0:
					hb = claim(id, v.highest, c)
				}
				log = append(log, hb)
			}
			for _, id := range ids { // then reads ZooKeeper and the log to its end
				if !alive[id] {
					continue
				}
				votes[id].setRecord(zk)
				for ; read[id] < len(log); read[id]++ {
					votes[id].observe(log[read[id]], int64(read[id]), now)
				}
			}
		}
	}
	run(5 * time.Second)
	if zk.Epoch != 1 || zk.Node != "c" {
		t.Fatalf("record %v, want c leading epoch 1", zk)
	}
	for _, id := range []string{"a", "b"} {
		if !votes[id].leaderLive(now) {
			t.Fatalf("%s does not see c live", id)
		}
	}
	alive["c"] = false
	died := now
	for zk.Epoch != 2 {
		if now.Sub(died) > 3*testTimeout {
			t.Fatalf("no new leader %v after c died: record %v", now.Sub(died), zk)
		}
		run(now.Sub(t0) + tickEvery)
	}
	if zk.Node != "b" {
		t.Errorf("epoch 2 recorded for %s, want b", zk.Node)
	}
	// c's last heartbeat is one tick before it died; detection is at tick
	// granularity, the claim is read one tick later and recorded the next.
	if took := now.Sub(died); took > testTimeout+3*tickEvery {
		t.Errorf("failover took %v, want at most LeaderTimeout + 3 ticks (%v)", took, testTimeout+3*tickEvery)
	}
}

// A member whose compare-and-set failed (not a lost race) does not claim
// again for a full timeout.
func TestVoteFailedClaimSitsOutATimeout(t *testing.T) {
	t.Parallel()
	s := time.Second
	v := newVote("c", testInstance, testTimeout, t0)
	v.setRecord(*rec(0, ""))
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for d := time.Duration(0); d < 3*s; d += s {
		feed(v, follower("c", 0), at(d))
	}
	if got := v.tick(at(3 * s)); got != 1 {
		t.Fatalf("tick = %d, want claim 1", got)
	}
	feed(v, claim("c", 0, 1), at(3*s))
	if e, _, ok := v.recording(); !ok || e != 1 {
		t.Fatalf("c's claim is not the one being recorded")
	}
	failed := at(3*s + 50*time.Millisecond)
	v.giveUp(1, failed, true)
	feed(v, claim("c", 0, 1), failed) // a claim heartbeat sent before the failure
	for d := 100 * time.Millisecond; d < testTimeout; d += 500 * time.Millisecond {
		now := failed.Add(d)
		feed(v, follower("c", 0), now)
		if got := v.tick(now); got != 0 {
			t.Fatalf("claimed %d %v after a failed claim, want no claim within a timeout", got, d)
		}
	}
	// The log showed c stop claiming 100 ms after the failure: a timeout
	// after that, it claims again.
	now := failed.Add(100*time.Millisecond + testTimeout)
	feed(v, follower("c", 0), now)
	if got := v.tick(now); got != 1 {
		t.Fatalf("tick a timeout after the failure = %d, want claim 1 again", got)
	}
}

// A member that was paused (SIGSTOP, a long GC, a starved machine) reads,
// when it runs again, its own heartbeat made before the pause: received
// now, it says nothing of what the others wrote meanwhile. The recorded
// leader, whose heartbeats of the pause follow in the log, must not be
// judged gone on it: the member claims only on an own heartbeat made a
// timeout after the leader's last one was read.
func TestVoteResumedMemberDoesNotClaimOnItsOwnOldHeartbeat(t *testing.T) {
	t.Parallel()
	s, ms := time.Second, time.Millisecond
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	made := func(hb *Heartbeat, d time.Duration) *Heartbeat { hb.SentAtMs = at(d).UnixMilli(); return hb }
	v := newVote("d2", testInstance, testTimeout, t0)
	v.setRecord(*rec(3, "d1"))
	for d := time.Duration(0); d < 10*s; d += s { // a healthy cluster: d1 leads, d2 follows
		feed(v, made(leader("d1", 3), d), at(d))
		feed(v, made(follower("d2", 3), d+100*ms), at(d+100*ms))
		if got := v.tick(at(d + 100*ms)); got != 0 {
			t.Fatalf("tick at %v = %d with d1 leading, want no claim", d+100*ms, got)
		}
	}
	// d2 made a heartbeat at 9.95 s and was stopped before reading it; it
	// runs again at 12.9 s (d1's last heartbeat read: 9 s) and reads it.
	resumed := 12900 * ms
	feed(v, made(follower("d2", 3), 9950*ms), at(resumed))
	if got := v.tick(at(resumed)); got != 0 {
		t.Fatalf("tick on resuming = %d: claimed on an own heartbeat made before the pause, want no claim", got)
	}
	// The log holds what d1 wrote during the pause: d1 is live.
	for d := 10 * s; d < 13*s; d += s {
		feed(v, made(leader("d1", 3), d), at(resumed))
	}
	feed(v, made(follower("d2", 3), resumed), at(resumed+5*ms))
	if got := v.tick(at(resumed + 5*ms)); got != 0 {
		t.Fatalf("tick after reading d1's heartbeats = %d, want no claim", got)
	}
	// Had d1 written nothing, the same own heartbeat (made 3.9 s after
	// d1's last one was read) would let d2 claim.
	w := newVote("d2", testInstance, testTimeout, t0)
	w.setRecord(*rec(3, "d1"))
	for d := time.Duration(0); d < 10*s; d += s {
		feed(w, made(leader("d1", 3), d), at(d))
		feed(w, made(follower("d2", 3), d+100*ms), at(d+100*ms))
		w.tick(at(d + 100*ms))
	}
	feed(w, made(follower("d2", 3), 9950*ms), at(resumed))
	if got := w.tick(at(resumed)); got != 0 {
		t.Fatalf("tick on resuming = %d, want no claim before an own heartbeat made after the pause comes back", got)
	}
	if b, ok := w.barrier(at(resumed)); !ok || b.After(at(resumed)) {
		t.Fatalf("barrier = %v %v, want an own heartbeat asked for now", b, ok)
	}
	feed(w, made(follower("d2", 3), resumed), at(resumed+5*ms))
	if got := w.tick(at(resumed + 5*ms)); got != 4 {
		t.Fatalf("tick after an own heartbeat made after the pause = %d, want claim 4", got)
	}
}
