package dispatch

import (
	"math/rand/v2"
	"time"
)

// flight is one delivery waiting for its ack. It sits in three structures at
// once: the flight table by delivery id, the deadline list (dprev/dnext),
// and its client's list (prev/next), so that an ack, an expiry and a
// disconnect each find it without a scan and take it out in O(1).
type flight struct {
	id       uint64 // 0 while not in the table
	msg      *Message
	attempt  uint32
	client   *client
	deadline time.Time
	prev     *flight // its client's list
	next     *flight
	dprev    *flight // the deadline list
	dnext    *flight
}

// deadlineList holds the flights in deadline order, earliest first. It
// replaces a timer per message (one timer is armed for the first) and a
// heap: every deadline is set to now + the ack timeout, at a delivery or a
// touch, so each is at or after every deadline already in the list and
// goes at its end. push keeps the order even if the clock stepped back, by
// taking the last deadline instead: a flight then expires a little late,
// never early.
type deadlineList struct {
	first, last *flight
}

// push appends f, whose deadline is set, at the end.
func (l *deadlineList) push(f *flight) {
	f.dnext = nil
	f.dprev = l.last
	if l.last != nil {
		if f.deadline.Before(l.last.deadline) {
			f.deadline = l.last.deadline
		}
		l.last.dnext = f
	} else {
		l.first = f
	}
	l.last = f
}

// remove takes f out of the list.
func (l *deadlineList) remove(f *flight) {
	if f.dprev != nil {
		f.dprev.dnext = f.dnext
	} else {
		l.first = f.dnext
	}
	if f.dnext != nil {
		f.dnext.dprev = f.dprev
	} else {
		l.last = f.dprev
	}
	f.dprev, f.dnext = nil, nil
}

// reset gives f the deadline d and moves it to the end.
func (l *deadlineList) reset(f *flight, d time.Time) {
	l.remove(f)
	f.deadline = d
	l.push(f)
}

// peek returns the flight with the earliest deadline, or nil.
func (l *deadlineList) peek() *flight { return l.first }

// flightTable finds flights by delivery id without hashing. Ids come from
// one counter, so the deliveries handed to a client in one round get
// consecutive ids (which its acks name as a range); a flight sits at slot
// id mod len(slots). An id whose slot is taken, by a flight that waits long
// for its ack, is skipped, so an id names one delivery only and is never
// reused. The table is kept at most half full (it doubles when it would
// be more), so the skips cost O(1) per id on average. Freed flights are kept
// for reuse: a steady flow allocates nothing.
type flightTable struct {
	slots []*flight // a power of two long, or empty
	next  uint64    // the next id to hand out
	free  []*flight
	live  int // flights in the table
}

// minSlots is the table's first size.
const minSlots = 64

func newFlightTable() flightTable {
	// The ids start at random below 2^48 (7 bytes as a varint), so that
	// ids from another dispatcher (another leader, another run) are
	// unlikely to name one of ours.
	return flightTable{next: 1 + rand.Uint64N(1<<48)}
}

// take returns a flight, not yet in the table (no id).
func (t *flightTable) take() *flight {
	if n := len(t.free); n > 0 {
		f := t.free[n-1]
		t.free[n-1] = nil
		t.free = t.free[:n-1]
		return f
	}
	return new(flight)
}

// insert gives f the next free id and puts it in the table.
func (t *flightTable) insert(f *flight) {
	if 2*(t.live+1) > len(t.slots) {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	for {
		id := t.next
		t.next++
		if id == 0 {
			continue // never handed out
		}
		if s := &t.slots[id&mask]; *s == nil {
			*s = f
			f.id = id
			t.live++
			return
		}
	}
}

// grow doubles the table. Flights keep distinct slots: two ids with
// different low bits under the old mask differ under the new one too.
func (t *flightTable) grow() {
	slots := make([]*flight, max(minSlots, 2*len(t.slots)))
	mask := uint64(len(slots) - 1)
	for _, f := range t.slots {
		if f != nil {
			slots[f.id&mask] = f
		}
	}
	t.slots = slots
}

// get returns the live flight with id, or nil.
func (t *flightTable) get(id uint64) *flight {
	if len(t.slots) == 0 {
		return nil
	}
	if f := t.slots[id&uint64(len(t.slots)-1)]; f != nil && f.id == id {
		return f
	}
	return nil
}

// release takes f out of the table and keeps it for reuse: its id is
// unknown from now on.
func (t *flightTable) release(f *flight) {
	if f.id != 0 {
		t.slots[f.id&uint64(len(t.slots)-1)] = nil
		t.live--
	}
	*f = flight{}
	t.free = append(t.free, f)
}
