package dispatch

import "github.com/nanoservice/core-fanout/fanout/deliverylog"

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

// toDeadLetter hands m, which failed maxAttempts times and is counted in
// bytes, to the dead-letter producer.
func (s *state) toDeadLetter(m *Message) {
	if s.trace != nil {
		s.traceMessage(deliverylog.DeadLetter, m, m.failed)
	}
	s.deadPending++
	s.deadLetter.Send(DeadLetterRecord{
		Msg:         m,
		Attempts:    m.failed,
		LastFailure: RedeliverReasons[m.failure],
		Reason:      m.reason,
	})
}

// deadLettered takes the messages the DeadLetter stored: each is done, as if
// acked, and its key goes on.
func (s *state) deadLettered(ms []*Message) {
	for _, m := range ms {
		if s.trace != nil {
			s.traceMessage(deliverylog.DeadLettered, m, m.failed)
		}
		s.deadPending--
		s.bytes -= m.Size()
		s.stats.DeadLettered++
		s.countAttempts(m.failed)
		s.tracker.AckIn(m.Partition, m.Offset, m.gen)
		if m.keyHash != 0 {
			s.keyDone(m)
		}
	}
}
