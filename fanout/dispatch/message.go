// Package dispatch hands each message consumed from Kafka to exactly one
// connected client, round-robin among clients with room, and takes it back
// for another client when the ack does not come in time.
//
// One goroutine (Dispatcher.Run) owns all of the state: the buffer, the
// clients, the in-flight set and the offset tracker. Everything else talks to
// it through channels; see docs/architecture.md.
package dispatch

import "time"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Message is one Kafka record as the dispatcher sees it.
type Message struct {
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	// Buffer, when not nil, is the fetched memory that Key, Value and the
	// header values alias; nil: they have memory of their own.
	Buffer *Buffer

	gen   uint32 // the tracker generation of its partition when received
	frame int    // Config.FrameSize of the message, computed once when received; 0 when not configured

	// Delivery policies.
	failed   uint32   // failed deliveries so far, those before a restart included (Config.Progress)
	failure  uint8    // why the last one failed: a Redeliver* reason
	failedAt int64    // when the last one failed (Unix ns; Config.DisconnectWindow)
	reason   string   // the reason given by the last nack that gave one
	keyHash  uint64   // key ordering: its key's gate (keys.go); 0: unkeyed, or not in key order
	keyNext  *Message // key ordering: the next message of its key, waiting behind it
	// wait, in key order, is the due time (Unix ns) of a delay restored
	// with the message, which it waits out once it holds its key; 0: none
	// (restore.go).
	wait int64
}

// Size is the number of payload bytes the message holds, used for the
// buffer's byte bound.
func (m *Message) Size() int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Batch is what a Source sends: messages of one partition in offset order.
// When Start is >= 0 the partition (re)starts at that offset (its first
// start, or a restart after its offset went out of range): what the
// dispatcher holds of the partition at or above Start is forgotten, buffered
// messages dropped and deliveries no longer counted, as those offsets are
// fetched again or gone; unacked messages below Start stay outstanding and
// hold the partition's committable offset until acked. A Batch may carry a
// Start and no messages.
type Batch struct {
	Partition int32
	Start     int64
	Messages  []*Message

	// Anchor, on a Start batch whose offset the source resolved itself (from
	// a policy, or by resetting an offset out of range) rather than read from
	// the store, asks the dispatcher to store the partition's committable
	// offset at once, through its committer, and to close Anchor once it is
	// stored. The source sends none of the partition's messages before, so
	// that a crash after their delivery cannot move the partition's start.
	Anchor chan struct{}
	// Buffers lists every Buffer the messages alias (Message.Buffer), each
	// once; batches cut from one fetch share them.
	Buffers []*Buffer
}

// Buffer is fetched memory that messages alias: a fetch response, or a
// record batch decompressed from one. The source sets Size, its bytes, and
// never changes it after sending a batch that lists it; the rest is the
// dispatcher's (pins.go). While a message it holds aliases a buffer, the
// whole buffer counts against Config.MaxBufferedBytes.
type Buffer struct {
	Size int

	scan  uint64  // the dispatcher's scan that counted it last; 0: never counted
	live  int     // the payload bytes of the messages that scan found in it
	to    *Buffer // while compacting it: where its messages' bytes go
	arena []byte  // while compacting it: the memory of to
}

// Source is the stream of messages to dispatch, typically every partition of
// one Kafka topic.
type Source interface {
	// Batches delivers message batches; it is closed when the source stops.
	Batches() <-chan Batch
	// Pause stops fetching from Kafka; batches already fetched may still
	// arrive. Pause and Resume are idempotent and safe from any goroutine.
	Pause()
	// Resume restarts fetching after Pause, except for partitions paused by
	// PausePartition.
	Resume()
	// PausePartition stops fetching partition p until ResumePartition,
	// whatever Pause and Resume do meanwhile; batches of p already fetched
	// may still arrive. Both are idempotent and safe from any goroutine.
	PausePartition(p int32)
	// ResumePartition restarts fetching partition p after PausePartition,
	// unless the source is paused as a whole.
	ResumePartition(p int32)
}
