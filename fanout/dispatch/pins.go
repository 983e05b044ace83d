package dispatch

import "time"

// Fetched memory the messages alias (Buffer). The source hands over
// messages whose Key, Value and header values are slices of what it
// fetched: a whole fetch response, or a record batch decompressed from
// one. Such a buffer stays in memory while any message aliases it, so one
// message held (in flight to a slow worker, waiting out a nack's delay,
// behind its key) keeps its whole buffer. The dispatcher counts what the
// messages it holds keep this way, and bounds it:
//
//   - pinned is the bytes of the buffers that messages the dispatcher holds
//     (buffered or in flight) alias: a buffer counts from the batch that
//     brings it until a scan finds no message of it left. Keeping the count
//     exact would take work at every place a message ends; a scan of the
//     messages held is cheap and runs only when it matters: on the commit
//     tick, and while pinned keeps fetching paused (at most once per
//     scanEvery).
//   - Fetching pauses while pinned reaches Config.MaxBufferedBytes, like the
//     payload of the buffered messages.
//   - When a scan finds pinned at the bound, the buffers that their
//     messages use less than half of are compacted: their messages' bytes
//     are copied into one new buffer each, of just those bytes, and the old
//     buffer is let go. So what is pinned is at most twice what the messages
//     hold, and fetching never waits for one message of an old buffer.
//
// Compaction writes the fields of messages that connections may be
// writing: a Delivery carries the payload as it was when delivered
// (Delivery.Payload), so a connection never reads those fields. Messages
// handed to the DeadLetter are copied first (its producer reads them), as
// are messages compaction would not find.

// scanEvery is how often, at most, the messages held are scanned while
// pinned keeps fetching paused.
const scanEvery = 10 * time.Millisecond

// holdBuffers counts the buffers of a batch just taken.
func (s *state) holdBuffers(bufs []*Buffer) {
	for _, b := range bufs {
		if b.scan != s.scanSeq {
			b.scan = s.scanSeq
			s.bufs = append(s.bufs, b)
			s.pinned += b.Size
		}
	}
}

// eachHeld calls fn with every message the dispatcher holds that may alias
// a buffer: buffered (fresh, redeliveries, unblocked, large, delayed,
// behind their key) and in flight. Messages handed to the DeadLetter are
// not among them (they own their bytes: toDeadLetter).
func (s *state) eachHeld(fn func(*Message)) {
	for i := range s.fresh.len() {
		fn(s.fresh.at(i))
	}
	for i := range s.unblocked.len() {
		fn(s.unblocked.at(i))
	}
	for i := range s.retries.len() {
		fn(s.retries.at(i).msg)
	}
	for i := range s.large.len() {
		fn(s.large.at(i).msg)
	}
	for _, d := range s.delays {
		fn(d.msg)
	}
	for _, g := range s.keys {
		for m := g.holder.keyNext; m != nil; m = m.keyNext {
			fn(m)
		}
	}
	for f := s.deadlines.first; f != nil; f = f.dnext {
		fn(f.msg)
	}
}

// scanBuffers counts again the buffers that messages held alias, and the
// bytes they use of each; when pinned is at least bound, it compacts the
// buffers used less than half. It returns pinned.
func (s *state) scanBuffers(bound int, now time.Time) int {
	s.lastScan = now
	s.scanSeq++
	found := s.bufs[:0]
	s.eachHeld(func(m *Message) {
		b := m.Buffer
		if b == nil {
			return
		}
		if b.scan != s.scanSeq {
			b.scan, b.live, b.to = s.scanSeq, 0, nil
			found = append(found, b)
		}
		b.live += m.Size()
	})
	clear(s.bufs[len(found):])
	s.bufs = found
	s.pinned = 0
	for _, b := range found {
		s.pinned += b.Size
	}
	if s.pinned < bound {
		return s.pinned
	}
	sparse := 0
	for _, b := range found {
		if 2*b.live < b.Size {
			b.to = &Buffer{Size: b.live, scan: s.scanSeq}
			b.arena = make([]byte, 0, b.live)
			sparse++
		}
	}
	if sparse == 0 {
		return s.pinned
	}
	s.eachHeld(func(m *Message) {
		if b := m.Buffer; b != nil && b.to != nil {
			m.Key, m.Value, m.Headers = b.copyOut(m)
			m.Buffer = b.to
		}
	})
	kept := found[:0]
	s.pinned = 0
	for _, b := range found {
		if b.to != nil {
			s.stats.Compacted += uint64(b.Size - b.to.Size)
			b = b.to
		}
		kept = append(kept, b)
		s.pinned += b.Size
	}
	for _, b := range found[len(kept):] {
		b.arena, b.to = nil, nil
	}
	clear(found[len(kept):])
	s.bufs = kept
	return s.pinned
}

// copyOut copies m's key, value and header values into b's arena, and
// returns the copies (headers in a slice of their own). The arena was made
// as large as the bytes b's messages use, so it never grows.
func (b *Buffer) copyOut(m *Message) (key, value []byte, headers []Header) {
	take := func(v []byte) []byte {
		if v == nil {
			return nil
		}
		start := len(b.arena)
		b.arena = append(b.arena, v...)
		return b.arena[start:len(b.arena):len(b.arena)]
	}
	key, value = take(m.Key), take(m.Value)
	if len(m.Headers) > 0 {
		headers = make([]Header, len(m.Headers))
		for i, h := range m.Headers {
			headers[i] = Header{Key: h.Key, Value: take(h.Value)}
		}
	}
	return key, value, headers
}

// ownBytes gives m bytes of its own, when it aliases a buffer: for a
// message that leaves the dispatcher's structures but not its care (handed
// to the DeadLetter).
func ownBytes(m *Message) {
	if m.Buffer == nil {
		return
	}
	b := &Buffer{arena: make([]byte, 0, m.Size())}
	m.Key, m.Value, m.Headers = b.copyOut(m)
	m.Buffer = nil
}
