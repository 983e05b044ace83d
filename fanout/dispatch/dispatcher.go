package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Config holds the dispatcher's settings. Zero values take the defaults.
type Config struct {
	AckTimeout       time.Duration // redeliver when no ack came in this long; default 30s
	MaxBuffered      int           // messages waiting for a client before fetching pauses; default 10000
	MaxBufferedBytes int           // payload bytes waiting for a client, and fetched bytes messages held alias (pins.go), before fetching pauses; default 64 MiB
	MaxOutstanding   int           // offsets the tracker may hold per partition before fetching it pauses (until half); default 50000
	CommitInterval   time.Duration // how often changed offsets are committed; default 1s
	DrainTimeout     time.Duration // how long shutdown waits for outstanding acks; default 10s
	// StallAfter is how long a partition's committable offset may stay put
	// while offsets of it are held before it is logged as stalled (see
	// stall.go); default 3 × AckTimeout, at least 30s.
	StallAfter time.Duration
	// MaxCommitFailure is how long commits may keep failing (or one may
	// hang) before Run gives up with ErrCommitsFailing; 0 means never.
	MaxCommitFailure time.Duration
	Store            offsets.Store // where offsets are committed; required
	// Scope is what the dispatcher serves and how its commits are fenced:
	// WholeTopic (a term's fence, given to every commit) or
	// AssignedPartitions; required.
	Scope  Scope
	Logger *logrus.Entry // default: the standard logger
	Now    func() time.Time

	// Stored holds the offsets loaded from Store: Stats.Committed reports
	// them until commits replace them.
	Stored map[int32]int64
	// OnCommit, when set, is called by the committer after each commit
	// attempt (not per message) with its duration and error, for metrics.
	OnCommit func(took time.Duration, err error)
	// FrameSize, when set, returns the size of the largest frame that can
	// carry a message to a client (the server's encoding). It is called once
	// per message as it arrives; clients whose sink is a LimitedSink get only
	// messages that fit their MaxFrameSize. Nil: every client takes every
	// message.
	FrameSize func(*Message) int

	// Progress holds the progress loaded with Stored from a Store that keeps
	// it (offsets.ProgressStore): messages it shows acked are not delivered
	// again, the others resume their failure counts (restore.go). With such
	// a Store every commit stores the partitions' progress too.
	Progress map[int32]offsets.Progress

	// Delivery policies; the zero values change nothing.

	// MaxAttempts, when > 0, is how many failed deliveries (ack timeout,
	// nack, client gone) a message gets before it goes to DeadLetter
	// instead of being delivered again (deadletter.go).
	MaxAttempts int
	// DeadLetter takes the messages that failed MaxAttempts times; required
	// with MaxAttempts.
	DeadLetter DeadLetter
	// RetryBackoffMin and RetryBackoffMax, when Min > 0, delay a redelivery
	// after a failure without a delay of its own by Min·2^(failures−1)
	// capped at Max, jittered (retry.go).
	RetryBackoffMin, RetryBackoffMax time.Duration
	// DisconnectWindow, when > 0, counts the failures of a message by
	// clients leaving (RedeliverDisconnect) at most once in this long: a
	// message requeued when its client left may go next to a client whose
	// connection is dead too and not yet seen closed (after a network cut,
	// or a pause of the daemon itself, all of them are), and each of those
	// leaves would otherwise burn one of its MaxAttempts (retry.go). The
	// daemon sets it to its client liveness window.
	DisconnectWindow time.Duration
	// KeyOrdering delivers the messages of a key of a partition in offset
	// order, one at a time (keys.go).
	KeyOrdering bool
	// Turn is how many messages, at most, a client takes in its
	// round-robin turn (up to its room); 0 or 1: one. One spreads messages
	// over every client with room; more carries several in one frame and
	// one ack to a client when clients outnumber the messages at hand,
	// for less CPU per message at the cost of a coarser balance. Clients
	// that gave weights are served by weight, one message at a time.
	Turn int

	// Pause, when set, pauses the deliveries while it is on (control.go);
	// the dispatcher starts as it stands. Nil: never paused.
	Pause *Pause

	// DeliveryLog, when set, gets an event per delivery, per outcome of one
	// (and whether a failure counted toward MaxAttempts), per client joining
	// and leaving, and per partition assigned, revoked, lost or restarted
	// (trace.go). Nil: nothing is logged, at the cost of a nil check.
	DeliveryLog *deliverylog.Log
}

