package offsets

import "time"

// Arrival times. The age of a partition's oldest pending message (received,
// not yet acked) is what an operator scales workers and alerts on beside
// the lag. The tracker knows that message's offset (the lowest pending
// one); when it arrived is kept per batch, not per offset: a mark says that
// the offsets received from its offset on, up to the next mark's, arrived
// at its time. The dispatcher marks once per batch (Arrived), so receiving
// and acking cost nothing more, and the marks a partition holds are at most
// its pending batches, dropped as the acked prefix passes them.

// mark is the arrival time (Unix ns) of the offsets received from offset on.
type mark struct {
	offset int64
	at     int64
}

// arrivals holds a partition's marks in offset order, oldest first: a ring
// over buf from head with n entries; len(buf) is a power of two.
type arrivals struct {
	buf  []mark
	head int
	n    int
}

func (a *arrivals) at(i int) *mark { return &a.buf[(a.head+i)&(len(a.buf)-1)] }

func (a *arrivals) push(m mark) {
	if a.n == len(a.buf) {
		size := max(2*len(a.buf), 8)
		buf := make([]mark, size)
		for i := range a.n {
			buf[i] = *a.at(i)
		}
		a.buf, a.head = buf, 0
	}
	*a.at(a.n) = m
	a.n++
}

// prune drops the marks that no pending offset needs: those before the
// last mark at or below low, the lowest pending offset.
func (a *arrivals) prune(low int64) {
	for a.n > 1 && a.at(1).offset <= low {
		a.head = (a.head + 1) & (len(a.buf) - 1)
		a.n--
	}
}

// truncate drops the marks at or above offset (a restart there forgets
// those offsets; they get marks again when received again).
func (a *arrivals) truncate(offset int64) {
	for a.n > 0 && a.at(a.n-1).offset >= offset {
		a.n--
	}
}

// Receivable returns the lowest offset of partition p that Received would
// take now: one past the last received, or where the partition starts when
// none is pending. It returns false when p is not tracked.
func (t *Tracker) Receivable(p int32) (int64, bool) {
	pt := t.get(p)
	if pt == nil {
		return 0, false
	}
	if pt.n > 0 {
		return max(pt.at(pt.n-1).offset+1, pt.next), true
	}
	return pt.next, true
}

// Arrived records that the offsets of partition p received from offset on
// arrived at when: the dispatcher calls it once per batch, after receiving
// the batch's offsets, with Receivable as it was before (or the batch's
// first offset, for a partition not yet tracked). A mark at the last mark's
// offset replaces its time (nothing was received under it); one below is
// ignored (offsets arrive in increasing order, and a restart below them
// has removed their marks, see Start).
func (t *Tracker) Arrived(p int32, offset int64, when time.Time) {
	pt := t.get(p)
	if pt == nil {
		return
	}
	a := &pt.arrivals
	switch {
	case a.n > 0 && a.at(a.n-1).offset == offset:
		a.at(a.n - 1).at = when.UnixNano()
	case a.n > 0 && a.at(a.n-1).offset > offset:
		return
	default:
		a.push(mark{offset: offset, at: when.UnixNano()})
	}
	if pt.n == 0 {
		a.n, a.head = 0, 0 // nothing pending: no mark is needed
		return
	}
	a.prune(pt.at(0).offset)
}

// OldestPending returns when the oldest pending offset of partition p (the
// lowest one received and not acked) arrived, and false when p has none
// pending, or none that arrived with a mark (Arrived).
func (t *Tracker) OldestPending(p int32) (time.Time, bool) {
	pt := t.get(p)
	if pt == nil {
		return time.Time{}, false
	}
	return pt.oldestPending()
}

// OldestPendingAll returns OldestPending of every tracked partition that has
// one.
func (t *Tracker) OldestPendingAll() map[int32]time.Time {
	out := map[int32]time.Time{}
	t.each(func(p int32, pt *partition) {
		if at, ok := pt.oldestPending(); ok {
			out[p] = at
		}
	})
	return out
}

func (pt *partition) oldestPending() (time.Time, bool) {
	a := &pt.arrivals
	if pt.n == 0 || a.n == 0 {
		return time.Time{}, false
	}
	low := pt.at(0).offset
	a.prune(low)
	if m := a.at(0); m.offset <= low {
		return time.Unix(0, m.at), true
	}
	return time.Time{}, false
}
