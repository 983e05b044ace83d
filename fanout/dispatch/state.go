package dispatch

import (
	"slices"
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Redelivery reasons, as indexes of Stats.Redelivered.
const (
	RedeliverTimeout    = iota // no ack within the ack timeout
	RedeliverDisconnect        // the client left with the message unacked
	RedeliverNack              // the client gave the message back
	numRedeliverReasons
)

// RedeliverReasons names the redelivery reasons for logs and metrics.
var RedeliverReasons = [numRedeliverReasons]string{"timeout", "disconnect", "nack"}

// Stats is a snapshot of the dispatcher's counters and gauges.
type Stats struct {
	Consumed    uint64                      // messages taken from the source
	Delivered   uint64                      // deliveries sent, first attempts and redeliveries
	Acked       uint64                      // deliveries acked
	Nacked      uint64                      // deliveries nacked
	Redelivered [numRedeliverReasons]uint64 // messages queued again, by reason
	UnknownAcks uint64                      // acks, nacks and touches naming no outstanding delivery of the client
	InFlight    int                         // deliveries waiting for an ack
	Buffered    int                         // messages waiting for a client
	BufferBytes int                         // payload bytes of the buffered messages
	Clients     int                         // clients joined
	Paused      bool                        // fetching is paused
	// Outstanding is, per partition, the offsets the tracker holds:
	// received and not yet behind the committable offset.
	Outstanding map[int32]int
	// Held lists, sorted, the partitions whose fetching is paused because
	// they hold more than Config.MaxOutstanding offsets.
	Held []int32
	// TooLarge is the number of buffered messages larger than any joined
	// client accepts (LimitedSink): they wait for a client that takes them.
	TooLarge int

	// Committed is the next offset to consume per partition as the store
	// holds it, as far as this dispatcher knows: Config.Stored, updated by
	// every successful commit.
	Committed          map[int32]int64
	CommitFailures     uint64    // offset commits that failed
	CommitFailingSince time.Time // first failed commit since the last success; zero after a success
}

// client is the dispatcher's view of one connection.
type client struct {
	id      uint64
	name    string
	sink    ClientSink
	max     int     // in-flight limit
	maxSize int     // largest frame it accepts (LimitedSink); 0 means any
	n       int     // deliveries in flight
	first   *flight // oldest of its flights; a doubly linked list
	last    *flight
	inReady bool       // queued in state.ready
	gone    bool       // left; dropped lazily from state.ready
	out     []Delivery // deliveries of the current dispatch round
	touched bool       // in state.touched this round
}

func (c *client) hasRoom() bool { return !c.gone && c.n < c.max }

// fits reports whether c accepts m's frame size.
func (c *client) fits(m *Message) bool { return c.maxSize == 0 || m.frame <= c.maxSize }

// retry is a message waiting to be delivered again.
type retry struct {
	msg     *Message
	attempt uint32 // the attempt number of the next delivery
	last    uint64 // the client that had it, to prefer another one
}

// state is the dispatcher's data. It is not safe for concurrent use: only
// the dispatcher's goroutine touches it, which keeps every step a plain
// function call that tests drive directly with a fake clock.
type state struct {
	ackTimeout time.Duration
	tracker    *offsets.Tracker

	clients map[uint64]*client
	ready   ring[*client] // clients with room, in round-robin order
	retries ring[retry]   // redeliveries; they go before fresh messages
	fresh   ring[*Message]
	bytes   int // payload bytes in retries, fresh and large

	// large holds messages that were larger than the client whose turn it
	// was; they wait, in order, for a client they fit, while the messages
	// behind them go on. largeBlocked is set when no client with room fits
	// large's first message, and cleared when one might: a client that fits
	// it gets room, or the first message changes.
	large        ring[retry]
	largeBlocked bool
	frameSize    func(*Message) int            // Config.FrameSize; nil: messages have no size
	onTooLarge   func(m *Message, largest int) // a message fits no joined client; nil: nothing
	// largest is the largest maxSize of the joined clients (0 when one takes
	// any size, -1 with no client); stale after a leave until recomputed.
	largest      int
	largestStale bool

	flights   flightTable  // outstanding deliveries by id
	deadlines deadlineList // outstanding deliveries by deadline

	// parts holds, in per-partition mode, the partitions served; nil when
	// every partition is (a term's dispatcher). revoking counts those being
	// revoked, so that the hot path checks one integer (see partitions.go).
	parts    map[int32]*owned
	revoking int

	draining bool      // no more deliveries
	paused   bool      // the source is paused
	touched  []*client // clients given deliveries in the current round
	stats    Stats

	// held holds the partitions whose fetching is paused because the
	// tracker holds more than Config.MaxOutstanding of their offsets.
	held map[int32]bool
}

func newState(ackTimeout time.Duration) *state {
	return &state{
		ackTimeout: ackTimeout,
		tracker:    offsets.NewTracker(),
		clients:    map[uint64]*client{},
		flights:    newFlightTable(),
		held:       map[int32]bool{},
		largest:    -1,
	}
}

// buffered returns the number of messages waiting for a client.
func (s *state) buffered() int { return s.retries.len() + s.fresh.len() + s.large.len() }

// largestSize returns the largest frame size a joined client accepts: 0
// when one accepts any, -1 with no client.
func (s *state) largestSize() int {
	if s.largestStale {
		s.largest = -1
		for _, c := range s.clients {
			if s.largest = max(s.largest, c.maxSize); c.maxSize == 0 {
				break
			}
		}
		s.largestStale = false
	}
	return s.largest
}

// fitsAnyone reports whether some joined client accepts m.
func (s *state) fitsAnyone(m *Message) bool {
	l := s.largestSize()
	return l == 0 || (l > 0 && m.frame <= l)
}

// addBatch takes messages from the source.
func (s *state) addBatch(b Batch) {
	if b.Start >= 0 {
		s.restart(b.Partition, b.Start)
	}
	for _, m := range b.Messages {
		if !s.tracker.Received(m.Partition, m.Offset) {
			continue // already tracked: a re-fetch
		}
		m.gen = s.tracker.Gen(m.Partition)
		if s.frameSize != nil {
			m.frame = s.frameSize(m)
		}
		s.fresh.push(m)
		s.bytes += m.Size()
		s.stats.Consumed++
	}
}

// restart (re)starts partition p at offset r: the tracker forgets its
// offsets at or above r, and so does the buffer. Unacked messages below r
// stay, in the buffer and in flight, and their acks count. A delivery of a
// forgotten message still in flight is dropped when it comes back (requeue).
func (s *state) restart(p int32, r int64) {
	if s.tracker.Start(p, r) == 0 {
		return // nothing at or above r was outstanding, so nothing is buffered there
	}
	s.dropWaiting(func(m *Message) bool { return m.Partition == p && m.Offset >= r })
}

// dropWaiting removes the messages waiting for a client (fresh,
// redeliveries, large) for which forgotten returns true, and returns how
// many it removed.
func (s *state) dropWaiting(forgotten func(*Message) bool) int {
	drop := func(m *Message) bool {
		if forgotten(m) {
			s.bytes -= m.Size()
			return true
		}
		return false
	}
	n := s.fresh.filter(func(m *Message) bool { return !drop(m) })
	n += s.retries.filter(func(rt retry) bool { return !drop(rt.msg) })
	if s.large.len() > 0 {
		first := s.large.front().msg
		n += s.large.filter(func(rt retry) bool { return !drop(rt.msg) })
		if s.large.len() == 0 || s.large.front().msg != first {
			s.largeBlocked = false // a new first message
		}
	}
	return n
}

// join adds a client.
func (s *state) join(id uint64, name string, max int, sink ClientSink) {
	if max < 1 {
		max = 1
	}
	if old := s.clients[id]; old != nil {
		s.leave(id) // a reused id replaces the old client
	}
	c := &client{id: id, name: name, sink: sink, max: max}
	if ls, ok := sink.(LimitedSink); ok && ls.MaxFrameSize() > 0 {
		c.maxSize = ls.MaxFrameSize()
	}
	s.clients[id] = c
	if l := s.largestSize(); l != 0 && (c.maxSize == 0 || c.maxSize > l) {
		s.largest = c.maxSize
	}
	if s.draining {
		sink.Goodbye("draining")
		return
	}
	s.makeReady(c)
}

// leave removes a client and queues its flights for other clients.
func (s *state) leave(id uint64) {
	c := s.clients[id]
	if c == nil {
		return
	}
	delete(s.clients, id)
	c.gone = true
	if c.maxSize == s.largest {
		s.largestStale = true
	}
	for f := c.first; f != nil; {
		next := f.next
		s.deadlines.remove(f)
		s.requeue(f, RedeliverDisconnect)
		f = next
	}
	c.first, c.last, c.n = nil, nil, 0
}

// ack completes deliveries of client id.
func (s *state) ack(id uint64, ids []uint64) { s.settle(id, OpAck, ids, nil, time.Time{}) }

// nack gives deliveries of client id back for another client.
func (s *state) nack(id uint64, ids []uint64) { s.settle(id, OpNack, ids, nil, time.Time{}) }

// touch restarts the ack timeout of deliveries of client id.
func (s *state) touch(id uint64, ids []uint64, now time.Time) { s.settle(id, OpTouch, ids, nil, now) }

// settle acks, nacks or touches (op) the deliveries of client id named by
// ids and by ranges; now is the time of a touch.
func (s *state) settle(id uint64, op Op, ids []uint64, ranges []Range, now time.Time) {
	for _, did := range ids {
		if f := s.own(id, did); f != nil {
			s.settleFlight(op, f, now)
		}
	}
	for _, r := range ranges {
		s.settleRange(id, op, r, now)
	}
}

// settleRange settles the deliveries of client id in r in one step: by
// their ids when r names no more ids than the client holds, else by a walk
// over the client's flights, so that its cost is at most what the client
// holds, whatever r's count.
func (s *state) settleRange(id uint64, op Op, r Range, now time.Time) {
	c := s.clients[id]
	if c == nil || r.Count > uint64(c.n) {
		matched := uint64(0)
		if c != nil {
			for f := c.first; f != nil; {
				next := f.next // f may leave the list
				if f.id-r.First < r.Count {
					matched++
					s.settleFlight(op, f, now)
				}
				f = next
			}
		}
		s.stats.UnknownAcks += r.Count - matched
		return
	}
	for k := range r.Count {
		if f := s.own(id, r.First+k); f != nil {
			s.settleFlight(op, f, now)
		}
	}
}

// settleFlight acks, nacks or touches f.
func (s *state) settleFlight(op Op, f *flight, now time.Time) {
	switch op {
	case OpAck:
		s.deadlines.remove(f)
		c := f.client
		s.unlink(f)
		s.tracker.AckIn(f.msg.Partition, f.msg.Offset, f.msg.gen)
		s.stats.Acked++
		s.recycle(f)
		s.makeReady(c)
	case OpNack:
		s.deadlines.remove(f)
		c := f.client
		s.stats.Nacked++
		s.requeue(f, RedeliverNack)
		s.makeReady(c)
	case OpTouch:
		s.deadlines.reset(f, now.Add(s.ackTimeout))
	}
}

// expire queues every delivery whose deadline is not after now for another
// client.
func (s *state) expire(now time.Time) {
	for f := s.deadlines.peek(); f != nil && !f.deadline.After(now); f = s.deadlines.peek() {
		s.deadlines.remove(f)
		c := f.client
		s.requeue(f, RedeliverTimeout)
		s.makeReady(c)
	}
}

// nextDeadline returns the earliest ack deadline, if any.
func (s *state) nextDeadline() (time.Time, bool) {
	if f := s.deadlines.peek(); f != nil {
		return f.deadline, true
	}
	return time.Time{}, false
}

// own returns the outstanding flight did if it belongs to client id.
func (s *state) own(id, did uint64) *flight {
	f := s.flights.get(did)
	if f == nil || f.client.id != id {
		s.stats.UnknownAcks++
		return nil
	}
	return f
}

// requeue turns a flight (already out of the heap) into a retry, unless its
// partition restarted at or below its offset since it was received: then the
// message is forgotten (fetched again, or gone) and dropped.
func (s *state) requeue(f *flight, reason int) {
	if s.revoking > 0 && s.revoked(f.msg.Partition) {
		s.unlink(f) // being handed over: the next owner delivers it
		s.recycle(f)
		return
	}
	c := f.client
	s.unlink(f)
	if m := f.msg; !s.tracker.Pending(m.Partition, m.Offset, m.gen) {
		s.recycle(f)
		return
	}
	s.retries.push(retry{msg: f.msg, attempt: f.attempt + 1, last: c.id})
	s.bytes += f.msg.Size()
	s.stats.Redelivered[reason]++
	s.recycle(f)
}

// unlink removes f from its client's list and the in-flight map.
func (s *state) unlink(f *flight) {
	c := f.client
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		c.first = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		c.last = f.prev
	}
	c.n--
	if s.revoking > 0 {
		if o := s.parts[f.msg.Partition]; o != nil && o.revoke != nil {
			o.revoke.inFlight--
		}
	}
}

