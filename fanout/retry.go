package fanout

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/backoff"
)

// retry calls fn until it succeeds or ctx ends, with the daemon's backoff
// (500ms doubling up to max, jittered), logging every failure as a warning
// naming what failed. It returns nil on success and ctx.Err() when ctx ends
// first.
func retry(ctx context.Context, log *logrus.Entry, what string, max time.Duration, fn func(ctx context.Context) error) error {
	failed := 0
	err := backoff.Retry(ctx, backoff.Backoff{Min: 500 * time.Millisecond, Max: max, Jitter: true}, fn,
		func(attempt int, err error, wait time.Duration) {
			failed = attempt
			log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": wait.Round(time.Millisecond)}).
				Warnf("%s failed; retrying", what)
		})
	if err == nil && failed > 0 {
		log.WithField("attempts", failed+1).Infof("%s: succeeded", what)
	}
	return err
}
