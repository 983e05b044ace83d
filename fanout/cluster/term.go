package cluster

import (
	"context"
	"errors"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Causes of the end of a Term, as returned by Term.Cause (wrapped with
// details; test with errors.Is).
var (
	// ErrSuperseded: the fence record (the znode in ZooKeeper, or the
	// group's member in Kafka) no longer is the one the term wrote (another
	// term recorded its epoch, or the record was rewritten or deleted).
	ErrSuperseded = errors.New("cluster: the fence record no longer names this term")
	// ErrCutOff: this node's own heartbeats stopped coming back through
	// the log for LeaderTimeout, so it may be cut off from Kafka.
	ErrCutOff = errors.New("cluster: own heartbeats not seen in the log")
	// ErrSessionExpired: the session with the authority that fenced the
	// term is gone (the ZooKeeper session expired, or the coordinator no
	// longer knows the term's membership of the Kafka group).
	ErrSessionExpired = errors.New("cluster: session with the authority lost")
	// ErrResigned: Resign was called.
	ErrResigned = errors.New("cluster: resigned")
	// ErrStopped: Run returned.
	ErrStopped = errors.New("cluster: elector stopped")
)

// Term is one leadership term of this node: it won Epoch and recorded it
// with the authority (in ZooKeeper, leaving the fence znode at
// FenceVersion; or as the Kafka group's member). It ends once, when Lost is
// closed; Cause then says why.
type Term struct {
	Epoch        uint64        // the leader epoch of this term
	FenceVersion int32         // ZooKeeper: the fence znode's version written by this term's CAS
	Fence        offsets.Fence // for every commit of the term: the znode at FenceVersion, or the group membership

	session int64 // the ZooKeeper session of the CAS
	ctx     context.Context
	end     context.CancelCauseFunc
}

// newTerm returns a running term that wrote rec and commits under fence.
func newTerm(epoch uint64, rec record, fence offsets.Fence, session int64) *Term {
	ctx, end := context.WithCancelCause(context.Background())
	return &Term{Epoch: epoch, FenceVersion: rec.Version, Fence: fence, session: session, ctx: ctx, end: end}
}

// Lost is closed when the term ends.
func (t *Term) Lost() <-chan struct{} { return t.ctx.Done() }

// Cause says why the term ended; nil while it runs.
func (t *Term) Cause() error {
	if t.ctx.Err() == nil {
		return nil
	}
	return context.Cause(t.ctx)
}

// Context returns a context derived from parent that is also cancelled
// when the term ends, with the term's cause as its context.Cause. Call
// cancel to release it.
func (t *Term) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancelCause := context.WithCancelCause(parent)
	stop := context.AfterFunc(t.ctx, func() { cancelCause(context.Cause(t.ctx)) })
	return ctx, func() {
		stop()
		cancelCause(context.Canceled)
	}
}

// End ends the term from outside with cause: its holder lost the right to
// lead (a commit under its fence was refused, commits have failed too
// long). The Elector then says in the log that this node no longer leads,
// without leaving the cluster, and sits out a leader timeout, so that
// another member takes over. It does nothing once the term has ended.
func (t *Term) End(cause error) {
	if cause == nil {
		cause = errors.New("cluster: term ended by its holder")
	}
	t.finish(cause)
}

// finish ends the term with cause (the first cause wins).
func (t *Term) finish(cause error) { t.end(cause) }
