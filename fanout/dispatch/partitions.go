package dispatch

import (
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// This file is the state of AssignedPartitions (Config.Scope): a
// member that owns some partitions, each fenced on its own, serves only
// those, and partitions are assigned, revoked and dropped while it runs.

// owned is a partition the dispatcher serves under AssignedPartitions.
type owned struct {
	cond   offsets.Condition // the commits of the partition are made under it
	revoke *revocation       // non-nil while the partition is being revoked
}

// revocation is a partition being handed over: nothing of it is buffered or
// delivered any more; its deliveries in flight are awaited until deadline.
type revocation struct {
	deadline time.Time
	inFlight int // its deliveries still in flight
	dropped  int // its buffered messages dropped when it began
	returned int // its deliveries that came back meanwhile (nack, ack timeout, client gone): left to the next owner
	reply    chan<- revokeReply
	// delays are the due times of its messages that waited out a delay
	// when it began, or were nacked with one meanwhile: the final commit
	// stores them, for the next owner.
	delays []offsets.Delay
}

// revokeReply is what the dispatcher answers a Revoke with.
type revokeReply struct {
	Revoked
	final <-chan error // the outcome of the final commit; nil when there was none
	err   error
}

// Revoked is the outcome of Revoke.
type Revoked struct {
	// Offset is the partition's committable offset when it was revoked,
	// committed as its last commit when Committed.
	Offset    int64
	Committed bool
	// Unacked is the number of its deliveries still in flight at the
	// handoff timeout: they are dropped here (acks for them are unknown)
	// and come again from the next owner.
	Unacked int
	// Dropped is the number of its buffered messages dropped: the next
	// owner fetches them again.
	Dropped int
	// Returned is the number of its deliveries that came back while it was
	// being revoked (nacked, past their ack timeout, their client gone):
	// not queued again, the next owner delivers them.
	Returned int
}

// takes reports whether the state takes batches of partition p: in
// AssignedPartitions only the partitions assigned and not being revoked.
func (s *state) takes(p int32) bool {
	if s.parts == nil {
		return true
	}
	o := s.parts[p]
	return o != nil && o.revoke == nil
}

// assign adds partition p under cond, with the progress stored above its
// offset (restore.go). A partition assigned again (it was dropped, or came
// back after a revoke) starts afresh.
func (s *state) assign(p int32, cond offsets.Condition, prog offsets.Progress) {
	if o := s.parts[p]; o != nil {
		s.forget(p, "reassigned")
	}
	s.parts[p] = &owned{cond: cond}
	if s.tracker.TracksProgress() {
		s.addRestore(p, prog)
	}
}

// revokeStart begins the revocation of partition p: its buffered messages
// are dropped and its deliveries in flight awaited until deadline. When p is
// not assigned, or already being revoked, it answers reply with an error.
func (s *state) revokeStart(p int32, deadline time.Time, reply chan<- revokeReply) {
	o := s.parts[p]
	switch {
	case o == nil:
		reply <- revokeReply{err: errNotAssigned(p)}
		return
	case o.revoke != nil:
		reply <- revokeReply{err: errRevoking(p)}
		return
	}
	if s.trace != nil {
		s.tracePartition(deliverylog.Revoke, p, -1, "")
	}
	var delays offsets.Progress
	s.addDelays(func(q int32) *offsets.Progress {
		if q == p {
			return &delays
		}
		return nil
	})
	dropped := s.dropBuffered(p)
	n := 0
	for _, f := range s.flights.slots {
		if f != nil && f.msg.Partition == p {
			n++
		}
	}
	o.revoke = &revocation{deadline: deadline, inFlight: n, dropped: dropped, reply: reply, delays: delays.Delayed}
	s.revoking++
}

// revocations returns the partitions whose revocation can end at now (no
// delivery in flight, or the deadline passed), and the earliest deadline of
// the others (zero when none).
func (s *state) revocations(now time.Time) (ready []int32, next time.Time) {
	if s.revoking == 0 {
		return nil, time.Time{}
	}
	for p, o := range s.parts {
		r := o.revoke
		switch {
		case r == nil:
		case r.inFlight == 0 || !now.Before(r.deadline):
			ready = append(ready, p)
		case next.IsZero() || r.deadline.Before(next):
			next = r.deadline
		}
	}
	return ready, next
}

// revokeEnd ends the revocation of partition p: its deliveries still in
// flight are dropped, it is forgotten, and its committable offset is
// returned with the number of deliveries dropped (ok false when nothing of
// it was ever received) and its progress above the offset, for the final
// commit (the next owner skips what it shows acked, resumes the failure
// counts and waits out the delays).
func (s *state) revokeEnd(p int32) (o *owned, offset int64, tracked bool, unacked int, prog offsets.Progress) {
	o = s.parts[p]
	unacked = s.dropFlights(p, "revoked")
	offset, tracked = s.tracker.Committable(p)
	if s.trace != nil {
		committed := int64(-1)
		if tracked {
			committed = offset
		}
		s.tracePartition(deliverylog.Revoked, p, committed, "")
	}
	prog = s.progress(map[int32]int64{p: offset})[p] // with the delays the revocation holds
	s.tracker.Forget(p)
	s.forgetRestore(p)
	delete(s.parts, p)
	delete(s.held, p) // its source has stopped fetching it (Source.Remove)
	s.revoking--
	return o, offset, tracked, unacked, prog
}

// forget drops everything of partition p at once (it was lost, or is
// assigned again: why): buffered messages, deliveries in flight (their acks
// become unknown) and its offsets. A revocation under way is answered with
// an error.
func (s *state) forget(p int32, why string) {
	o := s.parts[p]
	if o == nil {
		return
	}
	if s.trace != nil {
		s.tracePartition(deliverylog.Lost, p, -1, why)
	}
	s.dropBuffered(p)
	s.dropFlights(p, why)
	s.tracker.Forget(p)
	s.forgetRestore(p)
	delete(s.parts, p)
	delete(s.held, p)
	if o.revoke != nil {
		s.revoking--
		o.revoke.reply <- revokeReply{err: errDropped(p)}
	}
}

// dropBuffered removes partition p's messages waiting for a client and
// returns how many it removed.
func (s *state) dropBuffered(p int32) int {
	return s.dropWaiting(func(m *Message) bool { return m.Partition == p })
}

// dropFlights ends partition p's deliveries in flight without requeueing
// them (their acks become unknown; why goes to the delivery log) and
// returns how many it ended.
func (s *state) dropFlights(p int32, why string) int {
	n := 0
	for _, f := range s.flights.slots {
		if f == nil || f.msg.Partition != p {
			continue
		}
		if s.trace != nil {
			s.traceFlight(deliverylog.Dropped, f, why)
		}
		s.deadlines.remove(f)
		c, m := f.client, f.msg
		s.unlink(f)
		s.recycle(f)
		if m.keyHash != 0 {
			s.keyDone(m) // its chain was dropped before: the gate goes
		}
		s.makeReady(c)
		n++
	}
	return n
}

// revoked reports whether partition p is being revoked: a delivery of it
// that comes back (nack, timeout, disconnect) is not queued again.
func (s *state) revoked(p int32) bool {
	o := s.parts[p]
	return o != nil && o.revoke != nil
}
