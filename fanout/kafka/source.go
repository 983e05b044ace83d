// Package kafka reads the Kafka topic that fanout dispatches: NewConfig
// builds the sarama configuration, Source turns every partition of the topic
// into dispatch batches.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// ErrTopicNotFound is returned (wrapped, with the topic name) by Source.Run
// and TopicPartitions when the topic does not exist. It is retryable: the
// topic may be created later.
var ErrTopicNotFound = errors.New("kafka topic not found")

// Defaults of SourceConfig.
const (
	DefaultBatchSize       = 256
	DefaultRefreshInterval = 10 * time.Second
)

const (
	// retryMin and retryMax bound the backoff between attempts to open a
	// partition consumer.
	retryMin = 250 * time.Millisecond
	retryMax = 10 * time.Second
	// errLogEvery is the shortest interval between two logged errors of one
	// partition consumer; errors in between are counted, not logged.
	errLogEvery = 10 * time.Second
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Topic is the Kafka topic to consume, every partition of it.
	Topic string
	// Initial (--initial-offset) is sarama.OffsetNewest or
	// sarama.OffsetOldest: where partitions start when Stored is empty (the
	// group never committed an offset of this topic), and where a partition
	// whose offset is beyond the log end restarts. Once Stored holds any
	// offset, a partition without one starts at its oldest offset (see
	// Source).
	Initial int64
	// Stored holds the next offset to consume per partition, as loaded from
	// the offset store.
	Stored map[int32]int64
	// BatchSize is the most messages one Batch carries (DefaultBatchSize when 0).
	BatchSize int
	// RefreshInterval is how often new partitions are looked for
	// (DefaultRefreshInterval when 0).
	RefreshInterval time.Duration
	// Logger receives the source's logs (the standard logger when nil).
	Logger *logrus.Entry
	// Manual makes the source consume only the partitions given to Add,
	// each until Remove (spread mode: a member consumes the partitions it
	// owns). Stored and RefreshInterval are then unused: Add says where a
	// partition starts, and the assignment follows the partition count.
	Manual bool
	// MaxFetchBytes, when > 0, bounds a fetch response below the client's
	// Consumer.Fetch.MaxBytes: each response is memory the messages fetched
	// alias until they are done (see dispatch.Buffer).
	MaxFetchBytes int32
}

// ParseInitialOffset turns "newest" or "oldest" into sarama.OffsetNewest or
// sarama.OffsetOldest.
func ParseInitialOffset(s string) (int64, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "newest":
		return sarama.OffsetNewest, nil
	case "oldest":
		return sarama.OffsetOldest, nil
	}
	return 0, fmt.Errorf("initial offset %q: want \"newest\" or \"oldest\"", s)
}

// Source consumes every partition of one topic and implements
// dispatch.Source.
//
// Each partition is read by one goroutine that sends a Batch with a Start
// offset before its first messages, then batches of the messages fetched
// (at most BatchSize each, never mixing partitions, in offset order). The
// fetching is done by one fetcher per broker for the partitions it leads
// (fetch.go); the messages alias the fetch responses (records.go).
//
// A partition starts at its stored offset. Without one it starts by
// SourceConfig.Initial only in a group that has stored no offset at all for
// the topic; otherwise, and for partitions added while running, at its
// oldest offset whatever Initial says: such a partition was added (or
// written to) before anyone committed its start, while the cluster was down
// or just before a crash or failover, or before we noticed it (up to
// RefreshInterval late), and its messages must not be skipped.
//
// A start offset this Source resolved itself (from a policy, or by
// resetting an offset out of range) is anchored before the partition's first
// message is sent: its Start batch carries an Anchor that the dispatcher
// closes once the partition's committable offset is stored. Otherwise a
// crash right after the first deliveries would resolve the start again
// (newest has moved on) and lose them.
//
// A Manual source (spread mode) consumes only the partitions given to Add,
// each until Remove, and discovers nothing by itself.
type Source struct {
	client  sarama.Client
	cfg     SourceConfig
	log     *logrus.Entry
	batches chan dispatch.Batch

	mu       sync.Mutex           // guards the fields below
	paused   bool                 // Pause: every partition is paused
	held     map[int32]bool       // PausePartition: these are paused whatever Resume says
	running  bool                 // Run has started consuming
	parts    map[int32]*partition // partitions being consumed
	manual   manualParts          // Manual: the partitions added
	fetchers map[int32]*fetcher   // Run's, by the broker they fetch from
	fetchCtx context.Context      // Run's
	fetching *actor.Group         // Run's fetcher goroutines

	offsets *offsetLookups // the partitions' offset lookups, together
}

