package dispatch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// committer writes offsets to the store off the dispatcher's goroutine, so a
// slow store never stalls deliveries. Offers merge: only the newest offset of
// each partition is written, and one commit runs at a time, so a stored
// offset never goes backwards. Which partitions it commits and under which
// fence is its scope's (Scope: the whole topic under the term's fence,
// fixed at creation, so that a committer abandoned with a commit under way
// cannot write once another term began, however late that commit runs; or
// the partitions assigned, each under its own condition, see
// partitionCommits).
//
// With a store that keeps progress (offsets.ProgressStore) each partition's
// latest progress is kept beside its pending offset, and a commit of offset
// o of a partition writes the progress recorded above o with it: a newer
// offer's progress above the same offset is as true, and a progress above
// another offset is not written (the store then holds none for it until the
// next commit).
type committer struct {
	store    offsets.Store
	ps       offsets.ProgressStore // store, when it keeps progress; else nil
	interval time.Duration         // wait before retrying a failed commit
	log      *logrus.Entry

	observe func(took time.Duration, err error) // Config.OnCommit; may be nil

	mu           sync.Mutex                 // guards the fields below
	scope        commitScope                // which partitions are committed, under which fence
	pending      map[int32]int64            // offered, not yet stored
	prog         map[int32]offsets.Progress // with ps: the latest progress offered per partition
	anchors      map[int32][]chan struct{}  // closed once a commit of their partition, offered after them, succeeds
	stored       map[int32]int64            // what the store holds, as far as this committer knows
	failures     uint64                     // failed commits, in total
	failingSince time.Time                  // first failure since the last success; zero after a success
	runningSince time.Time                  // start of the commit under way; zero when none

	kick   chan struct{}                    // capacity 1: pending has something new
	fenced chan error                       // capacity 1: the store refused the whole scope for good
	lost   chan map[int32]offsets.Condition // partitions whose condition no longer holds
	cancel context.CancelFunc
	loop   actor.Group // the commit loop
}

// newCommitter returns the committer of scope on store, not yet started.
func newCommitter(store offsets.Store, scope Scope, interval time.Duration, log *logrus.Entry,
	stored map[int32]int64, observe func(time.Duration, error)) (*committer, error) {
	cs, err := scope.commits()
	if err != nil {
		return nil, err
	}
	ps, _ := store.(offsets.ProgressStore)
	return &committer{
		store:    store,
		ps:       ps,
		scope:    cs,
		prog:     map[int32]offsets.Progress{},
		interval: interval,
		log:      log,
		observe:  observe,
		pending:  map[int32]int64{},
		anchors:  map[int32][]chan struct{}{},
		stored:   maps.Clone(stored),
		kick:     make(chan struct{}, 1),
		fenced:   make(chan error, 1),
		lost:     make(chan map[int32]offsets.Condition),
	}, nil
}

// start runs the commit loop in its own goroutine until stop.
func (c *committer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.loop.Go(c.log, "committer", func() { c.run(ctx) }, nil)
}

// stop ends the loop and waits for a commit under way.
func (c *committer) stop() {
	if c.cancel != nil {
		c.cancel()
		c.loop.Wait()
		c.cancel = nil
	}
}

// abandon ends the loop without waiting: a commit under way may hang on a
// store that is out of reach, and after losing leadership it would be
// refused anyway (fenced).
func (c *committer) abandon() {
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
}

// offer queues offsets for the next commit, with their progress (nil: none,
// or a store that keeps none). Offsets of partitions outside the scope
// (not assigned) are ignored.
func (c *committer) offer(m map[int32]int64, prog map[int32]offsets.Progress) {
	if len(m) == 0 {
		return
	}
	c.mu.Lock()
	for p, o := range m {
		if c.scope.covers(p) {
			c.pending[p] = o
			c.setProgress(p, prog)
		}
	}
	c.mu.Unlock()
	c.poke()
}

// setProgress keeps prog[p] as partition p's latest progress, or none when
// prog has no entry for p. c.mu must be held.
func (c *committer) setProgress(p int32, prog map[int32]offsets.Progress) {
	if pr, ok := prog[p]; ok && c.ps != nil {
		c.prog[p] = pr
	} else {
		delete(c.prog, p)
	}
}

// progressOf returns the progress to write with offsets m: each partition's
// latest progress, when it was recorded above the offset written.
func (c *committer) progressOf(m map[int32]int64) map[int32]offsets.Progress {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int32]offsets.Progress, len(m))
	for p, o := range m {
		if pr, ok := c.prog[p]; ok && pr.Base == o {
			out[p] = pr
		}
	}
	return out
}

