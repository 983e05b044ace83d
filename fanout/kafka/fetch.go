package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// The fetch path. Each partition being consumed has a goroutine
// (Source.runPartition) that opens it, announces its start and sends its
// batches to the dispatcher; the fetching itself is done by one fetcher
// per broker for every partition that broker leads, as sarama's consumer
// does: a fetch request for the partitions not paused, sarama's decoding
// of the response, and each partition's records cut into dispatch batches
// that alias the response (records.go), handed to the partition's
// goroutine whole, one channel send per partition and response. The next
// fetch goes out as soon as every partition has taken its part, so while
// the partitions send one response's batches the next is on its way.
//
// A fetcher has a connection of its own to its broker: a fetch waits up to
// Consumer.MaxWaitTime for records, and sarama's broker holds its
// connection meanwhile, so the client's requests (metadata, offsets) would
// wait behind it.
//
// What ends a subscription is handed over the same way, after the records
// fetched before it: an offset out of range (the partition's goroutine
// opens it again, resetting by policy), a partition that moved to another
// leader or a broker that failed (it subscribes again after a backoff,
// where it was).

// errMoved wraps what a broker answers for a partition it no longer leads:
// the partition is subscribed again to its leader after a metadata refresh.
var errMoved = errors.New("partition moved")

// subscription is a partition being fetched by a fetcher, from offset on.
type subscription struct {
	part  *partition
	epoch int32 // the leader epoch it was subscribed under
	// offset and size are the fetcher's: the next offset to fetch and the
	// partition's fetch size.
	offset int64
	size   int32
	feed   chan fetched  // to the partition's goroutine; capacity 1
	stop   chan struct{} // closed by the partition's goroutine when it stops reading feed
}

// fetched is what one response brought a partition: its batches, and when
// the subscription ends, why (err) and where the partition stands (next).
type fetched struct {
	batches []dispatch.Batch
	next    int64
	err     error
}

// fetcher fetches the partitions subscribed to one broker.
type fetcher struct {
	s      *Source
	id     int32          // the broker's
	broker *sarama.Broker // the fetcher's own connection to it
	wake   chan struct{}  // capacity 1: a subscription came, or a partition was resumed

	mu   sync.Mutex      // guards adds
	adds []*subscription // subscribed, not yet taken by the loop

	subs   []*subscription // the loop's
	reader *blockReader
}

// subscribe hands sub to the fetcher of leader, starting one if there is
// none. s.mu must not be held.
func (s *Source) subscribe(leader *sarama.Broker, sub *subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fetchers[leader.ID()]
	if f == nil {
		conf := s.client.Config()
		conn := sarama.NewBroker(leader.Addr())
		if err := conn.Open(conf); err != nil {
			// Only a configuration the client already took fails here: the
			// fetch reports it.
			s.log.WithError(err).Warn("opening a connection to fetch from the broker")
		}
		f = &fetcher{s: s, id: leader.ID(), broker: conn, wake: make(chan struct{}, 1),
			reader: newBlockReader(s.cfg.BatchSize, conf.Consumer.IsolationLevel == sarama.ReadCommitted)}
		s.fetchers[f.id] = f
		ctx := s.fetchCtx
		s.fetching.Go(s.log.WithField("broker", f.id), "fetcher", func() {
			defer func() { _ = f.broker.Close() }()
			f.run(ctx)
		}, nil)
	}
	// Under s.mu: a fetcher that fails removes itself from s.fetchers
	// under s.mu before it takes adds for the last time.
	f.mu.Lock()
	f.adds = append(f.adds, sub)
	f.mu.Unlock()
	f.poke()
}

// poke wakes the fetcher if it waits for work.
func (f *fetcher) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run fetches until ctx ends or the broker fails.
func (f *fetcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		f.take()
		req := f.request()
		if req == nil {
			select {
			case <-ctx.Done():
			case <-f.wake:
			}
			continue
		}
		resp, err := f.broker.Fetch(req)
		if err != nil {
			f.fail(fmt.Errorf("fetch from broker %d (%s): %w", f.id, f.broker.Addr(), err))
			return
		}
		f.handle(ctx, resp)
	}
}

// take adds the new subscriptions and drops those whose partition stopped.
func (f *fetcher) take() {
	f.mu.Lock()
	f.subs = append(f.subs, f.adds...)
	clear(f.adds)
	f.adds = f.adds[:0]
	f.mu.Unlock()
	f.subs = slices.DeleteFunc(f.subs, func(sub *subscription) bool {
		select {
		case <-sub.stop:
			return true
		default:
			return false
		}
	})
}

// request returns the fetch request for the subscriptions not paused, nil
// when every one is (or there is none). It is built as sarama's consumer
// builds its own.
func (f *fetcher) request() *sarama.FetchRequest {
	conf := f.s.client.Config()
	var req *sarama.FetchRequest
	for _, sub := range f.subs {
		if sub.part.paused.Load() {
			continue
		}
		if req == nil {
			req = &sarama.FetchRequest{
				MinBytes:     conf.Consumer.Fetch.Min,
				MaxWaitTime:  int32(conf.Consumer.MaxWaitTime / time.Millisecond),
				MaxBytes:     f.s.maxBytes(),
				Isolation:    conf.Consumer.IsolationLevel,
				SessionID:    0,
				SessionEpoch: -1, // no fetch session
				RackID:       conf.RackID,
				Version:      fetchVersion(conf.Version),
			}
		}
		req.AddBlock(f.s.cfg.Topic, sub.part.id, sub.offset, sub.size, sub.epoch)
	}
	return req
}

