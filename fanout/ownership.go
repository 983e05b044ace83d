package fanout

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// The seams of the ownership loop, so that it is tested with fakes. The
// first three are the member's authority.Claims (the offset store's
// Owners), in parts.
type (
	// assignments is where a member learns its partitions
	// (authority.Assignments).
	assignments interface {
		Assignment() *cluster.Assignment
		AssignmentChanged() <-chan struct{}
	}
	// ownerRecords are how a member takes partitions and gives them back,
	// each reserve's condition fencing the partition's commits
	// (authority.Claims).
	ownerRecords interface {
		Session() int64
		Join(ctx context.Context, waiting func(session int64)) (int64, error)
		Reserve(ctx context.Context, p int32, gen uint64, waiting func(authority.Holder)) (offsets.Condition, error)
		Release(p int32, cond offsets.Condition, gen uint64) error
		Watch(ctx context.Context, cond offsets.Condition) error
	}
	// partitionLoader reads one partition's committed offset
	// (authority.Claims).
	partitionLoader interface {
		LoadPartition(ctx context.Context, p int32) (int64, bool, error)
	}
	// progressLoader reads the progress stored above one partition's
	// offset (authority.Claims; a loader without it restores none).
	progressLoader interface {
		LoadPartitionProgress(ctx context.Context, p int32) (offsets.Progress, error)
	}
	// partitionSource fetches the partitions added (*kafka.Source, Manual).
	partitionSource interface {
		Add(p int32, offset int64)
		Remove(p int32)
	}
	// partitionDispatcher serves the partitions assigned
	// (*dispatch.Dispatcher of dispatch.AssignedPartitions).
	partitionDispatcher interface {
		Assign(p int32, cond offsets.Condition, stored int64, prog offsets.Progress) bool
		Revoke(ctx context.Context, p int32, timeout time.Duration) (dispatch.Revoked, error)
		Drop(p int32)
	}
)

// partState is where one partition of interest to the member stands.
type partState int

const (
	acquiring partState = iota // assigned: reserving its record (waiting for its holder's release)
	serving                    // reserved: fetched, delivered, committed under cond
	releasing                  // handing over: awaiting its in-flight, final commit, release
)

// ownedPart is one partition of interest to the member.
type ownedPart struct {
	state  partState
	token  uint64             // tells this acquirer's events from an earlier one's
	cancel context.CancelFunc // stops its acquirer (and watcher)
	cond   offsets.Condition  // serving, releasing: the condition our reserve left
	gen    uint64             // the assignment generation it was reserved or released under
	since  time.Time          // when it entered its state
}

// ownEvent is what the loop's helpers report to it.
type ownEvent struct {
	p      int32
	token  uint64
	kind   ownEventKind
	cond   offsets.Condition
	offset int64 // reserved: the committed offset, when stored
	stored bool
	prog   offsets.Progress // reserved: the progress stored above offset
	waited time.Duration    // reserved: since the acquirer began
	begin  time.Time        // released: when the handoff began
	err    error            // released: what went wrong, if anything
	rev    dispatch.Revoked
}

type ownEventKind int

const (
	evReserved ownEventKind = iota // the record is ours
	evLost                         // the record is no longer ours
	evReleased                     // a handoff is done
)

// OwnershipStatus is a member's view of its partitions in spread mode, for
// metrics, /readyz and logs.
type OwnershipStatus struct {
	Generation uint64  // of the assignment in force; 0 when none
	Assigned   []int32 // the partitions the assignment gives this member
	Owned      []int32 // the partitions it serves (reserved, fetched, delivered)
	HandingOff []int32 // the partitions it is handing over
	Handoffs   uint64  // handoffs done since the daemon started
}