// partition is a partition being consumed.
type partition struct {
	id     int32
	paused atomic.Bool  // fetch none of it: the source is paused, or the partition held
	hwm    atomic.Int64 // the offset the next record produced will get, as of the last fetch
	open   bool         // s.mu: its start is checked; it is fetched or about to be
}

// manualParts are the partitions of a Manual source.
type manualParts struct {
	ctx     context.Context // Run's; nil before Run consumes and after it stops
	group   *actor.Group    // Run's partition goroutines
	waiting map[int32]int64 // added before Run consumes: their start offsets
	running map[int32]*partRun
}

// partRun is a partition goroutine of a Manual source.
type partRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned
}

// NewSource returns a Source for cfg.Topic over client. The caller keeps
// owning the client: the Source never closes it.
func NewSource(client sarama.Client, cfg SourceConfig) (*Source, error) {
	if client == nil {
		return nil, errors.New("kafka source: nil client")
	}
	if cfg.Topic == "" {
		return nil, errors.New("kafka source: empty topic")
	}
	if cfg.Initial != sarama.OffsetNewest && cfg.Initial != sarama.OffsetOldest {
		return nil, fmt.Errorf("kafka source: initial offset %d is neither newest (%d) nor oldest (%d)",
			cfg.Initial, sarama.OffsetNewest, sarama.OffsetOldest)
	}
	for p, o := range cfg.Stored {
		if o < 0 {
			return nil, fmt.Errorf("kafka source: stored offset %d of partition %d is negative", o, p)
		}
	}
	if cfg.BatchSize < 0 || cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("kafka source: negative batch size %d or refresh interval %s",
			cfg.BatchSize, cfg.RefreshInterval)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Source{
		client:   client,
		cfg:      cfg,
		log:      cfg.Logger.WithField("topic", cfg.Topic),
		batches:  make(chan dispatch.Batch),
		held:     map[int32]bool{},
		parts:    map[int32]*partition{},
		manual:   manualParts{waiting: map[int32]int64{}, running: map[int32]*partRun{}},
		fetchers: map[int32]*fetcher{},
		offsets:  &offsetLookups{client: client, topic: cfg.Topic},
	}, nil
}

// Add starts consuming partition p (Manual sources): at offset when it is
// >= 0 (the committed offset), else by that policy (sarama.OffsetOldest or
// sarama.OffsetNewest; a start resolved so is anchored, see Source). It
// sends a Batch with the numeric Start first. Adding a partition being
// consumed does nothing. Before Run consumes, the partition waits for it.
func (s *Source) Add(p int32, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.manual.running[p]; ok {
		return
	}
	if s.manual.ctx == nil {
		s.manual.waiting[p] = offset
		return
	}
	s.startLocked(p, offset)
}

// startLocked runs partition p's goroutine under Run's context; s.mu held.
func (s *Source) startLocked(p int32, offset int64) {
	ctx, cancel := context.WithCancel(s.manual.ctx)
	r := &partRun{cancel: cancel, done: make(chan struct{})}
	s.manual.running[p] = r
	part := s.addPartLocked(p)
	s.manual.group.Go(s.log.WithField("partition", p), "partition", func() {
		defer close(r.done)
		s.runPartition(ctx, part, offset)
	}, nil)
}

// addPartLocked registers partition p as consumed, paused as Pause and
// PausePartition say; s.mu held.
func (s *Source) addPartLocked(p int32) *partition {
	part := &partition{id: p}
	part.hwm.Store(-1)
	part.paused.Store(s.paused || s.held[p])
	s.parts[p] = part
	return part
}

// Remove stops consuming partition p (Manual sources) and returns once its
// goroutine has stopped: no batch of p is sent after Remove returns (one
// being sent when it is called is either taken before it returns or never).
// A PausePartition of p ends with it.
func (s *Source) Remove(p int32) {
	s.mu.Lock()
	delete(s.manual.waiting, p)
	r := s.manual.running[p]
	delete(s.manual.running, p)
	s.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
	s.mu.Lock()
	if _, again := s.manual.running[p]; !again {
		delete(s.parts, p)
		delete(s.held, p)
	}
	s.mu.Unlock()
}

