package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// outItem is one entry of a connection's outbox: a control frame, a Pong
// (kept as its nonce: a flood of Pings queues no frames), or the deliveries
// handed over by one Send.
type outItem struct {
	frame  *protocol.Frame
	ds     []dispatch.Delivery
	nonce  uint64
	isPong bool
}

// What the outbox charges its entries against Config.MaxOutboxBytes: the
// memory a control entry holds, an upper bound. A Pong is at most 13 bytes
// of protobuf after the prefix.
const (
	outItemSize = int(unsafe.Sizeof(outItem{}))
	pongCost    = outItemSize + protocol.HeaderSize + 13
	// frameOverhead bounds the Go structs around a control frame's bytes.
	frameOverhead = 128
)

// The outbox holds two kinds of entries, bounded differently:
//
//   - Deliveries are bounded by credit: the dispatcher never has more than
//     the client's in-flight limit outstanding on it. Their payload is the
//     dispatcher's message, held until acked wherever the delivery waits,
//     so they are not charged to the outbox.
//   - Control frames (Welcome, Pong, Goodbye) are what a client can make
//     the daemon queue by sending frames and not reading. They are charged
//     what they hold; when one more would take the outbox past
//     Config.MaxOutboxBytes it is dropped and the pump closes the connection
//     as a slow consumer.
//
// Whatever is queued must be written within WriteTimeout of being queued:
// the pump gives the whole batch one write deadline, the time the oldest
// entry was queued plus WriteTimeout, so a client reading a trickle is
// dropped even though each write call makes progress.

// MaxFrameSize implements dispatch.LimitedSink: the largest frame the
// client said it accepts. The dispatcher asks it at Join, after the Hello.
func (c *conn) MaxFrameSize() int { return c.maxFrame }

// Weight implements dispatch.WeightedSink: the client's Hello.weight, or
// the default.
func (c *conn) Weight() int { return c.weight }

// observerCopy is what a copy queued for an observer is charged beside its
// payload: the delivery and its frame's fields.
const observerCopy = 64

// DeliverFrameSize is dispatch.Config.FrameSize for this server: an upper
// bound of the bytes (length prefix excluded) of the Deliver frame that
// carries m, whatever its delivery id and attempt.
func DeliverFrameSize(m *dispatch.Message) int {
	field := func(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }
	n := 1 + 10 + // delivery_id
		1 + protowire.SizeVarint(uint64(int64(m.Partition))) +
		1 + protowire.SizeVarint(uint64(m.Offset)) +
		field(len(m.Key)) + field(len(m.Value)) +
		1 + 10 + // timestamp_ms
		1 + 5 // attempt
	for _, h := range m.Headers {
		key := len(h.Key)
		if !utf8.ValidString(h.Key) {
			key *= 3 // each invalid byte becomes at most one U+FFFD
		}
		n += field(field(key) + field(len(h.Value)))
	}
	return field(n)
}

// Send queues deliveries for the pump. It never blocks and never touches
// the socket. Deliveries sent after the connection started closing are
// dropped: the backend redelivers them after Leave. An observer's copies
// are charged against MaxObserverBytes: one batch more than it allows
// closes the observer instead (it fell behind), so that it never holds
// payloads the clients have acked for long.
func (c *conn) Send(ds []dispatch.Delivery) {
	if len(ds) == 0 {
		return
	}
	if !c.observer {
		c.enqueue(outItem{ds: ds}, 0)
		return
	}
	cost := 0
	for i := range ds {
		cost += observerCopy + ds[i].Msg.Size()
	}
	c.mu.Lock()
	behind := c.obsBehind.Load() || c.obsBytes+cost > c.s.cfg.MaxObserverBytes
	if !behind {
		c.obsBytes += cost
	}
	c.mu.Unlock()
	if behind {
		// close calls the backend's Leave, which the dispatcher's goroutine
		// (our caller) must not wait for: the pump closes, after aborting
		// the write it may be blocked in.
		if !c.obsBehind.Swap(true) {
			_ = c.nc.SetWriteDeadline(time.Now())
			c.wake()
		}
		return
	}
	c.enqueue(outItem{ds: ds}, 0)
}