// ownership is the loop of spread mode that makes a member own exactly the
// partitions its assignment gives it: it reserves each assigned partition
// once free (release-before-reserve: while another member holds it, it
// watches the record), then starts fetching and delivering it; it hands
// over each partition the assignment takes away (stop fetching, await its
// in-flight messages up to the handoff timeout, commit, release); it drops
// a partition at once when its record no longer is ours (another member
// took it over because our session expired, or an operator changed it; or
// the group's generation no longer lets it hold it), and every partition
// when our membership is lost (the ZooKeeper session expired, or the group's
// coordinator dropped the member). One goroutine
// owns all of its state; helpers (an acquirer-and-watcher per partition
// being reserved or served, a goroutine per handoff) report on events.
type ownership struct {
	node      string
	opts      Options
	initial   int64 // --initial-offset as a sarama policy
	log       *logrus.Entry
	assign    assignments
	records   ownerRecords
	loader    partitionLoader
	src       partitionSource
	disp      partitionDispatcher
	onHandoff func(took time.Duration) // metrics; may be nil
	onMembers func(addrs []string)     // the members that own partitions changed (nil: none in force); may be nil
	// onUnassigned is called once no assignment is in force and every
	// partition was handed over (the spread mode sends the clients away
	// then, not before: their acks of the deliveries in flight are what
	// the handoffs wait for); again only after an assignment was in force.
	onUnassigned func()
	onStop       func() // called first when ctx ends (spread: resign from the election); may be nil

	events  chan ownEvent
	lost    chan ownEvent // from the dispatcher (its scope's onLost): must never block it
	helpers actor.Group
	status  *atomic.Pointer[OwnershipStatus] // published after every change
	total   *atomic.Uint64                   // handoffs done, across stretches

	// Owned by the loop.
	parts    map[int32]*ownedPart
	session  int64
	tokens   uint64
	current  *cluster.Assignment // the assignment in force as last reconciled
	members  []string            // its member addresses as last told
	sentAway bool                // onUnassigned was called since an assignment was last in force
}

// newOwnership returns the loop of a stretch of spread mode.
func newOwnership(node string, opts Options, log *logrus.Entry, assign assignments, records ownerRecords,
	loader partitionLoader, src partitionSource, disp partitionDispatcher,
	status *atomic.Pointer[OwnershipStatus], total *atomic.Uint64) (*ownership, error) {
	initial, err := kafka.ParseInitialOffset(opts.InitialOffset)
	if err != nil {
		return nil, err
	}
	return &ownership{
		node: node, opts: opts, initial: initial, log: log, assign: assign, records: records, loader: loader,
		src: src, disp: disp, status: status, total: total,
		events: make(chan ownEvent), lost: make(chan ownEvent, 1024), parts: map[int32]*ownedPart{},
	}, nil
}

// dispatcherLost is the dispatcher's onLost: a commit under p's condition
// was refused, so p is no longer ours. It never blocks; when the queue is
// full the record's watch tells the loop anyway.
func (o *ownership) dispatcherLost(p int32, cond offsets.Condition) {
	select {
	case o.lost <- ownEvent{p: p, kind: evLost, cond: cond}:
	default:
	}
}

// run owns the member's partitions until ctx ends, then hands every one of
// them over: it stops fetching, has stop (the dispatcher's drain: goodbye
// to the clients, in-flight messages awaited up to the handoff timeout,
// final commit under each partition's condition) run, and releases the
// records. It returns early, dropping everything, when the dispatcher
// stopped by itself (dispDone closed).
func (o *ownership) run(ctx context.Context, dispDone <-chan struct{}, stop func()) {
	defer o.publish()
	session, err := o.join(ctx)
	if err != nil {
		stop()
		return
	}
	o.session = session
	tick := time.NewTicker(o.opts.ClusterHeartbeat)
	defer tick.Stop()
	for {
		// Before the assignment: a membership lost takes the assignment
		// with it, and its partitions are dropped, not handed over.
		if s := o.records.Session(); s != o.session && ctx.Err() == nil {
			o.log.WithFields(logrus.Fields{"session": sessionHex(o.session), "now": sessionHex(s)}).
				Warn("membership lost (the ZooKeeper session expired, or the group's coordinator dropped this member): every partition may be taken over now; dropping them all")
			o.dropAll(ctx, false)
			o.publish()
			if s, err := o.join(ctx); err == nil {
				o.session = s
			}
		}
		o.reconcile(ctx)
		o.publish()
		select {
		case <-ctx.Done():
			o.shutdown(stop, dispDone)
			return
		case <-dispDone:
			o.log.Warn("the dispatcher stopped: dropping every partition, releasing their records")
			o.dropAll(ctx, true)
			o.finish()
			return
		case <-o.assign.AssignmentChanged():
		case ev := <-o.events:
			o.handle(ctx, ev)
		case ev := <-o.lost:
			o.handle(ctx, ev)
		case <-tick.C:
		}
	}
}

func sessionHex(s int64) string { return fmt.Sprintf("%#x", s) }