// recycle frees f's id; a later ack naming it is unknown.
func (s *state) recycle(f *flight) { s.flights.release(f) }

// makeReady queues c for deliveries if it has room and is not queued.
func (s *state) makeReady(c *client) {
	if !c.inReady && c.hasRoom() && !s.draining {
		c.inReady = true
		s.ready.push(c)
		if s.largeBlocked && c.fits(s.large.front().msg) {
			s.largeBlocked = false
		}
	}
}

// wait puts a message that does not fit client c into large, to wait for a
// client it fits, and reports it when no joined client accepts it.
func (s *state) wait(msg *Message, attempt uint32, c uint64) {
	if s.large.len() == 0 {
		s.largeBlocked = false
	}
	s.large.push(retry{msg: msg, attempt: attempt, last: c})
	if s.onTooLarge != nil && !s.fitsAnyone(msg) {
		s.onTooLarge(msg, s.largestSize())
	}
}

// nextReady returns the client whose turn it is, dropping clients that left
// or are full; nil when no client has room.
func (s *state) nextReady() *client {
	for s.ready.len() > 0 {
		c := s.ready.front()
		if c.hasRoom() {
			return c
		}
		s.ready.pop()
		c.inReady = false
	}
	return nil
}

// dispatch hands buffered messages to clients with room, redeliveries first,
// round-robin, and sends each client its deliveries in one batch. A message
// larger than the client whose turn it is waits in large for a client it
// fits; each client's turn first offers it large's first message.
func (s *state) dispatch(now time.Time) {
	if s.draining {
		return
	}
	deadline := now.Add(s.ackTimeout)
	misses := 0 // consecutive clients that fit nothing left
	for s.retries.len()+s.fresh.len() > 0 || (s.large.len() > 0 && !s.largeBlocked) {
		c := s.nextReady()
		if c == nil {
			break
		}
		if s.large.len() > 0 && !s.largeBlocked && c.fits(s.large.front().msg) {
			r := s.large.pop()
			s.largeBlocked = false // a new first message
			s.give(c, r.msg, r.attempt, deadline)
			misses = 0
			continue
		}
		var msg *Message
		attempt := uint32(1)
		switch {
		case s.retries.len() > 0:
			r := s.retries.front()
			if r.last == c.id && s.ready.len() > 1 {
				// Prefer another client for a redelivery: c goes to the
				// back; nextReady returns c again only when every other
				// client turned out to be full or gone.
				s.ready.pop()
				s.ready.push(c)
				c = s.nextReady()
			}
			s.retries.pop()
			msg, attempt = r.msg, r.attempt
		case s.fresh.len() > 0:
			msg = s.fresh.pop()
		default:
			// Only large messages are left and c does not fit the first:
			// try the next client, until every one has had its turn.
			if misses++; misses >= s.ready.len() {
				s.largeBlocked = true
				continue
			}
			s.ready.pop()
			s.ready.push(c)
			continue
		}
		if !c.fits(msg) {
			s.wait(msg, attempt, c.id)
			continue
		}
		s.give(c, msg, attempt, deadline)
		misses = 0
	}
	for _, c := range s.touched {
		c.touched = false
		if !c.gone {
			s.number(c)
			c.sink.Send(c.out)
		}
		c.out = nil
	}
	s.touched = s.touched[:0]
}