// Goodbye queues a Goodbye frame. The connection stays open so that acks
// still arrive; the dispatcher sends nothing after it.
func (c *conn) Goodbye(reason string) { c.queue(protocol.GoodbyeFrame(reason)) }

var _ dispatch.DisconnectSink = (*conn)(nil)

// Disconnect has the pump close the connection once it has written what
// was queued before (the dispatcher drained the client: it said Goodbye,
// and the client holds nothing or kept it too long). Like Send it runs on
// the dispatcher's goroutine, which must not call close (it calls back into
// the backend): the pump closes.
func (c *conn) Disconnect(string) {
	if !c.drained.Swap(true) {
		c.wake()
	}
}

// queue queues a control frame for the pump.
func (c *conn) queue(f *protocol.Frame) {
	c.enqueue(outItem{frame: f}, outItemSize+frameOverhead+proto.Size(f))
}

// queueLocked is queue with c.mu held; it reports whether the pump must be
// woken (after c.mu is released).
func (c *conn) queueLocked(f *protocol.Frame) (wake bool) {
	return c.enqueueLocked(outItem{frame: f}, outItemSize+frameOverhead+proto.Size(f))
}

// membersChanged makes f, a Members frame, the list to write next, in place
// of any list not yet written: only the latest list matters. It does
// nothing for a client that did not announce CAPABILITY_MEMBERS or is not
// welcomed yet (its Welcome will carry the list). f is shared by every
// connection and never modified, so it is not charged to MaxOutboxBytes:
// a connection holds one pointer to it at most. Like every queued frame it
// must be written within WriteTimeout.
func (c *conn) membersChanged(f *protocol.Frame) {
	c.mu.Lock()
	if !c.wantMembers || c.closing.Load() || c.overflow {
		c.mu.Unlock()
		return
	}
	wasEmpty := c.emptyLocked()
	if wasEmpty {
		c.outSince = time.Now()
	}
	c.members = f
	c.mu.Unlock()
	if wasEmpty {
		c.wake()
	}
}

// emptyLocked reports whether the pump has nothing to write. c.mu must be
// held.
func (c *conn) emptyLocked() bool { return len(c.out) == 0 && c.members == nil }

// pong queues the answer to a client's Ping.
func (c *conn) pong(nonce uint64) { c.enqueue(outItem{nonce: nonce, isPong: true}, pongCost) }

// enqueue appends to the outbox, charging cost against MaxOutboxBytes, and
// wakes the pump when the outbox was empty: the pump empties the whole
// outbox whenever it wakes, so one signal per empty-to-non-empty transition
// is enough. An entry that would pass the bound is dropped and the pump is
// told to close the connection: enqueue runs on the dispatcher's goroutine
// too, which must not call close (it calls back into the backend).
func (c *conn) enqueue(it outItem, cost int) {
	c.mu.Lock()
	wake := c.enqueueLocked(it, cost)
	c.mu.Unlock()
	if wake {
		c.wake()
	}
}

// enqueueLocked is enqueue with c.mu held; it reports whether the pump must
// be woken (after c.mu is released).
func (c *conn) enqueueLocked(it outItem, cost int) (wake bool) {
	if c.closing.Load() || c.overflow {
		return false
	}
	wasEmpty := c.emptyLocked()
	if c.outBytes+cost > c.s.cfg.MaxOutboxBytes {
		c.overflow = true
		return true
	}
	if wasEmpty {
		c.outSince = time.Now()
	}
	c.out = append(c.out, it)
	c.outBytes += cost
	return wasEmpty
}

// errClosing aborts writes once the connection is closing.
var errClosing = errors.New("connection closing")

// deadlineWriter writes to the socket under the deadline the pump set for
// the current batch, and fails writes once the connection is closing
// (except the final frame's).
type deadlineWriter struct {
	c        *conn
	nc       net.Conn // where the bytes go: c.nc, or c.raw for a plain-text final frame
	deadline time.Time
	final    bool
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if err := w.arm(); err != nil {
		return 0, err
	}
	return w.nc.Write(p)
}

