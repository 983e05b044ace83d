package fanout

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// term is one stretch of serving under one fence. It owns the fence it
// commits under, the source that consumes the topic, the dispatcher that
// serves the clients, and the redirect of those clients when it is lost.
// It does not know where its fence came from (the election, or a store led
// alone): the daemon makes a term for each fence it wins and runs them one
// after another.
type term struct {
	fence  offsets.Fence // given to every commit of the term
	store  offsets.Store
	client sarama.Client
	opts   Options
	// With --max-attempts: the dead-letter producer's client, and the
	// largest record it sends (deadLetterLimit).
	deadClient sarama.Client
	deadLimit  int
	log        *logrus.Entry
	onCommit   func(took time.Duration, err error) // the committer's report, for metrics
	redirect   func()                              // sends every client away once the term is lost
	serving    *atomic.Pointer[term]               // holds the term while its dispatcher runs

	// Spread mode (nil spread: a leader's term, fenced as a whole): the
	// term serves the partitions this member owns, each under its own
	// fence condition (see runSpread).
	spread    *spreadDeps
	ownStatus *atomic.Pointer[OwnershipStatus] // the ownership loop's status
	handoffs  *atomic.Uint64                   // handoffs done since the daemon started
	onHandoff func(took time.Duration)         // metrics
	onMembers func(addrs []string)             // the members owning partitions changed

	// Set before the term is published in serving, never changed after.
	src  *kafka.Source
	disp *dispatch.Dispatcher
	dead *kafka.DeadLetters // with --max-attempts: the term's dead-letter producer; else nil
}

// newTerm returns the daemon's term under fence, not yet running.
func (d *Daemon) newTerm(client sarama.Client, store offsets.Store, fence offsets.Fence, log *logrus.Entry) *term {
	return &term{
		fence:  fence,
		store:  store,
		client: client,
		opts:   d.opts,

		deadClient: d.deadClient,
		deadLimit:  d.deadLimit,
		log:        log,
		onCommit:   d.observeCommit,
		redirect:   func() { d.srv.RedirectAll(d.leadership()) },
		serving:    &d.backend.cur,

		ownStatus: &d.ownStatus,
		handoffs:  &d.handoffs,
		onHandoff: d.collector.ObserveHandoff,
		onMembers: d.membersChanged,
	}
}

// run serves the term until ctx ends, then drains and commits under the
// fence and returns nil; or until the term is lost, then it returns at once
// with the reason: ctx's cause when that wraps dispatch.ErrAbandon (the
// authority ended the term), the refused commit's error wrapping
// offsets.ErrFenced, or dispatch.ErrCommitsFailing when commits have failed
// for the offset store's session timeout. A lost term's clients are redirected before its source
// stops. started is called once the term serves clients.
func (t *term) run(ctx context.Context, started func()) error {
	if t.spread != nil {
		return t.runSpread(ctx, started)
	}
	var stored map[int32]int64
	err := retry(ctx, t.log, "load offsets", t.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		stored, err = t.store.Load(ctx)
		return err
	})
	if err != nil { // ended before serving
		if cause := context.Cause(ctx); errors.Is(cause, dispatch.ErrAbandon) {
			return cause
		}
		return nil
	}
	progress, err := t.loadProgress(ctx)
	if err != nil { // ended before serving
		if cause := context.Cause(ctx); errors.Is(cause, dispatch.ErrAbandon) {
			return cause
		}
		return nil
	}
	initial, err := kafka.ParseInitialOffset(t.opts.InitialOffset)
	if err != nil {
		return err
	}
	src, err := kafka.NewSource(t.client, kafka.SourceConfig{
		Topic: t.opts.Topic, Initial: initial, Stored: stored, Logger: t.log,
	})
	if err != nil {
		return fmt.Errorf("kafka source: %w", err)
	}
	cfg := t.dispatchConfig()
	cfg.Scope, cfg.Stored, cfg.Progress = dispatch.WholeTopic(t.fence), stored, progress
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
	t.src, t.disp, t.dead = src, disp, dead

	// The source and the dead-letter producer outlive the dispatcher's
	// drain: they stop only after the dispatcher has returned.
	srcCtx, stopSource := context.WithCancel(context.Background())
	var routines actor.Group
	routines.Go(t.log, "source", func() {
		_ = retry(srcCtx, t.log, "consume topic "+t.opts.Topic, t.opts.ConnectBackoffMax, src.Run)
	}, nil)
	if dead != nil {
		routines.Go(t.log, "dead letters", func() { dead.Run(srcCtx) }, nil)
	}
	defer func() {
		stopSource()
		routines.Wait()
	}()

	t.serving.Store(t)
	started()
	t.log.WithFields(logrus.Fields{"stored_offsets": stored, "fence": t.fence}).Info("serving clients")
	err = disp.Run(ctx)
	t.serving.CompareAndSwap(t, nil)
	if err != nil {
		// The term is lost: send the clients on now, before waiting for the
		// source to stop (a broker out of reach can hold that up).
		t.redirect()
	}
	return err
}

