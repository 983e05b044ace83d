package fanout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// spreadDeps are what a term of spread mode needs beyond a leader's: where
// the assignment comes from, the ownership records, the offsets of one
// partition, and how to leave the election when stopping.
type spreadDeps struct {
	assign  assignments
	records ownerRecords
	loader  partitionLoader
	resign  func()
}

// runSpread is runCluster in spread mode: this member serves the partitions
// its assignment gives it until ctx ends, in stretches: a stretch (one
// term of spread mode: a source, a dispatcher, an ownership loop) ends
// early only when its dispatcher stops by itself (its commits failed for
// the ZooKeeper session timeout); the next one begins after a backoff.
func (d *Daemon) runSpread(ctx context.Context, client sarama.Client, store *zkstore.Store, deps spreadDeps) error {
	b := backoff.Backoff{Min: 500 * time.Millisecond, Max: d.opts.ConnectBackoffMax, Jitter: true}
	for {
		t := d.newTerm(client, store, offsets.Fence{}, d.log)
		t.spread = &deps
		err := t.run(ctx, d.markReady)
		if ctx.Err() != nil {
			return nil
		}
		wait := b.Next()
		d.log.WithError(err).WithField("retry_in", wait.Round(time.Millisecond)).
			Error("serving the owned partitions stopped; starting again")
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// runSpread serves the term of a spread-mode member: a Manual source, a
// per-partition dispatcher, and the ownership loop that reserves, serves,
// hands over and drops partitions as the assignment and the ownership
// records say. It returns nil once ctx ended and every partition was handed
// over, or the dispatcher's error when it stopped by itself.
func (t *term) runSpread(ctx context.Context, started func()) error {
	initial, err := kafka.ParseInitialOffset(t.opts.InitialOffset)
	if err != nil {
		return err
	}
	src, err := kafka.NewSource(t.client, kafka.SourceConfig{
		Topic: t.opts.Topic, Initial: initial, Manual: true, Logger: t.log,
	})
	if err != nil {
		return fmt.Errorf("kafka source: %w", err)
	}
	var own *ownership
	cfg := t.dispatchConfig()
	cfg.DrainTimeout = t.opts.HandoffTimeout // stopping hands every partition over
	cfg.Scope = dispatch.AssignedPartitions(func(p int32, c offsets.Condition) {
		if v, ok := c.(zkstore.Version); ok {
			own.dispatcherLost(p, v)
		}
	})
	dead, err := t.newDeadLetters()
	if err != nil {
		return err
	}
	if dead != nil {
		defer dead.Close()
		cfg.DeadLetter = dead
	}
	disp, err := dispatch.New(cfg, src)
	if err != nil {
		return err
	}
	own, err = newOwnership(t.opts.NodeID, t.opts, t.log, t.spread.assign, t.spread.records, t.spread.loader,
		src, disp, t.ownStatus, t.handoffs)
	if err != nil {
		return err
	}
	own.onHandoff, own.onMembers, own.onStop = t.onHandoff, t.onMembers, t.spread.resign
	t.src, t.disp, t.dead = src, disp, dead

	srcCtx, stopSource := context.WithCancel(context.Background())
	dispCtx, stopDisp := context.WithCancel(context.Background())
	dispDone := make(chan struct{})
	var dispErr error
	var routines actor.Group
	routines.Go(t.log, "source", func() {
		_ = retry(srcCtx, t.log, "consume topic "+t.opts.Topic, t.opts.ConnectBackoffMax, src.Run)
	}, nil)
	if dead != nil {
		// Like the source, it outlives the dispatcher's handoffs.
		routines.Go(t.log, "dead letters", func() { dead.Run(srcCtx) }, nil)
	}
	routines.Go(t.log, "dispatcher", func() {
		defer close(dispDone)
		dispErr = disp.Run(dispCtx)
	}, nil)
	defer func() {
		stopDisp()
		<-dispDone
		stopSource()
		routines.Wait()
	}()

	t.serving.Store(t)
	started()
	t.log.Info("serving clients: the partitions this member owns")
	own.run(ctx, dispDone, stopDisp)
	<-dispDone
	t.serving.CompareAndSwap(t, nil)
	if ctx.Err() == nil {
		t.redirect()
		if dispErr == nil {
			dispErr = errors.New("the dispatcher stopped")
		}
		return dispErr
	}
	return nil
}

// spreadLeadership is what the server tells a client of a spread-mode
// member: a welcome while the member serves under an assignment in force
// (its mode is the leader's), else to retry shortly (a member starting, or
// one whose mode differs from the leader's: it does not serve).
func (d *Daemon) spreadLeadership() server.Leadership {
	if d.backend.serving() != nil {
		if el := d.elector.Load(); el != nil && el.Assignment() != nil {
			return server.Leadership{Leader: true}
		}
	}
	return server.Leadership{RetryAfter: d.opts.ClusterHeartbeat}
}

// members lists the advertised addresses of the members that own
// partitions (spread mode), sorted, with the assignment's epoch and
// generation as the list's version; nil and nil in leader mode or without
// an assignment in force. It is the server's Config.Members: it reads the
// elector's snapshot, never blocks.
func (d *Daemon) members() ([]string, *protocol.MembersVersion) {
	if el := d.elector.Load(); el != nil {
		if a := el.Assignment(); a != nil {
			return a.Addrs(), &protocol.MembersVersion{Epoch: a.Epoch, Generation: a.Generation}
		}
	}
	return nil, nil
}

// membersChanged is the one place the daemon tells the server that the
// members owning partitions changed (the server pushes the new list to the
// clients that asked for it); without an assignment in force it also sends
// the clients away (to retry: this member does not serve).
func (d *Daemon) membersChanged(addrs []string) {
	d.srv.MembersChanged()
	if addrs == nil {
		d.srv.RedirectAll(d.leadership())
	}
}