// arm sets the batch's write deadline, or fails once the connection is
// closing (except for the final frame).
func (w *deadlineWriter) arm() error {
	if !w.final && w.c.closing.Load() {
		return errClosing
	}
	if err := w.nc.SetWriteDeadline(w.deadline); err != nil {
		return err
	}
	// close sets closing before it resets the deadline, and an observer
	// falling behind sets obsBehind; checking again after ours was set
	// means neither can be missed.
	if !w.final && (w.c.closing.Load() || w.c.obsBehind.Load()) {
		return errClosing
	}
	return nil
}

// WriteBuffers implements protocol.BuffersWriter: the pieces of a vector
// Writer go to the socket in one writev, under the same deadline and
// checks as Write.
func (w *deadlineWriter) WriteBuffers(b *net.Buffers) (int64, error) {
	if err := w.arm(); err != nil {
		return 0, err
	}
	return b.WriteTo(w.nc)
}

// Batches of deliveries for clients with CAPABILITY_BATCH. The pump writes
// everything queued when it wakes; consecutive deliveries share DeliverBatch
// frames of at most batchBytes (and the client's max_frame_size), so a
// batch is what is ready at that moment: nothing waits to fill one.
const (
	// batchBytes bounds a DeliverBatch frame: large enough that the frame's
	// own cost (a read, an allocation and a wake-up in the client) is
	// small beside its messages', small enough that the client starts on
	// the first message soon.
	batchBytes = 256 << 10
	// batchWindow is the most deliveries prepared at once for
	// WriteDeliverBatch (the Deliver messages are reused).
	batchWindow = 512
)

// pumpState is owned by the pump goroutine: the writer and the messages
// reused to encode every Deliver, Ping and Pong.
type pumpState struct {
	dw      deadlineWriter
	w       *protocol.Writer
	batch   bool                // the client reads DeliverBatch frames; set with the Welcome
	msgs    []*protocol.Deliver // reused for every delivery, one per delivery of a window
	headers [][]*protocol.Header
	used    int                 // msgs filled since the last release
	pending []dispatch.Delivery // deliveries waiting for a DeliverBatch frame
	pframe  *protocol.Frame     // a Ping
	pong    *protocol.Frame     // a Pong
	live    liveness            // judges the client's silence at each tick
	// since is when the oldest frame not yet written was queued (zero when
	// everything is written); the writes must end by since + WriteTimeout.
	since time.Time
}

// liveness judges, at each heartbeat tick, whether the client has been
// silent too long. A tick that comes late (more than 1.5 heartbeats after
// the previous one) means this daemon itself was not running: a pause (GC,
// SIGSTOP, a VM frozen) or a starved goroutine. The frames the client sent
// meanwhile wait unread in the socket, and the reader has not had its turn
// yet, so such a tick judges nothing; the next one does. Only one tick in a
// row is let go, so a daemon starved for good still drops dead clients.
type liveness struct {
	lastTick time.Time // the previous tick, or when the ticker started; zero: none
	skipped  bool      // the previous tick came late and judged nothing
}

// silence returns how long the client has been silent at now, given the
// time it was last heard from, and whether that makes it dead: longer than
// window, judged at a tick that did not come late.
func (l *liveness) silence(now, lastSeen time.Time, heartbeat, window time.Duration) (time.Duration, bool) {
	late := !l.lastTick.IsZero() && now.Sub(l.lastTick) > heartbeat*3/2
	l.lastTick = now
	if late && !l.skipped {
		l.skipped = true
		return 0, false
	}
	l.skipped = false
	silent := now.Sub(lastSeen)
	return silent, silent > window
}

// writer returns the connection's Writer, created at the first write, so
// that a connection that never says hello holds no write buffer. On a TCP
// connection it is a vector Writer: the values of the messages delivered
// go from the buffers they were fetched in to the socket, with the frames'
// other bytes, in one writev per flush. Over TLS, which encrypts every
// write in records of its own, and on other connections, whose writes of a
// list of buffers are one write per buffer, the frames are copied into a
// buffer first.
func (p *pumpState) writer() *protocol.Writer {
	if p.w == nil {
		// Until the Welcome, frames are limited only by the 4-byte length
		// prefix; then by the client's max_frame_size (writeBatch).
		if _, tcp := p.dw.nc.(*net.TCPConn); tcp {
			p.w = protocol.NewVectorWriter(&p.dw, math.MaxInt)
		} else {
			p.w = protocol.NewWriter(&p.dw, math.MaxInt)
		}
	}
	return p.w
}

