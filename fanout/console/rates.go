package console

import (
	"sync"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

// SampleInterval is how often the daemon samples its counters into Rates.
const SampleInterval = 2 * time.Second

// RingSize is how many points Rates keeps: five minutes at SampleInterval.
const RingSize = 150

// Counters are the cumulative counters of one dispatcher, the rates' input.
type Counters struct {
	Consumed, Delivered, Acked, Redelivered uint64

	// ClientAcks are the acks of each client by id, since it joined.
	ClientAcks map[uint64]uint64
}

// Rates holds the message rates of the last RingSize samples in a fixed
// ring, and each client's ack rate over the last sample. One goroutine
// samples (Sample, every SampleInterval); handlers read. Nothing is counted
// per message: a sample turns two snapshots of counters into rates.
type Rates struct {
	interval time.Duration

	mu          sync.Mutex // guards the fields below
	ring        [RingSize]status.RatePoint
	next, n     int // where the next point goes; how many the ring holds
	last        Counters
	lastAt      time.Time // zero before the first sample
	clientRates map[uint64]float64
}

// NewRates returns empty rates sampled every interval (for the readers:
// Sample is called by the owner's clock).
func NewRates(interval time.Duration) *Rates {
	return &Rates{interval: interval}
}

// Sample records the rates between the previous sample and now. fresh says
// that c counts from zero since the previous sample (a new dispatcher, or
// none: then c is zero and so are the rates). The first sample only sets
// the base.
func (r *Rates) Sample(now time.Time, c Counters, fresh bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, prevAt := r.last, r.lastAt
	r.last, r.lastAt = c, now
	if prevAt.IsZero() {
		return
	}
	secs := now.Sub(prevAt).Seconds()
	if secs <= 0 {
		return
	}
	if fresh {
		prev = Counters{}
	}
	rate := func(cur, old uint64) float64 {
		if cur < old { // counted from zero again without being told: a reset
			old = 0
		}
		return float64(cur-old) / secs
	}
	r.ring[r.next] = status.RatePoint{
		Time:        now,
		Consumed:    rate(c.Consumed, prev.Consumed),
		Delivered:   rate(c.Delivered, prev.Delivered),
		Acked:       rate(c.Acked, prev.Acked),
		Redelivered: rate(c.Redelivered, prev.Redelivered),
	}
	r.next = (r.next + 1) % RingSize
	r.n = min(r.n+1, RingSize)
	r.clientRates = make(map[uint64]float64, len(c.ClientAcks))
	for id, acked := range c.ClientAcks {
		r.clientRates[id] = rate(acked, prev.ClientAcks[id])
	}
}

// Status returns the points held, oldest first.
func (r *Rates) Status() *status.Rates {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &status.Rates{IntervalSeconds: r.interval.Seconds(), Points: make([]status.RatePoint, 0, r.n)}
	for i := range r.n {
		out.Points = append(out.Points, r.ring[(r.next-r.n+i+RingSize)%RingSize])
	}
	return out
}

// ClientRate returns client id's acks per second over the last sample
// interval: 0 for a client not seen by a sample yet.
func (r *Rates) ClientRate(id uint64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clientRates[id]
}