// write commits m under fence, with its progress when the store keeps it.
func (c *committer) write(ctx context.Context, fence offsets.Fence, m map[int32]int64) error {
	if c.ps == nil {
		return c.store.Commit(ctx, fence, m)
	}
	return c.ps.CommitProgress(ctx, fence, m, c.progressOf(m))
}

// anchor queues offset for partition p with its progress in prog, like
// offer, and closes done once a commit that includes p, of this offset or of
// a newer offer, has succeeded.
// An anchor of a partition outside the scope, or forgotten before its
// commit, is never closed (its source has stopped fetching it).
func (c *committer) anchor(p int32, offset int64, prog map[int32]offsets.Progress, done chan struct{}) {
	c.mu.Lock()
	if c.scope.covers(p) {
		c.pending[p] = offset
		c.setProgress(p, prog)
		c.anchors[p] = append(c.anchors[p], done)
	}
	c.mu.Unlock()
	c.poke()
}

// poke wakes the loop.
func (c *committer) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// assign makes partition p committable under cond (AssignedPartitions),
// with stored, when >= 0, the offset the store holds for it. A new stretch
// of p begins: a final commit of the previous one still pending is answered
// with an error (its offset will not be written), so that no commit of the
// new stretch is taken for it. It fails when the scope takes no
// assignments.
func (c *committer) assign(p int32, cond offsets.Condition, stored int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.scope.assign(p, cond); err != nil {
		return err
	}
	delete(c.pending, p)
	delete(c.prog, p)
	if c.stored == nil {
		c.stored = map[int32]int64{}
	}
	if stored >= 0 {
		c.stored[p] = stored
	} else {
		delete(c.stored, p)
	}
	return nil
}

// forget stops committing partition p: what is pending of it is dropped,
// and a commit under way that carries it is the last one.
func (c *committer) forget(p int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(p, errors.New("dispatch: partition dropped before its final commit"))
}

func (c *committer) forgetLocked(p int32, err error) {
	c.scope.forget(p, err)
	delete(c.pending, p)
	delete(c.prog, p)
	delete(c.anchors, p)
	delete(c.stored, p)
}

// finish commits offset o of partition p, with its progress in prog, under
// its condition as the partition's last commit, after any commit of it
// under way, and then forgets p. The returned channel receives the outcome
// once: nil, or the error of a commit that was refused (wrapping
// offsets.ErrFenced) or that could not run because the committer stopped. A
// commit that fails otherwise is retried, as any.
func (c *committer) finish(p int32, o int64, prog map[int32]offsets.Progress) <-chan error {
	done := make(chan error, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.scope.finish(p, done); err != nil {
		done <- err
		return done
	}
	c.pending[p] = o
	c.setProgress(p, prog)
	c.poke()
	return done
}

// take removes and returns everything pending with the fence to commit it
// under and the anchors waiting for it (every anchor waits for a pending
// partition), or nil when nothing is pending.
func (c *committer) take() (map[int32]int64, offsets.Fence, map[int32][]chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil, offsets.Fence{}, nil
	}
	m, anchors := c.pending, c.anchors
	c.pending, c.anchors = map[int32]int64{}, map[int32][]chan struct{}{}
	return m, c.scope.fenceOf(m), anchors
}

// putBack returns offsets of a failed commit, unless newer ones arrived or
// the partition was forgotten or assigned again since, and their anchors,
// which wait for whichever is committed next.
func (c *committer) putBack(m map[int32]int64, fence offsets.Fence, anchors map[int32][]chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, o := range m {
		if !c.scope.current(p, fence) {
			continue
		}
		if _, newer := c.pending[p]; !newer {
			c.pending[p] = o
		}
		c.anchors[p] = append(c.anchors[p], anchors[p]...)
	}
}

// release closes the anchors of the partitions of done, committed.
func release(anchors map[int32][]chan struct{}, done map[int32]int64) {
	for p, a := range anchors {
		if _, ok := done[p]; !ok {
			continue
		}
		for _, ch := range a {
			close(ch)
		}
	}
}

