package dispatch

import (
	"fmt"
	"slices"
	"time"
)

// Stalled commits. A partition's committable offset waits for its lowest
// unacked message; normally that message is acked, or fails and is
// delivered again, within an ack timeout or so. A partition whose
// committable offset has not moved for Config.StallAfter while the tracker
// holds offsets of it is stalled: the dispatcher logs it once, with where
// that message is (in flight to which client, buffered, delayed, behind its
// key, going to the dead-letter topic, or nowhere: a message the tracker
// holds and the dispatcher does not, which would never be delivered),
// counts it in Stats.Stalled, and logs again when the offset moves. The
// check runs on the commit tick, once per tracked partition: nothing per
// message.

// stall is the watch of one partition's committable offset.
type stall struct {
	offset int64     // the committable offset last seen
	since  time.Time // when it was first seen at offset (with offsets held)
	logged bool      // reported stalled
}

// stallReport is a partition that became stalled (Moved false) or moved
// again after it was reported (Moved true).
type stallReport struct {
	Partition   int32
	Offset      int64         // the committable offset it stalled at
	For         time.Duration // how long it has not moved
	Outstanding int           // offsets the tracker holds of it
	Where       string        // where the message at Offset is (stalled only)
	Moved       bool
}

// checkStalls updates the watch of every tracked partition at now and
// returns the partitions that became stalled (their offset unmoved for
// after while offsets of them are held) or moved again after that.
func (s *state) checkStalls(now time.Time, after time.Duration) []stallReport {
	var out []stallReport
	for p, st := range s.stalls {
		if _, tracked := s.tracker.Committable(p); !tracked {
			delete(s.stalls, p) // forgotten: revoked or dropped
			if st.logged {
				out = append(out, stallReport{Partition: p, Offset: st.offset, For: now.Sub(st.since), Moved: true})
			}
		}
	}
	for p, n := range s.tracker.OutstandingAll() {
		c, _ := s.tracker.Committable(p)
		st := s.stalls[p]
		switch {
		case st != nil && n > 0 && st.offset == c:
			if !st.logged && now.Sub(st.since) >= after {
				st.logged = true
				out = append(out, stallReport{Partition: p, Offset: c, For: now.Sub(st.since), Outstanding: n, Where: s.whereIs(p, c)})
			}
			continue
		case st != nil && st.logged:
			out = append(out, stallReport{Partition: p, Offset: st.offset, For: now.Sub(st.since), Outstanding: n, Moved: true})
		}
		if n == 0 {
			delete(s.stalls, p)
			continue
		}
		if s.stalls == nil {
			s.stalls = map[int32]*stall{}
		}
		s.stalls[p] = &stall{offset: c, since: now}
	}
	if len(s.stalls) == 0 {
		s.stalls = nil
	}
	slices.SortFunc(out, func(a, b stallReport) int { return int(a.Partition) - int(b.Partition) })
	return out
}

// stalled returns, sorted, the partitions reported stalled and not moved
// since.
func (s *state) stalled() []int32 {
	var out []int32
	for p, st := range s.stalls {
		if st.logged {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// whereIs says where the message at offset of partition p is. It looks
// through the in-flight table and the buffers: only for a stalled
// partition, never per message.
func (s *state) whereIs(p int32, offset int64) string {
	is := func(m *Message) bool { return m != nil && m.Partition == p && m.Offset == offset }
	for _, f := range s.flights.slots {
		if f != nil && is(f.msg) {
			return fmt.Sprintf("in flight to client %q (id %d, attempt %d), its ack timeout at %s",
				f.client.name, f.client.id, f.attempt, f.deadline.Format(time.RFC3339Nano))
		}
	}
	for i := range s.retries.len() {
		if is(s.retries.at(i).msg) {
			return "buffered: waiting for a client, to be delivered again"
		}
	}
	for i := range s.fresh.len() {
		if is(s.fresh.at(i)) {
			return "buffered: waiting for a client"
		}
	}
	for i := range s.unblocked.len() {
		if is(s.unblocked.at(i)) {
			return "buffered: waiting for a client, its key's previous message done"
		}
	}
	for i := range s.large.len() {
		if is(s.large.at(i).msg) {
			return "buffered: waiting for a client that accepts its size"
		}
	}
	for _, d := range s.delays {
		if is(d.msg) {
			return "waiting out a retry delay until " + d.due.Format(time.RFC3339Nano)
		}
	}
	for _, g := range s.keys {
		for m := g.holder.keyNext; m != nil; m = m.keyNext {
			if is(m) {
				return "waiting behind an earlier message of its key"
			}
		}
	}
	if s.deadPending > 0 {
		return "not in flight nor buffered: going to the dead-letter topic, or lost by the dispatcher"
	}
	return "not in flight nor buffered: lost by the dispatcher, it will never be delivered (a bug)"
}