// join makes this member one of the members (the member znode, or the
// group's membership), retrying until ctx ends.
func (o *ownership) join(ctx context.Context) (int64, error) {
	var session int64
	err := retry(ctx, o.log, "join the members", o.opts.ConnectBackoffMax, func(ctx context.Context) error {
		var err error
		session, err = o.records.Join(ctx, func(other int64) {
			o.log.WithField("session", sessionHex(other)).
				Warn("this node id's member znode belongs to another session (a previous run whose session has not expired yet, or another process with this --node-id): waiting for it to go")
		})
		return err
	})
	if err == nil {
		o.log.WithField("session", sessionHex(session)).Info("joined the members")
	}
	return session, err
}

// reconcile brings the partitions in line with the assignment in force:
// it starts reserving those assigned and not held, and hands over those
// held and no longer assigned.
func (o *ownership) reconcile(ctx context.Context) {
	a := o.assign.Assignment()
	if a != o.current {
		o.current = a
		if addrs := a.Addrs(); !slices.Equal(addrs, o.members) {
			o.members = addrs
			if o.onMembers != nil {
				o.onMembers(addrs)
			}
		}
	}
	if ctx.Err() != nil {
		return
	}
	mine := a.Of(o.node)
	for _, p := range mine {
		if o.parts[p] == nil {
			o.acquire(p, a.Generation)
		}
	}
	for p, op := range o.parts {
		if _, ok := slices.BinarySearch(mine, p); ok {
			continue
		}
		switch op.state {
		case acquiring:
			op.cancel() // its reserve, if it wins, is released on arrival
			delete(o.parts, p)
		case serving:
			gen := uint64(0)
			if a != nil {
				gen = a.Generation
			}
			o.handOff(ctx, p, op, gen)
		}
	}
	switch {
	case a != nil:
		o.sentAway = false
	case len(o.parts) == 0 && !o.sentAway && o.onUnassigned != nil:
		o.sentAway = true
		o.onUnassigned()
	}
}

// acquire starts reserving partition p; once reserved, the same helper
// loads its committed offset, reports it, and watches the record.
func (o *ownership) acquire(p int32, gen uint64) {
	o.tokens++
	ctx, cancel := context.WithCancel(context.Background())
	op := &ownedPart{state: acquiring, token: o.tokens, cancel: cancel, gen: gen, since: time.Now()}
	o.parts[p] = op
	log := o.log.WithField("partition", p)
	o.helpers.Go(log, "acquire partition", func() {
		begin := time.Now()
		var cond offsets.Condition
		err := retry(ctx, log, "reserve partition", o.opts.ConnectBackoffMax, func(ctx context.Context) error {
			var err error
			cond, err = o.records.Reserve(ctx, p, gen, func(h authority.Holder) {
				log.WithFields(logrus.Fields{"holder": h.Node, "holder_session": h.Session}).
					Info("partition assigned to this member, held by another: waiting for its release")
			})
			return err
		})
		if err != nil {
			return // cancelled before reserving
		}
		ev := ownEvent{p: p, token: op.token, kind: evReserved, cond: cond, offset: -1}
		// The reserve is ours even if we were cancelled meanwhile: the loop
		// must hear of it, to serve or release it. Loading the offset is
		// only worth it while we still want it.
		_ = retry(ctx, log, "load the committed offset", o.opts.ConnectBackoffMax, func(ctx context.Context) error {
			off, ok, err := o.loader.LoadPartition(ctx, p)
			if err != nil || !ok {
				return err
			}
			ev.offset, ev.stored = off, true
			if pl, ok := o.loader.(progressLoader); ok {
				ev.prog, err = pl.LoadPartitionProgress(ctx, p)
				if errors.Is(err, offsets.ErrBadProgress) {
					log.WithError(err).Warn("stored progress unreadable: the partition delivers again everything from its committed offset")
					ev.prog, err = offsets.Progress{}, nil
				}
			}
			return err
		})
		ev.waited = time.Since(begin)
		if ctx.Err() != nil {
			ev.stored = false // unknown: this reserve is released
		}
		o.send(ev)
		if ctx.Err() != nil {
			return
		}
		if err := o.records.Watch(ctx, cond); err == nil {
			o.send(ownEvent{p: p, token: op.token, kind: evLost, cond: cond})
		}
	}, nil)
}

// send reports ev to the loop, which reads events until its helpers are
// done.
func (o *ownership) send(ev ownEvent) { o.events <- ev }

