package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// process is one process of a node in the tests of replays: its node id,
// its instance and the sequence number of its last heartbeat.
type process struct {
	id, instance string
	seq          uint64
}

// beat returns the next heartbeat of p, made when p had reached position
// seen of the log.
func (p *process) beat(role Role, epoch, claim uint64, seen int64) *Heartbeat {
	p.seq++
	return &Heartbeat{NodeId: p.id, Addr: p.id + ":4000", Instance: p.instance, Role: role, Epoch: epoch,
		ClaimEpoch: claim, Seq: p.seq, Seen: seen}
}

// simNode is a live process of a simulated cluster with its vote and how
// far it has read the log.
type simNode struct {
	process
	v       *vote
	read    int64  // the next offset to read
	end     int64  // the log's end when it started: its first heartbeat's position
	claim   uint64 // the claim of its last heartbeat
	term    uint64 // the epoch it recorded; it leads while the fence record holds it
	leaving bool   // its next heartbeat says it leaves, and it stops
}

// sim is a cluster of votes over one heartbeat log and one fence record,
// on a fake clock: every step each live process ticks, records its claim
// when it is the one being recorded, and publishes a heartbeat made at its
// read position; then each reads the fence record and the log to its end,
// ticking after each record as the Elector's loop does, and publishing at
// once a heartbeat whose claim changed.
type sim struct {
	t       *testing.T
	now     time.Time
	zk      record
	log     []*Heartbeat
	nodes   map[string]*simNode // the live process of each node id
	starts  int                 // processes started: instances are "<id>-<n>"
	claimed []string            // "<node>@<epoch>" of every claim a tick returned
}

const simStep = 500 * time.Millisecond

func newSim(t *testing.T) *sim {
	return &sim{t: t, now: t0, nodes: map[string]*simNode{}}
}

// start runs a new process of node id, reading the log from its start.
func (s *sim) start(id string) {
	s.starts++
	n := &simNode{process: process{id: id, instance: fmt.Sprintf("%s-%d", id, s.starts)}, end: int64(len(s.log))}
	n.v = newVote(id, n.instance, testTimeout, s.now)
	n.v.strict = true
	n.v.readFrom(0)
	s.nodes[id] = n
}

// crash stops node id's process without a word.
func (s *sim) crash(id string) { delete(s.nodes, id) }

// leave makes node id's process publish a leaving heartbeat at the next
// step and stop.
func (s *sim) leave(id string) { s.nodes[id].leaving = true }