// Batches implements dispatch.Source. The channel is closed when Run returns
// after consumption started.
func (s *Source) Batches() <-chan dispatch.Batch { return s.batches }

// Pause implements dispatch.Source: it stops fetching from every partition,
// including partitions started later, until Resume. Messages already fetched
// (at most two fetch responses per broker: one being handed over, one on
// its way) may still arrive.
func (s *Source) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return
	}
	s.paused = true
	s.repauseLocked()
}

// Resume implements dispatch.Source: it restarts fetching after Pause,
// except for the partitions paused by PausePartition.
func (s *Source) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused {
		return
	}
	s.paused = false
	s.repauseLocked()
}

// PausePartition implements dispatch.Source: it stops fetching partition p
// until ResumePartition, across Pause and Resume and a reopen of the
// partition. Messages of p already fetched may still arrive.
func (s *Source) PausePartition(p int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[p] = true
	s.repauseLocked()
}

// ResumePartition implements dispatch.Source: it restarts fetching partition
// p after PausePartition, unless the Source is paused.
func (s *Source) ResumePartition(p int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, p)
	s.repauseLocked()
}

// repauseLocked sets each partition's paused flag from s.paused and s.held,
// and wakes the fetchers, which build their next request from them; s.mu
// held.
func (s *Source) repauseLocked() {
	for p, part := range s.parts {
		part.paused.Store(s.paused || s.held[p])
	}
	for _, f := range s.fetchers {
		f.poke()
	}
}

// Partitions returns, sorted, the partitions being consumed.
func (s *Source) Partitions() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int32, 0, len(s.parts))
	for p := range s.parts {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// HighWaterMarks returns, per partition being fetched, the offset the next
// produced message will get, as of the last fetch.
func (s *Source) HighWaterMarks() map[int32]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int32]int64, len(s.parts))
	for p, part := range s.parts {
		if part.open {
			out[p] = part.hwm.Load()
		}
	}
	return out
}

// maxBytes is the most bytes one fetch response may carry.
func (s *Source) maxBytes() int32 {
	m := s.client.Config().Consumer.Fetch.MaxBytes
	if s.cfg.MaxFetchBytes > 0 && (m <= 0 || s.cfg.MaxFetchBytes < m) {
		m = s.cfg.MaxFetchBytes
	}
	return m
}

// Run consumes the topic until ctx ends, then returns nil once every
// partition goroutine and fetcher has stopped and Batches is closed.
//
// It first checks that the topic exists: if it does not, Run returns an error
// wrapping ErrTopicNotFound; on that or any other error before consumption
// starts Batches stays open and Run may be called again (the daemon retries
// with backoff). Once consumption started Run may not be called again.
func (s *Source) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("kafka source: Run called twice")
	}
	s.running = true
	s.mu.Unlock()

	parts, err := s.partitions()
	if err != nil {
		s.mu.Lock()
		s.running = false // Run may be retried
		s.mu.Unlock()
		return err
	}
	var partitions, fetchers actor.Group
	s.mu.Lock()
	s.fetchCtx, s.fetching = ctx, &fetchers
	s.mu.Unlock()
	if s.cfg.Manual {
		return s.runManual(ctx, &partitions)
	}
	started := make(map[int32]bool, len(parts)) // owned by this goroutine
	start := func(p int32, from int64) {
		started[p] = true
		s.mu.Lock()
		part := s.addPartLocked(p)
		s.mu.Unlock()
		offset, ok := s.cfg.Stored[p]
		if !ok {
			offset = from
		}
		partitions.Go(s.log.WithField("partition", p), "partition", func() {
			s.runPartition(ctx, part, offset)
		}, nil)
	}
	// --initial-offset applies only to a group that never committed: once
	// it has, a partition without an offset is one whose start nobody
	// committed, and the oldest offset skips none of it.
	first := s.cfg.Initial
	if len(s.cfg.Stored) > 0 {
		first = sarama.OffsetOldest
	}
	for _, p := range parts {
		start(p, first)
	}
	s.log.WithField("partitions", len(parts)).Info("kafka source started")

	ticker := time.NewTicker(s.cfg.RefreshInterval)
	defer ticker.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-ticker.C:
			now, err := s.partitions()
			if err != nil {
				s.log.WithError(err).Warn("partition discovery failed")
				continue
			}
			for _, p := range now {
				if !started[p] {
					s.log.WithField("partition", p).Info("new partition found, consuming it from its stored or oldest offset")
					start(p, sarama.OffsetOldest)
				}
			}
		}
	}

	s.stop(&partitions, &fetchers)
	return nil
}

