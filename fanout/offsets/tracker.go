package offsets

// Tracker turns acks into committable offsets. For each partition it keeps
// the offsets received but not yet acked, in the order they were received
// (which is offset order, as Kafka delivers a partition in order). The
// committable offset of a partition is the next offset after its contiguous
// acked prefix: the lowest outstanding offset, or one past the last offset
// received when nothing is outstanding. With 104 unacked and 105 acked it is
// 104, never 106.
//
// Offsets need not be contiguous (compaction and transaction markers leave
// gaps); only the offsets actually received count.
//
// A Tracker is not safe for concurrent use: the dispatcher's goroutine owns it.
type Tracker struct {
	parts map[int32]*partition
}

type partition struct {
	// pending holds received offsets not yet past the acked prefix, oldest
	// first, as a ring over buf from head with n entries; acked marks the
	// entries that are acked but still behind an unacked one.
	buf   []entry
	head  int
	n     int
	next  int64  // committable offset when nothing is pending
	dirty bool   // committable offset changed since the last Dirty call
	last  int64  // committable offset reported by the last Dirty call
	gen   uint32 // counts Starts: offsets received before the last one are not acked by AckIn
}

type entry struct {
	offset int64
	acked  bool
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{parts: map[int32]*partition{}} }

// Start (re)starts partition p at offset: anything tracked for p is
// forgotten and offset becomes its committable offset.
func (t *Tracker) Start(p int32, offset int64) {
	pt := t.parts[p]
	if pt == nil {
		pt = &partition{last: -1}
		t.parts[p] = pt
	}
	pt.head, pt.n = 0, 0
	pt.next = offset
	pt.dirty = pt.last != offset
	pt.gen++
}

// Gen returns how many times partition p was started: offsets received
// since the last Start belong to that generation.
func (t *Tracker) Gen(p int32) uint32 {
	if pt := t.parts[p]; pt != nil {
		return pt.gen
	}
	return 0
}

// Received records that offset of partition p entered the daemon. Offsets of
// a partition must be received in increasing order; an offset at or below
// one already received (a re-fetch after a restart) is ignored and reported
// as false. A partition not started is started at offset.
func (t *Tracker) Received(p int32, offset int64) bool {
	pt := t.parts[p]
	if pt == nil {
		t.Start(p, offset)
		pt = t.parts[p]
	}
	if offset < pt.next || (pt.n > 0 && offset <= pt.at(pt.n-1).offset) {
		return false
	}
	if pt.n == len(pt.buf) {
		pt.grow()
	}
	*pt.at(pt.n) = entry{offset: offset}
	pt.n++
	return true
}

// Ack records that offset of partition p was processed. It reports false for
// an offset that is not outstanding (never received, already acked, or from
// before a Start).
func (t *Tracker) Ack(p int32, offset int64) bool { return t.AckIn(p, offset, t.Gen(p)) }

// AckIn is Ack for an offset received in generation gen (Gen at the time):
// after a restart of the partition at a lower offset the same offset can be
// received again, and an ack of the earlier one must not count for it.
func (t *Tracker) AckIn(p int32, offset int64, gen uint32) bool {
	pt := t.parts[p]
	if pt == nil || pt.n == 0 || pt.gen != gen {
		return false
	}
	// Binary search: pending offsets are increasing.
	lo, hi := 0, pt.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if pt.at(mid).offset < offset {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == pt.n {
		return false
	}
	e := pt.at(lo)
	if e.offset != offset || e.acked {
		return false
	}
	e.acked = true
	for pt.n > 0 && pt.at(0).acked {
		pt.next = pt.at(0).offset + 1
		pt.head = (pt.head + 1) & (len(pt.buf) - 1)
		pt.n--
		pt.dirty = true
	}
	return true
}

// Committable returns the committable offset of partition p, and false if p
// is not tracked.
func (t *Tracker) Committable(p int32) (int64, bool) {
	pt := t.parts[p]
	if pt == nil {
		return 0, false
	}
	return pt.committable(), true
}

// Outstanding returns how many received offsets of p are not yet behind the
// committable offset.
func (t *Tracker) Outstanding(p int32) int {
	if pt := t.parts[p]; pt != nil {
		return pt.n
	}
	return 0
}

// Dirty returns the committable offsets that changed since the last call, or
// nil when none did, and marks them reported.
func (t *Tracker) Dirty() map[int32]int64 {
	var out map[int32]int64
	for p, pt := range t.parts {
		if !pt.dirty {
			continue
		}
		pt.dirty = false
		c := pt.committable()
		if c == pt.last {
			continue
		}
		pt.last = c
		if out == nil {
			out = map[int32]int64{}
		}
		out[p] = c
	}
	return out
}

// All returns the committable offset of every tracked partition.
func (t *Tracker) All() map[int32]int64 {
	out := make(map[int32]int64, len(t.parts))
	for p, pt := range t.parts {
		out[p] = pt.committable()
	}
	return out
}

func (pt *partition) committable() int64 {
	if pt.n > 0 {
		return pt.at(0).offset
	}
	return pt.next
}

// at returns the i-th pending entry; len(buf) is a power of two.
func (pt *partition) at(i int) *entry { return &pt.buf[(pt.head+i)&(len(pt.buf)-1)] }

func (pt *partition) grow() {
	size := 2 * len(pt.buf)
	if size == 0 {
		size = 64
	}
	buf := make([]entry, size)
	for i := 0; i < pt.n; i++ {
		buf[i] = *pt.at(i)
	}
	pt.buf, pt.head = buf, 0
}

// Forget stops tracking partition p (it was handed over to another owner):
// what it held is dropped, and p is neither committable nor dirty until it
// is received or started again.
func (t *Tracker) Forget(p int32) { delete(t.parts, p) }
