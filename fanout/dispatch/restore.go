package dispatch

import (
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Progress restored after a restart or failover (Config.Progress). A commit
// stores, with each partition's offset, the offsets acked above it, the
// failure counts of the unacked messages and the due times of those
// waiting out a retry delay (offsets.Progress; progress.go). When the
// partition starts again at that offset, the messages the progress shows
// acked are taken as acked as they arrive (Stats.Skipped), not delivered
// again, the others resume their failure counts, so that
// Config.MaxAttempts counts across failovers, and a message still due
// later waits until then before its first delivery (restoredDelay). A
// partition that starts elsewhere (its offset was changed by a tool, or
// went out of range) drops its progress: it would describe other offsets.
// Until its messages are past it, what the progress says of offsets not
// received yet is committed again with the partition's progress (carry),
// so that a second failover soon after the first loses none of it.

// restoring is the progress of one partition until its messages passed it.
type restoring struct {
	offsets.Progress
	started bool  // the partition's first Start was at Progress.Base
	last    int64 // the highest offset the progress says anything of
}

// newRestore indexes the loaded progress by partition.
func newRestore(progress map[int32]offsets.Progress) map[int32]*restoring {
	var out map[int32]*restoring
	for p, pr := range progress {
		if rs := newRestoring(pr); rs != nil {
			if out == nil {
				out = map[int32]*restoring{}
			}
			out[p] = rs
		}
	}
	return out
}

// newRestoring returns the restoring of pr, or nil when pr records nothing.
func newRestoring(pr offsets.Progress) *restoring {
	if pr.IsZero() {
		return nil
	}
	rs := &restoring{Progress: pr, last: pr.Base}
	if n := len(pr.Acked); n > 0 {
		rs.last = max(rs.last, pr.Acked[n-1].Last)
	}
	if n := len(pr.Failed); n > 0 {
		rs.last = max(rs.last, pr.Failed[n-1].Offset)
	}
	if n := len(pr.Delayed); n > 0 {
		rs.last = max(rs.last, pr.Delayed[n-1].Offset)
	}
	return rs
}

// addRestore sets the progress of partition p, assigned now (AssignedPartitions),
// replacing any it had.
func (s *state) addRestore(p int32, pr offsets.Progress) {
	s.forgetRestore(p)
	if rs := newRestoring(pr); rs != nil {
		if s.restore == nil {
			s.restore = map[int32]*restoring{}
		}
		s.restore[p] = rs
	}
}

// restoring returns the progress that applies to b's messages, or nil. The
// progress of a partition applies from its first Start, when that is at the
// progress' base, until its messages are past what it records.
func (s *state) restoring(b Batch) *restoring {
	rs := s.restore[b.Partition]
	if rs == nil {
		return nil
	}
	if b.Start >= 0 {
		if rs.started || b.Start != rs.Base {
			s.forgetRestore(b.Partition)
			return nil
		}
		rs.started = true
	}
	if !rs.started {
		return nil // messages before any Start: not from the stored offset
	}
	if n := len(b.Messages); n > 0 && b.Messages[0].Offset > rs.last {
		s.forgetRestore(b.Partition)
		return nil
	}
	return rs
}

func (s *state) forgetRestore(p int32) {
	delete(s.restore, p)
	if len(s.restore) == 0 {
		s.restore = nil
	}
}

// restored applies rs to m, just received at now: it reports true when m
// was acked before (then it is acked now, not delivered) or waits out a
// delay (restoredDelay); it sets m's failure count.
func (s *state) restored(rs *restoring, m *Message, now time.Time) bool {
	if rs.AckedAt(m.Offset) {
		s.tracker.AckIn(m.Partition, m.Offset, m.gen)
		s.stats.Skipped++
		if s.trace != nil {
			s.traceMessage(deliverylog.Skipped, m, 0, "")
		}
		return true
	}
	if n := rs.FailuresAt(m.Offset); n > 0 {
		m.failed = n
		s.tracker.SetFailures(m.Partition, m.Offset, m.gen, n)
	}
	return len(rs.Delayed) > 0 && s.restoredDelay(rs, m, now)
}

// restoredDelay makes m, just received, wait out the delay rs records for
// it, on this member's clock, cut to protocol.MaxNackDelay from now (a
// member whose clock is far behind the one that stored it cannot park the
// message; one whose clock is ahead delivers early by the difference). An
// unordered message goes to the delay heap at once, and restoredDelay
// reports true; in key order the message goes on as a fresh one and waits
// out its time once it holds its key (Message.wait), so that its key's
// order holds.
func (s *state) restoredDelay(rs *restoring, m *Message, now time.Time) bool {
	nb, ok := rs.DelayAt(m.Offset)
	if !ok {
		return false
	}
	wait := time.UnixMilli(nb).Sub(now)
	if wait <= 0 {
		return false
	}
	due := now.Add(min(wait, protocol.MaxNackDelay))
	if s.keys != nil && len(m.Key) > 0 {
		m.wait = due.UnixNano()
		s.waits++
		return false
	}
	if s.frameSize != nil {
		m.frame = s.frameSize(m)
	}
	s.bytes += m.Size()
	s.delay(m, 0, due)
	return true
}

// waitRestored puts m, taken to be delivered while it holds its key, in
// the delay heap when its restored delay (Message.wait) is not over, and
// reports whether it did.
func (s *state) waitRestored(m *Message, now time.Time) bool {
	left := time.Duration(m.wait - now.UnixNano())
	m.wait = 0
	if s.waits > 0 {
		s.waits--
	}
	if left <= 0 {
		return false
	}
	s.delay(m, 0, now.Add(left))
	return true
}

// carry adds to pr what rs records of the offsets from on (not received
// yet): acked ranges (cut at from), failure counts and delays.
func (rs *restoring) carry(pr *offsets.Progress, from int64) {
	for _, r := range rs.Acked {
		if r.Last >= from {
			pr.Acked = append(pr.Acked, offsets.Range{First: max(r.First, from), Last: r.Last})
		}
	}
	for _, f := range rs.Failed {
		if f.Offset >= from {
			pr.Failed = append(pr.Failed, f)
		}
	}
	for _, d := range rs.Delayed {
		if d.Offset >= from {
			pr.Delayed = append(pr.Delayed, d)
		}
	}
}
