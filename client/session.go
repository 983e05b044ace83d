package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nanoservice/core-fanout/protocol"
	"github.com/sirupsen/logrus"
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
	log     *logrus.Entry

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
	acks    []uint64
	nacks   []uint64
	touches []uint64
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
		log:          c.log.WithFields(logrus.Fields{"addr": addr, "node": w.GetNodeId(), "session": w.GetSessionId()}),
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

// release counts one message handed to Messages as done, waking a draining
// writer when it was the last.
func (s *session) release() {
	if s.held.Add(-1) == 0 && s.draining.Load() {
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

// laterNack is a nack with a delay or a reason: each distinct pair is a
// Nack frame of its own.
type laterNack struct {
	id     uint64
	delay  time.Duration
	reason string
}

// enqueueNack queues a nack with a delay or a reason and wakes the writer.
func (s *session) enqueueNack(id uint64, delay time.Duration, reason string) error {
	s.mu.Lock()
	if s.ended != nil {
		err := s.ended
		s.mu.Unlock()
		return err
	}
	s.later = append(s.later, laterNack{id: id, delay: delay, reason: reason})
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
	switch o {
	case opAck:
		s.acks = append(s.acks, id)
	case opNack:
		s.nacks = append(s.nacks, id)
	case opTouch:
		s.touches = append(s.touches, id)
	}
	s.mu.Unlock()
	s.signal()
	return nil
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
	for {
		if s.closing.Load() {
			_ = s.nc.SetReadDeadline(time.Unix(0, s.lingerUntil.Load()))
		} else if s.liveness > 0 && s.r.Buffered() == 0 {
			_ = s.nc.SetReadDeadline(time.Now().Add(s.liveness))
			if s.closing.Load() { // the writer may have set the linger deadline meanwhile
				_ = s.nc.SetReadDeadline(time.Unix(0, s.lingerUntil.Load()))
			}
		}
		if err := s.r.ReadFrame(&f); err != nil {
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
		switch b := f.Body.(type) {
		case *protocol.Frame_Deliver:
			if err := s.deliver(ctx, b.Deliver); err != nil {
				return err
			}
		case *protocol.Frame_Ping:
			s.mu.Lock()
			s.pongs = append(s.pongs, b.Ping.GetNonce())
			s.mu.Unlock()
			s.signal()
		case *protocol.Frame_Pong:
			// Any frame counts as a sign of life.
		case *protocol.Frame_Goodbye:
			// The daemon sends nothing more but takes acks until it closes.
			s.log.WithField("reason", b.Goodbye.GetReason()).Info("daemon said goodbye")
		case *protocol.Frame_Error:
			rerr := protocol.NewRemoteError(b.Error)
			if rerr.Fatal {
				return fmt.Errorf("daemon %s: %w", s.addr, rerr)
			}
			s.log.WithError(rerr).Warn("daemon reported an error")
		case *protocol.Frame_Redirect:
			return &redirectError{addr: b.Redirect.GetLeaderAddress()}
		case *protocol.Frame_Members:
			s.c.event(event{kind: evMembers, link: s.link, sess: s, members: protocol.Addresses(b.Members.GetMembers())})
		default:
			s.log.Warnf("ignoring unexpected %T frame", b)
		}
	}
}

// deliver hands one delivery to Messages. The channel holds the in-flight
// limit, so this blocks only if the daemon overruns it, the session ends, or
// other sessions' messages fill it. A retiring session passes no delivery
// on: it gives each back (giveBack).
func (s *session) deliver(ctx context.Context, d *protocol.Deliver) error {
	// Counted before draining is read, and retire sets draining before the
	// writer reads held: either this delivery is given back, or the writer
	// waits for it to be acked.
	s.held.Add(1)
	if s.draining.Load() {
		s.giveBack(d)
		return nil
	}
	m := &Message{
		Partition:  d.GetPartition(),
		Offset:     d.GetOffset(),
		Key:        d.GetKey(),
		Value:      d.GetValue(),
		Timestamp:  time.UnixMilli(d.GetTimestampMs()),
		Attempt:    int(d.GetAttempt()),
		DeliveryID: d.GetDeliveryId(),
		Observed:   s.welcome.GetObserver(),
		sess:       s,
	}
	if hs := d.GetHeaders(); len(hs) > 0 {
		m.Headers = make([]Header, len(hs))
		for i, h := range hs {
			m.Headers[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
		}
	}
	select {
	case s.c.msgs <- m:
		return nil
	default:
	}
	s.log.Debug("Messages is full; waiting for the consumer")
	select {
	case s.c.msgs <- m:
	case <-ctx.Done(): // Close: the daemon redelivers it
	case <-s.quit:
	case <-s.drain:
		s.giveBack(d)
	}
	return nil
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
// that timeout), and hold its partition's commit meanwhile. Like the
// timeout, the nack counts as a failed attempt at the daemon. A record is
// given back once per session: when it comes back to this session, no
// other client of the daemon had room, and a nack would only bounce it
// between the two (a failed attempt each time) until the session ends; it
// is dropped then, as before, and comes again after the Goodbye. An
// observer's copy needs nothing; a session that ended cannot nack (the
// daemon redelivers what it had in flight anyway).
func (s *session) giveBack(d *protocol.Deliver) {
	if !s.welcome.GetObserver() {
		r := record{d.GetPartition(), d.GetOffset()}
		s.mu.Lock()
		nack := s.ended == nil && !s.givenBack[r]
		if nack {
			if s.givenBack == nil {
				s.givenBack = map[record]bool{}
			}
			s.givenBack[r] = true
			s.later = append(s.later, laterNack{id: d.GetDeliveryId(), reason: retiringReason})
		}
		s.mu.Unlock()
		if nack {
			s.signal()
		}
	}
	s.release() // after the nack is queued: it is sent before the Goodbye
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
			s.log.WithField("held", s.held.Load()).Warn("retired session: messages not acked within the ack timeout; they come again")
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
		if ended == ErrClosed {
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
		ids *[]uint64
		set func([]uint64)
		f   *protocol.Frame
	}{
		{&b.acks, func(ids []uint64) { b.ack.Ack.DeliveryIds = ids }, b.ackFrame},
		{&b.nacks, func(ids []uint64) { b.nack.Nack.DeliveryIds = ids }, b.nackFrame},
		{&b.touches, func(ids []uint64) { b.touch.Touch.DeliveryIds = ids }, b.touchFrame},
	} {
		ids := *part.ids
		for len(ids) > 0 {
			n := min(len(ids), s.maxIDs)
			part.set(ids[:n])
			if err := s.w.WriteFrame(part.f); err != nil {
				return err
			}
			ids = ids[n:]
		}
	}
	// Nacks with a delay or a reason: one frame per run of the same pair.
	for i := 0; i < len(b.later); {
		j, ids := i, b.laterIDs[:0]
		for ; j < len(b.later) && b.later[j].delay == b.later[i].delay && b.later[j].reason == b.later[i].reason && len(ids) < s.maxIDs; j++ {
			ids = append(ids, b.later[j].id)
		}
		b.laterIDs = ids
		if err := s.w.WriteFrame(protocol.NackWithFrame(ids, b.later[i].delay, b.later[i].reason)); err != nil {
			return err
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

// batch is the writer's side of the queues, plus frames reused for every
// write so that a batch allocates nothing.
type batch struct {
	acks, nacks, touches, pongs []uint64
	later                       []laterNack
	laterIDs                    []uint64

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