// ids returns the live node ids in order.
func (s *sim) ids() []string {
	ids := make([]string, 0, len(s.nodes))
	for id := range s.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// step advances the clock by one step.
func (s *sim) step() {
	for _, id := range s.ids() {
		s.update(s.nodes[id], true)
	}
	for _, id := range s.ids() {
		s.readAll(s.nodes[id])
	}
	s.now = s.now.Add(simStep)
}

// update has n tick, record its claim when it is the one being recorded,
// and publish a heartbeat on a tick or when its claim changed.
func (s *sim) update(n *simNode, tick bool) {
	c := n.v.tick(s.now)
	if c != 0 {
		s.claimed = append(s.claimed, fmt.Sprintf("%s@%d", n.id, c))
	}
	if e, _, ok := n.v.recording(); ok && s.zk.Epoch < e {
		s.zk = record{Epoch: e, Node: n.id, Addr: n.id + ":4000", Version: s.zk.Version + 1} // the CAS
		n.term = e
	}
	role, epoch := Role_ROLE_FOLLOWER, n.v.highest
	switch {
	case n.term != 0 && s.zk.Epoch == n.term:
		role, epoch, c = Role_ROLE_LEADER, n.term, 0
	case c != 0:
		role = Role_ROLE_CANDIDATE
	}
	if !tick && c == n.claim {
		return
	}
	n.claim = c
	hb := n.beat(role, epoch, c, max(n.read, n.end))
	if n.leaving {
		hb.Leaving = true
		delete(s.nodes, n.id)
	}
	s.log = append(s.log, hb)
}

// readAll has n read the fence record and the log to its end, updating
// after each record.
func (s *sim) readAll(n *simNode) {
	n.v.setRecord(s.zk)
	for n.read < int64(len(s.log)) && s.nodes[n.id] == n {
		n.read++
		n.v.observe(s.log[n.read-1], n.read-1, s.now)
		s.update(n, false)
	}
}

// run steps for d.
func (s *sim) run(d time.Duration) {
	for end := s.now.Add(d); s.now.Before(end); {
		s.step()
	}
}

// until steps until cond holds, failing the test after limit.
func (s *sim) until(limit time.Duration, what string, cond func() bool) {
	s.t.Helper()
	for end := s.now.Add(limit); !cond(); s.step() {
		if !s.now.Before(end) {
			s.t.Fatalf("%v of simulated time without %s: fence record %v", limit, what, s.zk)
		}
	}
}

// replay appends copies of recs to the log, as they are.
func (s *sim) replay(recs []*Heartbeat) { s.log = append(s.log, recs...) }

// of returns the heartbeats of node id in recs, its leaving ones left out.
func of(recs []*Heartbeat, id string) []*Heartbeat {
	var out []*Heartbeat
	for _, hb := range recs {
		if hb.NodeId == id && !hb.Leaving {
			out = append(out, hb)
		}
	}
	return out
}

// unmoved steps for three timeouts and fails the test when the fence
// record changes, any process claims, or a follower sees no live leader.
func (s *sim) unmoved(what string) {
	s.t.Helper()
	rec, claims := s.zk, len(s.claimed)
	for end := s.now.Add(3 * testTimeout); s.now.Before(end); {
		s.step()
		if s.zk != rec {
			s.t.Fatalf("after %s the fence record moved from %v to %v (claims %v)", what, rec, s.zk, s.claimed[claims:])
		}
		if len(s.claimed) > claims {
			s.t.Fatalf("after %s claims while %s leads: %v", what, rec.Node, s.claimed[claims:])
		}
		for _, id := range s.ids() {
			if !s.nodes[id].v.leaderLive(s.now) {
				s.t.Fatalf("after %s %s sees no live leader (%s leads)", what, id, rec.Node)
			}
		}
	}
}

// The leader c ran once before and left. The recorded log appended again,
// c's earlier run through its leaving heartbeat or all of it, moves
// nothing: nobody claims, everybody sees c live, the fence record stays;
// and when c dies afterwards, the next member leads the next epoch.
func TestVoteReplayedLogMovesNoLeader(t *testing.T) {
	t.Parallel()
	s := newSim(t)
	s.start("c")
	s.until(10*time.Second, "c leading alone", func() bool { return s.zk.Node == "c" && s.zk.Epoch == 1 })
	s.run(2 * time.Second)
	s.leave("c")
	s.step()
	earlier := slices.Clone(s.log) // c's first run, through its leaving heartbeat
	for _, id := range []string{"a", "b", "c"} {
		s.start(id)
	}
	s.until(20*time.Second, "c leading again", func() bool { return s.zk.Node == "c" && s.zk.Epoch == 2 })
	s.run(3 * time.Second)
	s.claimed = nil

	s.replay(earlier)
	s.unmoved("c's earlier run replayed")
	s.replay(slices.Clone(s.log))
	s.unmoved("the whole log replayed")

	s.crash("c")
	s.until(3*testTimeout, "b leading epoch 3", func() bool { return s.zk.Node == "b" && s.zk.Epoch == 3 })
}

// A departed member's heartbeats appended again make it live for nobody,
// whether it left with a leaving heartbeat or crashed, before the others
// forget it and after.
func TestVoteReplayedDepartedMemberStaysGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		depart func(s *sim)
	}{
		{"left", func(s *sim) { s.leave("a") }},
		{"crashed", func(s *sim) { s.crash("a") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			for _, id := range []string{"a", "b", "c", "d"} {
				s.start(id)
			}
			s.until(20*time.Second, "d leading", func() bool { return s.zk.Node == "d" })
			s.run(2 * time.Second)
			tc.depart(s)
			s.run(testTimeout + simStep) // nobody sees a live any more
			gone := of(s.log, "a")
			replay := func(when string) {
				t.Helper()
				s.replay(gone)
				replayed := s.now
				for end := s.now.Add(testTimeout); s.now.Before(end); {
					s.step()
					for _, id := range s.ids() {
						v := s.nodes[id].v
						if v.live("a", s.now) {
							t.Fatalf("%s sees the departed a live after a replay of its %d heartbeats %s", id, len(gone), when)
						}
						for _, m := range v.view(s.now) { // a crashed member is shown for two timeouts
							if m.id == "a" && !m.lastSeen.Before(replayed) {
								t.Fatalf("%s shows the departed a as heard from after a replay %s: %+v", id, when, m)
							}
						}
					}
				}
			}
			replay("before it is forgotten")
			s.run(testTimeout / 2) // members are forgotten two timeouts after their last record, checked every half timeout
			for _, id := range s.ids() {
				if m := s.nodes[id].v.members["a"]; m != nil {
					t.Fatalf("%s still keeps a at %v, after its last record at %v: %+v", id, s.now.Sub(t0), m.lastSeen.Sub(t0), *m)
				}
			}
			replay("after it was forgotten")
			replay("once more")
		})
	}
}

