package fanout

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// pipeline is what serves clients for one stretch of time, whichever the
// mode: the source that consumes the topic, the dead-letter producer (with
// --max-attempts) and the dispatcher between them. start starts the three;
// close stops the source and the dead letters only once the dispatcher has
// returned, so that they outlive its drain (a leader's final deliveries, a
// spread member's handoffs).
type pipeline struct {
	src  *kafka.Source
	disp *dispatch.Dispatcher
	dead *kafka.DeadLetters // nil without --max-attempts

	topic      string
	backoffMax time.Duration // of the source's retries
	log        *logrus.Entry

	routines   actor.Group
	stopSource context.CancelFunc
	dispDone   chan struct{} // closed when the dispatcher's Run returned
	dispErr    error         // what it returned, once dispDone is closed
}

// newPipeline returns the pipeline of the source of src on client and the
// dispatcher of cfg over it, with the daemon's dead-letter producer when
// --max-attempts is set. Nothing runs until start.
func (d *Daemon) newPipeline(client sarama.Client, src kafka.SourceConfig, cfg dispatch.Config) (*pipeline, error) {
	initial, err := kafka.ParseInitialOffset(d.opts.InitialOffset)
	if err != nil {
		return nil, err
	}
	src.Topic, src.Initial, src.Logger = d.opts.Topic, initial, cfg.Logger
	source, err := kafka.NewSource(client, src)
	if err != nil {
		return nil, fmt.Errorf("kafka source: %w", err)
	}
	p := &pipeline{src: source, topic: d.opts.Topic, backoffMax: d.opts.ConnectBackoffMax, log: cfg.Logger,
		dispDone: make(chan struct{})}
	if d.opts.MaxAttempts > 0 {
		producer, err := sarama.NewSyncProducerFromClient(d.deadClient)
		if err != nil {
			return nil, fmt.Errorf("dead-letter producer: %w", err)
		}
		p.dead = kafka.NewDeadLetters(producer, d.opts.DeadLetterTopic, d.opts.Topic, d.deadLimit, d.opts.ConnectBackoffMax, cfg.Logger)
		cfg.DeadLetter = p.dead
	}
	cfg.DeliveryLog = d.delivery
	cfg.Pause = d.pause
	if p.disp, err = dispatch.New(cfg, source); err != nil {
		if p.dead != nil {
			p.dead.Close()
		}
		return nil, err
	}
	return p, nil
}

// start runs the source and the dead-letter producer until close, and the
// dispatcher until ctx ends (then it drains, see dispatch.Dispatcher.Run)
// or it stops by itself.
func (p *pipeline) start(ctx context.Context) {
	srcCtx, stop := context.WithCancel(context.Background())
	p.stopSource = stop
	p.routines.Go(p.log, "source", func() {
		_ = retry(srcCtx, p.log, "consume topic "+p.topic, p.backoffMax, p.src.Run)
	}, nil)
	if p.dead != nil {
		p.routines.Go(p.log, "dead letters", func() { p.dead.Run(srcCtx) }, nil)
	}
	p.routines.Go(p.log, "dispatcher", func() {
		defer close(p.dispDone)
		p.dispErr = p.disp.Run(ctx)
	}, nil)
}

// stopped is closed once the dispatcher has returned.
func (p *pipeline) stopped() <-chan struct{} { return p.dispDone }

// wait waits for the dispatcher and returns what it returned.
func (p *pipeline) wait() error {
	<-p.dispDone
	return p.dispErr
}

// close waits for the dispatcher (end its context first), then stops the
// source and the dead-letter producer and waits for them.
func (p *pipeline) close() {
	<-p.dispDone
	p.stopSource()
	p.routines.Wait()
	if p.dead != nil {
		p.dead.Close()
	}
}

// backend forwards the server's calls to the dispatcher of the serving
// pipeline, if any. Between pipelines there is nobody to forward to: a
// joining client is told goodbye and other calls are dropped (their
// deliveries belong to a dispatcher that is gone and are redelivered from
// the committed offsets).
type backend struct {
	cur atomic.Pointer[pipeline] // the serving pipeline; nil between them
}

var _ dispatch.Backend = (*backend)(nil)

// serve makes p the serving pipeline until the returned function is
// called.
func (b *backend) serve(p *pipeline) (stop func()) {
	b.cur.Store(p)
	return func() { b.cur.CompareAndSwap(p, nil) }
}

// serving returns the serving pipeline, or nil.
func (b *backend) serving() *pipeline { return b.cur.Load() }

// dispatcher returns the serving pipeline's dispatcher, or nil.
func (b *backend) dispatcher() *dispatch.Dispatcher {
	if p := b.cur.Load(); p != nil {
		return p.disp
	}
	return nil
}

// Join implements dispatch.Backend.
func (b *backend) Join(id uint64, name string, max int, sink dispatch.ClientSink) {
	if d := b.dispatcher(); d != nil {
		d.Join(id, name, max, sink)
		return
	}
	sink.Goodbye("not serving")
}

// Ack implements dispatch.Backend.
func (b *backend) Ack(id uint64, ids []uint64) {
	if d := b.dispatcher(); d != nil {
		d.Ack(id, ids)
	}
}

// Nack implements dispatch.Backend.
func (b *backend) Nack(id uint64, ids []uint64, how dispatch.NackInfo) {
	if d := b.dispatcher(); d != nil {
		d.Nack(id, ids, how)
	}
}

// Observe implements dispatch.Backend.
func (b *backend) Observe(id uint64, name string, sink dispatch.ClientSink) {
	if d := b.dispatcher(); d != nil {
		d.Observe(id, name, sink)
		return
	}
	sink.Goodbye("not serving")
}

// Touch implements dispatch.Backend.
func (b *backend) Touch(id uint64, ids []uint64) {
	if d := b.dispatcher(); d != nil {
		d.Touch(id, ids)
	}
}

// Settle implements dispatch.Backend.
func (b *backend) Settle(id uint64, op dispatch.Op, ranges []dispatch.Range, how dispatch.NackInfo) {
	if d := b.dispatcher(); d != nil {
		d.Settle(id, op, ranges, how)
	}
}

// Leave implements dispatch.Backend.
func (b *backend) Leave(id uint64, reason dispatch.LeaveReason) {
	if d := b.dispatcher(); d != nil {
		d.Leave(id, reason)
	}
}