// Defaults of Config's zero fields.
const (
	DefaultAckTimeout       = 30 * time.Second
	DefaultMaxBuffered      = 10000
	DefaultMaxBufferedBytes = 64 << 20
	DefaultMaxOutstanding   = 50000
	DefaultCommitInterval   = time.Second
	DefaultDrainTimeout     = 10 * time.Second
)

func (c *Config) setDefaults() {
	if c.RetryBackoffMax < c.RetryBackoffMin {
		c.RetryBackoffMax = c.RetryBackoffMin
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxOutstanding <= 0 {
		c.MaxOutstanding = DefaultMaxOutstanding
	}
	if c.CommitInterval <= 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.StallAfter <= 0 {
		c.StallAfter = max(3*c.AckTimeout, 30*time.Second)
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

type reqKind uint8

const (
	reqJoin reqKind = iota
	reqLeave
	reqAck
	reqNack
	reqTouch
	reqSettle
	reqStats
	reqClients
	reqObserve
	reqAssign
	reqRevoke
	reqDrop
	reqDrain
)

// request is a call from another goroutine, handled by Run in order.
type request struct {
	kind   reqKind
	id     uint64
	ids    []uint64
	op     Op      // reqSettle
	ranges []Range // reqSettle
	name   string
	why    string // reqDrain: the Goodbye's reason
	max    int
	sink   ClientSink
	reason LeaveReason
	reply  chan Stats
	list   chan []ClientStats // the answer to reqClients
	nack   NackInfo           // reqNack

	part    int32             // reqAssign, reqRevoke, reqDrop
	cond    offsets.Condition // reqAssign
	stored  int64             // reqAssign: the stored offset, or -1
	prog    offsets.Progress  // reqAssign: the progress stored above it
	timeout time.Duration     // reqRevoke
	revoked chan revokeReply  // reqRevoke
}

// Dispatcher hands messages from a Source to clients. Create it with New,
// run it with Run, and connect clients through its Backend methods.
type Dispatcher struct {
	cfg  Config
	src  Source
	log  *logrus.Entry
	reqs chan request
	done chan struct{} // closed when Run returns
}

// New returns a Dispatcher for src. It does nothing until Run.
func New(cfg Config, src Source) (*Dispatcher, error) {
	if cfg.Store == nil {
		return nil, errors.New("dispatch: Config.Store is required")
	}
	if cfg.Scope == nil {
		return nil, errors.New("dispatch: Config.Scope is required: the whole topic under a fence, or assigned partitions")
	}
	if _, err := cfg.Scope.commits(); err != nil {
		return nil, err
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("dispatch: Config.MaxAttempts %d is negative", cfg.MaxAttempts)
	}
	if cfg.MaxAttempts > 0 && cfg.DeadLetter == nil {
		return nil, errors.New("dispatch: Config.DeadLetter is required with MaxAttempts")
	}
	cfg.setDefaults()
	return &Dispatcher{
		cfg:  cfg,
		src:  src,
		log:  cfg.Logger,
		reqs: make(chan request, reqQueue),
		done: make(chan struct{}),
	}, nil
}

var _ Backend = (*Dispatcher)(nil)

// Join implements Backend.
func (d *Dispatcher) Join(id uint64, name string, maxInFlight int, sink ClientSink) {
	d.send(request{kind: reqJoin, id: id, name: name, max: maxInFlight, sink: sink})
}

// Leave implements Backend.
func (d *Dispatcher) Leave(id uint64, reason LeaveReason) {
	d.send(request{kind: reqLeave, id: id, reason: reason})
}

// Ack implements Backend.
func (d *Dispatcher) Ack(id uint64, ids []uint64) { d.sendIDs(reqAck, id, ids) }

// Nack implements Backend.
func (d *Dispatcher) Nack(id uint64, ids []uint64, how NackInfo) {
	for len(ids) > 0 {
		n := min(len(ids), maxRequestIDs)
		d.send(request{kind: reqNack, id: id, ids: ids[:n:n], nack: how})
		ids = ids[n:]
	}
}

// Observe implements Backend.
func (d *Dispatcher) Observe(id uint64, name string, sink ClientSink) {
	d.send(request{kind: reqObserve, id: id, name: name, sink: sink})
}

// Touch implements Backend.
func (d *Dispatcher) Touch(id uint64, ids []uint64) { d.sendIDs(reqTouch, id, ids) }

// Settle implements Backend.
func (d *Dispatcher) Settle(id uint64, op Op, ranges []Range, how NackInfo) {
	for len(ranges) > 0 {
		n := min(len(ranges), maxRequestIDs)
		d.send(request{kind: reqSettle, id: id, op: op, ranges: ranges[:n:n], nack: how})
		ranges = ranges[n:]
	}
}

// Bounds of the request queue: at most reqQueue requests wait, each naming
// at most maxRequestIDs delivery ids or ranges, so the ids and ranges
// waiting in the queue take at most 16 MiB whatever the clients' in-flight
// limits.
const (
	reqQueue      = 1024
	maxRequestIDs = 1024
)

// sendIDs queues ids for the dispatcher in requests of at most
// maxRequestIDs ids each.
func (d *Dispatcher) sendIDs(kind reqKind, id uint64, ids []uint64) {
	for len(ids) > 0 {
		n := min(len(ids), maxRequestIDs)
		d.send(request{kind: kind, id: id, ids: ids[:n:n]})
		ids = ids[n:]
	}
}

// Assign adds partition p (AssignedPartitions): its batches are taken from
// once Assign returns, and its offsets committed under cond. stored is the
// offset the store holds for it (for Stats.Committed), or -1, and prog the
// progress stored above it (its acked messages are not delivered again,
// the others resume their failure counts; zero: none). Call it
// before the source starts fetching p. It returns false when Run has
// returned.
func (d *Dispatcher) Assign(p int32, cond offsets.Condition, stored int64, prog offsets.Progress) bool {
	done := make(chan Stats, 1)
	select {
	case d.reqs <- request{kind: reqAssign, part: p, cond: cond, stored: stored, prog: prog, reply: done}:
	case <-d.done:
		return false
	}
	select {
	case <-done:
		return true
	case <-d.done:
		return false
	}
}

// Drop takes partition p away at once (AssignedPartitions: it was lost to
// another owner): its buffered messages and deliveries in flight are
// dropped (acks for them become unknown), nothing more of it is committed.
func (d *Dispatcher) Drop(p int32) { d.send(request{kind: reqDrop, part: p}) }

// Revoke hands partition p over (AssignedPartitions): call it once the
// source has stopped fetching p. Its buffered messages are dropped (the next
// owner fetches them again) and nothing more of it is delivered; its
// deliveries in flight are awaited for up to timeout, then dropped; its
// committable offset is committed under its condition as its last commit.
// Revoke returns once that commit is done; an error when p is not assigned,
// the commit was refused or failed until ctx ended, or the dispatcher
// stopped first. Acks of the deliveries awaited count as usual.
func (d *Dispatcher) Revoke(ctx context.Context, p int32, timeout time.Duration) (Revoked, error) {
	reply := make(chan revokeReply, 1)
	select {
	case d.reqs <- request{kind: reqRevoke, part: p, timeout: timeout, revoked: reply}:
	case <-d.done:
		return Revoked{}, ErrStopped
	case <-ctx.Done():
		return Revoked{}, fmt.Errorf("revoke partition %d: %w", p, ctx.Err())
	}
	var r revokeReply
	select {
	case r = <-reply:
	case <-d.done:
		select {
		case r = <-reply: // answered as Run returned
		default:
			return Revoked{}, ErrStopped
		}
	case <-ctx.Done():
		return Revoked{}, fmt.Errorf("revoke partition %d: %w", p, ctx.Err())
	}
	if r.err != nil || r.final == nil {
		return r.Revoked, r.err
	}
	select {
	case err := <-r.final:
		if err != nil {
			return r.Revoked, fmt.Errorf("final commit of partition %d at %d: %w", p, r.Offset, err)
		}
		r.Committed = true
		return r.Revoked, nil
	case <-ctx.Done():
		return r.Revoked, fmt.Errorf("final commit of partition %d at %d: %w", p, r.Offset, ctx.Err())
	}
}

// ErrStopped is returned by Revoke when the dispatcher's Run has returned.
var ErrStopped = errors.New("dispatch: dispatcher stopped")

func errNotAssigned(p int32) error { return fmt.Errorf("dispatch: partition %d is not assigned", p) }
func errRevoking(p int32) error {
	return fmt.Errorf("dispatch: partition %d is already being revoked", p)
}
func errDropped(p int32) error {
	return fmt.Errorf("dispatch: partition %d was dropped while being revoked", p)
}

// Stats returns a snapshot of the counters, or false once Run has returned
// or ctx ends first.
func (d *Dispatcher) Stats(ctx context.Context) (Stats, bool) {
	reply := make(chan Stats, 1)
	return call(ctx, d, request{kind: reqStats, reply: reply}, reply)
}

// Clients returns a snapshot of every joined client and observer, in no
// particular order, or false once Run has returned or ctx ends first. Like
// Stats it is one request, answered between deliveries; the per-client
// counters it reads are added to once per ack request, not per message.
func (d *Dispatcher) Clients(ctx context.Context) ([]ClientStats, bool) {
	reply := make(chan []ClientStats, 1)
	return call(ctx, d, request{kind: reqClients, list: reply}, reply)
}

// DrainClient drains the client whose session id is id or, when id is 0,
// every client named name (see control.go): each gets Goodbye(reason) and
// no more deliveries, and leaves once it holds nothing, or after
// Config.DrainTimeout; observers leave at once. It returns the sessions
// drained as they stood (none: no such client), or false once Run has
// returned or ctx ends first.
func (d *Dispatcher) DrainClient(ctx context.Context, id uint64, name, reason string) ([]ClientStats, bool) {
	reply := make(chan []ClientStats, 1)
	return call(ctx, d, request{kind: reqDrain, id: id, name: name, why: reason, list: reply}, reply)
}

// call queues r and waits for its answer on reply (capacity 1), or returns
// false once Run has returned or ctx ends first.
func call[T any](ctx context.Context, d *Dispatcher, r request, reply <-chan T) (T, bool) {
	var zero T
	select {
	case d.reqs <- r:
	case <-d.done:
		return zero, false
	case <-ctx.Done():
		return zero, false
	}
	select {
	case v := <-reply:
		return v, true
	case <-d.done:
		return zero, false
	case <-ctx.Done():
		return zero, false
	}
}

// send queues r unless Run has returned: then there is nobody to tell, and
// nothing to lose, as unacked messages are redelivered after a restart.
func (d *Dispatcher) send(r request) {
	select {
	case d.reqs <- r:
	case <-d.done:
	}
}

// ErrCommitsFailing is returned by Run when offset commits have failed (or
// one has hung) for Config.MaxCommitFailure: a leader that cannot commit
// must not deliver forever, as a crash would replay everything since.
var ErrCommitsFailing = errors.New("dispatch: offset commits failing for too long")

// ErrAbandon, as the cause of Run's context (context.WithCancelCause), makes
// Run return at once: no drain, no final commit. The daemon abandons a
// dispatcher when it loses leadership: another node owns the offsets then.
var ErrAbandon = errors.New("dispatch: abandoned")

// Run dispatches until ctx ends, then drains: it says goodbye to every
// client, waits up to DrainTimeout for outstanding acks, commits and returns
// nil. It returns early with an error wrapping offsets.ErrFenced, without a
// final commit, when the store refuses a commit because another node leads,
// with ErrCommitsFailing when commits have failed for MaxCommitFailure, and
// at once with ctx's cause when that wraps ErrAbandon.
func (d *Dispatcher) Run(ctx context.Context) (err error) {
	defer close(d.done)
	s := newState(d.cfg.AckTimeout)
	s.parts = d.cfg.Scope.table()
	s.trace, s.now = d.cfg.DeliveryLog, d.cfg.Now
	if s.trace != nil {
		s.tracePartition(deliverylog.Start, -1, -1, d.cfg.Scope.name())
		defer func() {
			s.traceStopped()
			s.tracePartition(deliverylog.Stop, -1, -1, stopDetail(err))
		}()
	}
	s.frameSize = d.cfg.FrameSize
	s.maxAttempts = uint32(d.cfg.MaxAttempts)
	s.deadLetter = d.cfg.DeadLetter
	s.retryMin, s.retryMax = d.cfg.RetryBackoffMin, d.cfg.RetryBackoffMax
	s.disconnectWindow = d.cfg.DisconnectWindow
	s.turn = max(d.cfg.Turn, 1)
	if d.cfg.KeyOrdering {
		s.keys = map[uint64]keyGate{}
	}
	_, progress := d.cfg.Store.(offsets.ProgressStore)
	if progress {
		s.tracker.TrackProgress()
		s.restore = newRestore(d.cfg.Progress)
	}
	var deadLetters <-chan []*Message
	if d.cfg.DeadLetter != nil {
		deadLetters = d.cfg.DeadLetter.Stored()
	}
	tooLarge := "message larger than any connected client accepts: it waits for a client that announces a large enough max_frame_size"
	if d.cfg.MaxAttempts > 0 {
		tooLarge += fmt.Sprintf(", for at most --max-attempts ack timeouts (%v), then it goes to the dead-letter topic",
			time.Duration(d.cfg.MaxAttempts)*d.cfg.AckTimeout)
	}
	s.onTooLarge = func(m *Message, largest int) {
		d.log.WithFields(logrus.Fields{"partition": m.Partition, "offset": m.Offset, "frame_size": m.frame, "largest_client_limit": largest}).
			Warn(tooLarge)
	}
	now := d.cfg.Now

	cm, err := newCommitter(d.cfg.Store, d.cfg.Scope, d.cfg.CommitInterval, d.log, d.cfg.Stored, d.cfg.OnCommit)
	if err != nil {
		return err // New checked it
	}
	cm.start()
	defer cm.stop()
	defer func() { // revocations and final commits still waiting
		for p, o := range s.parts {
			if o.revoke != nil {
				o.revoke.reply <- revokeReply{err: ErrStopped}
				delete(s.parts, p)
			}
		}
		cm.resolveFinals(ErrStopped)
	}()

	ackTimer := time.NewTimer(time.Hour)
	ackTimer.Stop()
	var armed time.Time // deadline ackTimer is armed for; zero when stopped
	commitTick := time.NewTicker(d.cfg.CommitInterval)
	defer commitTick.Stop()
	revokeTimer := time.NewTimer(time.Hour) // the earliest revocation deadline
	revokeTimer.Stop()
	var revokeArmed time.Time
	scanTimer := time.NewTimer(time.Hour) // the next scan of the buffers held (pins.go)
	scanTimer.Stop()
	scanArmed := false

	setPaused := func(p bool) {
		if p != s.paused {
			s.paused = p
			if p {
				d.src.Pause()
			} else {
				d.src.Resume()
			}
			d.log.WithField("buffered", s.buffered()).Debugf("fetching paused=%v", p)
		}
	}

	var pauseCh <-chan struct{}
	if d.cfg.Pause != nil {
		var on bool
		on, pauseCh = d.cfg.Pause.watch()
		d.setDeliveryPaused(s, on)
	}

	var drainTimer <-chan time.Time
	ctxDone := ctx.Done()
	batches := d.src.Batches()
	for {
		// While the fetched buffers held reach the bound, count them again
		// (the messages of some may be done), at most every scanEvery.
		if s.pinned >= d.cfg.MaxBufferedBytes && !scanArmed {
			if wait := s.lastScan.Add(scanEvery).Sub(now()); wait > 0 {
				scanTimer.Reset(wait)
				scanArmed = true
			} else {
				s.scanBuffers(d.cfg.MaxBufferedBytes, now())
			}
		}
		// Backpressure: take no batch while the buffer is full; fetch only
		// while someone can take messages and the buffer has room.
		// Once paused for a full buffer, fetch again only below half of
		// it, so that Pause and Resume do not alternate on every batch.
		// The fetched buffers that messages held alias count too
		// (pins.go).
		room := s.buffered() < d.cfg.MaxBuffered && s.bytes < d.cfg.MaxBufferedBytes && s.pinned < d.cfg.MaxBufferedBytes
		lowWater := s.buffered() <= d.cfg.MaxBuffered/2 && s.bytes <= d.cfg.MaxBufferedBytes/2
		var batchCh <-chan Batch
		if room && !s.draining {
			batchCh = batches
		}
		setPaused(s.draining || s.deliveryPaused || len(s.clients) == 0 || !room || (s.paused && !lowWater))
		if len(s.held) > 0 {
			d.releaseHeld(s)
		}
		if len(s.drains) > 0 {
			d.endDrains(s, now())
		}

		if dl, ok := s.nextDeadline(); !ok {
			if !armed.IsZero() {
				ackTimer.Stop()
				armed = time.Time{}
			}
		} else if !dl.Equal(armed) {
			ackTimer.Reset(dl.Sub(now()))
			armed = dl
		}

		if s.revoking > 0 {
			ready, next := s.revocations(now())
			for _, p := range ready {
				d.endRevoke(s, cm, p)
			}
			if !next.Equal(revokeArmed) {
				revokeTimer.Stop()
				if revokeArmed = next; !next.IsZero() {
					revokeTimer.Reset(next.Sub(now()))
				}
			}
		}

		if s.draining && s.flights.live == 0 && s.deadPending == 0 {
			return d.finalCommit(s, cm)
		}

		select {
		case b, ok := <-batchCh:
			if !ok {
				batches = nil
				d.log.Debug("source closed")
				continue
			}
			if !s.takes(b.Partition) {
				continue // not ours (any more): the owner fetches it
			}
			s.addBatch(b, now())
			d.hold(s, b.Partition)
			if b.Anchor != nil {
				// The source waits for the partition's start to be stored
				// before it sends the partition's messages.
				c, _ := s.tracker.Report(b.Partition)
				var prog map[int32]offsets.Progress
				if progress {
					prog = s.progress(map[int32]int64{b.Partition: c})
				}
				cm.anchor(b.Partition, c, prog, b.Anchor)
			}
		case ms := <-deadLetters:
			s.deadLettered(ms)
		case r := <-d.reqs:
			d.handle(s, cm, r, now())
		case <-pauseCh:
			var on bool
			on, pauseCh = d.cfg.Pause.watch()
			d.setDeliveryPaused(s, on)
		case <-ackTimer.C:
			armed = time.Time{}
			s.expire(now())
		case <-revokeTimer.C:
			revokeArmed = time.Time{}
		case <-scanTimer.C:
			scanArmed = false
			s.scanBuffers(d.cfg.MaxBufferedBytes, now())
		case lost := <-cm.lost:
			for p, cond := range lost {
				if o := s.parts[p]; o != nil && o.cond == cond {
					s.forget(p, "lost")
					d.cfg.Scope.lost(p, cond)
				}
			}
		case <-commitTick.C:
			cm.offer(d.dirty(s, progress))
			if s.pinned > 0 {
				s.scanBuffers(d.cfg.MaxBufferedBytes, now())
			}
			if !s.deliveryPaused {
				d.logStalls(s.checkStalls(now(), d.cfg.StallAfter))
			}
			for _, m := range s.expireTooLarge(now()) {
				d.log.WithFields(logrus.Fields{"partition": m.Partition, "offset": m.Offset, "frame_size": m.frame,
					"largest_client_limit": s.largestSize(), "waited_over": time.Duration(d.cfg.MaxAttempts) * d.cfg.AckTimeout}).
					Warn("message larger than any connected client accepts, for --max-attempts ack timeouts: it goes to the dead-letter topic")
			}
			if since := cm.troubleSince(); d.cfg.MaxCommitFailure > 0 && !since.IsZero() && time.Since(since) >= d.cfg.MaxCommitFailure {
				err := fmt.Errorf("%w: since %s (%v)", ErrCommitsFailing, since.Format(time.RFC3339Nano), time.Since(since).Round(time.Millisecond))
				d.log.WithError(err).WithField("in_flight", s.flights.live).
					Error("offset commits keep failing: stopping without a final commit; unacked messages will be redelivered by the next leader")
				s.drain("offset commits failing")
				cm.abandon()
				return err
			}
		case err := <-cm.fenced:
			d.log.WithError(err).Warn("offset commit fenced: stopping without a final commit")
			s.drain("not the leader")
			cm.abandon()
			return err
		case <-ctxDone:
			if cause := context.Cause(ctx); errors.Is(cause, ErrAbandon) {
				d.log.WithError(cause).WithField("in_flight", s.flights.live).
					Warn("dispatcher abandoned: no drain, no final commit; unacked messages will be redelivered by the next leader")
				cm.abandon()
				return cause
			}
			ctxDone = nil
			d.log.WithField("in_flight", s.flights.live).Info("draining: waiting for outstanding acks")
			s.drain("shutting down")
			drainTimer = time.After(d.cfg.DrainTimeout)
		case <-drainTimer:
			d.log.WithField("in_flight", s.flights.live).Warn("drain timeout: unacked messages will be redelivered after restart")
			return d.finalCommit(s, cm)
		}
		s.dispatch(now())
	}
}

// stopDetail names, for the delivery log, why Run returned err.
func stopDetail(err error) string {
	switch {
	case err == nil:
		return "drained"
	case errors.Is(err, ErrAbandon):
		return "abandoned"
	case errors.Is(err, offsets.ErrFenced):
		return "fenced"
	case errors.Is(err, ErrCommitsFailing):
		return "commits-failing"
	}
	return "failed"
}

// hold pauses fetching partition p when the tracker holds more than
// MaxOutstanding of its offsets: an unacked message (a poison record, a
// client that holds it) keeps every later offset in the tracker, and
// fetching on would grow it without bound. The other partitions flow on.
func (d *Dispatcher) hold(s *state, p int32) {
	n := s.tracker.Outstanding(p)
	if n <= d.cfg.MaxOutstanding || s.held[p] {
		return
	}
	s.held[p] = true
	d.src.PausePartition(p)
	committable, _ := s.tracker.Committable(p)
	d.log.WithFields(logrus.Fields{"partition": p, "outstanding": n, "unacked": committable, "max_outstanding": d.cfg.MaxOutstanding}).
		Warn("partition holds too many offsets behind an unacked message: fetching it is paused until that message is acked")
}

// logStalls logs the partitions that became stalled or moved again.
func (d *Dispatcher) logStalls(rs []stallReport) {
	for _, r := range rs {
		log := d.log.WithFields(logrus.Fields{"partition": r.Partition, "offset": r.Offset, "for": r.For.Round(time.Millisecond),
			"outstanding": r.Outstanding})
		if r.Moved {
			log.Info("partition's committed offset moves again")
			continue
		}
		log.WithField("where", r.Where).
			Warn("partition's committed offset has not moved: the message at that offset holds it")
	}
}

// releaseHeld resumes fetching the held partitions that are back at half of
// MaxOutstanding or below (hysteresis, as for the buffer).
func (d *Dispatcher) releaseHeld(s *state) {
	for p := range s.held {
		if n := s.tracker.Outstanding(p); n <= d.cfg.MaxOutstanding/2 {
			delete(s.held, p)
			d.src.ResumePartition(p)
			d.log.WithFields(logrus.Fields{"partition": p, "outstanding": n}).Info("partition fetching resumed")
		}
	}
}

func (d *Dispatcher) handle(s *state, cm *committer, r request, now time.Time) {
	switch r.kind {
	case reqJoin:
		s.join(r.id, r.name, r.max, r.sink)
	case reqObserve:
		s.observe(r.id, r.name, r.sink)
	case reqLeave:
		if s.trace != nil {
			if c := s.clients[r.id]; c != nil {
				s.traceClient(deliverylog.Leave, c.id, c.name, r.reason.String())
			}
		}
		s.leave(r.id, r.reason, now)
	case reqAck:
		s.ack(r.id, r.ids)
	case reqNack:
		s.nack(r.id, r.ids, r.nack, now)
	case reqTouch:
		s.touch(r.id, r.ids, now)
	case reqSettle:
		s.settle(r.id, r.op, nil, r.ranges, r.nack, now)
	case reqStats:
		st := s.snapshot()
		cm.report(&st)
		r.reply <- st
	case reqClients:
		r.list <- s.clientStats()
	case reqDrain:
		r.list <- d.drainClients(s, r.id, r.name, r.why, now)
	case reqAssign:
		if err := cm.assign(r.part, r.cond, r.stored); err != nil {
			d.log.WithError(err).Error("Assign: ignored")
		} else {
			s.assign(r.part, r.cond, r.prog)
			if s.trace != nil {
				s.tracePartition(deliverylog.Assign, r.part, r.stored, "")
			}
		}
		r.reply <- Stats{}
	case reqDrop:
		if s.parts[r.part] != nil {
			s.forget(r.part, "lost")
			cm.forget(r.part)
		}
	case reqRevoke:
		s.revokeStart(r.part, now.Add(r.timeout), r.revoked)
	}
}

// dirty returns what changed since the last offer, for the committer: the
// committable offsets and, with a store that keeps it, their progress.
func (d *Dispatcher) dirty(s *state, progress bool) (map[int32]int64, map[int32]offsets.Progress) {
	offs := s.tracker.Dirty()
	if !progress || offs == nil {
		return offs, nil
	}
	return offs, s.progress(offs)
}

// endRevoke ends the revocation of partition p: its committable offset goes
// to the committer as its final commit, and the caller of Revoke is told.
func (d *Dispatcher) endRevoke(s *state, cm *committer, p int32) {
	o, offset, tracked, unacked, prog := s.revokeEnd(p)
	r := revokeReply{Revoked: Revoked{Offset: offset, Unacked: unacked, Dropped: o.revoke.dropped, Returned: o.revoke.returned}}
	if tracked {
		r.final = cm.finish(p, offset, map[int32]offsets.Progress{p: prog})
	} else {
		cm.forget(p)
	}
	log := d.log.WithFields(logrus.Fields{"partition": p, "offset": offset, "dropped_buffered": r.Dropped})
	if unacked > 0 {
		log.WithField("unacked", unacked).Warn("handoff timeout: deliveries still unacked are dropped; the next owner delivers them again")
	} else {
		log.Debug("partition revoked: every delivery acked")
	}
	o.revoke.reply <- r
}

// finalCommit commits what the committer has not yet stored plus every
// offset that changed since, synchronously.
func (d *Dispatcher) finalCommit(s *state, cm *committer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, prog := d.dirty(s, cm.ps != nil)
	if err := cm.flush(ctx, offs, prog); err != nil {
		return fmt.Errorf("final offset commit: %w", err)
	}
	d.log.Info("offsets committed; dispatcher stopped")
	return nil
}
