package dispatch

import (
	"hash/maphash"
	"maps"
	"slices"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/backoff"
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
	// Pinned is the bytes of the fetched buffers that messages held alias
	// (Buffer, pins.go), as of the last count; Compacted the bytes of
	// buffers let go so far by copying what messages used of them.
	Pinned    int
	Compacted uint64
	Clients   int  // clients joined
	Paused    bool // fetching is paused
	// DeliveryPaused: an operator paused the deliveries (Config.Pause).
	DeliveryPaused bool
	// Outstanding is, per partition, the offsets the tracker holds:
	// received and not yet behind the committable offset.
	Outstanding map[int32]int
	// PendingSince is, per partition with a message received and not yet
	// acked (in flight, buffered, waiting out a delay, behind its key or
	// for the dead-letter topic), when the oldest such message arrived from
	// the source: the age of the oldest pending message is now minus it.
	// Redeliveries do not make a message younger; a restart or failover
	// does (the message arrives again).
	PendingSince map[int32]time.Time
	// Held lists, sorted, the partitions whose fetching is paused because
	// they hold more than Config.MaxOutstanding offsets.
	Held []int32
	// TooLarge is the number of buffered messages larger than any joined
	// client accepts (LimitedSink): they wait for a client that takes them.
	TooLarge int
	// Stalled lists, sorted, the partitions whose committable offset has
	// not moved for Config.StallAfter while offsets of them are held.
	Stalled []int32

	// Delivery policies.
	Delayed           int    // redeliveries waiting out a retry delay (a nack's, or --retry-backoff)
	DeadLettered      uint64 // messages stored in the dead-letter topic after Config.MaxAttempts failures
	DeadLetterPending int    // messages handed to the dead-letter producer, not yet stored
	KeyWaiting        int    // key ordering: messages waiting for the previous message of their key
	Observers         int    // observers joined
	// DeadLetterPendingBy is DeadLetterPending per partition (those with
	// some only).
	DeadLetterPendingBy map[int32]int
	// TooLargeDeadLettered counts the messages handed to the dead-letter
	// producer because they fitted no joined client for MaxAttempts ack
	// timeouts (FailureTooLarge).
	TooLargeDeadLettered uint64
	// NotCounted counts the failed deliveries that did not count toward
	// Config.MaxAttempts: nacks of deliveries the client never processed
	// (NackInfo.Unprocessed), deliveries unanswered when their client said
	// goodbye (LeaveGoodbye) or the daemon closed its connection
	// (LeaveShutdown), and disconnects within Config.DisconnectWindow of a
	// message's last counted one.
	NotCounted uint64
	// Skipped counts the messages received after a restart that the stored
	// progress shows acked already (Config.Progress): not delivered again.
	Skipped uint64
	// Attempts is a histogram of the deliveries a message took until it was
	// acked or dead-lettered: Attempts[i] counts those that took at most
	// AttemptBuckets[i] (the last: more); AttemptsSum is their sum.
	Attempts    [len(AttemptBuckets) + 1]uint64
	AttemptsSum uint64

	// Committed is the next offset to consume per partition as the store
	// holds it, as far as this dispatcher knows: Config.Stored, updated by
	// every successful commit.
	Committed          map[int32]int64
	CommitFailures     uint64    // offset commits that failed
	CommitFailingSince time.Time // first failed commit since the last success; zero after a success
}

// ClientStats is a snapshot of one joined client or observer, for the
// console.
type ClientStats struct {
	ID          uint64 // the id the client joined with (the server's session id)
	Name        string // the name it joined with (Hello.client_id)
	InFlight    int    // its deliveries waiting for an ack
	MaxInFlight int    // its in-flight limit
	Acked       uint64 // its deliveries acked since it joined
	Weight      int    // its share (WeightedSink; protocol.DefaultWeight when it gives none); 0 for an observer
	Observer    bool   // it observes (Observe): copies of every delivery, no acks, no credit
	// Outcomes of its deliveries since it joined, besides Acked: nacked,
	// not acked within the ack timeout, queued again for another delivery
	// (after a nack, a timeout, or as it left holding them), and failed for
	// the last time (the message went to the dead-letter topic).
	Nacked, TimedOut, Redelivered, DeadLettered uint64
	// Draining: it is being drained (DrainClient).
	Draining bool
}

