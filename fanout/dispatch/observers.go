package dispatch

import (
	"slices"
	"time"
)

// Observers (Backend.Observe). An observer receives a copy of every
// delivery made to the clients, redeliveries included, with delivery ID 0
// and the delivery's attempt. It acks nothing: its copies are not flights,
// so they affect neither the committed offsets nor anyone's credit, and it
// is not in the round-robin. Its copies go out once per dispatch round, in
// one Send, like a client's deliveries; its sink bounds what it queues and
// drops an observer that falls behind (the server closes its connection), so
// an observer never slows the clients.

// observer is the dispatcher's view of one observing connection.
type observer struct {
	id   uint64
	name string
	sink ClientSink
	out  []Delivery // copies of the current dispatch round
}

// observe adds an observer.
func (s *state) observe(id uint64, name string, sink ClientSink) {
	if s.clients[id] != nil || s.observer(id) != nil {
		s.leave(id, LeaveDisconnect, time.Time{}) // a reused id replaces the old one
	}
	if s.draining {
		sink.Goodbye("draining")
		return
	}
	s.observers = append(s.observers, &observer{id: id, name: name, sink: sink})
}

// observer returns the observer id, or nil.
func (s *state) observer(id uint64) *observer {
	for _, o := range s.observers {
		if o.id == id {
			return o
		}
	}
	return nil
}

// unobserve removes observer id, if any.
func (s *state) unobserve(id uint64) {
	for i, o := range s.observers {
		if o.id == id {
			s.observers = slices.Delete(s.observers, i, i+1)
			return
		}
	}
}

// sendObservers sends every observer the copies of the round.
func (s *state) sendObservers() {
	for _, o := range s.observers {
		if len(o.out) > 0 {
			o.sink.Send(o.out)
			o.out = nil
		}
	}
}
