package console

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)

func counters(consumed, delivered, acked, redelivered uint64, clients map[uint64]uint64) Counters {
	return Counters{Consumed: consumed, Delivered: delivered, Acked: acked, Redelivered: redelivered, ClientAcks: clients}
}

func TestRatesPerSecond(t *testing.T) {
	r := NewRates(2 * time.Second)
	r.Sample(t0, counters(100, 100, 90, 1, map[uint64]uint64{7: 50}), true)
	if got := r.Status(); got.IntervalSeconds != 2 || len(got.Points) != 0 {
		t.Fatalf("after the first sample: %+v, want no point (it is the base)", got)
	}
	r.Sample(t0.Add(2*time.Second), counters(120, 130, 110, 5, map[uint64]uint64{7: 60, 8: 10}), false)
	r.Sample(t0.Add(6*time.Second), counters(120, 130, 150, 5, map[uint64]uint64{7: 100, 8: 10}), false)
	want := []status.RatePoint{
		{Time: t0.Add(2 * time.Second), Consumed: 10, Delivered: 15, Acked: 10, Redelivered: 2},
		{Time: t0.Add(6 * time.Second), Consumed: 0, Delivered: 0, Acked: 10, Redelivered: 0},
	}
	if got := r.Status().Points; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("points %+v, want %+v", got, want)
	}
	if got := r.ClientRate(7); got != 10 {
		t.Errorf("client 7: %v acks/s, want 10", got)
	}
	if got := r.ClientRate(8); got != 0 {
		t.Errorf("client 8: %v acks/s, want 0", got)
	}
	if got := r.ClientRate(9); got != 0 {
		t.Errorf("unknown client: %v acks/s, want 0", got)
	}
}

// A new dispatcher counts from zero: its counters are taken whole, not
// subtracted from the old one's; no dispatcher gives zero rates.
func TestRatesFreshCounters(t *testing.T) {
	r := NewRates(time.Second)
	r.Sample(t0, counters(1000, 1000, 1000, 0, map[uint64]uint64{1: 1000}), true)
	r.Sample(t0.Add(time.Second), Counters{}, true) // between terms
	r.Sample(t0.Add(2*time.Second), counters(1500, 1500, 1200, 3, map[uint64]uint64{1: 1200}), true)
	r.Sample(t0.Add(3*time.Second), counters(1600, 1600, 1300, 3, map[uint64]uint64{1: 1250}), false)
	pts := r.Status().Points
	if len(pts) != 3 {
		t.Fatalf("%d points, want 3", len(pts))
	}
	if p := pts[0]; p.Consumed != 0 || p.Acked != 0 {
		t.Errorf("between terms: %+v, want zero rates", p)
	}
	if p := pts[1]; p.Consumed != 1500 || p.Acked != 1200 || p.Redelivered != 3 {
		t.Errorf("first sample of a new dispatcher: %+v, want its counters whole", p)
	}
	if p := pts[2]; p.Consumed != 100 || p.Acked != 100 {
		t.Errorf("second sample of the dispatcher: %+v, want the difference", p)
	}
	if got := r.ClientRate(1); got != 50 {
		t.Errorf("client 1: %v acks/s, want 50", got)
	}
	// A counter that went back without being told is a reset too.
	r.Sample(t0.Add(4*time.Second), counters(10, 10, 10, 0, nil), false)
	if p := r.Status().Points[3]; p.Consumed != 10 {
		t.Errorf("after an unannounced reset: %+v, want 10/s", p)
	}
}

// The ring keeps the newest RingSize points, oldest first.
func TestRatesRingWraps(t *testing.T) {
	r := NewRates(time.Second)
	var c Counters
	r.Sample(t0, c, true)
	const n = RingSize + 37
	for i := 1; i <= n; i++ {
		c.Acked += uint64(i) // i acks in second i
		r.Sample(t0.Add(time.Duration(i)*time.Second), c, false)
	}
	pts := r.Status().Points
	if len(pts) != RingSize {
		t.Fatalf("%d points, want %d", len(pts), RingSize)
	}
	for k, p := range pts {
		i := n - RingSize + 1 + k
		if !p.Time.Equal(t0.Add(time.Duration(i)*time.Second)) || p.Acked != float64(i) {
			t.Fatalf("point %d = %+v, want second %d with %d acks/s", k, p, i, i)
		}
	}
}

// A sample at the same instant as the previous one adds nothing.
func TestRatesSameInstant(t *testing.T) {
	r := NewRates(time.Second)
	r.Sample(t0, counters(1, 1, 1, 1, nil), true)
	r.Sample(t0, counters(2, 2, 2, 2, nil), false)
	if pts := r.Status().Points; len(pts) != 0 {
		t.Errorf("points %+v, want none", pts)
	}
}

// One sampler and many readers at once (run with -race).
func TestRatesConcurrent(t *testing.T) {
	r := NewRates(time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 500 {
			r.Sample(t0.Add(time.Duration(i)*time.Millisecond), counters(uint64(i), 0, 0, 0, map[uint64]uint64{1: uint64(i)}), false)
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 200 {
				_ = r.Status()
				_ = r.ClientRate(1)
			}
		})
	}
	wg.Wait()
	if got := len(r.Status().Points); got != RingSize {
		t.Errorf("%d points, want %d", got, RingSize)
	}
}
