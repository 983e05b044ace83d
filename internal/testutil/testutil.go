// Package testutil holds the helpers that the tests of every package share,
// so that there is one poller instead of a copy per package.
package testutil

import (
	"testing"
	"testing/synctest"
	"time"
)

// PollInterval is how often WaitFor evaluates its condition.
const PollInterval = 10 * time.Millisecond

// WaitFor polls cond every PollInterval until it returns true, and fails the
// test with "timed out after <timeout> waiting for <what>" once timeout has
// passed. It never sleeps longer than needed: a condition already true
// returns at once.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(PollInterval)
	}
}

// InBubble returns a subtest that runs f in a testing/synctest bubble, on
// the bubble's fake clock: synctest.Test cannot call t.Run, so each subtest
// of a table gets a bubble of its own (t.Run(name, testutil.InBubble(...))).
func InBubble(f func(*testing.T)) func(*testing.T) {
	return func(t *testing.T) { synctest.Test(t, f) }
}
