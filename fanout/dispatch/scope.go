package dispatch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Scope is what a dispatcher serves and how its commits are fenced: the
// whole topic under the one fence of a term (WholeTopic), or the
// partitions assigned to it while it runs, each under its own condition
// (AssignedPartitions). Whoever makes the dispatcher chooses it once;
// neither Run nor the committer asks which one it is.
type Scope interface {
	// commits returns the committer's share of the scope for one
	// dispatcher, or what makes the scope unusable.
	commits() (commitScope, error)
	// table returns the dispatch state's table of assigned partitions:
	// nil when every partition is served.
	table() map[int32]*owned
	// lost is told of partition p, dropped because a commit under its
	// condition cond was refused. It is called from the dispatcher's
	// goroutine and must not block.
	lost(p int32, cond offsets.Condition)
	// name says what it serves, for the delivery log.
	name() string
}

// WholeTopic is the scope of a term that serves every partition of the
// topic and commits them all under fence. A commit refused under it ends
// the dispatcher (Run returns an error wrapping offsets.ErrFenced).
func WholeTopic(fence offsets.Fence) Scope { return wholeTopic{fence: fence} }

// AssignedPartitions is the scope of a member that serves only the
// partitions given to it with Dispatcher.Assign, each committed under the
// condition it was assigned with, until Revoke or Drop; batches of other
// partitions are dropped. A commit refused for a partition drops that
// partition alone, never the dispatcher, and onLost, when set, is told
// (from the dispatcher's goroutine: it must not block).
func AssignedPartitions(onLost func(p int32, cond offsets.Condition)) Scope {
	return assignedPartitions{onLost: onLost}
}

// commitScope is a Scope's share of one committer: which partitions it
// commits, under which fence, and what a refused commit ends. Its methods
// are called with the committer's mutex held, except refused.
type commitScope interface {
	// covers reports whether offsets of partition p are committed.
	covers(p int32) bool
	// fenceOf returns the fence of a commit of m (partitions it covers).
	fenceOf(m map[int32]int64) offsets.Fence
	// current reports whether partition p is still committed under the
	// condition fence holds for it.
	current(p int32, fence offsets.Fence) bool
	// assign makes partition p committable under cond.
	assign(p int32, cond offsets.Condition) error
	// forget stops committing partition p; a final commit of it still
	// waiting is answered with err.
	forget(p int32, err error)
	// finish registers done as the final commit of p: the next commit of
	// p under its current condition answers it.
	finish(p int32, done chan<- error) error
	// committed is told that a commit of p under fence succeeded with no
	// newer offset pending; it reports whether that answered p's final
	// commit (then p is forgotten).
	committed(p int32, fence offsets.Fence) bool
	// resolveFinals answers every final commit still waiting with err.
	resolveFinals(err error)
	// takeLost returns the partitions found fenced since the last call.
	takeLost() map[int32]offsets.Condition
	// refused handles the commit of m under fence that the store refused
	// with err (wrapping offsets.ErrFenced), and returns what it committed
	// after all and the error, if any, that the commit loop is to take.
	refused(ctx context.Context, c *committer, m map[int32]int64, fence offsets.Fence,
		anchors map[int32][]chan struct{}, err error) (map[int32]int64, error)
}

// wholeTopic is the Scope of WholeTopic.
type wholeTopic struct{ fence offsets.Fence }

func (s wholeTopic) commits() (commitScope, error) {
	if s.fence.IsZero() {
		return nil, errors.New("dispatch: WholeTopic needs a fence: no commit without a fence")
	}
	return topicCommits(s), nil
}

func (wholeTopic) table() map[int32]*owned       { return nil }
func (wholeTopic) name() string                  { return "all-partitions" }
func (wholeTopic) lost(int32, offsets.Condition) {}

// topicCommits is the committer's share of WholeTopic: every partition,
// one fence, and a refused commit is the end of the term.
type topicCommits struct{ fence offsets.Fence }

func (topicCommits) covers(int32) bool                         { return true }
func (t topicCommits) fenceOf(map[int32]int64) offsets.Fence   { return t.fence }
func (topicCommits) current(int32, offsets.Fence) bool         { return true }
func (topicCommits) forget(int32, error)                       {}
func (topicCommits) committed(int32, offsets.Fence) bool       { return false }
func (topicCommits) resolveFinals(error)                       {}
func (topicCommits) takeLost() map[int32]offsets.Condition     { return nil }
func (topicCommits) assign(p int32, _ offsets.Condition) error { return errWholeTopic(p) }
func (topicCommits) finish(p int32, _ chan<- error) error      { return errWholeTopic(p) }
func errWholeTopic(p int32) error {
	return fmt.Errorf("dispatch: partition %d: this dispatcher serves the whole topic, under one fence", p)
}

// refused ends the committer: another term owns the offsets now.
func (topicCommits) refused(_ context.Context, _ *committer, _ map[int32]int64, _ offsets.Fence,
	_ map[int32][]chan struct{}, err error) (map[int32]int64, error) {
	return nil, err
}

// assignedPartitions is the Scope of AssignedPartitions.
type assignedPartitions struct {
	onLost func(p int32, cond offsets.Condition)
}

