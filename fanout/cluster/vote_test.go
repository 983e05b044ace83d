package cluster

import (
	"fmt"
	"testing"
	"time"
)

const testTimeout = 3 * time.Second

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// beat is a heartbeat of node id in epoch with role.
func beat(id string, epoch uint64, role Role) *Heartbeat {
	return &Heartbeat{NodeId: id, Addr: id + ":4000", Epoch: epoch, Role: role}
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

// step is one scripted event of a vote test: at the offset from t0, observe
// hbs (in log order), then, if tick, tick and compare the claim.
type step struct {
	at        time.Duration
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
	s := time.Second
	tests := []struct {
		name       string
		self       string
		floor      uint64
		steps      []step
		wantEpoch  uint64
		wantLeader string
		wantLive   bool // a live leader at the last step
	}{
		{
			name: "alone: waits out the grace, then claims epoch 1 and leads",
			self: "a",
			steps: []step{
				{at: 0, tick: true},
				{at: 2 * s, hbs: []*Heartbeat{follower("a", 0)}, tick: true},
				{at: 3 * s, tick: true, wantClaim: 1},
				{at: 3*s + 10*time.Millisecond, hbs: []*Heartbeat{claim("a", 0, 1)}, tick: true},
				{at: 4 * s, hbs: []*Heartbeat{leader("a", 1)}, tick: true},
			},
			wantEpoch: 1, wantLeader: "a", wantLive: true,
		},
		{
			name: "three nodes: the highest id c claims",
			self: "c",
			steps: concat(every(0, 3*s, hbs(follower("a", 0), follower("b", 0), follower("c", 0))),
				[]step{{at: 3 * s, tick: true, wantClaim: 1}}),
			wantEpoch: 0,
		},
		{
			name: "three nodes: b does not claim",
			self: "b",
			steps: concat(every(0, 3*s, hbs(follower("a", 0), follower("b", 0), follower("c", 0))),
				[]step{{at: 3 * s, tick: true}, {at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1)}, tick: true}}),
			wantEpoch: 1, wantLeader: "c", wantLive: true,
		},
		{
			name: "three nodes: a agrees on c",
			self: "a",
			steps: concat(every(0, 3*s, hbs(follower("a", 0), follower("b", 0), follower("c", 0))),
				[]step{{at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1)}, tick: true}}),
			wantEpoch: 1, wantLeader: "c", wantLive: true,
		},
		{
			name:      "simultaneous claims: the first in the log wins (seen by a)",
			self:      "a",
			steps:     []step{{at: 4 * s, hbs: []*Heartbeat{claim("b", 0, 1), claim("c", 0, 1)}, tick: true}},
			wantEpoch: 1, wantLeader: "b", wantLive: true,
		},
		{
			name:      "simultaneous claims: the first in the log wins (seen by the loser c)",
			self:      "c",
			steps:     []step{{at: 4 * s, hbs: []*Heartbeat{claim("b", 0, 1), claim("c", 0, 1)}, tick: true}},
			wantEpoch: 1, wantLeader: "b", wantLive: true,
		},
		{
			name: "leader c stops heartbeating: b claims after the timeout, not before",
			self: "b",
			steps: concat(
				[]step{{at: s, hbs: []*Heartbeat{claim("c", 0, 1)}}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				every(5*s, 9*s, hbs(follower("a", 1), follower("b", 1))),
				[]step{{at: 7*s - time.Millisecond, tick: true}, {at: 7 * s, tick: true, wantClaim: 2}}),
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name: "leader leaves: b claims at once",
			self: "b",
			steps: concat(
				[]step{{at: s, hbs: []*Heartbeat{claim("c", 0, 1)}}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				[]step{{at: 5 * s, hbs: []*Heartbeat{leaving(leader("c", 1))}, tick: true, wantClaim: 2}}),
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name: "leader leaves: a waits for b, the highest live member",
			self: "a",
			steps: concat(
				[]step{{at: s, hbs: []*Heartbeat{claim("c", 0, 1)}}},
				every(s, 5*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				[]step{{at: 5 * s, hbs: []*Heartbeat{leaving(leader("c", 1))}, tick: true}}),
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name: "late node z (highest id) learns the leader from leader heartbeats and does not claim",
			self: "z",
			steps: concat(
				every(0, 6*s, hbs(follower("a", 5), leader("c", 5))),
				[]step{{at: 6 * s, tick: true}}),
			wantEpoch: 5, wantLeader: "c", wantLive: true,
		},
		{
			name: "late node: a losing claim read first is overruled by the winner's leader heartbeat",
			self: "z",
			steps: concat(
				[]step{{at: 0, hbs: []*Heartbeat{claim("a", 4, 5)}}},
				every(0, 6*s, hbs(follower("a", 5), leader("c", 5))),
				[]step{{at: 6 * s, tick: true}}),
			wantEpoch: 5, wantLeader: "c", wantLive: true,
		},
		{
			name: "stale leader heartbeat (lower epoch) is ignored",
			self: "a",
			steps: []step{
				{at: s, hbs: []*Heartbeat{leader("c", 3)}},
				{at: 2 * s, hbs: []*Heartbeat{leader("b", 2), follower("c", 2)}, tick: true},
			},
			wantEpoch: 3, wantLeader: "c", wantLive: true,
		},
		{
			name: "leader c sees a higher epoch and steps down",
			self: "c",
			steps: []step{
				{at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1), leader("c", 1)}},
				{at: 4 * s, hbs: []*Heartbeat{claim("b", 1, 2)}, tick: true},
			},
			wantEpoch: 2, wantLeader: "b", wantLive: true,
		},
		{
			name: "claimer b dies before claiming: a claims one timeout after b falls silent",
			self: "a",
			steps: concat(
				[]step{{at: 0, hbs: []*Heartbeat{leader("c", 1)}}},
				every(0, 3*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				every(3*s, 6*s, hbs(follower("a", 1), follower("b", 1))), // c died at 2s; b dies at 5s
				every(6*s, 9*s, hbs(follower("a", 1))),
				[]step{
					{at: 5 * s, tick: true},                  // vacant since 5s (c last seen at 2s); b is live
					{at: 8*s - time.Millisecond, tick: true}, // b still counted live
					{at: 8 * s, tick: true, wantClaim: 2},
				}),
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name: "bully rule: a live but silent claimer b is passed over after another timeout",
			self: "a",
			steps: concat(
				[]step{{at: 0, hbs: []*Heartbeat{leader("c", 1)}}},
				every(0, 3*s, hbs(follower("a", 1), follower("b", 1), leader("c", 1))),
				every(3*s, 10*s, hbs(follower("a", 1), follower("b", 1))),
				[]step{
					{at: 5 * s, tick: true},
					{at: 8*s - time.Millisecond, tick: true},
					{at: 8 * s, tick: true, wantClaim: 2},
				}),
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name: "winner a whose CAS was void says follower in its epoch: b claims at once",
			self: "b",
			steps: concat(
				every(0, 4*s, hbs(follower("a", 0), follower("b", 0))),
				[]step{
					{at: 4 * s, hbs: []*Heartbeat{claim("a", 0, 1)}, tick: true},
					{at: 4*s + 100*time.Millisecond, hbs: []*Heartbeat{follower("a", 1)}, tick: true, wantClaim: 2},
				}),
			wantEpoch: 1, wantLeader: "a", wantLive: false,
		},
		{
			name: "leader c cut off: its own heartbeats stop, so it is no longer the live leader",
			self: "c",
			steps: []step{
				{at: 3 * s, hbs: []*Heartbeat{claim("c", 0, 1), leader("c", 1)}},
				{at: 4 * s, hbs: []*Heartbeat{leader("c", 1)}, tick: true},
				{at: 7*s - time.Millisecond, tick: true},
				{at: 7 * s, tick: true, wantClaim: 2},
			},
			wantEpoch: 1, wantLeader: "c", wantLive: false,
		},
		{
			name:      "a floor learnt from ZooKeeper raises the claim",
			self:      "a",
			floor:     7,
			steps:     []step{{at: 3 * s, tick: true, wantClaim: 8}},
			wantEpoch: 0,
		},
		{
			name: "a leaving member no longer outranks",
			self: "a",
			steps: concat(
				every(0, 3*s, hbs(follower("a", 0), follower("b", 0))),
				[]step{{at: 3 * s, hbs: []*Heartbeat{leaving(follower("b", 0))}, tick: true, wantClaim: 1}}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newVote(tc.self, testTimeout, t0)
			v.raiseFloor(tc.floor)
			// Steps are sorted by time for the run (stable: script order
			// within one instant).
			steps := sortSteps(tc.steps)
			var now time.Time
			for i, st := range steps {
				now = t0.Add(st.at)
				for _, hb := range st.hbs {
					v.observe(hb, now)
				}
				if st.tick {
					if got := v.tick(now); got != st.wantClaim {
						t.Fatalf("step %d (at %v): tick() = claim %d, want %d (epoch %d leader %q)",
							i, st.at, got, st.wantClaim, v.epoch, v.leader)
					}
				}
			}
			if v.epoch != tc.wantEpoch || v.leader != tc.wantLeader || v.leaderLive(now) != tc.wantLive {
				t.Errorf("end: epoch %d leader %q live %v, want epoch %d leader %q live %v",
					v.epoch, v.leader, v.leaderLive(now), tc.wantEpoch, tc.wantLeader, tc.wantLive)
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

func TestVoteAbdicate(t *testing.T) {
	v := newVote("c", testTimeout, t0)
	now := t0.Add(4 * time.Second)
	v.observe(claim("c", 0, 1), now)
	if !v.selfLeads(1, now) {
		t.Fatalf("c does not lead epoch 1 after its claim")
	}
	v.abdicate(1)
	v.observe(leader("c", 1), now) // an old heartbeat still in flight
	if v.selfLeads(1, now) {
		t.Errorf("c leads epoch 1 after abdicating")
	}
	if got := v.tick(now); got != 2 {
		t.Errorf("tick after abdicating = claim %d, want 2", got)
	}
}

// TestVoteSimulatedCluster runs three votes over one shared log with a
// fake clock: they elect the highest id, agree at every log position, and
// after the leader dies elect the next highest with epoch 2.
func TestVoteSimulatedCluster(t *testing.T) {
	ids := []string{"a", "b", "c"}
	votes := map[string]*vote{}
	read := map[string]int{} // log position each node has read
	alive := map[string]bool{}
	for _, id := range ids {
		votes[id] = newVote(id, testTimeout, t0)
		alive[id] = true
	}
	var log []*Heartbeat
	const tickEvery = 500 * time.Millisecond
	now := t0
	run := func(until time.Duration) {
		for ; now.Before(t0.Add(until)); now = now.Add(tickEvery) {
			for _, id := range ids { // each live node ticks and heartbeats
				if !alive[id] {
					continue
				}
				v := votes[id]
				c := v.tick(now)
				role := Role_ROLE_FOLLOWER
				if v.selfLeads(v.epoch, now) {
					role = Role_ROLE_LEADER
				}
				hb := beat(id, v.epoch, role)
				hb.ClaimEpoch = c
				log = append(log, hb)
			}
			for _, id := range ids { // then reads the log to its end
				if !alive[id] {
					continue
				}
				for ; read[id] < len(log); read[id]++ {
					votes[id].observe(log[read[id]], now)
				}
			}
			checkAgreement(t, votes, read, alive)
		}
	}
	run(5 * time.Second)
	for _, id := range ids {
		if v := votes[id]; v.epoch != 1 || v.leader != "c" || !v.leaderLive(now) {
			t.Fatalf("%s: epoch %d leader %q live %v, want c leading epoch 1", id, v.epoch, v.leader, v.leaderLive(now))
		}
	}
	alive["c"] = false
	died := now
	for !(votes["a"].leader == "b" && votes["b"].leader == "b" && votes["a"].epoch == 2 && votes["b"].epoch == 2) {
		if now.Sub(died) > 3*testTimeout {
			t.Fatalf("no new leader %v after c died: a: %d/%q, b: %d/%q", now.Sub(died),
				votes["a"].epoch, votes["a"].leader, votes["b"].epoch, votes["b"].leader)
		}
		run(now.Sub(t0) + tickEvery)
	}
	// c's last heartbeat is one tick before it died; detection is at tick
	// granularity, the claim is read one tick later.
	if took := now.Sub(died); took > testTimeout+2*tickEvery {
		t.Errorf("failover took %v, want at most LeaderTimeout + 2 ticks (%v)", took, testTimeout+2*tickEvery)
	}
}

// checkAgreement fails unless the live votes that have read the same log
// prefix hold the same (epoch, leader).
func checkAgreement(t *testing.T, votes map[string]*vote, read map[string]int, alive map[string]bool) {
	t.Helper()
	seen := map[int]string{}
	for id, v := range votes {
		if !alive[id] {
			continue
		}
		state := fmt.Sprintf("%d/%s", v.epoch, v.leader)
		if prev, ok := seen[read[id]]; ok && prev != state {
			t.Fatalf("disagreement at log position %d: %s vs %s (%s)", read[id], prev, state, id)
		}
		seen[read[id]] = state
	}
}
