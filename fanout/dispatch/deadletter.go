package dispatch

import (
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// Max attempts and the dead-letter topic (Config.MaxAttempts,
// Config.DeadLetter). A message whose deliveries failed MaxAttempts times
// (ack timeouts, nacks, clients gone; counted across restarts and failovers
// through the stored progress) is not delivered again: it is handed to the
// DeadLetter, which produces it to the dead-letter topic. Until the
// DeadLetter reports it stored (acked by Kafka), it is buffered (it counts
// against MaxBuffered and MaxBufferedBytes), its partition's committed
// offset stays below it, and in key order its key stays held. So a
// dead-letter topic out of reach loses nothing: the partition's offset
// waits, and with it, once the buffer is full, fetching.
//
// A message that fits no joined client's frame limit (LimitedSink) waits
// in large for a client it fits; with a dead-letter topic, once it has
// fitted no joined client for MaxAttempts ack timeouts, it is failed for
// good and dead-lettered (FailureTooLarge) like a message out of attempts,
// so that its partition moves on (expireTooLarge, on the commit tick).

// DeadLetter takes the messages that failed Config.MaxAttempts times. It
// lives outside the dispatcher (the daemon's is a Kafka producer): the
// dispatcher only hands records over and learns which are stored.
type DeadLetter interface {
	// Send queues a record for the dead-letter topic. It is called from the
	// dispatcher's goroutine and must not block. The record must be stored
	// eventually, retrying as long as it takes; a record never stored holds
	// its partition's committed offset.
	Send(r DeadLetterRecord)
	// Stored yields the messages of records now stored, in batches.
	Stored() <-chan []*Message
}

// DeadLetterRecord is a message dead-lettered, with what is known of its
// failures, for the record's headers.
type DeadLetterRecord struct {
	Msg         *Message
	Attempts    uint32 // failed deliveries
	LastFailure string // why the last one failed: RedeliverReasons
	Reason      string // the reason of the last nack that gave one; may be empty
}

// FailureTooLarge is the DeadLetterRecord.LastFailure of a message
// dead-lettered because it fitted no joined client's frame limit for
// Config.MaxAttempts ack timeouts.
const FailureTooLarge = "too_large"

// toDeadLetter hands m, which failed maxAttempts times and is counted in
// bytes, to the dead-letter producer.
func (s *state) toDeadLetter(m *Message) {
	s.sendDeadLetter(m, RedeliverReasons[m.failure])
}

// sendDeadLetter hands m, counted in bytes, to the dead-letter producer,
// its last failure named lastFailure.
func (s *state) sendDeadLetter(m *Message, lastFailure string) {
	if s.trace != nil {
		s.traceMessage(deliverylog.DeadLetter, m, m.failed, lastFailure)
	}
	s.deadPending++
	if s.deadPendingBy == nil {
		s.deadPendingBy = map[int32]int{}
	}
	s.deadPendingBy[m.Partition]++
	s.deadLetter.Send(DeadLetterRecord{
		Msg:         m,
		Attempts:    m.failed,
		LastFailure: lastFailure,
		Reason:      m.reason,
	})
}

// expireTooLarge dead-letters, with a dead-letter topic, the messages of
// large that have fitted no joined client for longer than maxAttempts ack
// timeouts, and returns them. The time counts from when a message was first
// seen fitting none while clients were joined; a joined client that fits
// it, or no client at all, starts it again. It runs on the commit tick: a
// walk of large, which holds only the messages waiting for a bigger client.
func (s *state) expireTooLarge(now time.Time) []*Message {
	if s.maxAttempts == 0 || (s.large.len() == 0 && s.stuck == nil) {
		return nil
	}
	limit := time.Duration(s.maxAttempts) * s.ackTimeout
	var out []*Message
	var stuck map[*Message]time.Time
	var first *Message
	if s.large.len() > 0 {
		first = s.large.front().msg
	}
	s.large.filter(func(r retry) bool {
		m := r.msg
		if s.largestSize() < 0 || s.fitsAnyone(m) {
			return true
		}
		since, ok := s.stuck[m]
		if !ok {
			since = now
		}
		if now.Sub(since) > limit {
			out = append(out, m)
			return false
		}
		if stuck == nil {
			stuck = map[*Message]time.Time{}
		}
		stuck[m] = since
		return true
	})
	s.stuck = stuck
	if s.large.len() == 0 || s.large.front().msg != first {
		s.largeBlocked = false // a new first message
	}
	for _, m := range out {
		s.stats.TooLargeDeadLettered++
		s.sendDeadLetter(m, FailureTooLarge)
	}
	return out
}

// deadLettered takes the messages the DeadLetter stored: each is done, as if
// acked, and its key goes on.
func (s *state) deadLettered(ms []*Message) {
	for _, m := range ms {
		if s.trace != nil {
			s.traceMessage(deliverylog.DeadLettered, m, m.failed, "")
		}
		s.deadPending--
		if s.deadPendingBy[m.Partition]--; s.deadPendingBy[m.Partition] <= 0 {
			delete(s.deadPendingBy, m.Partition)
		}
		s.bytes -= m.Size()
		s.stats.DeadLettered++
		s.countAttempts(m.failed)
		s.tracker.AckIn(m.Partition, m.Offset, m.gen)
		if m.keyHash != 0 {
			s.keyDone(m)
		}
	}
}
