package dispatch

import (
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// The delivery log (Config.DeliveryLog): the state writes one event per
// delivery, per outcome of one, and per change of what it serves. Every call
// site checks s.trace != nil first, so without a log the hot path costs one
// nil check per event and allocates nothing; with one, an event is a value
// put on the log's bounded queue (deliverylog.Log.Add never blocks).

// outcomeKinds maps a Redeliver reason to the event of the failed attempt.
var outcomeKinds = [numRedeliverReasons]deliverylog.Kind{
	RedeliverTimeout:    deliverylog.Timeout,
	RedeliverDisconnect: deliverylog.Gone,
	RedeliverNack:       deliverylog.Nack,
}

// traceFlight logs event k of flight f, which must still be whole.
func (s *state) traceFlight(k deliverylog.Kind, f *flight, detail string) {
	s.traceFlightAt(k, f, detail, s.now())
}

// traceFlightAt is traceFlight at time at.
func (s *state) traceFlightAt(k deliverylog.Kind, f *flight, detail string, at time.Time) {
	s.trace.Add(deliverylog.Event{At: at, Kind: k, Partition: f.msg.Partition, Offset: f.msg.Offset, ID: f.id,
		Attempt: f.attempt, Session: f.client.id, Detail: detail, Client: f.client.name})
}

// traceMessage logs event k of message m; attempt is the event's number
// (the failures counted, for a dead letter).
func (s *state) traceMessage(k deliverylog.Kind, m *Message, attempt uint32, detail string) {
	s.trace.Add(deliverylog.Event{At: s.now(), Kind: k, Partition: m.Partition, Offset: m.Offset, Attempt: attempt, Detail: detail})
}

// tracePartition logs event k of partition p (offset -1: none).
func (s *state) tracePartition(k deliverylog.Kind, p int32, offset int64, detail string) {
	s.trace.Add(deliverylog.Event{At: s.now(), Kind: k, Partition: p, Offset: offset, Detail: detail})
}

// traceClient logs event k of the client with session id and name.
func (s *state) traceClient(k deliverylog.Kind, id uint64, name, detail string) {
	s.trace.Add(deliverylog.Event{At: s.now(), Kind: k, Partition: -1, Offset: -1, Session: id, Detail: detail, Client: name})
}

// traceFailure logs the failed attempt f (reason, how, counted or not).
func (s *state) traceFailure(f *flight, reason int, how NackInfo, counted bool) {
	detail := deliverylog.Counted
	switch {
	case counted:
	case reason == RedeliverNack:
		detail = deliverylog.UncountedUnprocessed
	case how.Unprocessed: // the client left gracefully, or the daemon closed its connection
		detail = deliverylog.Uncounted + how.Reason
	default:
		detail = deliverylog.UncountedWindow
	}
	s.traceFlight(outcomeKinds[reason], f, detail)
}

// traceStopped logs every delivery still in flight as dropped: the
// dispatcher stops, and nobody will know of their outcome.
func (s *state) traceStopped() {
	for _, f := range s.flights.slots {
		if f != nil {
			s.traceFlight(deliverylog.Dropped, f, "stopped")
		}
	}
}