// AttemptBuckets are the upper bounds of Stats.Attempts' buckets.
var AttemptBuckets = [...]uint32{1, 2, 3, 5, 10, 25}

// client is the dispatcher's view of one connection.
type client struct {
	id      uint64
	name    string
	sink    ClientSink
	max     int     // in-flight limit
	maxSize int     // largest frame it accepts (LimitedSink); 0 means any
	weight  int64   // its share (WeightedSink); protocol.DefaultWeight when it gives none
	cw      int64   // smooth weighted round-robin: its current weight
	n       int     // deliveries in flight
	first   *flight // oldest of its flights; a doubly linked list
	last    *flight
	acked   uint64     // deliveries acked, added once per ack request
	inReady bool       // queued in state.ready
	gone    bool       // left; dropped lazily from state.ready
	out     []Delivery // deliveries of the current dispatch round
	touched bool       // in state.touched this round

	// Outcomes of its deliveries, counted where the dispatcher handles
	// them (ClientStats).
	nacked, timedOut, deadLettered, redelivered uint64

	draining bool      // drained (DrainClient): no more deliveries
	drainBy  time.Time // when its drain ends, whatever it holds
}

func (c *client) hasRoom() bool { return !c.gone && !c.draining && c.n < c.max }

// stats returns c's ClientStats.
func (c *client) stats() ClientStats {
	return ClientStats{ID: c.id, Name: c.name, InFlight: c.n, MaxInFlight: c.max, Acked: c.acked, Weight: int(c.weight),
		Nacked: c.nacked, TimedOut: c.timedOut, DeadLettered: c.deadLettered, Redelivered: c.redelivered, Draining: c.draining}
}

// fits reports whether c accepts m's frame size.
func (c *client) fits(m *Message) bool { return c.maxSize == 0 || m.frame <= c.maxSize }

// retry is a message waiting to be delivered again (its attempt is
// msg.failed+1).
type retry struct {
	msg  *Message
	last uint64 // the client that had it, to prefer another one
}

// state is the dispatcher's data. It is not safe for concurrent use: only
// the dispatcher's goroutine touches it, which keeps every step a plain
// function call that tests drive directly with a fake clock.
type state struct {
	ackTimeout time.Duration
	tracker    *offsets.Tracker

	clients   map[uint64]*client
	ready     ring[*client]  // clients with room, in round-robin order (by weight: see weights.go)
	turn      int            // messages a client takes in its turn, at most (Config.Turn, at least 1)
	turnOf    *client        // the client whose turn is under way (round-robin), if any
	turnTaken int            // the messages turnOf took in it
	weighted  int            // joined clients whose weight is not the default: then by weight
	retries   ring[retry]    // redeliveries; they go before fresh messages
	unblocked ring[*Message] // key ordering: messages whose key's previous message is done
	fresh     ring[*Message]
	bytes     int // payload bytes of the messages buffered: retries, unblocked, fresh, large, delays, keys, dead letters

	// Delivery policies (Config); see retry.go, keys.go, deadletter.go.
	maxAttempts uint32        // failures after which a message is dead-lettered; 0: never
	retryMin    time.Duration // --retry-backoff; 0: redeliver at once
	retryMax    time.Duration
	// disconnectWindow is Config.DisconnectWindow: disconnects of one
	// message within it count as one failure.
	disconnectWindow time.Duration
	delays           delayHeap            // redeliveries waiting out a delay
	deadLetter       DeadLetter           // where dead letters go; nil without maxAttempts
	deadPending      int                  // messages handed to deadLetter, not yet stored
	deadPendingBy    map[int32]int        // deadPending per partition, those with some only
	keys             map[uint64]keyGate   // key ordering: the gate of each key with a message out; nil: unordered
	keySeed          maphash.Seed         // of the keys' hashes
	keyWaiting       int                  // messages waiting in the gates' chains
	observers        []*observer          // see observers.go
	restore          map[int32]*restoring // progress loaded from the store, until applied; see restore.go
	// waits counts, at most, the messages with a restored delay to wait out
	// once they hold their key (Message.wait); progress looks for them
	// while it is not 0.
	waits int

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
	// stuck holds, with a dead-letter topic, the messages of large that fit
	// no joined client, and since when (expireTooLarge); nil when none.
	stuck map[*Message]time.Time

	flights   flightTable  // outstanding deliveries by id
	deadlines deadlineList // outstanding deliveries by deadline

	// The fetched buffers that messages held alias (pins.go): pinned is the
	// bytes of bufs, those counted since the last scan; scanSeq numbers the
	// scans.
	pinned   int
	bufs     []*Buffer
	scanSeq  uint64
	lastScan time.Time

	// parts holds, under AssignedPartitions, the partitions served; nil when
	// every partition is (WholeTopic: Scope.table). revoking counts those being
	// revoked, so that the hot path checks one integer (see partitions.go).
	parts    map[int32]*owned
	revoking int

	draining bool // no more deliveries
	paused   bool // the source is paused
	// deliveryPaused: an operator paused the deliveries (Config.Pause,
	// control.go); drains holds the clients being drained.
	deliveryPaused bool
	drains         []*client
	touched        []*client // clients given deliveries in the current round
	stats          Stats

	// held holds the partitions whose fetching is paused because the
	// tracker holds more than Config.MaxOutstanding of their offsets.
	held map[int32]bool
	// stalls watches the committable offsets of the partitions with
	// offsets held (stall.go); nil when there are none.
	stalls map[int32]*stall

	// trace is the delivery log (Config.DeliveryLog, trace.go); nil: none.
	// now stamps its events.
	trace *deliverylog.Log
	now   func() time.Time
}