// fetchVersion is the fetch request version sarama's consumer uses for
// protocol version v (sarama negotiates it down to what the broker
// supports). Kafka 4 speaks every version from 4 on.
func fetchVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 12 // flexible, last fetched epoch
	case v.IsAtLeast(sarama.V2_3_0_0):
		return 11
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 10
	}
	return 4 // isolation levels
}

// handle hands every subscription its part of resp: batches, or the reason
// it ends. A subscription that ends leaves the fetcher.
func (f *fetcher) handle(ctx context.Context, resp *sarama.FetchResponse) {
	f.reader.reset()
	type part struct {
		sub *subscription
		fd  fetched
	}
	var parts []part
	keep := f.subs[:0]
	for _, sub := range f.subs {
		block := resp.GetBlock(f.s.cfg.Topic, sub.part.id)
		if block == nil {
			keep = append(keep, sub) // not in this request (paused), or left out
			continue
		}
		fd, ends := f.read(sub, block)
		if !ends {
			keep = append(keep, sub)
		}
		if len(fd.batches) > 0 || fd.err != nil {
			parts = append(parts, part{sub, fd})
		}
	}
	clear(f.subs[len(keep):])
	f.subs = keep
	f.reader.finish()
	for _, p := range parts {
		select {
		case p.sub.feed <- p.fd:
		case <-p.sub.stop:
		case <-ctx.Done():
			return
		}
	}
}

// read reads sub's block of a response. ends reports that the subscription
// ends (fd.err says why).
func (f *fetcher) read(sub *subscription, block *sarama.FetchResponseBlock) (fd fetched, ends bool) {
	switch {
	case errors.Is(block.Err, sarama.ErrNoError):
	case errors.Is(block.Err, sarama.ErrOffsetOutOfRange):
		return fetched{next: sub.offset, err: block.Err}, true
	case errors.Is(block.Err, sarama.ErrUnknownTopicOrPartition), errors.Is(block.Err, sarama.ErrNotLeaderForPartition),
		errors.Is(block.Err, sarama.ErrLeaderNotAvailable), errors.Is(block.Err, sarama.ErrReplicaNotAvailable),
		errors.Is(block.Err, sarama.ErrFencedLeaderEpoch), errors.Is(block.Err, sarama.ErrUnknownLeaderEpoch):
		return fetched{next: sub.offset, err: fmt.Errorf("%w: %w", errMoved, block.Err)}, true
	default:
		return fetched{next: sub.offset, err: block.Err}, true
	}
	sub.part.hwm.Store(block.HighWaterMarkOffset)
	batches, next := f.reader.read(block, sub.part.id, sub.offset)
	conf := f.s.client.Config()
	if next == sub.offset && len(batches) == 0 && partial(block) {
		// A record batch larger than the fetch size: ask for more, as
		// sarama's consumer does.
		if limit := conf.Consumer.Fetch.Max; limit > 0 && sub.size >= limit {
			return fetched{next: sub.offset, err: fmt.Errorf("a record batch at offset %d is larger than the most "+
				"a fetch may take (%d bytes): %w", sub.offset, limit, sarama.ErrMessageTooLarge)}, true
		}
		sub.size = int32(min(int64(sub.size)*2, math.MaxInt32))
		if limit := conf.Consumer.Fetch.Max; limit > 0 {
			sub.size = min(sub.size, limit)
		}
		return fetched{}, false
	}
	if next > sub.offset {
		sub.size = conf.Consumer.Fetch.Default
	}
	sub.offset = next
	return fetched{batches: batches, next: next}, false
}

// partial reports whether block holds only the beginning of a record batch
// (or legacy message): one larger than the fetch size.
func partial(block *sarama.FetchResponseBlock) bool {
	if block.Partial {
		return true
	}
	if len(block.RecordsSet) != 1 {
		return false
	}
	switch set := block.RecordsSet[0]; {
	case set.RecordBatch != nil:
		return set.RecordBatch.PartialTrailingRecord
	case set.MsgSet != nil:
		return set.MsgSet.PartialTrailingMessage
	}
	return false
}

// fail ends the fetcher after a failed fetch (its connection is closed as
// it returns): every subscription ends with err, to be subscribed again
// after a backoff, to a fetcher with a new connection.
func (f *fetcher) fail(err error) {
	s := f.s
	s.mu.Lock()
	if s.fetchers[f.id] == f {
		delete(s.fetchers, f.id)
	}
	s.mu.Unlock()
	f.take() // no subscription is added after the removal above
	for _, sub := range f.subs {
		select {
		case sub.feed <- fetched{next: sub.offset, err: err}:
		case <-sub.stop:
		}
	}
	f.subs = nil
}
