package fanout

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// leaderMode is --assignment leader: the member the election makes leader
// serves every partition of the topic in a term under the term's fence,
// for as long as the term lasts; the other members redirect their clients
// to it.
type leaderMode struct{ d *Daemon }

func newLeaderMode(d *Daemon) mode { return &leaderMode{d: d} }

func (m *leaderMode) prepare(context.Context, *cluster.Config, authority.Authority) bool { return true }

// run leads during every term this node wins, until ctx ends.
func (m *leaderMode) run(ctx context.Context, s serveEnv) error {
	for {
		var term *cluster.Term
		select {
		case <-ctx.Done():
			return nil
		case err := <-s.elDone:
			s.elDone <- err // for the caller's wait
			return fmt.Errorf("election stopped: %w", err)
		case t, ok := <-s.el.Terms():
			if !ok {
				return nil
			}
			term = t
		}
		log := m.d.log.WithField("epoch", term.Epoch)
		log.WithField("fence", term.Fence).Info("elected leader")
		m.leadTerm(ctx, s.client, s.auth.Offsets(), term.Fence, term, log)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// termAuthority is where a term's fence came from: the election's term
// (*cluster.Term). It ends the term when it is lost, and is told when the
// term cannot go on.
type termAuthority interface {
	Lost() <-chan struct{} // closed when the term ends
	Cause() error          // why it ended; nil while it runs
	End(cause error)       // the term cannot go on: let another member lead
}

var _ termAuthority = (*cluster.Term)(nil)

// leadTerm serves a term under fence until ctx ends (then it drains and
// commits under the fence) or the term ends (then it abandons at once:
// another node owns the offsets). When the term cannot go on (a commit under
// its fence was refused, leading failed), it tells auth, so that the
// election hands leadership over instead of keeping a leader that serves
// nobody.
func (m *leaderMode) leadTerm(ctx context.Context, client sarama.Client, store offsets.Store, fence offsets.Fence,
	auth termAuthority, log *logrus.Entry) {
	termCtx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	unhook := context.AfterFunc(ctx, func() { stop(context.Canceled) })
	defer unhook()
	var watch actor.Group
	watchDone := make(chan struct{})
	watch.Go(log, "term watch", func() {
		select {
		case <-auth.Lost():
			stop(fmt.Errorf("%w: %w", dispatch.ErrAbandon, auth.Cause()))
		case <-watchDone:
		}
	}, nil)
	defer watch.Wait()
	defer close(watchDone)

	err := m.d.runTerm(termCtx, client, store, fence, log)
	switch {
	case err == nil:
		log.Info("leadership term over")
	case errors.Is(err, dispatch.ErrAbandon), errors.Is(err, offsets.ErrFenced), errors.Is(err, dispatch.ErrCommitsFailing):
		log.WithError(err).Warn("lost leadership")
	default:
		log.WithError(err).Error("leading failed")
	}
	if err != nil {
		auth.End(err) // a no-op when the authority ended it
	}
	m.d.srv.RedirectAll(m.d.leadership())
}

// leadership welcomes clients only while a term serves. A follower
// redirects to the leader the election names; a leader still starting up,
// or a cluster with no leader, tells clients to retry shortly.
func (m *leaderMode) leadership() server.Leadership {
	d := m.d
	if d.backend.serving() != nil {
		return server.Leadership{Leader: true}
	}
	// Without a leader, clients retry after about one cluster heartbeat: a
	// handover (the old leader resigned) takes about that long.
	none := server.Leadership{RetryAfter: d.opts.ClusterHeartbeat}
	el := d.elector.Load()
	if el == nil {
		return none
	}
	l := el.Leadership()
	if l.Leader || !l.Known || l.LeaderID == d.opts.NodeID {
		return none // elected, not serving yet; or resigning; or no leader known
	}
	if l.Mode != d.assignment.cluster {
		return none // the leader runs another mode: this member does not serve (the elector says why)
	}
	return server.Leadership{Known: true, LeaderID: l.LeaderID, LeaderAddr: l.LeaderAddr, Epoch: l.Epoch,
		RetryAfter: d.opts.ClusterHeartbeat}
}

// members is none: clients of a leader are not told of members.
func (m *leaderMode) members() ([]string, *protocol.MembersVersion) { return nil, nil }

func (m *leaderMode) snapshot(*metrics.Snapshot) {}
func (m *leaderMode) ownership() OwnershipStatus { return OwnershipStatus{} }

// partitions adds, while this node serves, every partition it knows: the
// serving leader owns them all.
func (m *leaderMode) partitions(_ context.Context, st *status.Status, snap metrics.Snapshot) {
	if snap.Serving {
		addOwnPartitions(st, snap, m.d.opts.NodeID)
	}
}

// runTerm serves one term under fence, the whole topic committed to store:
// until ctx ends, then it drains and commits under the fence and returns
// nil; or until the term is lost, then it returns at once with the reason:
// ctx's cause when that wraps dispatch.ErrAbandon (the authority ended the
// term), the refused commit's error wrapping offsets.ErrFenced, or
// dispatch.ErrCommitsFailing when commits have failed for the offset
// store's session timeout. A lost term's clients are redirected before its
// source stops. It does not know where its fence came from (the election,
// or a store led alone).
func (d *Daemon) runTerm(ctx context.Context, client sarama.Client, store offsets.Store, fence offsets.Fence,
	log *logrus.Entry) error {
	var stored map[int32]int64
	err := retry(ctx, log, "load offsets", d.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		stored, err = store.Load(ctx)
		return err
	})
	if err != nil { // ended before serving
		if cause := context.Cause(ctx); errors.Is(cause, dispatch.ErrAbandon) {
			return cause
		}
		return nil
	}
	progress, err := d.loadProgress(ctx, store, log)
	if err != nil { // ended before serving
		if cause := context.Cause(ctx); errors.Is(cause, dispatch.ErrAbandon) {
			return cause
		}
		return nil
	}
	cfg := d.opts.dispatchConfig(dispatch.WholeTopic(fence), store, log, d.collector.ObserveCommit)
	cfg.Stored, cfg.Progress = stored, progress
	p, err := d.newPipeline(client, kafka.SourceConfig{Stored: stored}, cfg)
	if err != nil {
		return err
	}
	p.start(ctx)
	defer p.close()
	unserve := d.backend.serve(p)
	d.markReady()
	log.WithFields(logrus.Fields{"stored_offsets": stored, "fence": fence}).Info("serving clients")
	err = p.wait()
	unserve()
	if err != nil {
		// The term is lost: send the clients on now, before waiting for the
		// source to stop (a broker out of reach can hold that up).
		d.srv.RedirectAll(d.leadership())
	}
	return err
}

// loadProgress loads, from a store that keeps it, the progress stored with
// the offsets, retrying until ctx ends (then it returns ctx's error).
// Progress that does not decode is logged and left out: those partitions
// start from their committed offsets alone.
func (d *Daemon) loadProgress(ctx context.Context, store offsets.Store, log *logrus.Entry) (map[int32]offsets.Progress, error) {
	ps, ok := store.(offsets.ProgressStore)
	if !ok {
		return nil, nil
	}
	var progress map[int32]offsets.Progress
	err := retry(ctx, log, "load progress", d.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		progress, err = ps.LoadProgress(ctx)
		if errors.Is(err, offsets.ErrBadProgress) {
			log.WithError(err).Warn("stored progress unreadable: those partitions deliver again everything from their committed offsets")
			return nil
		}
		return err
	})
	return progress, err
}