// handle takes one helper's report.
func (o *ownership) handle(ctx context.Context, ev ownEvent) {
	op := o.parts[ev.p]
	log := o.log.WithField("partition", ev.p)
	switch ev.kind {
	case evReserved:
		if op == nil || op.state != acquiring || op.token != ev.token || ctx.Err() != nil {
			// No longer wanted: give it back.
			gen := o.generation()
			o.helpers.Go(log, "release unwanted partition", func() {
				if err := o.records.Release(ev.p, ev.cond, gen); err != nil {
					log.WithError(err).Debug("releasing a partition reserved after it was no longer assigned")
				}
			}, nil)
			return
		}
		op.state, op.cond, op.since = serving, ev.cond, time.Now()
		start, stored := ev.offset, ev.offset
		if !ev.stored {
			start, stored = o.initial, -1
			if a := o.current; a == nil || ev.p >= a.InitialPartitions {
				// Added while the cluster ran, or its start was never
				// committed: nothing of it may be skipped.
				start = sarama.OffsetOldest
			}
		}
		if !o.disp.Assign(ev.p, ev.cond, stored, ev.prog) {
			return // the dispatcher stopped: run sees it
		}
		o.src.Add(ev.p, start)
		log.WithFields(logrus.Fields{"condition": ev.cond, "offset": offsetName(start), "waited": ev.waited.Round(time.Millisecond)}).
			Info("partition reserved: serving it")
	case evLost:
		if op == nil || op.cond != ev.cond || op.state != serving {
			return // a handoff under way finds out at its release
		}
		op.cancel()
		delete(o.parts, ev.p)
		o.src.Remove(ev.p)
		o.disp.Drop(ev.p)
		log.WithField("condition", ev.cond).
			Warn("partition lost: its ownership record changed (another member took it over); dropped, its in-flight messages come again from the new owner")
	case evReleased:
		if op != nil && op.state == releasing && op.cond == ev.cond {
			delete(o.parts, ev.p)
		}
		took := time.Since(ev.begin)
		fields := logrus.Fields{"took": took.Round(time.Millisecond), "offset": ev.rev.Offset,
			"unacked_dropped": ev.rev.Unacked, "buffered_dropped": ev.rev.Dropped, "returned_dropped": ev.rev.Returned}
		if ev.err != nil {
			log.WithError(ev.err).WithFields(fields).Warn("partition handed over with trouble")
		} else {
			log.WithFields(fields).Info("partition handed over: committed and released")
		}
		o.total.Add(1)
		if o.onHandoff != nil {
			o.onHandoff(took)
		}
	}
}

// handOff hands partition p over in a helper: stop fetching, let the
// dispatcher await its in-flight messages (up to the handoff timeout) and
// commit its final offset, then release its record under generation gen
// (retried until done, see release; ctx is the loop's).
func (o *ownership) handOff(ctx context.Context, p int32, op *ownedPart, gen uint64) {
	op.cancel() // its watcher
	op.state, op.since = releasing, time.Now()
	cond, begin, session := op.cond, op.since, o.session
	log := o.log.WithField("partition", p)
	log.WithField("generation", gen).Info("partition assigned elsewhere: handing it over")
	loop := ctx
	o.helpers.Go(log, "hand over partition", func() {
		o.src.Remove(p)
		// A bound for the final commit too: a store out of reach must not
		// keep the handoff forever (the partition is released anyway: the
		// next owner then resumes from an older offset, at-least-once).
		ctx, cancel := context.WithTimeout(context.Background(), o.opts.HandoffTimeout+o.opts.storeSessionTimeout())
		defer cancel()
		rev, err := o.disp.Revoke(ctx, p, o.opts.HandoffTimeout)
		if rerr := o.release(loop, log, p, cond, gen, session); rerr != nil {
			err = errors.Join(err, rerr)
		}
		o.send(ownEvent{p: p, kind: evReleased, cond: cond, err: err, rev: rev, begin: begin})
	}, nil)
}

// release writes partition p's released record, retrying while ZooKeeper
// cannot be reached. A record left naming this member's session keeps the
// next owner waiting until that session ends, and a ZooKeeper restart does
// not end it (sessions survive one): a --quick chaos run (spread, seed 8)
// had a partition unserved for minutes after a release failed during one.
// It stops when the release is done, when the record changed (another
// member took it over, or this member reserved it again: ErrNotOwner),
// when this member's session is no longer session (expired: the record is
// free), or when ctx (the loop's) ends: on shutdown the daemon closes its
// session, which frees the record too. The loop waits for its helpers when
// it stops, so a dispatcher stopped by failing commits restarts only once
// this is done; the new one could not join ZooKeeper before anyway.
func (o *ownership) release(ctx context.Context, log *logrus.Entry, p int32, cond offsets.Condition, gen uint64, session int64) error {
	var last error
	err := retry(ctx, log, "release of the partition's ownership record", o.opts.ConnectBackoffMax, func(context.Context) error {
		last = o.records.Release(p, cond, gen)
		if last == nil || errors.Is(last, authority.ErrNotOwner) || o.records.Session() != session {
			return nil
		}
		return last
	})
	if err != nil {
		return errors.Join(last, err)
	}
	return last
}

