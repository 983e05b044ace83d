package offsets

// Tracker turns acks into committable offsets. For each partition it keeps
// the offsets received but not yet acked, in the order they were received
// (which is offset order, as Kafka delivers a partition in order). The
// committable offset of a partition is the next offset after its contiguous
// acked prefix: the lowest outstanding offset, or the offset consumption
// goes on from when nothing is outstanding. With 104 unacked and 105 acked
// it is 104, never 106.
//
// Offsets need not be contiguous (compaction and transaction markers leave
// gaps); only the offsets actually received count.
//
// A partition may restart at another offset R (Start): the log was
// truncated, or retention passed it. Offsets at or above R are forgotten
// (they are fetched again, or gone), while outstanding offsets below R stay
// outstanding: those records were received and may still be acked, and the
// committable offset must not pass them. Every received offset belongs to
// the generation of the partition's last Start, and an ack counts only for
// the entry of its own generation (AckIn): after a restart below an offset,
// the same offset is received again as another record.
//
// A Tracker is not safe for concurrent use: the dispatcher's goroutine owns it.
type Tracker struct {
	// parts holds the partitions below maxDense by number (Kafka numbers
	// a topic's partitions from 0), sparse the others: finding a
	// partition costs an index, not a hash, on every receipt and ack.
	parts    []*partition
	sparse   map[int32]*partition
	progress bool // TrackProgress: Dirty reports progress changes too
}

// maxDense bounds the partition numbers kept in Tracker.parts.
const maxDense = 1 << 16

type partition struct {
	// pending holds received offsets not yet past the acked prefix, oldest
	// first, as a ring over buf from head with n entries; acked marks the
	// entries that are acked but still behind an unacked one.
	buf   []entry
	head  int
	n     int
	next  int64  // committable offset when nothing is pending
	dirty bool   // committable offset changed since the last report
	last  int64  // committable offset last reported (Dirty, Report)
	gen   uint32 // counts Starts: the generation of offsets received now
	// moved: with TrackProgress, the progress above the committable
	// offset changed since the last report (an ack, a failure).
	moved bool
	// arrivals: when the pending offsets arrived (arrivals.go).
	arrivals arrivals
}

type entry struct {
	offset int64
	gen    uint32 // the partition's generation when received
	acked  bool
	failed uint16 // failed deliveries (SetFailures), saturated
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{} }

// get returns partition p, or nil when it is not tracked.
func (t *Tracker) get(p int32) *partition {
	if uint32(p) < uint32(len(t.parts)) {
		return t.parts[p]
	}
	return t.sparse[p]
}

// add starts tracking p.
func (t *Tracker) add(p int32) *partition {
	pt := &partition{last: -1}
	if p >= 0 && p < maxDense {
		if int(p) >= len(t.parts) {
			t.parts = append(t.parts, make([]*partition, int(p)+1-len(t.parts))...)
		}
		t.parts[p] = pt
		return pt
	}
	if t.sparse == nil {
		t.sparse = map[int32]*partition{}
	}
	t.sparse[p] = pt
	return pt
}

// each calls fn for every tracked partition.
func (t *Tracker) each(fn func(p int32, pt *partition)) {
	for p, pt := range t.parts {
		if pt != nil {
			fn(int32(p), pt)
		}
	}
	for p, pt := range t.sparse {
		fn(p, pt)
	}
}

// TrackProgress makes Dirty report the partitions whose Progress changed
// too, for a store that keeps it (ProgressStore).
func (t *Tracker) TrackProgress() { t.progress = true }

// TracksProgress reports whether TrackProgress was called.
func (t *Tracker) TracksProgress() bool { return t.progress }

