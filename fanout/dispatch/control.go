package dispatch

import (
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// An operator's actions on a running dispatcher: pausing its deliveries
// (Config.Pause) and draining one client (DrainClient).
//
// While paused, the dispatcher hands no message out and keeps every
// session: fetching stops as it does with no client (the buffer holds what
// was fetched), acks, nacks and touches of the deliveries in flight count
// as usual, and so do their ack timeouts: a delivery not acked in time
// fails and waits, with the nacked ones, for the deliveries to resume
// (a pause never makes a client's deadline longer). Stalled partitions are
// not watched meanwhile (their offsets stand still by the operator's
// choice), and the watch starts again at the resume.
//
// A client drained gets Goodbye and no more deliveries; the acks of what
// it holds count; once it holds nothing, or Config.DrainTimeout after the
// Goodbye, it leaves as if the daemon closed its connection (what it still
// holds goes to the other clients without counting as a failed attempt)
// and its sink is disconnected (DisconnectSink).

// Pause is a switch that pauses the deliveries of every dispatcher given
// it (Config.Pause). A daemon shares one Pause among the dispatchers it
// runs one after another, so that each starts as the switch stands. Its
// methods are safe for concurrent use.
type Pause struct {
	mu      sync.Mutex
	on      bool
	changed chan struct{} // closed, and replaced, by every change
}

// NewPause returns a switch that is off: deliveries flow.
func NewPause() *Pause { return &Pause{changed: make(chan struct{})} }

// Set turns the switch on (paused) or off; it reports whether that changed
// it.
func (p *Pause) Set(on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on == on {
		return false
	}
	p.on = on
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// On reports whether deliveries are paused.
func (p *Pause) On() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}

// watch returns the switch's state and a channel closed at its next change.
func (p *Pause) watch() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on, p.changed
}

// DisconnectSink is a ClientSink whose connection the dispatcher can end
// (a client drained). Disconnect must not block, nor call the Backend
// before it returns: the connection closes on its own goroutine, after
// what was queued before.
type DisconnectSink interface {
	ClientSink
	Disconnect(reason string)
}

// setDeliveryPaused pauses or resumes the deliveries.
func (d *Dispatcher) setDeliveryPaused(s *state, on bool) {
	if on == s.deliveryPaused {
		return
	}
	s.deliveryPaused = on
	log := d.log.WithFields(logrus.Fields{"in_flight": s.flights.live, "buffered": s.buffered()})
	if on {
		s.stalls = nil // watched again from the resume
		log.Info("deliveries paused: no message is handed out until they resume; acks and ack timeouts go on")
		return
	}
	log.Info("deliveries resumed")
}

// drainClients starts draining the joined clients with session id (when
// not 0) or else named name, and ends the observers so named at once:
// each gets Goodbye(reason) and no more deliveries. It returns what they
// held when they were drained.
func (d *Dispatcher) drainClients(s *state, id uint64, name, reason string, now time.Time) []ClientStats {
	match := func(cid uint64, cname string) bool { return cid == id || id == 0 && cname == name }
	var out []ClientStats
	for _, c := range s.clients {
		if !match(c.id, c.name) || c.draining {
			continue
		}
		c.draining, c.drainBy = true, now.Add(d.cfg.DrainTimeout)
		s.drains = append(s.drains, c)
		c.sink.Goodbye(reason)
		out = append(out, c.stats())
		d.log.WithFields(logrus.Fields{"client": c.name, "session": c.id, "in_flight": c.n, "reason": reason}).
			Info("draining a client: no more deliveries; what it holds goes to the others unless it acks it")
	}
	// An observer holds nothing: it goes at once.
	s.observers = slices.DeleteFunc(s.observers, func(o *observer) bool {
		if !match(o.id, o.name) {
			return false
		}
		out = append(out, ClientStats{ID: o.id, Name: o.name, Observer: true, Draining: true})
		o.sink.Goodbye(reason)
		if ds, ok := o.sink.(DisconnectSink); ok {
			ds.Disconnect(reason)
		}
		return true
	})
	return out
}

// endDrains ends the drains of the clients that hold nothing any more or
// whose drain timeout passed at now: each leaves as if the daemon closed
// its connection, and its sink is disconnected.
func (d *Dispatcher) endDrains(s *state, now time.Time) {
	keep := s.drains[:0]
	for _, c := range s.drains {
		switch {
		case c.gone:
			continue // left by itself
		case c.n > 0 && now.Before(c.drainBy):
			keep = append(keep, c)
			continue
		}
		held := c.n
		if s.trace != nil {
			s.traceClient(deliverylog.Leave, c.id, c.name, "drained")
		}
		s.leave(c.id, LeaveShutdown, now)
		if ds, ok := c.sink.(DisconnectSink); ok {
			ds.Disconnect("drained")
		}
		log := d.log.WithFields(logrus.Fields{"client": c.name, "session": c.id})
		if held > 0 {
			log.WithField("given_back", held).Warn("drain timeout: the client's unacked deliveries go to the other clients")
		} else {
			log.Info("client drained: it acked everything it held")
		}
	}
	clear(s.drains[len(keep):])
	s.drains = keep
}