// A node that restarts is heard at once: its new instance's first record
// was made after the old one's last record was appended. The old
// instance's records, late or replayed, are ignored; so are copies of the
// new instance's own records, which change none of its state.
func TestVoteInstancesOfOneNode(t *testing.T) {
	t.Parallel()
	v := newVote("a", "a-1", testTimeout, t0)
	v.strict = true
	v.setRecord(*rec(4, "x"))
	x1, x2 := &process{id: "x", instance: "x-1"}, &process{id: "x", instance: "x-2"}
	var log []*Heartbeat
	at := func(off int) time.Time { return t0.Add(time.Duration(off) * 100 * time.Millisecond) }
	read := func(hb *Heartbeat) verdict {
		log = append(log, hb)
		return v.observe(hb, int64(len(log)-1), at(len(log)-1))
	}
	for range 3 {
		if got := read(x1.beat(Role_ROLE_LEADER, 4, 0, int64(len(log)))); got != observed {
			t.Fatalf("x-1's heartbeat: %v, want observed", got)
		}
	}
	late := x1.beat(Role_ROLE_LEADER, 4, 0, int64(len(log))) // made, appended only after x-2's first
	if got := read(x2.beat(Role_ROLE_FOLLOWER, 4, 0, int64(len(log)))); got != observed {
		t.Fatalf("the first heartbeat of x's new instance: %v, want observed", got)
	}
	if m := v.members["x"]; m.instance != "x-2" || m.role != Role_ROLE_FOLLOWER {
		t.Fatalf("x is %+v, want its instance x-2, following", *m)
	}
	if got := read(late); got != stale {
		t.Errorf("x-1's late heartbeat: %v, want stale", got)
	}
	for i, hb := range slices.Clone(log[:3]) {
		if got := read(hb); got != stale {
			t.Errorf("x-1's heartbeat %d replayed: %v, want stale", i, got)
		}
	}
	candidate := x2.beat(Role_ROLE_CANDIDATE, 4, 5, int64(len(log)))
	read(candidate)
	read(x2.beat(Role_ROLE_FOLLOWER, 4, 0, int64(len(log))))
	before := *v.members["x"]
	for _, hb := range []*Heartbeat{candidate, log[3]} {
		if got := read(hb); got != stale {
			t.Errorf("x-2's heartbeat %d replayed: %v, want stale", hb.Seq, got)
		}
	}
	if m := *v.members["x"]; m != before {
		t.Errorf("replays of x-2's own heartbeats changed it: %+v, was %+v", m, before)
	}
	if v.pend.node == "x" {
		t.Errorf("x's replayed claim is pending: %+v", v.pend)
	}
}

