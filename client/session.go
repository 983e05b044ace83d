package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// op is the kind of a queued delivery id.
type op int

const (
	opAck op = iota
	opNack
	opTouch
)

// lingerTimeout bounds how long Close waits, after its Goodbye, for the
// daemon to close the connection.
const lingerTimeout = 2 * time.Second

// defaultLivenessIntervals is used when a Welcome gives a heartbeat but no
// liveness_intervals.
const defaultLivenessIntervals = 3

// redirectError ends a session whose daemon sent a Redirect after Welcome.
type redirectError struct{ addr string }

func (e *redirectError) Error() string { return "redirected to " + e.addr }

// errDead reports a daemon silent for longer than its liveness window.
var errDead = errors.New("daemon silent for too long")

// defaultDrainTimeout bounds a retiring session's wait for its messages to
// be acked when the Welcome gives no ack timeout.
const defaultDrainTimeout = 30 * time.Second

// session is one welcomed connection to a daemon. Its reader and writer are
// the only goroutines touching the socket; the reader owns r and the writer
// owns w.
type session struct {
	c       *Client
	link    *link
	nc      net.Conn
	addr    string
	welcome *protocol.Welcome
	credit  int // the max_in_flight its Hello asked for
	r       *protocol.Reader
	w       *protocol.Writer
	maxIDs  int // ids per Ack/Nack/Touch frame that fit the frame limit
	// ranges is set when the Welcome lists CAPABILITY_BATCH: the daemon
	// reads id ranges, so runs of consecutive ids go as one range.
	ranges bool
	log    *slog.Logger

	// held counts the messages handed to Messages and not yet acked or
	// nacked. draining is set, and drain closed, by retire: the reader
	// passes no more deliveries on, and the writer says goodbye once held
	// is 0 (or after the drain timeout).
	held       atomic.Int64
	draining   atomic.Bool
	drain      chan struct{}
	retireOnce sync.Once

	liveness     time.Duration // read deadline after each frame; 0 = none
	writeTimeout time.Duration

	wake chan struct{} // capacity 1: something was queued for the writer
	quit chan struct{} // closed by fail: the session is over
	// closing is set by the writer once it has sent Goodbye; the reader then
	// only drains until EOF, and lingerUntil (Unix ns) bounds that.
	closing     atomic.Bool
	lingerUntil atomic.Int64

	mu sync.Mutex // guards the fields below
	// ended is nil while Ack and friends may queue ids; then ErrStale (the
	// connection broke) or ErrClosed (Close sent Goodbye).
	ended   error
	acks    []idRange // runs of consecutive ids, in the order queued
	nacks   []idRange
	touches []idRange
	pongs   []uint64
	later   []laterNack // nacks with a delay or a reason
	// givenBack holds the records a retiring session gave back (giveBack).
	givenBack map[record]bool

	failOnce sync.Once
	err      error // why the session ended; set once, read after both loops exit
}

func newSession(c *Client, l *link, nc net.Conn, addr string, r *protocol.Reader, w *protocol.Welcome, credit int) *session {
	s := &session{
		c:            c,
		link:         l,
		nc:           nc,
		addr:         addr,
		welcome:      w,
		credit:       credit,
		r:            r,
		log:          c.log.With("addr", addr, "node", w.GetNodeId(), "session", w.GetSessionId()),
		writeTimeout: c.cfg.DialTimeout,
		wake:         make(chan struct{}, 1),
		quit:         make(chan struct{}),
		drain:        make(chan struct{}),
	}
	maxFrame := int(w.GetMaxFrameSize())
	if maxFrame <= 0 || (c.cfg.MaxFrameSize > 0 && c.cfg.MaxFrameSize < maxFrame) {
		maxFrame = c.cfg.MaxFrameSize
	}
	s.w = protocol.NewWriter(nc, maxFrame)
	s.maxIDs = idsPerFrame(maxFrame, int(w.GetMaxInFlight()))
	s.ranges = slices.Contains(w.GetCapabilities(), protocol.Capability_CAPABILITY_BATCH)
	if hb := time.Duration(w.GetHeartbeatMs()) * time.Millisecond; hb > 0 {
		n := time.Duration(w.GetLivenessIntervals())
		if n == 0 {
			n = defaultLivenessIntervals
		}
		// One more interval of margin for scheduling and network delay.
		s.liveness = hb * (n + 1)
		s.writeTimeout = max(s.writeTimeout, s.liveness)
	}
	return s
}