// loadProgress loads, from a store that keeps it, the progress stored with
// the offsets, retrying until ctx ends (then it returns ctx's error).
// Progress that does not decode is logged and left out: those partitions
// start from their committed offsets alone.
func (t *term) loadProgress(ctx context.Context) (map[int32]offsets.Progress, error) {
	ps, ok := t.store.(offsets.ProgressStore)
	if !ok {
		return nil, nil
	}
	var progress map[int32]offsets.Progress
	err := retry(ctx, t.log, "load progress", t.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		progress, err = ps.LoadProgress(ctx)
		if errors.Is(err, offsets.ErrBadProgress) {
			t.log.WithError(err).Warn("stored progress unreadable: those partitions deliver again everything from their committed offsets")
			return nil
		}
		return err
	})
	return progress, err
}

// newDeadLetters returns, with --max-attempts, the term's dead-letter
// producer on the daemon's dead-letter client (the caller runs it, and
// closes it once it has stopped); nil without.
func (t *term) newDeadLetters() (*kafka.DeadLetters, error) {
	if t.opts.MaxAttempts == 0 {
		return nil, nil
	}
	producer, err := sarama.NewSyncProducerFromClient(t.deadClient)
	if err != nil {
		return nil, fmt.Errorf("dead-letter producer: %w", err)
	}
	return kafka.NewDeadLetters(producer, t.opts.DeadLetterTopic, t.opts.Topic, t.deadLimit, t.opts.ConnectBackoffMax, t.log), nil
}

// dispatchConfig is the dispatcher's configuration derived from the
// options, without a fence.
func (t *term) dispatchConfig() dispatch.Config {
	return dispatch.Config{
		AckTimeout:       t.opts.AckTimeout,
		MaxBuffered:      t.opts.MaxBuffered,
		MaxBufferedBytes: t.opts.MaxBufferedBytes,
		MaxOutstanding:   t.opts.MaxOutstanding,
		CommitInterval:   t.opts.CommitInterval,
		DrainTimeout:     t.opts.DrainTimeout,
		MaxCommitFailure: t.opts.storeSessionTimeout(),
		Store:            t.store,
		Logger:           t.log,
		OnCommit:         t.onCommit,
		FrameSize:        server.DeliverFrameSize,
		MaxAttempts:      t.opts.MaxAttempts,
		RetryBackoffMin:  max(0, t.opts.RetryBackoffMin), // RetryBackoffOff: 0, none
		RetryBackoffMax:  max(0, t.opts.RetryBackoffMax),
		DisconnectWindow: time.Duration(t.opts.Liveness) * t.opts.Heartbeat,
		KeyOrdering:      t.opts.Ordering == OrderingKey,
	}
}

// termBackend forwards the server's calls to the dispatcher of the serving
// term, if any. Between terms there is nobody to forward to: a joining
// client is told goodbye and other calls are dropped (their deliveries
// belong to a dispatcher that is gone and are redelivered from the committed
// offsets).
type termBackend struct {
	cur atomic.Pointer[term] // the serving term; nil between terms
}

var _ dispatch.Backend = (*termBackend)(nil)

// serving returns the serving term, or nil.
func (b *termBackend) serving() *term { return b.cur.Load() }

// dispatcher returns the serving term's dispatcher, or nil.
func (b *termBackend) dispatcher() *dispatch.Dispatcher {
	if t := b.cur.Load(); t != nil {
		return t.disp
	}
	return nil
}

// Join implements dispatch.Backend.
func (b *termBackend) Join(id uint64, name string, max int, sink dispatch.ClientSink) {
	if d := b.dispatcher(); d != nil {
		d.Join(id, name, max, sink)
		return
	}
	sink.Goodbye("not serving")
}

// Ack implements dispatch.Backend.
func (b *termBackend) Ack(id uint64, ids []uint64) {
	if d := b.dispatcher(); d != nil {
		d.Ack(id, ids)
	}
}

// Nack implements dispatch.Backend.
func (b *termBackend) Nack(id uint64, ids []uint64, how dispatch.NackInfo) {
	if d := b.dispatcher(); d != nil {
		d.Nack(id, ids, how)
	}
}

// Observe implements dispatch.Backend.
func (b *termBackend) Observe(id uint64, name string, sink dispatch.ClientSink) {
	if d := b.dispatcher(); d != nil {
		d.Observe(id, name, sink)
		return
	}
	sink.Goodbye("not serving")
}

// Touch implements dispatch.Backend.
func (b *termBackend) Touch(id uint64, ids []uint64) {
	if d := b.dispatcher(); d != nil {
		d.Touch(id, ids)
	}
}

// Settle implements dispatch.Backend.
func (b *termBackend) Settle(id uint64, op dispatch.Op, ranges []dispatch.Range, how dispatch.NackInfo) {
	if d := b.dispatcher(); d != nil {
		d.Settle(id, op, ranges, how)
	}
}

// Leave implements dispatch.Backend.
func (b *termBackend) Leave(id uint64, reason dispatch.LeaveReason) {
	if d := b.dispatcher(); d != nil {
		d.Leave(id, reason)
	}
}
