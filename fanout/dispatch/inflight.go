package dispatch

import (
	"math/rand/v2"
	"time"
)

// flight is one delivery waiting for its ack. It sits in three structures at
// once: the flight table by delivery id, the deadline heap (index), and its
// client's list (prev/next), so that an ack, an expiry and a disconnect each
// find it without a scan.
type flight struct {
	id       uint64 // generation << 32 | slot; 0 while free
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

// flightTable finds flights by delivery id without hashing: an id is the
// flight's slot in the table and a generation that changes each time the
// slot is reused, so an id names one delivery only. Freed flights are kept
// for reuse: a steady flow allocates nothing.
type flightTable struct {
	slots []*flight
	gens  []uint32 // generation of each slot's next id
	free  []uint32 // free slots
	live  int      // flights in use
}

func newFlightTable() flightTable { return flightTable{} }

// take returns a free flight with a fresh id.
func (t *flightTable) take() *flight {
	var slot uint32
	if n := len(t.free); n > 0 {
		slot, t.free = t.free[n-1], t.free[:n-1]
	} else {
		slot = uint32(len(t.slots))
		t.slots = append(t.slots, new(flight))
		// Generations start at random, so that ids from another dispatcher
		// (another leader, another run) are unlikely to name one of ours.
		t.gens = append(t.gens, rand.Uint32()|1)
	}
	f := t.slots[slot]
	gen := t.gens[slot]
	t.gens[slot] = gen + 1
	if t.gens[slot] == 0 {
		t.gens[slot] = 1 // id 0 is never used
	}
	*f = flight{id: uint64(gen)<<32 | uint64(slot), index: -1}
	t.live++
	return f
}

// get returns the live flight with id, or nil.
func (t *flightTable) get(id uint64) *flight {
	slot := uint32(id)
	if int(slot) >= len(t.slots) {
		return nil
	}
	if f := t.slots[slot]; f.id == id && id != 0 {
		return f
	}
	return nil
}

// release frees f: its id is unknown from now on.
func (t *flightTable) release(f *flight) {
	slot := uint32(f.id)
	*f = flight{index: -1}
	t.free = append(t.free, slot)
	t.live--
}