// run serves the session until it ends and returns why. It returns when
// both the reader and the writer have stopped and the socket is closed.
func (s *session) run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.fail(s.readLoop(ctx))
	}()
	go func() {
		defer wg.Done()
		if err := s.writeLoop(ctx); err != nil {
			s.fail(err)
		}
	}()
	wg.Wait()
	return s.err
}

// fail ends the session with err (the first reason wins): no more ids are
// queued, the writer stops and the socket closes, which stops the reader.
func (s *session) fail(err error) {
	s.failOnce.Do(func() {
		s.mu.Lock()
		if s.ended == nil {
			s.ended = ErrStale
		}
		s.mu.Unlock()
		s.err = err
		close(s.quit)
		_ = s.nc.Close()
	})
}

// retire ends the session without losing work and without duplicates: no
// more deliveries are passed on (the daemon delivers them again after the
// Goodbye), and once every message it passed on is acked or nacked (or the
// daemon's ack timeout has passed, after which it has redelivered them
// anyway), the writer sends the queued acks and a Goodbye. Messages still
// held then return ErrStale. It may be called more than once, at any time.
func (s *session) retire() {
	s.retireOnce.Do(func() {
		s.draining.Store(true)
		close(s.drain)
	})
}

// retired reports whether retire was called.
func (s *session) retired() bool { return s.draining.Load() }

// release counts n messages handed to Messages or Batches as done, waking
// a draining writer when they were the last.
func (s *session) release(n int) {
	if s.held.Add(-int64(n)) == 0 && s.draining.Load() {
		s.signal()
	}
}

// drainTimeout bounds how long a retiring session waits for its messages:
// the daemon's ack timeout.
func (s *session) drainTimeout() time.Duration {
	if ms := s.welcome.GetAckTimeoutMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return defaultDrainTimeout
}

// state returns nil while the session takes acks, else why it does not.
func (s *session) state() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// laterNack is a nack with a delay, a reason or the unprocessed flag: each
// distinct combination goes in Nack frames of its own.
type laterNack struct {
	id          uint64
	delay       time.Duration
	reason      string
	unprocessed bool // never handed to the application (giveBack)
}

// same reports whether n goes in the same Nack frame as o.
func (n laterNack) same(o laterNack) bool {
	return n.delay == o.delay && n.reason == o.reason && n.unprocessed == o.unprocessed
}

// enqueueNack queues a nack with a delay, a reason or the unprocessed flag
// and wakes the writer.
func (s *session) enqueueNack(n laterNack) error {
	s.mu.Lock()
	if s.ended != nil {
		err := s.ended
		s.mu.Unlock()
		return err
	}
	s.later = append(s.later, n)
	s.mu.Unlock()
	s.signal()
	return nil
}

// enqueue queues a delivery id for the writer and wakes it.
func (s *session) enqueue(o op, id uint64) error {
	s.mu.Lock()
	if s.ended != nil {
		err := s.ended
		s.mu.Unlock()
		return err
	}
	s.queueLocked(o, id)
	s.mu.Unlock()
	s.signal()
	return nil
}

// queueLocked queues id for the writer, extending the last run when it
// follows it. s.mu must be held.
func (s *session) queueLocked(o op, id uint64) {
	q := &s.acks
	switch o {
	case opNack:
		q = &s.nacks
	case opTouch:
		q = &s.touches
	}
	*q = appendID(*q, id)
}

