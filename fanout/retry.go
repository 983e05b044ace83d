package fanout

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/sirupsen/logrus"
)

// retry calls fn until it succeeds or ctx ends, waiting between attempts
// with exponential backoff (500ms doubling up to max, with jitter) and
// logging every failure as a warning naming what failed. It returns nil on
// success and ctx.Err() when ctx ends first.
func retry(ctx context.Context, log *logrus.Entry, what string, max time.Duration, fn func(ctx context.Context) error) error {
	wait := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			if attempt > 1 {
				log.WithField("attempts", attempt).Infof("%s: succeeded", what)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		jittered := wait/2 + rand.N(wait/2+1)
		log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": jittered.Round(time.Millisecond)}).
			Warnf("%s failed; retrying", what)
		t := time.NewTimer(jittered)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, max)
	}
}