// runManual consumes the partitions added until ctx ends (Manual sources).
func (s *Source) runManual(ctx context.Context, partitions *actor.Group) error {
	s.mu.Lock()
	s.manual.ctx, s.manual.group = ctx, partitions
	for p, offset := range s.manual.waiting {
		s.startLocked(p, offset)
	}
	clear(s.manual.waiting)
	s.mu.Unlock()
	s.log.Info("kafka source started: consuming the partitions added")
	<-ctx.Done()
	s.mu.Lock()
	s.manual.ctx = nil
	clear(s.manual.running)
	s.mu.Unlock()
	s.stop(partitions, s.fetching)
	return nil
}

// stop waits for the partition goroutines and the fetchers (Run's context
// has ended), then closes Batches.
func (s *Source) stop(partitions, fetchers *actor.Group) {
	partitions.Wait()
	fetchers.Wait()
	s.mu.Lock()
	clear(s.parts)
	clear(s.fetchers)
	s.mu.Unlock()
	close(s.batches)
	s.log.Info("kafka source stopped")
}

// partitions refreshes the topic's metadata and returns its partitions.
func (s *Source) partitions() ([]int32, error) { return TopicPartitions(s.client, s.cfg.Topic) }

// TopicPartitions refreshes topic's metadata through client and returns its
// partitions. When Kafka answers that the topic does not exist (or has no
// partitions) the error wraps ErrTopicNotFound; any other error means
// Kafka's answer did not come.
func TopicPartitions(client sarama.Client, topic string) ([]int32, error) {
	err := client.RefreshMetadata(topic)
	var parts []int32
	if err == nil {
		parts, err = client.Partitions(topic)
	}
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return nil, fmt.Errorf("%w: %q: %w", ErrTopicNotFound, topic, err)
	case err != nil:
		return nil, fmt.Errorf("kafka: partitions of topic %q: %w", topic, err)
	case len(parts) == 0:
		return nil, fmt.Errorf("%w: %q has no partitions", ErrTopicNotFound, topic)
	}
	return parts, nil
}

// runPartition consumes partition p from offset (a number: its stored
// offset; or a policy constant, resolved and anchored) until ctx ends.
func (s *Source) runPartition(ctx context.Context, part *partition, offset int64) {
	p := part.id
	log := s.log.WithField("partition", p)
	announce := true // the first start is always announced
	b := backoff.Backoff{Min: retryMin, Max: retryMax}
	for {
		at, reset, err := s.openPartition(ctx, log, part, offset, s.cfg.Initial)
		if err != nil {
			return // ctx ended
		}
		if announce || reset {
			start := dispatch.Batch{Partition: p, Start: at}
			if reset || offset < 0 { // resolved here, not read from the store
				start.Anchor = make(chan struct{})
			}
			if !s.send(ctx, start) || !s.anchored(ctx, log, start) {
				return
			}
		}
		next, ok := s.consume(ctx, log, part, at)
		s.mu.Lock()
		part.open = false
		s.mu.Unlock()
		if !ok {
			return // ctx ended
		}
		// The broker answered that the offset is out of range: open again
		// where we were; openPartition resets by policy if that is out of
		// range. Without progress since the last open, back off first so
		// that a broker that keeps saying "out of range" does not make us
		// spin.
		log.WithField("offset", next).Warn("partition offset out of range, reopening")
		if next != at {
			b.Reset()
		} else if !backoff.Sleep(ctx, b.Next()) {
			return
		}
		offset, announce = next, false
	}
}