// Start (re)starts partition p at offset R: consumption goes on from R, in a
// new generation. Tracked offsets at or above R are forgotten; outstanding
// offsets below R stay outstanding and their acks (AckIn with their own
// generation) still count. The committable offset becomes the lowest of
// them, or R when there is none. Start returns how many outstanding offsets
// it forgot.
func (t *Tracker) Start(p int32, offset int64) int {
	pt := t.get(p)
	if pt == nil {
		pt = t.add(p)
	}
	forgot := 0
	for pt.n > 0 && pt.at(pt.n-1).offset >= offset {
		pt.n--
		forgot++
	}
	pt.arrivals.truncate(offset)
	pt.next = offset
	pt.gen++
	pt.dirty = pt.committable() != pt.last
	return forgot
}

// Gen returns the generation of partition p: how many times it was
// started. Offsets received now belong to it.
func (t *Tracker) Gen(p int32) uint32 {
	if pt := t.get(p); pt != nil {
		return pt.gen
	}
	return 0
}

// Received records that offset of partition p entered the daemon, in the
// partition's current generation. Offsets of a partition must be received
// in increasing order; an offset at or below one already received, or below
// the partition's start, is ignored and reported as false. A partition not
// started is started at offset.
func (t *Tracker) Received(p int32, offset int64) bool {
	pt := t.get(p)
	if pt == nil {
		t.Start(p, offset)
		pt = t.get(p)
	}
	if offset < pt.next || (pt.n > 0 && offset <= pt.at(pt.n-1).offset) {
		return false
	}
	if pt.n == len(pt.buf) {
		pt.grow()
	}
	*pt.at(pt.n) = entry{offset: offset, gen: pt.gen}
	pt.n++
	return true
}

// Ack records that offset of partition p, received in the current
// generation, was processed. See AckIn.
func (t *Tracker) Ack(p int32, offset int64) bool { return t.AckIn(p, offset, t.Gen(p)) }

// AckIn records that offset of partition p, received in generation gen (Gen
// at the time), was processed. It reports false for an offset that is not
// outstanding: never received, already acked, forgotten by a Start at or
// below it, or received again in another generation.
func (t *Tracker) AckIn(p int32, offset int64, gen uint32) bool {
	pt := t.get(p)
	if pt == nil {
		return false
	}
	i, ok := pt.find(offset, gen)
	if !ok {
		return false
	}
	e := pt.at(i)
	if e.acked {
		return false
	}
	e.acked = true
	pt.moved = t.progress
	for pt.n > 0 && pt.at(0).acked {
		// Beyond a restart point R the committable offset stays at R until
		// offsets received from there are outstanding.
		pt.next = max(pt.next, pt.at(0).offset+1)
		pt.head = (pt.head + 1) & (len(pt.buf) - 1)
		pt.n--
		pt.dirty = true
	}
	return true
}

// Pending reports whether offset of partition p, received in generation
// gen, is outstanding: received and neither acked nor forgotten.
func (t *Tracker) Pending(p int32, offset int64, gen uint32) bool {
	pt := t.get(p)
	if pt == nil {
		return false
	}
	i, ok := pt.find(offset, gen)
	return ok && !pt.at(i).acked
}

// Committable returns the committable offset of partition p, and false if p
// is not tracked.
func (t *Tracker) Committable(p int32) (int64, bool) {
	pt := t.get(p)
	if pt == nil {
		return 0, false
	}
	return pt.committable(), true
}

// Outstanding returns how many received offsets of p are not yet behind the
// committable offset: the entries the tracker holds for p.
func (t *Tracker) Outstanding(p int32) int {
	if pt := t.get(p); pt != nil {
		return pt.n
	}
	return 0
}

// OutstandingAll returns Outstanding of every tracked partition.
func (t *Tracker) OutstandingAll() map[int32]int {
	out := map[int32]int{}
	t.each(func(p int32, pt *partition) { out[p] = pt.n })
	return out
}

// SetFailures records that the outstanding offset of partition p, received
// in generation gen, failed n deliveries so far, for Progress. It reports
// false when the offset is not outstanding.
func (t *Tracker) SetFailures(p int32, offset int64, gen uint32, n uint32) bool {
	pt := t.get(p)
	if pt == nil {
		return false
	}
	i, ok := pt.find(offset, gen)
	if !ok || pt.at(i).acked {
		return false
	}
	pt.at(i).failed = uint16(min(n, 1<<16-1))
	pt.moved = t.progress
	return true
}

