package client

import (
	"sync/atomic"
	"time"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Message is one delivery of a Kafka record. Ack, Nack and Touch are safe to
// call from any goroutine; the other fields must not be modified.
type Message struct {
	Partition int32
	Offset    int64
	// Key is nil for a record without a key (Kafka's null key), and empty
	// but not nil for a record whose key is empty. (A daemon older than
	// this distinction sends an empty key as none.)
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time // the Kafka record timestamp
	// Attempt is 1 for the first delivery by the daemon, then 2, 3, ...
	Attempt int
	// DeliveryID names this delivery to the daemon that made it.
	DeliveryID uint64
	// Observed is set on the copies an observer (Config.Observe) receives:
	// Ack, Nack and Touch do nothing on them and return nil.
	Observed bool

	sess *session
	done atomic.Bool // acked or nacked
}

// Ack tells the daemon the message is processed. It returns once the ack is
// queued; the connection's writer sends it, batched with others. An ack
// queued before the connection breaks may still be lost: the message is then
// delivered again. Ack returns ErrAlreadyAcked after a previous Ack or Nack,
// ErrStale if the message's connection has ended, and ErrClosed after Close;
// in those cases nothing is sent.
func (m *Message) Ack() error { return m.finish(opAck) }

// Nack gives the message back to the daemon for redelivery after the
// daemon's --retry-backoff (by default 1s, doubling with each failure of
// the message, at most 1m; at once with it off), possibly to another
// client. It fails like Ack.
func (m *Message) Nack() error { return m.finish(opNack) }

// NackWithDelay gives the message back for redelivery no earlier than d
// from now (rounded up to a millisecond; at most protocol.MaxNackDelay).
// The message waits at the daemon meanwhile, and holds its partition's
// committed offset. It fails like Ack.
func (m *Message) NackWithDelay(d time.Duration) error { return m.NackWith(d, "") }

// NackWith gives the message back for redelivery no earlier than d from now
// (0: at once), with a reason for the daemon's logs and, when the message
// ends in the dead-letter topic, its record (the daemon keeps
// protocol.MaxNackReason bytes). It fails like Ack.
func (m *Message) NackWith(d time.Duration, reason string) error {
	if d <= 0 && reason == "" {
		return m.Nack()
	}
	return m.nackLater(laterNack{id: m.DeliveryID, delay: d, reason: reason})
}

// giveBack nacks a message the application never received (Shutdown's),
// flagged unprocessed: a daemon that knows the flag does not count it as a
// failed attempt.
func (m *Message) giveBack() error {
	return m.nackLater(laterNack{id: m.DeliveryID, reason: shutdownReason, unprocessed: true})
}

// shutdownReason is the reason of Shutdown's nacks of the messages nobody
// received.
const shutdownReason = "client shutting down: not processed"

// nackLater queues n, a nack with a delay, a reason or the unprocessed flag,
// for the message.
func (m *Message) nackLater(n laterNack) error {
	if m.Observed {
		return nil
	}
	if err := m.usable(); err != nil {
		return err
	}
	if !m.done.CompareAndSwap(false, true) {
		return ErrAlreadyAcked
	}
	err := m.sess.enqueueNack(n)
	m.sess.release(1) // as in finish: a retiring session waits for no nacked message
	return err
}

// Touch restarts the message's ack timeout on the daemon, for work that
// takes longer. It fails like Ack, and with ErrAlreadyAcked after Ack or Nack.
func (m *Message) Touch() error {
	if m.Observed {
		return nil
	}
	if err := m.usable(); err != nil {
		return err
	}
	if m.done.Load() {
		return ErrAlreadyAcked
	}
	return m.sess.enqueue(opTouch, m.DeliveryID)
}

func (m *Message) finish(op op) error {
	if m.Observed {
		return nil
	}
	if err := m.usable(); err != nil {
		return err
	}
	if !m.done.CompareAndSwap(false, true) {
		return ErrAlreadyAcked
	}
	err := m.sess.enqueue(op, m.DeliveryID)
	m.sess.release(1) // after the id is queued: a retiring session then sends it before its Goodbye
	return err
}

// Member returns the address (host:port) of the daemon whose session
// delivered the message: in spread mode, the member that owns its
// partition, as listed by the daemons; in leader mode, the leader.
func (m *Message) Member() string {
	if m.sess == nil {
		return ""
	}
	return m.sess.addr
}

// usable checks, without changing anything, that the message's connection
// still takes acks.
func (m *Message) usable() error {
	if m.sess == nil {
		return ErrStale
	}
	return m.sess.state()
}

// Batch is the messages of the delivery frames the client read together
// (one frame, or those that one read of the connection brought), in the
// order the daemon sent them, for a client with Config.Batches. Each
// message can be acked, nacked and touched on its own, or the whole batch
// at once: Ack, Nack and Touch of a Batch cost one lock and one frame on the
// wire, whose ids are few ranges (the daemon gives the deliveries of a frame
// consecutive ids).
//
// The messages' Key, Value and header values are slices of the memory the
// frames were read into, up to 1 MiB shared with the frames read before and
// after, which is never written again while anything references it: they
// stay valid as long as they are referenced (and keep that memory alive
// meanwhile: copy what you keep long after the batch is settled).
type Batch struct {
	Messages []*Message
	sess     *session
}

// Ack acks every message of the batch not yet acked or nacked, in one call.
// It returns ErrAlreadyAcked when there was none, and fails like
// Message.Ack otherwise: ErrStale when the batch's connection has ended,
// ErrClosed after Close; nothing is sent then.
func (b *Batch) Ack() error { return b.finish(opAck) }

// Nack gives back every message of the batch not yet acked or nacked, for
// redelivery at once. It fails like Ack.
func (b *Batch) Nack() error { return b.finish(opNack) }

// NackWith gives back every message of the batch not yet acked or nacked,
// as Message.NackWith does: for redelivery no earlier than d from now (0:
// at once), with a reason. The batch's consecutive ids go as one range,
// with one delay and reason. It fails like Ack.
func (b *Batch) NackWith(d time.Duration, reason string) error {
	if d <= 0 && reason == "" {
		return b.Nack()
	}
	return b.settle(func(s *session, id uint64) {
		s.later = append(s.later, laterNack{id: id, delay: d, reason: reason})
	})
}

// Touch restarts the ack timeout of every message of the batch not yet
// acked or nacked. It fails like Ack.
func (b *Batch) Touch() error {
	if b.observed() {
		return nil
	}
	s := b.session()
	if s == nil {
		return ErrStale
	}
	s.mu.Lock()
	if s.ended != nil {
		err := s.ended
		s.mu.Unlock()
		return err
	}
	n := 0
	for _, m := range b.Messages {
		if !m.done.Load() {
			s.queueLocked(opTouch, m.DeliveryID)
			n++
		}
	}
	s.mu.Unlock()
	if n == 0 {
		return ErrAlreadyAcked
	}
	s.signal()
	return nil
}

// Member returns the address (host:port) of the daemon whose session
// delivered the batch, as Message.Member does.
func (b *Batch) Member() string {
	if s := b.session(); s != nil {
		return s.addr
	}
	return ""
}

// observed reports whether the batch holds an observer's copies, which
// Ack, Nack and Touch leave alone, as on a Message.
func (b *Batch) observed() bool { return b != nil && len(b.Messages) > 0 && b.Messages[0].Observed }

func (b *Batch) session() *session {
	if b == nil {
		return nil
	}
	return b.sess
}

// finish acks or nacks the messages not yet done, queueing their ids under
// one lock.
func (b *Batch) finish(o op) error {
	return b.settle(func(s *session, id uint64) { s.queueLocked(o, id) })
}

// settle marks the messages not yet done done, and queues each one's id
// with queue, under s.mu.
func (b *Batch) settle(queue func(s *session, id uint64)) error {
	if b.observed() {
		return nil
	}
	s := b.session()
	if s == nil {
		return ErrStale
	}
	if err := s.state(); err != nil {
		return err
	}
	n := 0
	s.mu.Lock()
	ended := s.ended
	for _, m := range b.Messages {
		if m.done.CompareAndSwap(false, true) {
			if ended == nil {
				queue(s, m.DeliveryID)
			}
			n++
		}
	}
	s.mu.Unlock()
	if n == 0 {
		return ErrAlreadyAcked
	}
	if ended == nil {
		s.signal()
	}
	s.release(n) // after the ids are queued: a retiring session then sends them before its Goodbye
	return ended
}
