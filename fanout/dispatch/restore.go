package dispatch

import "github.com/nanoservice/core-fanout/fanout/offsets"

// Progress restored after a restart or failover (Config.Progress). A commit
// stores, with each partition's offset, the offsets acked above it and the
// failure counts of the unacked messages (offsets.Progress). When the
// partition starts again at that offset, the messages the progress shows
// acked are taken as acked as they arrive (Stats.Skipped), not delivered
// again, and the others resume their failure counts, so that
// Config.MaxAttempts counts across failovers. A partition that starts
// elsewhere (its offset was changed by a tool, or went out of range) drops
// its progress: it would describe other offsets.

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

// restored applies rs to m, just received: it reports true when m was acked
// before (then it is acked now, not delivered), else it sets m's failure
// count.
func (s *state) restored(rs *restoring, m *Message) bool {
	if rs.AckedAt(m.Offset) {
		s.tracker.AckIn(m.Partition, m.Offset, m.gen)
		s.stats.Skipped++
		return true
	}
	if n := rs.FailuresAt(m.Offset); n > 0 {
		m.failed = n
		s.tracker.SetFailures(m.Partition, m.Offset, m.gen, n)
	}
	return false
}