func (c *committer) run(ctx context.Context) {
	var retry <-chan time.Time
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry:
			retry = nil
		}
		m, fence, anchors := c.take()
		if m == nil {
			continue
		}
		done, err := c.commit(ctx, m, fence, anchors)
		release(anchors, done)
		switch {
		case err == nil:
			if failures > 0 && len(done) > 0 {
				c.log.WithField("failures", failures).Info("offset commits work again")
				failures = 0
			}
			if len(done) > 0 {
				c.log.WithField("offsets", done).Debug("offsets committed")
			}
		case errors.Is(err, offsets.ErrFenced):
			c.fenced <- err
			return
		default:
			if failures == 0 || failures%30 == 0 {
				c.log.WithError(err).WithField("failures", failures+1).Warn("offset commit failed; retrying")
			}
			failures++
			retry = time.After(c.interval)
		}
		if lost := c.takeLost(); len(lost) > 0 {
			select {
			case c.lost <- lost:
			case <-ctx.Done():
				return
			}
		}
	}
}

// commit writes m under fence, records the outcome and returns what it
// committed. A commit that failed is put back for the next one; one the
// store refused goes to the scope, which returns what it committed after
// all and the error the loop is to take.
func (c *committer) commit(ctx context.Context, m map[int32]int64, fence offsets.Fence,
	anchors map[int32][]chan struct{}) (map[int32]int64, error) {
	err := c.attempt(ctx, m, fence)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, offsets.ErrFenced):
		return c.scope.refused(ctx, c, m, fence, anchors, err)
	}
	c.putBack(m, fence, anchors)
	return nil, err
}

// attempt writes m under fence once and records the outcome.
func (c *committer) attempt(ctx context.Context, m map[int32]int64, fence offsets.Fence) error {
	start := time.Now()
	c.mu.Lock()
	c.runningSince = start
	c.mu.Unlock()
	err := c.write(ctx, fence, m)
	c.record(m, fence, time.Since(start), err)
	return err
}

// takeLost returns the partitions found fenced since the last call.
func (c *committer) takeLost() map[int32]offsets.Condition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scope.takeLost()
}

// flush stops the loop and commits everything pending plus m (with its
// progress prog), synchronously. A commit that fails is tried again, with
// backoff, until it succeeds, the store refuses it (ErrFenced) or ctx ends:
// a store out of reach for a moment, or a Kafka group rebalancing as the
// members stop one after another, must not cost the final commit.
// Partitions of AssignedPartitions found fenced are only logged.
func (c *committer) flush(ctx context.Context, m map[int32]int64, prog map[int32]offsets.Progress) error {
	c.stop()
	c.offer(m, prog)
	b := backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second, Jitter: true}
	for attempt := 1; ; attempt++ {
		all, fence, anchors := c.take()
		if all == nil {
			break
		}
		done, err := c.commit(ctx, all, fence, anchors)
		release(anchors, done)
		if err == nil {
			continue // what the scope refused was dropped; nothing else is pending
		}
		wait := b.Next()
		if errors.Is(err, offsets.ErrFenced) || ctx.Err() != nil || !backoff.Sleep(ctx, wait) {
			c.resolveFinals(err)
			return fmt.Errorf("commit %v (attempt %d): %w", all, attempt, err)
		}
		c.log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": wait.Round(time.Millisecond)}).
			Warn("final offset commit failed; retrying")
	}
	c.resolveFinals(errors.New("dispatch: stopped before the final commit"))
	return nil
}

// resolveFinals answers every final commit still waiting with err.
func (c *committer) resolveFinals(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scope.resolveFinals(err)
}

// record notes the outcome of one commit of m under fence, for report and
// OnCommit, and answers the final commits it carried.
func (c *committer) record(m map[int32]int64, fence offsets.Fence, took time.Duration, err error) {
	if c.observe != nil {
		c.observe(took, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runningSince = time.Time{}
	if err != nil {
		c.failures++
		if c.failingSince.IsZero() {
			c.failingSince = time.Now()
		}
		return
	}
	c.failingSince = time.Time{}
	if c.stored == nil {
		c.stored = map[int32]int64{}
	}
	for p, o := range m {
		if !c.scope.current(p, fence) {
			continue // forgotten, or assigned again, since
		}
		c.stored[p] = o
		if _, newer := c.pending[p]; !newer && c.scope.committed(p, fence) {
			delete(c.stored, p)
		}
	}
}

// troubleSince returns since when commits have been failing, or the start
// of a commit under way, whichever is earlier; zero when neither.
func (c *committer) troubleSince() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.failingSince.IsZero():
		return c.runningSince
	case c.runningSince.IsZero() || c.failingSince.Before(c.runningSince):
		return c.failingSince
	}
	return c.runningSince
}

// report adds the committer's state to st.
func (c *committer) report(st *Stats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Committed = maps.Clone(c.stored)
	st.CommitFailures = c.failures
	st.CommitFailingSince = c.failingSince
}