func (s *session) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// readLoop decodes frames until the connection fails, the daemon goes
// silent or ends the session, or Close has been handled.
func (s *session) readLoop(ctx context.Context) error {
	var f protocol.Frame
	var b protocol.Batch
	for {
		if s.closing.Load() {
			_ = s.nc.SetReadDeadline(time.Unix(0, s.lingerUntil.Load()))
		} else if s.liveness > 0 && s.r.Buffered() == 0 {
			_ = s.nc.SetReadDeadline(time.Now().Add(s.liveness))
			if s.closing.Load() { // the writer may have set the linger deadline meanwhile
				_ = s.nc.SetReadDeadline(time.Unix(0, s.lingerUntil.Load()))
			}
		}
		deliveries, err := s.r.ReadBatch(&f, &b)
		if err != nil {
			if s.closing.Load() {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("read from %s: %w (%v)", s.addr, errDead, s.liveness)
			}
			return fmt.Errorf("read from %s: %w", s.addr, err)
		}
		if s.closing.Load() {
			continue // Goodbye sent: drain until the daemon closes
		}
		if deliveries {
			batch := s.newBatch(&b, nil)
			// Delivery frames that arrived with this one go in the same
			// Batch: one hand-over and, settled together, one write.
			for s.r.DeliveriesBuffered() {
				if _, err := s.r.ReadBatch(&f, &b); err != nil {
					return fmt.Errorf("read from %s: %w", s.addr, err)
				}
				batch = s.newBatch(&b, batch)
			}
			s.deliver(ctx, batch)
			continue
		}
		switch b := f.Body.(type) {
		case *protocol.Frame_Ping:
			s.mu.Lock()
			s.pongs = append(s.pongs, b.Ping.GetNonce())
			s.mu.Unlock()
			s.signal()
		case *protocol.Frame_Pong:
			// Any frame counts as a sign of life.
		case *protocol.Frame_Goodbye:
			// The daemon sends nothing more but takes acks until it closes.
			s.log.Info("daemon said goodbye", "reason", b.Goodbye.GetReason())
		case *protocol.Frame_Error:
			rerr := protocol.NewRemoteError(b.Error)
			if rerr.Fatal {
				return fmt.Errorf("daemon %s: %w", s.addr, rerr)
			}
			s.log.Warn("daemon reported an error", "error", rerr)
		case *protocol.Frame_Redirect:
			return &redirectError{addr: b.Redirect.GetLeaderAddress()}
		case *protocol.Frame_Members:
			s.c.event(event{kind: evMembers, link: s.link, sess: s, members: protocol.Addresses(b.Members.GetMembers()),
				version: b.Members.GetVersion()})
		default:
			s.log.Warn("ignoring an unexpected frame", "type", fmt.Sprintf("%T", b))
		}
	}
}

// deliver hands the messages of b, the deliveries of one or more frames,
// to Messages, or to Batches as one Batch. The channel holds the in-flight
// limit, so this blocks only if the daemon overruns it, the session ends,
// or other sessions' messages fill it. A retiring session passes no
// delivery on: it gives them back (giveBack).
func (s *session) deliver(ctx context.Context, b *Batch) {
	n := len(b.Messages)
	if n == 0 {
		return
	}
	// Counted before draining is read, and retire sets draining before the
	// writer reads held: either these deliveries are given back, or the
	// writer waits for them to be acked.
	s.held.Add(int64(n))
	if s.draining.Load() {
		s.giveBack(b.Messages)
		return
	}
	if s.c.batches != nil {
		if !handOver(ctx, s, s.c.batches, b) {
			s.giveBack(b.Messages) // the session retires
		}
		return
	}
	for i, m := range b.Messages {
		if !handOver(ctx, s, s.c.msgs, m) {
			s.giveBack(b.Messages[i:]) // the session retires
			return
		}
	}
}

// handOver sends v on ch. It reports false when the session retires first
// (the caller releases what was not handed over); it gives up without
// releasing when the client closes or the session ends, since nothing will
// wait for those messages then.
func handOver[T any](ctx context.Context, s *session, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	default:
	}
	s.log.Debug("the consumer is behind; waiting for it")
	select {
	case ch <- v:
	case <-ctx.Done(): // Close: the daemon redelivers it
	case <-s.quit:
	case <-s.drain:
		return false
	}
	return true
}