// pump is the connection's only writer. It waits for the outbox to fill or
// the heartbeat to tick, writes everything queued, and flushes once per
// batch. After close it writes the final frame, if any, and closes the socket.
func (c *conn) pump() {
	p := &pumpState{dw: deadlineWriter{c: c, nc: c.nc}, pframe: protocol.PingFrame(0), pong: protocol.PongFrame(0)}
	clean := c.pumpLoop(p)
	c.finish(p, clean)
}

// pumpLoop runs until the connection closes. It returns true when the
// stream is between frames, so that a final frame can still be written.
func (c *conn) pumpLoop(p *pumpState) bool {
	cfg := &c.s.cfg
	window := time.Duration(cfg.Liveness) * cfg.Heartbeat
	// tick stays nil, and no Ping is sent, until the Welcome is written.
	var tick <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	var spare []outItem
	for {
		select {
		case <-c.closed:
			return true
		case <-c.signal:
		case <-tick:
			if silent, dead := p.live.silence(time.Now(), time.Unix(0, c.lastSeen.Load()), cfg.Heartbeat, window); dead {
				c.close(closeDead, fmt.Errorf("no frame for %v (liveness window %d x %v)",
					silent.Round(time.Millisecond), cfg.Liveness, cfg.Heartbeat), nil)
				return true
			}
			p.pframe.GetPing().Nonce++
			if err := p.writer().WriteFrame(p.pframe); err != nil {
				c.writeFailed(err, p)
				return false
			}
			if p.since.IsZero() {
				p.since = time.Now()
			}
		}
		if c.closing.Load() {
			// Prefer the close over more work; finish waits for close to
			// complete. The writer holds only whole frames (a Ping at most).
			return true
		}
		c.mu.Lock()
		batch, members, since, overflow, behind := c.out, c.members, c.outSince, c.overflow, c.obsBehind.Load()
		c.out, c.outBytes, c.obsBytes, c.members = spare[:0], 0, 0, nil
		c.mu.Unlock()
		if overflow {
			c.close(closeSlow, fmt.Errorf("more than %d bytes of control frames queued and not read (--max-outbox-bytes)",
				cfg.MaxOutboxBytes), nil)
			return true
		}
		if behind {
			c.close(closeObserverBehind, fmt.Errorf("an observer fell behind: more than %d bytes of copies queued and not written (--max-observer-bytes)",
				cfg.MaxObserverBytes), nil)
			return true
		}
		if (len(batch) > 0 || members != nil) && (p.since.IsZero() || since.Before(p.since)) {
			p.since = since
		}
		p.dw.deadline = p.since.Add(cfg.WriteTimeout)
		welcomed, err := p.writeBatch(batch)
		if err == nil && members != nil {
			err = c.writeMembers(p, members)
		}
		clear(batch) // drop references to the messages
		spare = batch[:0]
		if err == nil && p.w != nil && p.w.Buffered() > 0 {
			err = p.w.Flush()
		}
		if err != nil {
			// An oversized frame is refused before any of its bytes are
			// buffered: the stream is still between frames.
			var tooLarge *protocol.FrameTooLargeError
			c.writeFailed(err, p)
			return errors.As(err, &tooLarge)
		}
		p.since = time.Time{}
		if c.drained.Load() {
			c.close(closeDrained, errors.New("drained: the client's session ends"), nil)
			return true
		}
		if welcomed && tick == nil {
			ticker = time.NewTicker(cfg.Heartbeat)
			tick = ticker.C
			p.live.lastTick = time.Now() // a pause before the first tick makes it late too
		}
	}
}

