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
)

// committer writes offsets to the store off the dispatcher's goroutine, so a
// slow store never stalls deliveries. Offers merge: only the newest offset of
// each partition is written, and one commit runs at a time, so a stored
// offset never goes backwards. Every commit is made under the term's fence,
// fixed at creation: a committer abandoned with a commit under way cannot
// write once another term began, however late that commit runs.
type committer struct {
	store    offsets.Store
	fence    offsets.Fence
	interval time.Duration // wait before retrying a failed commit
	log      *logrus.Entry

	observe func(took time.Duration, err error) // Config.OnCommit; may be nil

	mu           sync.Mutex                // guards pending, anchors, stored, failures, failingSince and runningSince
	pending      map[int32]int64           // offered, not yet stored
	anchors      map[int32][]chan struct{} // closed once a commit of their partition, offered after them, succeeds
	stored       map[int32]int64           // what the store holds, as far as this committer knows
	failures     uint64                    // failed commits, in total
	failingSince time.Time                 // first failure since the last success; zero after a success
	runningSince time.Time                 // start of the commit under way; zero when none

	kick   chan struct{} // capacity 1: pending has something new
	fenced chan error    // capacity 1: the store refused us for good
	cancel context.CancelFunc
	done   chan struct{}
}

func newCommitter(store offsets.Store, fence offsets.Fence, interval time.Duration, log *logrus.Entry,
	stored map[int32]int64, observe func(time.Duration, error)) *committer {
	return &committer{
		store:    store,
		fence:    fence,
		interval: interval,
		log:      log,
		observe:  observe,
		pending:  map[int32]int64{},
		anchors:  map[int32][]chan struct{}{},
		stored:   maps.Clone(stored),
		kick:     make(chan struct{}, 1),
		fenced:   make(chan error, 1),
	}
}

// start runs the commit loop in its own goroutine until stop.
func (c *committer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	go func() {
		defer close(c.done)
		c.run(ctx)
	}()
}

// stop ends the loop and waits for a commit under way.
func (c *committer) stop() {
	if c.cancel != nil {
		c.cancel()
		<-c.done
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

// offer queues offsets for the next commit.
func (c *committer) offer(m map[int32]int64) {
	if len(m) == 0 {
		return
	}
	c.mu.Lock()
	maps.Copy(c.pending, m)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// anchor queues offset for partition p, like offer, and closes done once a
// commit that includes p, of this offset or of a newer offer, has succeeded.
func (c *committer) anchor(p int32, offset int64, done chan struct{}) {
	c.mu.Lock()
	c.pending[p] = offset
	c.anchors[p] = append(c.anchors[p], done)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// take removes and returns everything pending, and the anchors waiting for
// it (every anchor waits for a pending partition).
func (c *committer) take() (map[int32]int64, map[int32][]chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil, nil
	}
	m, anchors := c.pending, c.anchors
	c.pending, c.anchors = map[int32]int64{}, map[int32][]chan struct{}{}
	return m, anchors
}

// putBack returns offsets of a failed commit, unless newer ones arrived,
// and their anchors, which wait for whichever is committed next.
func (c *committer) putBack(m map[int32]int64, anchors map[int32][]chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, o := range m {
		if _, newer := c.pending[p]; !newer {
			c.pending[p] = o
		}
	}
	for p, a := range anchors {
		c.anchors[p] = append(c.anchors[p], a...)
	}
}

// release closes the anchors of a successful commit.
func release(anchors map[int32][]chan struct{}) {
	for _, a := range anchors {
		for _, done := range a {
			close(done)
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
		m, anchors := c.take()
		if m == nil {
			continue
		}
		start := time.Now()
		c.mu.Lock()
		c.runningSince = start
		c.mu.Unlock()
		err := c.store.Commit(ctx, c.fence, m)
		c.record(m, time.Since(start), err)
		switch {
		case err == nil:
			if failures > 0 {
				c.log.WithField("failures", failures).Info("offset commits work again")
			}
			failures = 0
			release(anchors)
			c.log.WithFields(logrus.Fields{"offsets": m, "took": time.Since(start)}).Debug("offsets committed")
		case errors.Is(err, offsets.ErrFenced):
			c.fenced <- err
			return
		default:
			c.putBack(m, anchors)
			if failures == 0 || failures%30 == 0 {
				c.log.WithError(err).WithField("failures", failures+1).Warn("offset commit failed; retrying")
			}
			failures++
			retry = time.After(c.interval)
		}
	}
}

// flush stops the loop and commits everything pending plus m, synchronously.
func (c *committer) flush(ctx context.Context, m map[int32]int64) error {
	c.stop()
	c.offer(m)
	all, anchors := c.take()
	if all == nil {
		return nil
	}
	start := time.Now()
	err := c.store.Commit(ctx, c.fence, all)
	c.record(all, time.Since(start), err)
	if err != nil {
		return fmt.Errorf("commit %v: %w", all, err)
	}
	release(anchors)
	return nil
}

// record notes the outcome of one commit of m, for report and OnCommit.
func (c *committer) record(m map[int32]int64, took time.Duration, err error) {
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
	maps.Copy(c.stored, m)
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
