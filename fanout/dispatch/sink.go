package dispatch

import "time"

// Delivery is one attempt to hand a message to a client. The client acks or
// nacks it by ID. A redelivery gets a new ID and Attempt+1.
type Delivery struct {
	ID      uint64
	Attempt uint32
	Msg     *Message
}

// Op is what a client does with deliveries it names.
type Op uint8

// Ops of Backend.Settle.
const (
	OpAck   Op = iota // processed: Ack
	OpNack            // given back: Nack
	OpTouch           // still in progress: Touch
)

// Range names the delivery ids First, First+1, ..., First+Count-1.
type Range struct {
	First, Count uint64
}

// ClientSink is how the dispatcher reaches one connected client. Its methods
// are called from the dispatcher's goroutine and must not block: they queue
// work for the connection's own writer.
type ClientSink interface {
	// Send queues deliveries for the client. The slice is the sink's to keep.
	Send(ds []Delivery)
	// Goodbye tells the client that no more deliveries will come (the daemon
	// is draining). Acks are still accepted until the connection closes.
	Goodbye(reason string)
}

// LimitedSink is a ClientSink whose client takes only frames up to a size.
// The dispatcher asks MaxFrameSize once, at Join, and never sends the client
// a message whose Config.FrameSize is larger: such a message waits for a
// client that takes it, while the messages behind it go on to others. A sink
// that does not implement LimitedSink takes any size.
type LimitedSink interface {
	ClientSink
	// MaxFrameSize is the largest frame the client accepts, in the unit of
	// Config.FrameSize; 0 means no limit.
	MaxFrameSize() int
}

// WeightedSink is a ClientSink whose client asked for a share of the
// deliveries (Hello.weight). The dispatcher asks Weight once, at Join. While
// some joined client has a weight other than protocol.DefaultWeight,
// messages go out by smooth weighted round-robin over the clients with room
// (credit still applies): a client of weight 5 beside two of 100 gets about
// 5/205 of them. A sink that does not implement it, or gives 0, has the
// default weight.
type WeightedSink interface {
	ClientSink
	// Weight is the client's weight; 0 means protocol.DefaultWeight.
	Weight() int
}

// NackInfo is what a client may say with a Nack.
type NackInfo struct {
	// Delay asks for the redelivery no earlier than this from the nack; 0:
	// at once, or after Config.RetryBackoffMin's backoff.
	Delay time.Duration
	// Reason says why, for logs and the dead-letter record.
	Reason string
	// Unprocessed says the client never handed the deliveries to its
	// application (protocol Nack.unprocessed): they are redelivered without
	// counting as failed attempts, at once unless Delay asks otherwise.
	Unprocessed bool
}

// Backend is the dispatcher as the TCP server sees it. Every method only
// queues a request for the dispatcher's goroutine and returns at once;
// requests from one caller are handled in the order they were made.
type Backend interface {
	// Join adds a client that may hold up to maxInFlight unacked deliveries.
	// id is chosen by the caller and unique among connected clients.
	Join(id uint64, name string, maxInFlight int, sink ClientSink)
	// Ack marks deliveries as processed. Unknown ids, and ids that belong to
	// another client, are ignored and counted.
	Ack(id uint64, deliveryIDs []uint64)
	// Nack gives deliveries back for another client, at once or after
	// how.Delay.
	Nack(id uint64, deliveryIDs []uint64, how NackInfo)
	// Touch restarts the ack timeout of deliveries.
	Touch(id uint64, deliveryIDs []uint64)
	// Settle acks, nacks (as how says) or touches (op) the deliveries named
	// by ranges of consecutive ids, each range in one step: its cost is at
	// most the smaller of its count and the deliveries the client holds.
	// Ids in a range that name no delivery of the client are ignored and
	// counted, as by Ack.
	Settle(id uint64, op Op, ranges []Range, how NackInfo)
	// Observe adds an observer: a client that receives a copy of every
	// delivery made to the others (with ID 0), acks nothing and affects
	// neither offsets nor credit. id is chosen like Join's; Leave removes it.
	Observe(id uint64, name string, sink ClientSink)
	// Leave removes a client; its unacked deliveries go to other clients.
	Leave(id uint64, reason LeaveReason)
}

// LeaveReason says why a client left, for redelivery accounting and logs.
type LeaveReason int

// Reasons a client leaves.
const (
	LeaveGoodbye    LeaveReason = iota // the client said goodbye
	LeaveDisconnect                    // the connection closed or failed
	LeaveDead                          // no sign of life within the liveness window
	LeaveSlow                          // the client did not read in time
	LeaveProtocol                      // the client broke the protocol
	LeaveShutdown                      // the daemon closed the connection: it stops serving, shuts down, or drained the client
)

var leaveReasonNames = [...]string{"goodbye", "disconnect", "dead", "slow", "protocol error", "shutdown"}

// String returns the reason as a word for logs and metrics.
func (r LeaveReason) String() string {
	if int(r) < len(leaveReasonNames) {
		return leaveReasonNames[r]
	}
	return "unknown"
}
