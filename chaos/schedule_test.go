package chaos

import (
	"slices"
	"testing"
	"time"
)

func TestScheduleIsReplayedFromItsSeed(t *testing.T) {
	a := Schedule(42, 10*time.Minute, 5*time.Second)
	if !slices.Equal(a, Schedule(42, 10*time.Minute, 5*time.Second)) {
		t.Fatal("the same seed gave two schedules")
	}
	if slices.Equal(a, Schedule(43, 10*time.Minute, 5*time.Second)) {
		t.Fatal("two seeds gave the same schedule")
	}
}

func TestScheduleHasEveryKindFirstAndStaysInBounds(t *testing.T) {
	const span, interval = 30 * time.Minute, 5 * time.Second
	plan := Schedule(7, span, interval)
	first := map[string]bool{}
	for _, p := range plan[:len(weights)] {
		first[p.Kind] = true
	}
	if len(first) != len(weights) {
		t.Fatalf("the first %d faults are %d kinds, want every kind once", len(weights), len(first))
	}
	count := map[string]int{}
	for i, p := range plan {
		count[p.Kind]++
		if p.At >= span || p.Duration < time.Second || p.Duration >= 4*time.Second {
			t.Fatalf("fault %d out of bounds: %s", i, p)
		}
		if i > 0 {
			if gap := p.At - plan[i-1].At; gap < interval*7/10 || gap > interval*13/10 {
				t.Fatalf("fault %d starts %s after the previous one, want %s ±30%%", i, gap, interval)
			}
		}
	}
	for _, w := range weights {
		if w.max > 0 && count[w.kind] > w.max {
			t.Errorf("%s: %d faults, bound %d", w.kind, count[w.kind], w.max)
		}
	}
}