// openPartition checks partition p's start (offset: a number, or a policy
// constant resolved to a number here), retrying with backoff until ctx
// ends. A numeric offset out of range is replaced, and reset is true:
// below the log start by the oldest offset, beyond the end by policy. Which
// of the two it is takes a lookup of the log start; a failed lookup is
// retried, never taken as a reason to apply the policy.
// It returns the numeric offset consumption starts at.
func (s *Source) openPartition(ctx context.Context, log *logrus.Entry, part *partition,
	offset, policy int64) (at int64, reset bool, err error) {
	p := part.id
	b := backoff.Backoff{Min: retryMin, Max: retryMax}
	var outOfRange int64 // the first numeric offset found out of range, when reset
	var resetBy string   // what replaced it: "oldest" or the policy's name
	for {
		at, err = offset, nil
		if offset < 0 {
			at, err = s.offsetOf(ctx, p, offset)
		}
		if err == nil {
			err = s.checkRange(ctx, part, at)
		}
		if err == nil {
			if reset {
				log.WithFields(logrus.Fields{"offset": outOfRange, "policy": resetBy, "reset_to": at}).
					Warn("offset out of range, resetting")
			}
			s.mu.Lock()
			part.open = true
			s.mu.Unlock()
			return at, reset, nil
		}
		if offset >= 0 && errors.Is(err, sarama.ErrOffsetOutOfRange) {
			// Below the log start (retention removed those records): go on
			// from the oldest record still there, whatever the policy, so that
			// nothing still in Kafka is skipped. Beyond the end (the log was
			// truncated): the policy decides. Out of range again after a
			// reset (the log moved meanwhile): back off first.
			if reset && !backoff.Sleep(ctx, b.Next()) {
				return 0, false, ctx.Err()
			}
			oldest, ok := s.logStart(ctx, log, p)
			if !ok {
				return 0, false, ctx.Err()
			}
			if !reset {
				outOfRange, reset = at, true
			}
			if at < oldest {
				offset, resetBy = oldest, policyName(sarama.OffsetOldest)
			} else {
				offset, resetBy = policy, policyName(policy)
			}
			continue // no backoff: the next attempt is a different one
		}
		if ctx.Err() != nil { // stopping: a lookup gave up waiting
			return 0, false, ctx.Err()
		}
		wait := b.Next()
		log.WithError(err).WithField("offset", offset).WithField("retry_in", wait).
			Warn("cannot consume partition, retrying")
		if !backoff.Sleep(ctx, wait) {
			return 0, false, ctx.Err()
		}
	}
}

// checkRange checks that offset lies within partition p's log, between its
// oldest and newest offsets (both included): sarama.ErrOffsetOutOfRange
// when not. It notes the newest offset as the partition's high watermark.
func (s *Source) checkRange(ctx context.Context, part *partition, offset int64) error {
	newest, err := s.offsets.get(ctx, part.id, sarama.OffsetNewest, false)
	if err != nil {
		return err
	}
	part.hwm.Store(newest)
	oldest, err := s.offsets.get(ctx, part.id, sarama.OffsetOldest, false)
	if err != nil {
		return err
	}
	if offset < oldest || offset > newest {
		return sarama.ErrOffsetOutOfRange
	}
	return nil
}

// offsetOf resolves policy (sarama.OffsetNewest or OffsetOldest) to an
// offset of partition p. Under read_committed, newest is the last stable
// offset, not the high watermark: the records of a transaction still open
// lie between the two, and are delivered once it commits.
func (s *Source) offsetOf(ctx context.Context, p int32, policy int64) (int64, error) {
	committed := policy == sarama.OffsetNewest && s.client.Config().Consumer.IsolationLevel == sarama.ReadCommitted
	return s.offsets.get(ctx, p, policy, committed)
}

// LastStableOffset returns the last stable offset of partition p of topic:
// newest for a read_committed consumer, below every record of a
// transaction still open (sarama's GetOffset gives the high watermark,
// beyond them: a start there would skip them once they commit).
func LastStableOffset(client sarama.Client, topic string, p int32) (int64, error) {
	l := &offsetLookups{client: client, topic: topic}
	return l.get(context.Background(), p, sarama.OffsetNewest, true)
}

// logStart returns the oldest offset of partition p, retrying a failed
// lookup with backoff; false when ctx ends first.
func (s *Source) logStart(ctx context.Context, log *logrus.Entry, p int32) (int64, bool) {
	var oldest int64
	err := backoff.Retry(ctx, backoff.Backoff{Min: retryMin, Max: retryMax}, func(context.Context) error {
		var err error
		oldest, err = s.offsets.get(ctx, p, sarama.OffsetOldest, false)
		return err
	}, func(attempt int, err error, wait time.Duration) {
		log.WithError(err).WithFields(logrus.Fields{"attempt": attempt, "retry_in": wait}).
			Warn("offset out of range: cannot look up the oldest offset to tell where to reset, retrying")
	})
	return oldest, err == nil
}

