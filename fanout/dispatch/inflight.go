package dispatch

import "time"

// flight is one delivery waiting for its ack. It sits in three structures at
// once: the dispatcher's map by delivery id, the deadline heap (index), and
// its client's list (prev/next), so that an ack, an expiry and a disconnect
// each find it without a scan.
type flight struct {
	id       uint64
	msg      *Message
	attempt  uint32
	client   *client
	deadline time.Time
	index    int // position in the deadline heap
	prev     *flight
	next     *flight
}

// deadlineHeap is a min-heap of flights by deadline. Each flight stores its
// index so that removal and deadline changes cost O(log n). It replaces a
// timer per message: one timer is armed for the root.
type deadlineHeap []*flight

func (h deadlineHeap) less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }

func (h deadlineHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *deadlineHeap) push(f *flight) {
	f.index = len(*h)
	*h = append(*h, f)
	h.up(f.index)
}

// remove takes f out of the heap.
func (h *deadlineHeap) remove(f *flight) {
	i := f.index
	last := len(*h) - 1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	f.index = -1
}

// fix restores the heap after f's deadline changed.
func (h deadlineHeap) fix(f *flight) {
	if !h.down(f.index) {
		h.up(f.index)
	}
}

// peek returns the flight with the earliest deadline, or nil.
func (h deadlineHeap) peek() *flight {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

func (h deadlineHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h deadlineHeap) down(i0 int) bool {
	i, n := i0, len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