func newState(ackTimeout time.Duration) *state {
	return &state{
		ackTimeout: ackTimeout,
		tracker:    offsets.NewTracker(),
		clients:    map[uint64]*client{},
		flights:    newFlightTable(),
		held:       map[int32]bool{},
		largest:    -1,
		keySeed:    maphash.MakeSeed(),
		now:        time.Now,
		scanSeq:    1, // a Buffer never counted has scan 0
	}
}

// buffered returns the number of messages the dispatcher holds that are not
// in flight: waiting for a client, for a delay, behind their key, or for
// the dead-letter topic.
func (s *state) buffered() int {
	return s.retries.len() + s.unblocked.len() + s.fresh.len() + s.large.len() +
		len(s.delays) + s.keyWaiting + s.deadPending
}

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

// addBatch takes messages from the source; now is when they arrived.
func (s *state) addBatch(b Batch, now time.Time) {
	if b.Start >= 0 {
		if s.trace != nil {
			s.tracePartition(deliverylog.Restart, b.Partition, b.Start, "")
		}
		s.restart(b.Partition, b.Start)
	}
	var rs *restoring
	if s.restore != nil {
		rs = s.restoring(b)
	}
	if len(b.Messages) == 0 {
		return
	}
	s.holdBuffers(b.Buffers)
	// Every offset the loop receives is at or above from, and every one
	// received before is below it: one arrival mark for the batch, nothing
	// per message.
	from, tracked := s.tracker.Receivable(b.Partition)
	if !tracked {
		from = b.Messages[0].Offset
	}
	for _, m := range b.Messages {
		if !s.tracker.Received(m.Partition, m.Offset) {
			continue // already tracked: a re-fetch
		}
		m.gen = s.tracker.Gen(m.Partition)
		s.stats.Consumed++
		if rs != nil && s.restored(rs, m, now) {
			continue // acked before the restart, or waiting out the delay stored with it
		}
		if s.frameSize != nil {
			m.frame = s.frameSize(m)
		}
		if s.keys != nil && len(m.Key) > 0 {
			m.keyHash = s.keyHash(m)
		}
		s.fresh.push(m)
		s.bytes += m.Size()
	}
	s.tracker.Arrived(b.Partition, from, now) // Stats.PendingSince
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
// redeliveries, unblocked, delayed, large, and in key order those waiting
// behind their key) for which forgotten returns true, and returns how many
// it removed.
func (s *state) dropWaiting(forgotten func(*Message) bool) int {
	var dropped []*Message // forgotten messages that held their key's gate
	drop := func(m *Message) bool {
		if forgotten(m) {
			s.bytes -= m.Size()
			if m.keyHash != 0 {
				dropped = append(dropped, m)
			}
			return true
		}
		return false
	}
	n := s.fresh.filter(func(m *Message) bool { return !drop(m) })
	n += s.retries.filter(func(rt retry) bool { return !drop(rt.msg) })
	n += s.unblocked.filter(func(m *Message) bool { return !drop(m) })
	n += s.delays.filter(func(d delayed) bool { return !drop(d.msg) })
	if s.large.len() > 0 {
		first := s.large.front().msg
		n += s.large.filter(func(rt retry) bool { return !drop(rt.msg) })
		if s.large.len() == 0 || s.large.front().msg != first {
			s.largeBlocked = false // a new first message
		}
	}
	if s.keys != nil {
		n += s.dropKeys(forgotten, dropped)
	}
	return n
}

// join adds a client.
func (s *state) join(id uint64, name string, max int, sink ClientSink) {
	if max < 1 {
		max = 1
	}
	if s.clients[id] != nil || s.observer(id) != nil {
		s.leave(id, LeaveDisconnect, time.Time{}) // a reused id replaces the old client
	}
	c := &client{id: id, name: name, sink: sink, max: max, weight: protocol.DefaultWeight}
	if ls, ok := sink.(LimitedSink); ok && ls.MaxFrameSize() > 0 {
		c.maxSize = ls.MaxFrameSize()
	}
	if ws, ok := sink.(WeightedSink); ok && ws.Weight() > 0 {
		c.weight = int64(ws.Weight())
	}
	if c.weight != protocol.DefaultWeight {
		s.weighted++
	}
	s.clients[id] = c
	if s.trace != nil {
		s.traceClient(deliverylog.Join, id, name, "")
	}
	if l := s.largestSize(); l != 0 && (c.maxSize == 0 || c.maxSize > l) {
		s.largest = c.maxSize
	}
	if s.draining {
		sink.Goodbye("draining")
		return
	}
	s.makeReady(c)
}

// leave removes a client, or an observer, and queues its flights for other
// clients; reason is why it left, now when (for their retry delay).
func (s *state) leave(id uint64, reason LeaveReason, now time.Time) {
	c := s.clients[id]
	if c == nil {
		s.unobserve(id)
		return
	}
	delete(s.clients, id)
	c.gone = true
	if c.weight != protocol.DefaultWeight {
		s.weighted--
	}
	if c.maxSize == s.largest {
		s.largestStale = true
	}
	// A client that says goodbye did not crash on what it held: it left
	// gracefully, and its deliveries unanswered were not processed (a
	// retiring session of the Go and Python clients holds what reached it
	// after it gave one back). Nor did one whose connection the daemon
	// closed (it stops serving, shuts down, or drained the client). Their deliveries do not
	// count as failed attempts.
	var how NackInfo
	if reason == LeaveGoodbye || reason == LeaveShutdown {
		how = NackInfo{Unprocessed: true, Reason: reason.String()}
	}
	for f := c.first; f != nil; {
		next := f.next
		s.deadlines.remove(f)
		s.requeue(f, RedeliverDisconnect, now, how)
		f = next
	}
	c.first, c.last, c.n = nil, nil, 0
}

// ack completes deliveries of client id.
func (s *state) ack(id uint64, ids []uint64) { s.settle(id, OpAck, ids, nil, NackInfo{}, time.Time{}) }

// nack gives deliveries of client id back for another client, at once or
// after the delay asked for; now is when.
func (s *state) nack(id uint64, ids []uint64, how NackInfo, now time.Time) {
	s.settle(id, OpNack, ids, nil, how, now)
}

// touch restarts the ack timeout of deliveries of client id.
func (s *state) touch(id uint64, ids []uint64, now time.Time) {
	s.settle(id, OpTouch, ids, nil, NackInfo{}, now)
}

// settle acks, nacks (as how says) or touches (op) the deliveries of client
// id named by ids and by ranges; now is when. The ack counters are added to
// once per request, not per delivery.
func (s *state) settle(id uint64, op Op, ids []uint64, ranges []Range, how NackInfo, now time.Time) {
	acked := uint64(0)
	for _, did := range ids {
		if f := s.own(id, did); f != nil {
			acked += s.settleFlight(op, f, how, now)
		}
	}
	for _, r := range ranges {
		acked += s.settleRange(id, op, r, how, now)
	}
	if acked > 0 {
		s.stats.Acked += acked
		if c := s.clients[id]; c != nil {
			c.acked += acked
		}
	}
}

// settleRange settles the deliveries of client id in r in one step: by
// their ids when r names no more ids than the client holds, else by a walk
// over the client's flights, so that its cost is at most what the client
// holds, whatever r's count. It returns how many it acked.
func (s *state) settleRange(id uint64, op Op, r Range, how NackInfo, now time.Time) uint64 {
	acked := uint64(0)
	c := s.clients[id]
	if c == nil || r.Count > uint64(c.n) {
		matched := uint64(0)
		if c != nil {
			for f := c.first; f != nil; {
				next := f.next // f may leave the list
				if f.id-r.First < r.Count {
					matched++
					acked += s.settleFlight(op, f, how, now)
				}
				f = next
			}
		}
		s.stats.UnknownAcks += r.Count - matched
		return acked
	}
	for k := range r.Count {
		if f := s.own(id, r.First+k); f != nil {
			acked += s.settleFlight(op, f, how, now)
		}
	}
	return acked
}

// settleFlight acks, nacks or touches f; it returns 1 for an ack, else 0.
func (s *state) settleFlight(op Op, f *flight, how NackInfo, now time.Time) uint64 {
	switch op {
	case OpAck:
		if s.trace != nil {
			s.traceFlight(deliverylog.Ack, f, "")
		}
		s.deadlines.remove(f)
		c, m := f.client, f.msg
		s.unlink(f)
		s.tracker.AckIn(m.Partition, m.Offset, m.gen)
		s.countAttempts(f.attempt)
		s.recycle(f)
		if m.keyHash != 0 {
			s.keyDone(m)
		}
		s.makeReady(c)
		return 1
	case OpNack:
		s.deadlines.remove(f)
		c := f.client
		s.stats.Nacked++
		c.nacked++
		s.requeue(f, RedeliverNack, now, how)
		s.makeReady(c)
	case OpTouch:
		s.deadlines.reset(f, now.Add(s.ackTimeout))
	}
	return 0
}

// countAttempts adds a message done after n deliveries to Stats.Attempts.
func (s *state) countAttempts(n uint32) {
	i := 0
	for i < len(AttemptBuckets) && n > AttemptBuckets[i] {
		i++
	}
	s.stats.Attempts[i]++
	s.stats.AttemptsSum += uint64(n)
}

// expire queues every delivery whose deadline is not after now for another
// client, and every delayed redelivery whose delay is over.
func (s *state) expire(now time.Time) {
	for f := s.deadlines.peek(); f != nil && !f.deadline.After(now); f = s.deadlines.peek() {
		s.deadlines.remove(f)
		c := f.client
		c.timedOut++
		s.requeue(f, RedeliverTimeout, now, NackInfo{})
		s.makeReady(c)
	}
	for len(s.delays) > 0 && !s.delays[0].due.After(now) {
		d := s.delays.pop()
		s.retries.push(retry{msg: d.msg, last: d.last})
	}
}

// nextDeadline returns the earliest time expire has work, if any: an ack
// deadline or the end of a retry delay. The dispatcher arms its one timer
// for it.
func (s *state) nextDeadline() (time.Time, bool) {
	var next time.Time
	if f := s.deadlines.peek(); f != nil {
		next = f.deadline
	}
	if len(s.delays) > 0 && (next.IsZero() || s.delays[0].due.Before(next)) {
		next = s.delays[0].due
	}
	return next, !next.IsZero()
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

// requeue handles a failed delivery (its flight already out of the heap):
// the message is dead-lettered when it failed Config.MaxAttempts times, else
// queued for another delivery, at once or after its delay (see retry.go).
// When its partition restarted at or below its offset since it was
// received, the message is forgotten (fetched again, or gone) and dropped;
// so is a message of a partition being handed over (the next owner delivers
// it).
func (s *state) requeue(f *flight, reason int, now time.Time, how NackInfo) {
	c, m := f.client, f.msg
	if s.revoking > 0 && s.revoked(m.Partition) {
		if s.trace != nil {
			s.traceFlight(deliverylog.Returned, f, outcomeKinds[reason].String())
		}
		r := s.parts[m.Partition].revoke
		r.returned++
		if how.Delay > 0 {
			r.delays = append(r.delays, offsets.Delay{Offset: m.Offset, NotBefore: offsets.NotBefore(now.Add(how.Delay))})
		}
		s.unlink(f)
		s.recycle(f)
		if m.keyHash != 0 {
			s.keyDone(m)
		}
		return
	}
	pending := s.tracker.Pending(m.Partition, m.Offset, m.gen)
	counted := pending && s.counts(m, reason, how, now)
	if s.trace != nil {
		if pending {
			s.traceFailure(f, reason, how, counted)
		} else {
			s.traceFlight(deliverylog.Forgotten, f, outcomeKinds[reason].String())
		}
	}
	s.unlink(f)
	s.recycle(f)
	if !pending {
		if m.keyHash != 0 {
			s.keyDone(m)
		}
		return
	}
	if counted {
		s.failed(m, reason, how.Reason, now)
	} else {
		s.stats.NotCounted++
	}
	s.bytes += m.Size()
	if s.maxAttempts > 0 && m.failed >= s.maxAttempts {
		c.deadLettered++
		s.toDeadLetter(m)
		return
	}
	s.stats.Redelivered[reason]++
	c.redelivered++
	delay := how.Delay
	if delay <= 0 && s.retryMin > 0 && counted {
		delay = backoff.Delay(s.retryMin, s.retryMax, int(m.failed), true)
	}
	if delay > 0 {
		s.delay(m, c.id, now.Add(delay))
		return
	}
	s.retries.push(retry{msg: m, last: c.id})
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
func (s *state) wait(msg *Message, c uint64) {
	if s.large.len() == 0 {
		s.largeBlocked = false
	}
	s.large.push(retry{msg: msg, last: c})
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
// then messages whose key became free, then fresh ones; round-robin, or by
// weight when clients gave weights (weights.go); and sends each client its
// deliveries in one batch, and each observer its copies. A message larger
// than the client whose turn it is waits in large for a client it fits;
// each client's turn first offers it large's first message. In key order a
// fresh message whose key has a message out waits behind it (keys.go).
func (s *state) dispatch(now time.Time) {
	if s.draining || s.deliveryPaused {
		return
	}
	deadline := now.Add(s.ackTimeout)
	misses := 0 // consecutive clients that fit nothing left
	for s.retries.len()+s.unblocked.len()+s.fresh.len() > 0 || (s.large.len() > 0 && !s.largeBlocked) {
		var c *client
		if s.weighted > 0 {
			var avoid uint64
			if s.retries.len() > 0 {
				avoid = s.retries.front().last
			}
			c = s.pickWeighted(avoid)
		} else {
			c = s.nextReady()
		}
		if c == nil {
			break
		}
		if s.large.len() > 0 && !s.largeBlocked && c.fits(s.large.front().msg) {
			r := s.large.pop()
			s.largeBlocked = false // a new first message
			s.give(c, r.msg, deadline)
			misses = 0
			continue
		}
		var msg *Message
		switch {
		case s.retries.len() > 0:
			r := s.retries.front()
			if r.last == c.id && s.weighted == 0 && s.ready.len() > 1 {
				// Prefer another client for a redelivery: c goes to the
				// back; nextReady returns c again only when every other
				// client turned out to be full or gone.
				s.ready.pop()
				s.ready.push(c)
				c = s.nextReady()
			}
			s.retries.pop()
			msg = r.msg
		case s.unblocked.len() > 0:
			msg = s.unblocked.pop()
			if msg.wait != 0 && s.waitRestored(msg, now) {
				continue // holds its key while it waits out its restored delay
			}
		case s.fresh.len() > 0:
			msg = s.fresh.pop()
			if msg.keyHash != 0 {
				if !s.takeKey(msg) {
					continue // waits behind its key's message
				}
				if msg.wait != 0 && s.waitRestored(msg, now) {
					continue
				}
			}
		default:
			// Only large messages are left and c does not fit the first:
			// try the next client, until every one has had its turn.
			if misses++; misses >= s.ready.len() {
				s.largeBlocked = true
				continue
			}
			if s.weighted == 0 {
				s.ready.pop()
				s.ready.push(c)
			}
			continue
		}
		if s.maxAttempts > 0 && msg.failed >= s.maxAttempts {
			s.toDeadLetter(msg) // failed that often before a restart
			continue
		}
		if !c.fits(msg) {
			s.wait(msg, c.id)
			continue
		}
		s.give(c, msg, deadline)
		misses = 0
	}
	for _, c := range s.touched {
		c.touched = false
		if !c.gone {
			s.number(c, now)
			c.sink.Send(c.out)
		}
		c.out = nil
	}
	s.touched = s.touched[:0]
	if len(s.observers) > 0 {
		s.sendObservers()
	}
}

// number gives the flights of c's deliveries of this round, the last of its
// list, their ids: consecutive ones (but where a slot is taken), so that c
// can name them as a range; now is the round's time.
func (s *state) number(c *client, now time.Time) {
	f := c.last
	for range len(c.out) - 1 {
		f = f.prev
	}
	for i := range c.out {
		s.flights.insert(f)
		c.out[i].ID = f.id
		if s.trace != nil {
			// Stamped with the time its ack deadline counts from.
			s.traceFlightAt(deliverylog.Deliver, f, "", now)
		}
		f = f.next
	}
}

// give delivers msg to c and, in round-robin, once c took its turn's
// messages (s.turn) or is full, moves c, the first client of ready, to the
// back of ready, or out of it when full.
func (s *state) give(c *client, msg *Message, deadline time.Time) {
	s.bytes -= msg.Size()
	s.deliver(c, msg, deadline)
	if s.weighted > 0 {
		return // stays in ready; pickWeighted drops it when full
	}
	if s.turn > 1 {
		if s.turnOf != c {
			s.turnOf, s.turnTaken = c, 0
		}
		if s.turnTaken++; s.turnTaken < s.turn && c.hasRoom() {
			return // its turn goes on: it stays first
		}
		s.turnOf = nil
	}
	s.ready.pop()
	if c.hasRoom() {
		s.ready.push(c)
	} else {
		c.inReady = false
	}
}

// deliver records a flight of msg to c and queues the delivery, and its
// copy for every observer; the flight gets its id at the end of the round
// (number).
func (s *state) deliver(c *client, msg *Message, deadline time.Time) {
	attempt := msg.failed + 1
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
		// for, or its round-robin share of what is buffered, or its turn
		// (msg is already taken out of all of them).
		c.out = make([]Delivery, 0, min(c.max-c.n, max(s.buffered()/max(s.ready.len(), 1)+1, s.turn))+1)
	}
	d := Delivery{Attempt: attempt, Msg: msg, key: msg.Key, value: msg.Value, headers: msg.Headers, snapped: true}
	c.out = append(c.out, d)
	for _, o := range s.observers {
		o.out = append(o.out, d)
	}
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
	for _, o := range s.observers {
		o.sink.Goodbye(reason)
	}
}

// snapshot returns the current Stats.
func (s *state) snapshot() Stats {
	st := s.stats
	st.InFlight = s.flights.live
	st.Buffered = s.buffered()
	st.BufferBytes = s.bytes
	st.Pinned = s.pinned
	st.Clients = len(s.clients)
	st.Paused = s.paused
	st.DeliveryPaused = s.deliveryPaused
	st.Delayed = len(s.delays)
	st.DeadLetterPending = s.deadPending
	if len(s.deadPendingBy) > 0 {
		st.DeadLetterPendingBy = maps.Clone(s.deadPendingBy)
	}
	st.KeyWaiting = s.keyWaiting
	st.Observers = len(s.observers)
	st.Outstanding = s.tracker.OutstandingAll()
	st.PendingSince = s.tracker.OldestPendingAll()
	for p := range s.held {
		st.Held = append(st.Held, p)
	}
	slices.Sort(st.Held)
	st.Stalled = s.stalled()
	for i := range s.large.len() {
		if m := s.large.at(i).msg; !s.fitsAnyone(m) {
			st.TooLarge++
		}
	}
	return st
}

// clientStats returns a snapshot of every joined client and observer, in no
// particular order (sorting is the caller's business, off the dispatcher's
// goroutine).
func (s *state) clientStats() []ClientStats {
	out := make([]ClientStats, 0, len(s.clients)+len(s.observers))
	for _, c := range s.clients {
		out = append(out, c.stats())
	}
	for _, o := range s.observers {
		out = append(out, ClientStats{ID: o.id, Name: o.name, Observer: true})
	}
	return out
}