// The members map stays bounded: forged node ids beyond maxMembers are
// ignored while members kept are heard as before; members not heard from
// for two timeouts are forgotten at a tick, and new node ids are heard
// again.
func TestVoteMembersBounded(t *testing.T) {
	t.Parallel()
	v := newVote("a", testInstance, testTimeout, t0)
	v.setRecord(*rec(1, "b"))
	off := int64(0)
	read := func(hb *Heartbeat, at time.Time) verdict {
		off++
		return v.observe(hb, off, at)
	}
	read(leader("b", 1), t0)
	for i := range maxMembers + 100 {
		want := observed
		if i >= maxMembers-1 { // b and maxMembers-1 forged ones are kept
			want = crowded
		}
		if got := read(follower(fmt.Sprintf("forged-%04d", i), 1), t0.Add(time.Second)); got != want {
			t.Fatalf("forged node id %d of %d: %v, want %v", i, maxMembers+100, got, want)
		}
	}
	if len(v.members) != maxMembers {
		t.Fatalf("%d members kept, want %d", len(v.members), maxMembers)
	}
	if got := read(leader("b", 1), t0.Add(2*time.Second)); got != observed || !v.leaderLive(t0.Add(2*time.Second)) {
		t.Fatalf("the leader's heartbeat while the map is full: %v, leader live %v", got, v.leaderLive(t0.Add(2*time.Second)))
	}
	now := t0.Add(time.Second + v.retention())
	read(leader("b", 1), now)
	v.tick(now)
	if len(v.members) != 1 || v.members["b"] == nil {
		t.Fatalf("%d members kept two timeouts after the forged ones, want only b", len(v.members))
	}
	if got := read(follower("c", 1), now); got != observed {
		t.Fatalf("a new member after the forged ones were forgotten: %v, want observed", got)
	}
}

// With the cluster secret a heartbeat without a sequence number is ignored
// (it would leave replays open); without it, it is taken as before, the
// last one read of a node winning.
func TestVoteHeartbeatsWithoutSequence(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{true, false} {
		v := newVote("a", testInstance, testTimeout, t0)
		v.strict = strict
		v.setRecord(*rec(1, "b"))
		got := v.observe(leader("b", 1), 5, t0)
		switch {
		case strict && got != unbound:
			t.Errorf("strict: %v, want unbound", got)
		case !strict && (got != observed || !v.leaderLive(t0)):
			t.Errorf("not strict: %v (leader live %v), want observed", got, v.leaderLive(t0))
		}
		if !strict {
			if got := v.observe(leaving(leader("b", 1)), 6, t0); got != observed || v.leaderLive(t0) {
				t.Errorf("not strict: a leaving heartbeat: %v, leader live %v", got, v.leaderLive(t0))
			}
		}
	}
}

// This node's earlier incarnation, or a copy of its records, is not
// another live process with its node id; a process whose heartbeat was
// made after this one's last was appended is.
func TestVoteOwnEarlierIncarnationIsNoDuplicate(t *testing.T) {
	t.Parallel()
	v := newVote("c", "c-2", testTimeout, t0)
	v.strict = true
	v.setRecord(*rec(1, "c"))
	c1, c2, other := &process{id: "c", instance: "c-1"}, &process{id: "c", instance: "c-2"}, &process{id: "c", instance: "c-3"}
	early := c1.beat(Role_ROLE_LEADER, 1, 0, 0)
	if got := v.observe(early, 0, t0); got != observed {
		t.Fatalf("the earlier incarnation before this one's first heartbeat: %v, want observed (not folded)", got)
	}
	v.observe(c2.beat(Role_ROLE_FOLLOWER, 1, 0, 1), 1, t0)
	if got := v.observe(early, 2, t0); got != stale || v.duplicated(t0) {
		t.Fatalf("a replay of the earlier incarnation: %v (duplicated %v), want stale", got, v.duplicated(t0))
	}
	if got := v.observe(other.beat(Role_ROLE_FOLLOWER, 1, 0, 2), 3, t0); got != duplicate || !v.duplicated(t0) {
		t.Fatalf("another live process: %v (duplicated %v), want duplicate", got, v.duplicated(t0))
	}
}