// dropAll drops every partition at once (the session expired, or the
// dispatcher stopped): nothing more is fetched, delivered or committed of
// them. With release, their records are released too, by helpers that
// retry (release): the next loop reserves again those still assigned to
// this member, and nobody else could take the others while the records
// name its live session.
func (o *ownership) dropAll(ctx context.Context, release bool) {
	gen, session := o.generation(), o.session
	for p, op := range o.parts {
		switch op.state {
		case acquiring:
			op.cancel()
			delete(o.parts, p)
		case serving:
			op.cancel()
			delete(o.parts, p)
			o.src.Remove(p)
			o.disp.Drop(p)
			if release {
				log, cond := o.log.WithField("partition", p), op.cond
				o.helpers.Go(log, "release dropped partition", func() {
					if err := o.release(ctx, log, p, cond, gen, session); err != nil {
						log.WithError(err).Debug("release after drop")
					}
				}, nil)
			}
		}
	}
}

// shutdown hands every partition over at once: no new reserve, fetching
// stops, the dispatcher drains (stop) and commits, then the records are
// released.
func (o *ownership) shutdown(stop func(), dispDone <-chan struct{}) {
	if o.onStop != nil {
		o.onStop() // the leader reassigns at once: the next owners wait for our releases
	}
	held := map[int32]*ownedPart{} // what was served, with the condition it was reserved under
	for p, op := range o.parts {
		switch op.state {
		case acquiring:
			op.cancel()
			delete(o.parts, p)
		case serving:
			op.cancel()
			o.src.Remove(p)
			held[p] = op
		}
	}
	heldParts := slices.Sorted(maps.Keys(held))
	o.log.WithField("partitions", heldParts).Info("stopping: handing every partition over")
	o.publish()
	stop() // the dispatcher drains: goodbye, in-flight awaited, final commit
	o.waitFor(dispDone)
	gen := o.generation()
	for _, p := range heldParts {
		if err := o.records.Release(p, held[p].cond, gen); err != nil {
			o.log.WithError(err).WithField("partition", p).Warn("release at shutdown")
		}
		delete(o.parts, p)
	}
	o.finish()
}

// waitFor waits until done is closed, taking the helpers' reports
// meanwhile (handoffs under way end as the dispatcher stops).
func (o *ownership) waitFor(done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // reserves arriving now are released
	for {
		select {
		case <-done:
			return
		case ev := <-o.events:
			o.handle(ctx, ev)
		case <-o.lost:
		}
	}
}

// finish cancels the helpers and waits for them, taking their last reports.
func (o *ownership) finish() {
	for _, op := range o.parts {
		op.cancel()
	}
	done := make(chan struct{})
	var waiter actor.Group
	waiter.Go(o.log, "ownership helpers' end", func() {
		o.helpers.Wait()
		close(done)
	}, nil)
	o.waitFor(done)
	waiter.Wait()
}

// generation is the generation of the assignment in force, or 0.
func (o *ownership) generation() uint64 {
	if o.current == nil {
		return 0
	}
	return o.current.Generation
}

// publish stores the status for metrics and /readyz.
func (o *ownership) publish() {
	st := &OwnershipStatus{Generation: o.generation(), Assigned: slices.Clone(o.current.Of(o.node)), Handoffs: o.total.Load()}
	for p, op := range o.parts {
		switch op.state {
		case serving:
			st.Owned = append(st.Owned, p)
		case releasing:
			st.HandingOff = append(st.HandingOff, p)
		}
	}
	slices.Sort(st.Owned)
	slices.Sort(st.HandingOff)
	if st.Assigned == nil {
		st.Assigned = []int32{}
	}
	if st.Owned == nil {
		st.Owned = []int32{}
	}
	o.status.Store(st)
}

// offsetName describes a start offset for logs.
func offsetName(o int64) string {
	switch o {
	case sarama.OffsetOldest:
		return "oldest"
	case sarama.OffsetNewest:
		return "newest"
	}
	return fmt.Sprint(o)
}
