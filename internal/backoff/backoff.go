// Package backoff is the daemon's one way to wait between attempts: an
// exponential delay with jitter (Backoff), a context-aware sleep (Sleep),
// and a retry loop built on both (Retry). The Go client, which imports
// nothing of the daemon, keeps its own copy of the delay rule.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields exponentially growing delays from Min, doubling up to Max.
// With Jitter each delay is drawn from its upper half, so that peers that
// failed together do not retry together. The zero value is not usable: set
// Min and Max (Max >= Min > 0). A Backoff is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	Jitter   bool

	cur time.Duration // the last delay before jitter; 0 before the first Next
}

// Next returns the delay before the next attempt and grows the one after.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	if !b.Jitter {
		return b.cur
	}
	return Jitter(b.cur)
}

// Delay is the rule Next follows, as a function of the attempt: the delay
// after failed attempt n (from 1) is lo·2^(n-1), capped at hi (n below 1
// counts as 1). With jitter it is drawn from the upper half of that
// (Jitter). The dispatcher's per-message retry backoff uses it, so that it
// needs no state per message.
func Delay(lo, hi time.Duration, n int, jitter bool) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if jitter {
		return Jitter(d)
	}
	return d
}

// Jitter returns a delay drawn uniformly from [d/2, d], so that peers that
// failed together do not retry together.
func Jitter(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Reset makes the next delay Min again (after a success).
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits d unless ctx ends first; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool { return Wait(ctx, d, nil) }

// Wait waits d unless ctx ends or wake yields first (a nil wake never
// does); it reports whether ctx is still live.
func Wait(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-wake:
		return true
	}
}

// Retry calls fn until it returns nil or ctx ends, sleeping b.Next() after
// each failure. onFail, when not nil, is told of every failure (attempt
// counts from 1) and of the wait before the next attempt; it is where the
// caller logs. Retry returns nil on success and ctx.Err() when ctx ends
// first; fn's own errors are never returned.
func Retry(ctx context.Context, b Backoff, fn func(context.Context) error,
	onFail func(attempt int, err error, wait time.Duration)) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.Next()
		if onFail != nil {
			onFail(attempt, err, wait)
		}
		if !Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}
