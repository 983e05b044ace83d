package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Backoff
		want []time.Duration
	}{
		{"doubles to max", Backoff{Min: time.Second, Max: 5 * time.Second},
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"min equals max", Backoff{Min: time.Second, Max: time.Second},
			[]time.Duration{time.Second, time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.want {
				if got := tc.b.Next(); got != want {
					t.Fatalf("Next #%d = %v, want %v", i+1, got, want)
				}
			}
			tc.b.Reset()
			if got := tc.b.Next(); got != tc.b.Min {
				t.Fatalf("Next after Reset = %v, want Min %v", got, tc.b.Min)
			}
		})
	}
}

func TestNextJitterStaysInUpperHalf(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 800 * time.Millisecond, Jitter: true}
	bases := []time.Duration{100, 200, 400, 800, 800}
	for i, base := range bases {
		base *= time.Millisecond
		got := b.Next()
		if got < base/2 || got > base {
			t.Fatalf("Next #%d = %v, want within [%v, %v]", i+1, got, base/2, base)
		}
	}
}

// Delay is Next's rule as a function of the attempt: a caller with many
// independent retries (one per message) needs no Backoff per message.
func TestDelayFollowsNext(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for n := 1; n <= 8; n++ {
		if want, got := b.Next(), Delay(b.Min, b.Max, n, false); got != want {
			t.Fatalf("Delay(attempt %d) = %v, Next gave %v", n, got, want)
		}
	}
	if got := Delay(time.Second, time.Minute, 0, false); got != time.Second {
		t.Fatalf("Delay(attempt 0) = %v, want the minimum", got)
	}
	if got := Delay(time.Second, time.Minute, 1000, false); got != time.Minute {
		t.Fatalf("Delay(attempt 1000) = %v, want the maximum (no overflow)", got)
	}
	for range 100 {
		if got := Delay(time.Second, time.Minute, 3, true); got < 2*time.Second || got > 4*time.Second {
			t.Fatalf("Delay(attempt 3, jitter) = %v, want within [2s, 4s]", got)
		}
	}
}

func TestRetry(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}
	calls := 0
	var fails []int
	err := Retry(context.Background(), b, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}, func(attempt int, err error, wait time.Duration) {
		fails = append(fails, attempt)
		if wait <= 0 {
			t.Errorf("attempt %d: wait %v, want > 0", attempt, wait)
		}
	})
	if err != nil || calls != 3 || len(fails) != 2 || fails[0] != 1 || fails[1] != 2 {
		t.Fatalf("Retry = %v after %d calls, failures %v; want nil after 3 calls, failures [1 2]", err, calls, fails)
	}
}

func TestRetryStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b := Backoff{Min: time.Hour, Max: time.Hour}
	done := make(chan error, 1)
	go func() {
		done <- Retry(ctx, b, func(context.Context) error { return errors.New("down") }, nil)
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Retry = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Retry did not return after the context ended")
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep with a live context = false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep with an ended context = true")
	}
	if Sleep(ctx, 0) {
		t.Fatal("Sleep(0) with an ended context = true")
	}
}

// Wait ends early when wake yields, and reports a live context.
func TestWaitEndsOnWake(t *testing.T) {
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	if !Wait(context.Background(), time.Hour, wake) {
		t.Fatal("Wait reported the context ended")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Wait(ctx, time.Hour, nil) {
		t.Fatal("Wait with an ended context reported it live")
	}
}