// newBatch turns the deliveries of one frame into Messages, appended to
// the Batch into (a new Batch when nil): one allocation for the messages,
// one for all their headers. Key, Value and header values are the frame's
// bytes, not copied.
func (s *session) newBatch(pb *protocol.Batch, into *Batch) *Batch {
	n := len(pb.Deliveries)
	ms := make([]Message, n)
	b := into
	if b == nil {
		b = &Batch{Messages: make([]*Message, 0, n), sess: s}
	}
	observed := s.welcome.GetObserver()
	nh := 0
	for i := range pb.Deliveries {
		nh += len(pb.Deliveries[i].Headers)
	}
	var hs []Header
	if nh > 0 {
		hs = make([]Header, 0, nh)
	}
	for i := range pb.Deliveries {
		d := &pb.Deliveries[i]
		m := &ms[i]
		m.Partition, m.Offset, m.Key, m.Value = d.Partition, d.Offset, d.Key, d.Value
		m.Timestamp = time.UnixMilli(d.TimestampMs)
		m.Attempt, m.DeliveryID, m.Observed, m.sess = int(d.Attempt), d.ID, observed, s
		if len(d.Headers) > 0 {
			first := len(hs)
			for _, h := range d.Headers {
				hs = append(hs, Header(h))
			}
			m.Headers = hs[first:len(hs):len(hs)]
		}
		b.Messages = append(b.Messages, m)
	}
	return b
}

// retiringReason is the reason of the nacks of giveBack.
const retiringReason = "client session retiring: not processed"

// record names a Kafka record: a partition and an offset.
type record struct {
	partition int32
	offset    int64
}

// giveBack returns a delivery that this retiring session does not pass on:
// the daemon, which does not know the session retires, goes on delivering
// up to its credit. A nack at once has it delivered to another client now;
// dropped silently, it would stay in flight until the daemon's ack timeout
// or this session's Goodbye, which waits for the messages passed on (up to
// that timeout), and hold its partition's commit meanwhile. The nack is
// flagged unprocessed: a daemon that knows the flag does not count it as a
// failed attempt (an older one does). A record is given back once per
// session: when it comes back to this session, no other client of the
// daemon had room, and a nack would only bounce it between the two until
// the session ends; it is dropped then, as before, and comes again after
// the Goodbye. An observer's copy needs nothing; a session that ended
// cannot nack (the daemon redelivers what it had in flight anyway).
func (s *session) giveBack(ms []*Message) {
	if !s.welcome.GetObserver() {
		s.mu.Lock()
		nacked := false
		for _, m := range ms {
			r := record{m.Partition, m.Offset}
			if s.ended != nil || s.givenBack[r] {
				continue
			}
			if s.givenBack == nil {
				s.givenBack = map[record]bool{}
			}
			s.givenBack[r] = true
			s.later = append(s.later, laterNack{id: m.DeliveryID, reason: retiringReason, unprocessed: true})
			nacked = true
		}
		s.mu.Unlock()
		if nacked {
			s.signal()
		}
	}
	s.release(len(ms)) // after the nacks are queued: they are sent before the Goodbye
}

// writeLoop is the only writer of the socket. Each time it wakes it takes
// everything queued and writes it as at most one frame per kind, then
// flushes once. On Close it sends what is queued and a Goodbye; a retired
// session does so once its messages are acked (see retire).
func (s *session) writeLoop(ctx context.Context) error {
	b := newBatch()
	drain := s.drain
	var drained <-chan time.Time // the drain timeout, once retired
	for {
		select {
		case <-s.wake:
		case <-s.quit:
			return nil
		case <-ctx.Done():
			return s.goodbye(b, ErrClosed, "client closing")
		case <-drain:
			drain = nil
			t := time.NewTimer(s.drainTimeout())
			defer t.Stop()
			drained = t.C
		case <-drained:
			s.log.Warn("retired session: messages not acked within the ack timeout; they come again", "held", s.held.Load())
			return s.goodbye(b, ErrStale, "session retired")
		}
		s.mu.Lock()
		b.take(s)
		s.mu.Unlock()
		if err := s.writeBatch(b); err != nil {
			return err
		}
		if drain == nil && s.held.Load() <= 0 {
			return s.goodbye(b, ErrStale, "session retired")
		}
	}
}