// number gives the flights of c's deliveries of this round, the last of its
// list, their ids: consecutive ones (but where a slot is taken), so that c
// can name them as a range.
func (s *state) number(c *client) {
	f := c.last
	for range len(c.out) - 1 {
		f = f.prev
	}
	for i := range c.out {
		s.flights.insert(f)
		c.out[i].ID = f.id
		f = f.next
	}
}

// give delivers msg to c, the first client of ready, and moves c to the back
// of ready, or out of it when full.
func (s *state) give(c *client, msg *Message, attempt uint32, deadline time.Time) {
	s.bytes -= msg.Size()
	s.deliver(c, msg, attempt, deadline)
	s.ready.pop()
	if c.hasRoom() {
		s.ready.push(c)
	} else {
		c.inReady = false
	}
}

// deliver records a flight of msg to c and queues the delivery; the flight
// gets its id at the end of the round (number).
func (s *state) deliver(c *client, msg *Message, attempt uint32, deadline time.Time) {
	f := s.flights.take()
	f.msg, f.attempt, f.client, f.deadline, f.prev = msg, attempt, c, deadline, c.last
	if c.last != nil {
		c.last.next = f
	} else {
		c.first = f
	}
	c.last = f
	c.n++
	s.deadlines.push(f)
	if !c.touched {
		c.touched = true
		s.touched = append(s.touched, c)
		// One allocation per client and round, mostly: what it has room
		// for, or its round-robin share of what is buffered (msg is
		// already taken out of both).
		c.out = make([]Delivery, 0, min(c.max-c.n, s.buffered()/max(s.ready.len(), 1)+1)+1)
	}
	c.out = append(c.out, Delivery{Attempt: attempt, Msg: msg})
	s.stats.Delivered++
}

// drain stops deliveries and says goodbye to every client.
func (s *state) drain(reason string) {
	if s.draining {
		return
	}
	s.draining = true
	for _, c := range s.clients {
		c.sink.Goodbye(reason)
	}
}

// snapshot returns the current Stats.
func (s *state) snapshot() Stats {
	st := s.stats
	st.InFlight = s.flights.live
	st.Buffered = s.buffered()
	st.BufferBytes = s.bytes
	st.Clients = len(s.clients)
	st.Paused = s.paused
	st.Outstanding = s.tracker.OutstandingAll()
	for p := range s.held {
		st.Held = append(st.Held, p)
	}
	slices.Sort(st.Held)
	for i := range s.large.len() {
		if m := s.large.at(i).msg; !s.fitsAnyone(m) {
			st.TooLarge++
		}
	}
	return st
}