// writeMembers writes a Members frame after the batch that held the
// Welcome or a later one. A list that does not fit the client's
// max_frame_size is not sent (logged): the client keeps the list it has.
func (c *conn) writeMembers(p *pumpState, f *protocol.Frame) error {
	if size := proto.Size(f); size > c.maxFrame {
		c.log.Warnf("a member list of %d bytes does not fit the client's max_frame_size %d: not sent", size, c.maxFrame)
		return nil
	}
	return p.writer().WriteFrame(f)
}

// writeFailed closes the connection after a write error: a timeout means the
// client does not read fast enough.
func (c *conn) writeFailed(err error, p *pumpState) {
	var tooLarge *protocol.FrameTooLargeError
	if errors.As(err, &tooLarge) {
		// The dispatcher sends a client only messages that fit it.
		c.close(closeInternal, fmt.Errorf("a delivery larger than the client accepts reached the pump: %w", err),
			protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_INTERNAL, true, "internal error"))
		return
	}
	if c.obsBehind.Load() {
		c.close(closeObserverBehind, fmt.Errorf("an observer fell behind: more than %d bytes of copies queued and not written (--max-observer-bytes)",
			c.s.cfg.MaxObserverBytes), nil)
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.close(closeSlow, fmt.Errorf("frames queued %v ago not yet read (--write-timeout %v): %w",
			time.Since(p.since).Round(time.Millisecond), c.s.cfg.WriteTimeout, err), nil)
		return
	}
	c.close(closeDisconnect, err, nil)
}

// writeBatch encodes a batch into the writer. It reports whether the batch
// held the Welcome.
func (p *pumpState) writeBatch(batch []outItem) (welcomed bool, err error) {
	defer p.release()
	for i := range batch {
		it := &batch[i]
		if it.ds != nil {
			if !p.batch {
				for j := range it.ds {
					if err := p.writeDelivery(&it.ds[j]); err != nil {
						return welcomed, err
					}
				}
				continue
			}
			// Deliveries of consecutive entries share frames.
			p.pending = append(p.pending, it.ds...)
			continue
		}
		if err := p.writePending(); err != nil {
			return welcomed, err
		}
		if it.isPong {
			p.pong.GetPong().Nonce = it.nonce
			if err := p.writer().WriteFrame(p.pong); err != nil {
				return welcomed, err
			}
			continue
		}
		if it.frame.GetWelcome() != nil {
			welcomed = true
			// From here on frames are Deliveries, which the client
			// takes up to the size it announced, in batches if it said
			// so.
			p.writer().SetMaxFrameSize(p.dw.c.maxFrame)
			p.batch = p.dw.c.batch
		}
		if err := p.writer().WriteFrame(it.frame); err != nil {
			return welcomed, err
		}
	}
	return welcomed, p.writePending()
}

// writePending writes the pending deliveries in DeliverBatch frames of at
// most batchBytes, batchWindow deliveries prepared at a time. A delivery
// that does not fit a DeliverBatch frame alone (one close to the client's
// max_frame_size) goes in a Deliver frame, a few bytes smaller.
func (p *pumpState) writePending() error {
	ds := p.pending
	defer func() {
		clear(p.pending) // drop references to the messages
		p.pending = p.pending[:0]
	}()
	for len(ds) > 0 {
		window := ds[:min(len(ds), batchWindow)]
		ds = ds[len(window):]
		msgs := p.fill(window)
		for len(msgs) > 0 {
			n, err := p.writer().WriteDeliverBatch(msgs, batchBytes)
			var tooLarge *protocol.FrameTooLargeError
			if n == 0 && errors.As(err, &tooLarge) {
				n, err = 1, p.writer().WriteDeliver(msgs[0])
			}
			if err != nil {
				return err
			}
			msgs = msgs[n:]
		}
		p.release()
	}
	return nil
}

// fill fills reused Deliver messages with ds, from the first not used since
// the last release.
func (p *pumpState) fill(ds []dispatch.Delivery) []*protocol.Deliver {
	first := p.used
	for i := range ds {
		p.fillOne(&ds[i])
	}
	return p.msgs[first:p.used]
}

