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

// Nack gives the message back to the daemon for redelivery at once (or
// after the daemon's --retry-backoff), possibly to another client. It fails
// like Ack.
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
	if m.Observed {
		return nil
	}
	if err := m.usable(); err != nil {
		return err
	}
	if !m.done.CompareAndSwap(false, true) {
		return ErrAlreadyAcked
	}
	return m.sess.enqueueNack(m.DeliveryID, d, reason)
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
	m.sess.release() // after the id is queued: a retiring session then sends it before its Goodbye
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
