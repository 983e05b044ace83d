package dispatch

import (
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// What a commit stores of a partition besides its offset, with a store that
// keeps progress (offsets.ProgressStore): the tracker's acked runs and
// failure counts above the committable offset, the due time of each of the
// partition's messages waiting out a retry delay (in the delay heap, or in
// key order waiting for its key with a restored delay), and what the
// progress restored for the partition says of offsets not received yet
// (restore.go). The delays cost one pass over the heap per commit of
// partitions whose progress changed; a message that begins to wait marks
// its partition's progress changed (state.delay).

// progress returns what a commit stores of the partitions of parts (its
// keys).
func (s *state) progress(parts map[int32]int64) map[int32]offsets.Progress {
	prs := make(map[int32]*offsets.Progress, len(parts))
	for p := range parts {
		pr := s.tracker.Progress(p)
		prs[p] = &pr
	}
	s.addDelays(func(p int32) *offsets.Progress { return prs[p] })
	out := make(map[int32]offsets.Progress, len(prs))
	for p, pr := range prs {
		if o := s.parts[p]; o != nil && o.revoke != nil {
			// Taken out of the heap when the revocation began, and kept
			// for the next owner: every commit until the final one stores
			// them, or one made meanwhile would erase them.
			pr.Delayed = append(pr.Delayed, o.revoke.delays...)
		}
		if rs := s.restore[p]; rs != nil && rs.started {
			if from, ok := s.tracker.Receivable(p); ok {
				rs.carry(pr, from)
			}
		}
		pr.SortDelays()
		out[p] = *pr
	}
	return out
}

// addDelays appends to into(p), when not nil, the due time of each delayed
// message of partition p: in the delay heap, or with a restored delay to
// wait out once it holds its key.
func (s *state) addDelays(into func(p int32) *offsets.Progress) {
	add := func(m *Message, due time.Time) {
		if pr := into(m.Partition); pr != nil {
			pr.Delayed = append(pr.Delayed, offsets.Delay{Offset: m.Offset, NotBefore: offsets.NotBefore(due)})
		}
	}
	for _, d := range s.delays {
		add(d.msg, d.due)
	}
	if s.waits == 0 {
		return
	}
	found := 0
	visit := func(m *Message) {
		if m.wait != 0 {
			found++
			add(m, time.Unix(0, m.wait))
		}
	}
	for i := range s.fresh.len() {
		visit(s.fresh.at(i))
	}
	for i := range s.unblocked.len() {
		visit(s.unblocked.at(i))
	}
	for _, g := range s.keys {
		for m := g.holder.keyNext; m != nil; m = m.keyNext {
			visit(m)
		}
	}
	s.waits = found // messages dropped meanwhile left it too high
}