// Reading that resumes elsewhere (the topic recreated: offsets start over)
// judges from there: the members' new heartbeats are taken, and a record
// that names a position beyond its own offset (made for the old log) is
// not.
func TestVoteReadFromAfterTheLogBeganAgain(t *testing.T) {
	t.Parallel()
	v := newVote("a", "a-1", testTimeout, t0)
	v.strict = true
	v.setRecord(*rec(1, "b"))
	b := &process{id: "b", instance: "b-1"}
	v.observe(b.beat(Role_ROLE_LEADER, 1, 0, 900), 1000, t0)
	old := b.beat(Role_ROLE_LEADER, 1, 0, 1000)
	v.readFrom(0)
	if got := v.observe(old, 1, t0); got != stale {
		t.Errorf("a record of the old log (seen 1000) at offset 1: %v, want stale", got)
	}
	b2 := &process{id: "b", instance: "b-2"}
	if got := v.observe(b2.beat(Role_ROLE_LEADER, 1, 0, 0), 2, t0.Add(time.Second)); got != observed {
		t.Errorf("b's new instance in the new log: %v, want observed", got)
	}
	if !v.leaderLive(t0.Add(time.Second)) {
		t.Error("b not live after its heartbeat in the new log")
	}
}

// genProc is a process of a generated history: it makes records at its
// read position, which never goes back and starts at the log's end when it
// started.
type genProc struct {
	process
	pos int64 // its read position
}

// TestVoteNoCopyIsEverTaken generates histories of a few nodes that
// restart (with or without a leaving heartbeat, a last record now and then
// appended late, silences that make members forgotten), then appends copies
// of earlier records in any order among new genuine ones: no copy is ever
// taken, whatever the vote's state.
func TestVoteNoCopyIsEverTaken(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	ids := []string{"a", "b", "c", "d", "e"} // a is the vote's own node; it never restarts
	verdicts := map[verdict]int{}            // of the genuine records, made on time
	for trial := range 300 {
		v := newVote("a", "a-0", testTimeout, t0)
		v.strict = true
		var log []*Heartbeat
		now := t0
		procs := map[string]*genProc{}
		starts := 0
		start := func(id string) {
			starts++
			inst := fmt.Sprintf("%s-%d", id, starts)
			if id == "a" {
				inst = "a-0"
			}
			procs[id] = &genProc{process: process{id: id, instance: inst}, pos: int64(len(log))}
		}
		var late []*Heartbeat // made by a process that stopped, appended later
		appendRec := func(hb *Heartbeat) verdict {
			log = append(log, hb)
			now = now.Add(time.Duration(r.IntN(300)) * time.Millisecond)
			if r.IntN(40) == 0 {
				now = now.Add(v.retention() + time.Second) // a silence: members are forgotten
			}
			got := v.observe(hb, int64(len(log)-1), now)
			v.tick(now)
			return got
		}
		genuine := func() {
			id := ids[r.IntN(len(ids))]
			p := procs[id]
			if p == nil {
				start(id)
				return
			}
			p.pos = max(p.pos, int64(len(log))-int64(r.IntN(3)))
			hb := p.beat(Role_ROLE_FOLLOWER, 0, 0, p.pos)
			switch k := r.IntN(20); {
			case id == "a":
			case k == 0:
				hb.Leaving = true
				delete(procs, id)
			case k == 1:
				late = append(late, hb) // made, then the process died: appended later
				delete(procs, id)
				return
			}
			verdicts[appendRec(hb)]++
		}
		for range 200 {
			genuine()
			if len(late) > 0 && r.IntN(4) == 0 {
				appendRec(late[0])
				late = late[1:]
			}
		}
		recorded := slices.Clone(log)
		for range 400 {
			if r.IntN(3) == 0 {
				genuine()
				continue
			}
			i := r.IntN(len(recorded))
			if got := appendRec(recorded[i]); got == observed || got == duplicate {
				hb := recorded[i]
				t.Fatalf("trial %d: a copy of record %d (%s instance %s seq %d seen %d) was taken: %v",
					trial, i, hb.NodeId, hb.Instance, hb.Seq, hb.Seen, got)
			}
		}
	}
	// Genuine records are taken, but for the first of a restarted node's
	// new instance at times (made before the old one's last record was
	// appended) and those read after a silence made before it.
	t.Logf("genuine records: %v", verdicts)
	if total := verdicts[observed] + verdicts[stale]; verdicts[observed] < total*9/10 {
		t.Errorf("of %d genuine records %d were taken, want nearly all: %v", total, verdicts[observed], verdicts)
	}
}