func (assignedPartitions) commits() (commitScope, error) {
	return &partitionCommits{conds: map[int32]offsets.Condition{}, finals: map[int32]final{}}, nil
}

func (assignedPartitions) table() map[int32]*owned { return map[int32]*owned{} }
func (assignedPartitions) name() string            { return "assigned-partitions" }

func (s assignedPartitions) lost(p int32, cond offsets.Condition) {
	if s.onLost != nil {
		s.onLost(p, cond)
	}
}

// partitionCommits is the committer's share of AssignedPartitions: each
// partition committed under the condition it was assigned with, which its
// offers carry until it is forgotten or finished (a last commit, after
// which nothing of it is written). A commit's fence is made of the
// conditions of the partitions it writes, and a refused commit is not the
// end of the committer: the partitions whose conditions no longer hold are
// lost, the others committed again one by one. A final commit belongs to
// the stretch it was asked in: only a commit under that stretch's condition
// answers it, and a partition assigned again (a new stretch) answers a
// final commit still pending with an error, since its offset is no longer
// written.
type partitionCommits struct {
	conds     map[int32]offsets.Condition // the partitions committed, each under its condition
	finals    map[int32]final             // finish waits for these partitions' next commit
	lostParts map[int32]offsets.Condition // found fenced, not yet taken by takeLost
}

// final is a final commit that finish waits for: the partition's next
// successful commit under cond answers it.
type final struct {
	done chan<- error
	cond offsets.Condition
}

func (s *partitionCommits) covers(p int32) bool { return s.conds[p] != nil }

func (s *partitionCommits) fenceOf(m map[int32]int64) offsets.Fence {
	conds := make(map[int32]offsets.Condition, len(m))
	for p := range m {
		conds[p] = s.conds[p] // offer, anchor and finish keep only assigned partitions
	}
	return offsets.PartitionFence(conds)
}

func (s *partitionCommits) current(p int32, fence offsets.Fence) bool {
	conds, err := fence.Conditions([]int32{p})
	return err == nil && s.conds[p] != nil && conds[0] == s.conds[p]
}

func (s *partitionCommits) assign(p int32, cond offsets.Condition) error {
	if f, ok := s.finals[p]; ok {
		f.done <- fmt.Errorf("dispatch: final commit of partition %d not written: the partition was assigned again", p)
		delete(s.finals, p)
	}
	s.conds[p] = cond
	return nil
}

func (s *partitionCommits) forget(p int32, err error) {
	delete(s.conds, p)
	if f, ok := s.finals[p]; ok {
		f.done <- err
		delete(s.finals, p)
	}
}

func (s *partitionCommits) finish(p int32, done chan<- error) error {
	if s.conds[p] == nil {
		return fmt.Errorf("dispatch: final commit of partition %d: not assigned", p)
	}
	if f, ok := s.finals[p]; ok {
		f.done <- errors.New("dispatch: final commit replaced by a newer one")
	}
	s.finals[p] = final{done: done, cond: s.conds[p]}
	return nil
}

func (s *partitionCommits) committed(p int32, fence offsets.Fence) bool {
	f, ok := s.finals[p]
	if !ok || !s.current(p, fence) || f.cond != s.conds[p] {
		return false
	}
	f.done <- nil
	delete(s.finals, p)
	delete(s.conds, p)
	return true
}

func (s *partitionCommits) resolveFinals(err error) {
	for p, f := range s.finals {
		f.done <- err
		delete(s.finals, p)
	}
}

func (s *partitionCommits) takeLost() map[int32]offsets.Condition {
	l := s.lostParts
	s.lostParts = nil
	return l
}

// refused commits the partitions of m again one by one: those whose
// condition no longer holds are forgotten and kept for takeLost, the
// others are committed. It returns the first other error, if any, never
// offsets.ErrFenced.
func (s *partitionCommits) refused(ctx context.Context, c *committer, m map[int32]int64, fence offsets.Fence,
	anchors map[int32][]chan struct{}, err error) (map[int32]int64, error) {
	parts := slices.Sorted(maps.Keys(m))
	if len(parts) == 1 {
		s.lose(c, parts[0], fence, err)
		return nil, nil
	}
	done := map[int32]int64{}
	var first error
	for _, p := range parts {
		one := map[int32]int64{p: m[p]}
		err := c.attempt(ctx, one, fence)
		switch {
		case err == nil:
			done[p] = m[p]
		case errors.Is(err, offsets.ErrFenced):
			s.lose(c, p, fence, err)
		default:
			c.putBack(one, fence, anchors)
			if first == nil {
				first = err
			}
		}
	}
	return done, first
}

// lose forgets partition p, found fenced under its condition in fence, and
// keeps it for takeLost; unless p was forgotten or assigned again under
// another condition since.
func (s *partitionCommits) lose(c *committer, p int32, fence offsets.Fence, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !s.current(p, fence) {
		return // forgotten, or assigned again under another condition, since
	}
	cond := s.conds[p]
	c.forgetLocked(p, err)
	if s.lostParts == nil {
		s.lostParts = map[int32]offsets.Condition{}
	}
	s.lostParts[p] = cond
	c.log.WithError(err).WithField("partition", p).Warn("offset commit fenced: the partition is no longer ours")
}