// fillOne fills the next reused Deliver message with one delivery.
func (p *pumpState) fillOne(d *dispatch.Delivery) *protocol.Deliver {
	i := p.used
	p.used++
	if i == len(p.msgs) {
		p.msgs = append(p.msgs, &protocol.Deliver{})
		p.headers = append(p.headers, nil)
	}
	dv := p.msgs[i]
	dv.DeliveryId, dv.Attempt = d.ID, d.Attempt
	if m := d.Msg; m != nil {
		// The payload as delivered: the dispatcher may point the
		// message's fields at a copy meanwhile.
		key, value, headers := d.Payload()
		dv.Partition, dv.Offset, dv.Key, dv.Value = m.Partition, m.Offset, key, value
		dv.TimestampMs = 0
		if !m.Timestamp.IsZero() {
			dv.TimestampMs = m.Timestamp.UnixMilli()
		}
		dv.Headers = p.fillHeaders(i, headers)
	} else {
		dv.Partition, dv.Offset, dv.Key, dv.Value, dv.TimestampMs, dv.Headers = 0, 0, nil, nil, 0, nil
	}
	return dv
}

// writeDelivery encodes one delivery with WriteDeliver, which copies the
// payload once.
func (p *pumpState) writeDelivery(d *dispatch.Delivery) error {
	err := p.writer().WriteDeliver(p.fillOne(d))
	p.release()
	return err
}

// fillHeaders converts headers into the reused protocol.Header messages of
// message i. Keys that are not valid UTF-8 are repaired, because a proto3
// string must be valid UTF-8 and the frame would otherwise fail to encode.
func (p *pumpState) fillHeaders(i int, hs []dispatch.Header) []*protocol.Header {
	if len(hs) == 0 {
		return nil
	}
	for len(p.headers[i]) < len(hs) {
		p.headers[i] = append(p.headers[i], &protocol.Header{})
	}
	out := p.headers[i][:len(hs)]
	for j := range hs {
		key := hs[j].Key
		if !utf8.ValidString(key) {
			key = strings.ToValidUTF8(key, "\uFFFD")
		}
		out[j].Key, out[j].Value = key, hs[j].Value
	}
	return out
}

// release drops the reused messages' references to message payloads.
func (p *pumpState) release() {
	for i, dv := range p.msgs[:p.used] {
		dv.Key, dv.Value, dv.Headers = nil, nil, nil
		for _, h := range p.headers[i] {
			h.Value = nil
		}
	}
	p.used = 0
}

// finish ends the pump: after close has done its work it writes the final
// frame when the stream allows, half-closes, gives the client a short
// while to read it (reading and dropping what it sends, so that closing does
// not reset the connection under the unread frame), and closes the socket.
func (c *conn) finish(p *pumpState, clean bool) {
	<-c.closed
	c.mu.Lock()
	final, onRaw, answer := c.final, c.finalRaw, c.finalHTTP
	c.mu.Unlock()
	nc := c.nc
	if onRaw {
		// The TLS handshake failed: nothing was written through nc.
		nc, p.dw.nc, p.w = c.raw, c.raw, nil
	}
	if clean && (final != nil || onRaw || answer != nil) {
		var err error
		switch {
		case answer != nil:
			// An HTTP client: nothing else was written to it.
			_ = nc.SetWriteDeadline(time.Now().Add(min(lingerTimeout, c.s.cfg.WriteTimeout)))
			_, err = nc.Write(answer)
		case final != nil:
			p.dw.final, p.dw.deadline = true, time.Now().Add(min(lingerTimeout, c.s.cfg.WriteTimeout))
			if p.w == nil {
				// Nothing written yet (a rejected or evicted connection): a
				// small buffer for the one frame.
				p.w = protocol.NewWriterSize(&p.dw, math.MaxInt, finalWrite)
			}
			err = p.writer().WriteFrame(final)
			if err == nil {
				err = p.writer().Flush()
			}
		}
		if cw, ok := nc.(interface{ CloseWrite() error }); ok && err == nil && cw.CloseWrite() == nil {
			<-c.readerDone // the reader stopped at close's read deadline
			_ = nc.SetReadDeadline(time.Now().Add(lingerTimeout))
			_, _ = io.Copy(io.Discard, io.LimitReader(nc, lingerBytes))
		}
	}
	_ = nc.Close()
}