// MarkProgress records that the progress of partition p changed where the
// tracker does not see it (a message began to wait out a retry delay), so
// that Dirty reports p, with TrackProgress.
func (t *Tracker) MarkProgress(p int32) {
	if pt := t.get(p); pt != nil && t.progress {
		pt.moved = true
	}
}

// Progress returns what partition p holds above its committable offset: the
// runs of acked offsets (a run spans the received offsets between its ends,
// all acked) and the failure counts of the unacked ones. At most
// maxProgressRanges runs are returned, the lowest.
func (t *Tracker) Progress(p int32) Progress {
	pt := t.get(p)
	if pt == nil {
		return Progress{Base: -1}
	}
	pr := Progress{Base: pt.committable()}
	var run *Range
	for i := range pt.n {
		e := pt.at(i)
		switch {
		case !e.acked:
			run = nil
			if e.failed > 0 {
				pr.Failed = append(pr.Failed, Failure{Offset: e.offset, Count: uint32(e.failed)})
			}
		case run != nil:
			run.Last = e.offset
		case len(pr.Acked) < maxProgressRanges:
			pr.Acked = append(pr.Acked, Range{First: e.offset, Last: e.offset})
			run = &pr.Acked[len(pr.Acked)-1]
		}
	}
	return pr
}

// maxProgressRanges bounds the runs Progress collects: each takes at least
// four bytes encoded, so more would not fit MaxProgressBytes anyway.
const maxProgressRanges = MaxProgressBytes / 4

// Dirty returns the committable offsets that changed since they were last
// reported, with TrackProgress also those of the partitions whose progress
// changed, or nil when none did, and marks them reported.
func (t *Tracker) Dirty() map[int32]int64 {
	var out map[int32]int64
	t.each(func(p int32, pt *partition) {
		if !pt.dirty && !pt.moved {
			return
		}
		moved := pt.moved
		pt.dirty, pt.moved = false, false
		c := pt.committable()
		if c == pt.last && !moved {
			return
		}
		pt.last = c
		if out == nil {
			out = map[int32]int64{}
		}
		out[p] = c
	})
	return out
}

// Report returns the committable offset of partition p, and false if p is
// not tracked, and marks it reported, so that Dirty does not return it
// again until it changes.
func (t *Tracker) Report(p int32) (int64, bool) {
	pt := t.get(p)
	if pt == nil {
		return 0, false
	}
	pt.dirty, pt.moved = false, false
	pt.last = pt.committable()
	return pt.last, true
}

// All returns the committable offset of every tracked partition.
func (t *Tracker) All() map[int32]int64 {
	out := map[int32]int64{}
	t.each(func(p int32, pt *partition) { out[p] = pt.committable() })
	return out
}

func (pt *partition) committable() int64 {
	if pt.n > 0 {
		return pt.at(0).offset
	}
	return pt.next
}

// find returns the index of the pending entry of offset received in
// generation gen. Pending offsets are increasing, so a binary search finds
// the one entry of offset, whose generation must match. Offsets are mostly
// consecutive (gaps come from compaction and transaction markers), so the
// entry is first looked for where it would be without gaps.
func (pt *partition) find(offset int64, gen uint32) (int, bool) {
	if pt.n == 0 {
		return 0, false
	}
	if d := uint64(offset - pt.at(0).offset); d < uint64(pt.n) {
		if e := pt.at(int(d)); e.offset == offset {
			return int(d), e.gen == gen
		}
	}
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
		return 0, false
	}
	e := pt.at(lo)
	return lo, e.offset == offset && e.gen == gen
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
func (t *Tracker) Forget(p int32) {
	if uint32(p) < uint32(len(t.parts)) {
		t.parts[p] = nil
		return
	}
	delete(t.sparse, p)
}