// goodbye stops the queueing of ids (Ack and friends return ended from
// now on), sends what was queued and a Goodbye, half-closes the socket and
// lets the reader drain until the daemon closes. A failure on Close
// (ended is ErrClosed) is Close's error.
func (s *session) goodbye(b *batch, ended error, reason string) error {
	s.mu.Lock()
	s.ended = ended
	b.take(s)
	s.mu.Unlock()
	b.pongs = b.pongs[:0]
	err := s.writeFrames(b)
	if err == nil {
		err = s.w.WriteFrame(protocol.GoodbyeFrame(reason))
	}
	if err == nil {
		err = s.flush()
	}
	if err != nil {
		if ended == ErrClosed || s.c.shuttingDown.Load() {
			s.c.setCloseErr(err)
		}
		return err
	}
	s.lingerUntil.Store(time.Now().Add(lingerTimeout).UnixNano())
	s.closing.Store(true)
	_ = s.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	if cw, ok := s.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	return nil
}

// writeBatch writes the batch's frames and flushes once.
func (s *session) writeBatch(b *batch) error {
	if err := s.writeFrames(b); err != nil {
		return err
	}
	return s.flush()
}

// writeFrames encodes the batch into the write buffer in the order pongs,
// acks, nacks, touches.
func (s *session) writeFrames(b *batch) error {
	for _, n := range b.pongs {
		b.pong.Pong.Nonce = n
		if err := s.w.WriteFrame(b.pongFrame); err != nil {
			return err
		}
	}
	for _, part := range []struct {
		q   []idRange
		set func(ids, ranges []uint64)
		f   *protocol.Frame
	}{
		{b.acks, func(ids, ranges []uint64) { b.ack.Ack.DeliveryIds, b.ack.Ack.Ranges = ids, ranges }, b.ackFrame},
		{b.nacks, func(ids, ranges []uint64) { b.nack.Nack.DeliveryIds, b.nack.Nack.Ranges = ids, ranges }, b.nackFrame},
		{b.touches, func(ids, ranges []uint64) { b.touch.Touch.DeliveryIds, b.touch.Touch.Ranges = ids, ranges }, b.touchFrame},
	} {
		for q := part.q; len(q) > 0; {
			q = b.cut(q, s.maxIDs, s.ranges)
			part.set(b.ids, b.ranges)
			if err := s.w.WriteFrame(part.f); err != nil {
				return err
			}
		}
	}
	// Nacks with a delay, a reason or the unprocessed flag: frames per run
	// of the same, its consecutive ids as ranges (to a daemon that reads them).
	for i := 0; i < len(b.later); {
		j, q := i, b.laterQ[:0]
		for ; j < len(b.later) && b.later[j].same(b.later[i]); j++ {
			q = appendID(q, b.later[j].id)
		}
		b.laterQ = q
		for len(q) > 0 {
			q = b.cut(q, s.maxIDs, s.ranges)
			f := protocol.NackWithFrame(b.ids, b.later[i].delay, b.later[i].reason)
			f.GetNack().Ranges, f.GetNack().Unprocessed = b.ranges, b.later[i].unprocessed
			if err := s.w.WriteFrame(f); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

// flush writes out the buffered frames under the write timeout.
func (s *session) flush() error {
	if s.w.Buffered() == 0 {
		return nil
	}
	_ = s.nc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("write to %s: %w", s.addr, err)
	}
	return nil
}

// maxIDsPerFrame bounds the ids of one Ack, Nack or Touch frame.
const maxIDsPerFrame = 4096

// idsPerFrame returns how many delivery ids one Ack, Nack or Touch frame may
// carry under a frame limit of maxFrame bytes (an id takes at most 10 bytes,
// a varint, and the frame's tags and lengths fewer than 16) and the
// in-flight limit of the Welcome, which the daemon allows no frame to pass
// (0: none told).
func idsPerFrame(maxFrame, maxInFlight int) int {
	if maxFrame <= 0 {
		maxFrame = protocol.DefaultMaxFrameSize
	}
	n := min(maxIDsPerFrame, (maxFrame-16)/10)
	if maxInFlight > 0 {
		n = min(n, maxInFlight)
	}
	return max(1, n)
}

// idRange is a run of count consecutive delivery ids from first.
type idRange struct{ first, count uint64 }

// appendID appends id to q, extending q's last run when id follows it.
func appendID(q []idRange, id uint64) []idRange {
	if n := len(q); n > 0 {
		if end := q[n-1].first + q[n-1].count; end == id && end != 0 {
			q[n-1].count++
			return q
		}
	}
	return append(q, idRange{id, 1})
}

// batch is the writer's side of the queues, plus frames reused for every
// write so that a batch allocates nothing.
type batch struct {
	acks, nacks, touches []idRange
	pongs                []uint64
	ids, ranges          []uint64 // the fields of the frame being written
	later                []laterNack
	laterQ               []idRange // a run of later's of the same delay and reason

	ack        *protocol.Frame_Ack
	nack       *protocol.Frame_Nack
	touch      *protocol.Frame_Touch
	pong       *protocol.Frame_Pong
	ackFrame   *protocol.Frame
	nackFrame  *protocol.Frame
	touchFrame *protocol.Frame
	pongFrame  *protocol.Frame
}

func newBatch() *batch {
	b := &batch{
		ack:   &protocol.Frame_Ack{Ack: &protocol.Ack{}},
		nack:  &protocol.Frame_Nack{Nack: &protocol.Nack{}},
		touch: &protocol.Frame_Touch{Touch: &protocol.Touch{}},
		pong:  &protocol.Frame_Pong{Pong: &protocol.Pong{}},
	}
	b.ackFrame = &protocol.Frame{Body: b.ack}
	b.nackFrame = &protocol.Frame{Body: b.nack}
	b.touchFrame = &protocol.Frame{Body: b.touch}
	b.pongFrame = &protocol.Frame{Body: b.pong}
	return b
}

// cut fills b.ids and b.ranges with the ids of one frame from the front of
// q, naming at most max ids, and returns the rest of q. With ranges, runs
// of two ids or more go as ranges (a pair of values: the first id, the
// count) and single ids in the list; without, every id goes in the list.
// Either way a frame takes at most 10 bytes per id named.
func (b *batch) cut(q []idRange, max int, ranges bool) []idRange {
	b.ids, b.ranges = b.ids[:0], b.ranges[:0]
	room := uint64(max)
	for len(q) > 0 && room > 0 {
		r := q[0]
		take := min(r.count, room)
		switch {
		case ranges && take >= 2:
			b.ranges = append(b.ranges, r.first, take)
		default:
			for k := range take {
				b.ids = append(b.ids, r.first+k)
			}
		}
		room -= take
		if take < r.count {
			q[0] = idRange{r.first + take, r.count - take}
			break
		}
		q = q[1:]
	}
	return q
}

// take swaps the session's queues with the batch's emptied slices, so the
// two sets of buffers alternate and neither side allocates once warm.
// s.mu must be held.
func (b *batch) take(s *session) {
	b.acks, s.acks = s.acks, b.acks[:0]
	b.nacks, s.nacks = s.nacks, b.nacks[:0]
	b.touches, s.touches = s.touches, b.touches[:0]
	b.pongs, s.pongs = s.pongs, b.pongs[:0]
	clear(b.later)
	b.later, s.later = s.later, b.later[:0]
}