// consume fetches partition part from at and sends its batches until ctx
// ends (ok false) or the broker answers that the offset is out of range (ok
// true). next is where the partition stands: the offset after the records
// fetched.
func (s *Source) consume(ctx context.Context, log *logrus.Entry, part *partition, at int64) (next int64, ok bool) {
	next = at
	var lim errLimiter
	b := backoff.Backoff{Min: retryMin, Max: retryMax}
	var sub *subscription
	refresh := false // the leader is looked up anew after a failure
	defer func() {
		if sub != nil {
			close(sub.stop)
		}
	}()
	for {
		if sub == nil {
			var err error
			if sub, err = s.subscribeAt(ctx, log, part, next, &b, refresh); err != nil {
				return next, false // ctx ended
			}
		}
		var fd fetched
		select {
		case <-ctx.Done():
			return next, false
		case fd = <-sub.feed:
		}
		for _, batch := range fd.batches {
			if !s.send(ctx, batch) {
				return next, false
			}
		}
		if len(fd.batches) > 0 {
			b.Reset()
		}
		next = max(next, fd.next)
		if fd.err == nil {
			continue
		}
		sub, refresh = nil, true // the fetcher dropped it
		if errors.Is(fd.err, sarama.ErrOffsetOutOfRange) {
			log.WithError(fd.err).WithField("offset", next).Warn("partition offset out of range")
			return next, true
		}
		lim.log(log, fd.err)
		if !backoff.Sleep(ctx, b.Next()) {
			return next, false
		}
	}
}

// subscribeAt subscribes part at offset to the fetcher of its leader,
// retrying with backoff b until ctx ends. After a failure (refresh) the
// leader is looked up anew, else in the client's metadata.
func (s *Source) subscribeAt(ctx context.Context, log *logrus.Entry, part *partition, offset int64,
	b *backoff.Backoff, refresh bool) (*subscription, error) {
	for {
		var err error
		if refresh {
			err = s.client.RefreshMetadata(s.cfg.Topic)
		}
		var leader *sarama.Broker
		var epoch int32
		if err == nil {
			leader, epoch, err = s.client.LeaderAndEpoch(s.cfg.Topic, part.id)
		}
		if err == nil {
			sub := &subscription{part: part, epoch: epoch, offset: offset,
				size: s.client.Config().Consumer.Fetch.Default, feed: make(chan fetched, 1), stop: make(chan struct{})}
			s.subscribe(leader, sub)
			return sub, nil
		}
		refresh = true
		wait := b.Next()
		log.WithError(err).WithFields(logrus.Fields{"offset": offset, "retry_in": wait}).
			Warn("cannot find the partition's leader, retrying")
		if !backoff.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// anchored waits until the dispatcher has stored the committable offset of
// start's partition, when start asks for it (Anchor); false if ctx ends
// first.
func (s *Source) anchored(ctx context.Context, log *logrus.Entry, start dispatch.Batch) bool {
	if start.Anchor == nil {
		return true
	}
	select {
	case <-start.Anchor:
		log.WithField("offset", start.Start).Debug("start offset anchored")
		return true
	case <-ctx.Done():
		return false
	}
}

// send delivers b unless ctx ends first.
func (s *Source) send(ctx context.Context, b dispatch.Batch) bool {
	select {
	case s.batches <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// policyName names an offset policy for logs.
func policyName(policy int64) string {
	switch policy {
	case sarama.OffsetNewest:
		return "newest"
	case sarama.OffsetOldest:
		return "oldest"
	}
	return fmt.Sprint(policy)
}

// errLimiter logs at most one error per errLogEvery and counts the rest.
type errLimiter struct {
	last       time.Time
	suppressed int
}

func (l *errLimiter) log(log *logrus.Entry, err error) {
	now := time.Now()
	if now.Sub(l.last) < errLogEvery {
		l.suppressed++
		return
	}
	log.WithError(err).WithField("suppressed", l.suppressed).Warn("partition consumer error")
	l.last, l.suppressed = now, 0
}
