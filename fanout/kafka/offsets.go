package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/IBM/sarama"
)

// offsetLookups answers the partitions' offset lookups (Kafka's ListOffsets)
// together: a lookup asked while others are under way waits for them, then
// goes with every lookup that waited meanwhile, in one request per leader.
// Starting a topic of 1,024 partitions takes a few requests instead of one
// or two per partition. There is no timer and no goroutine of its own: the
// first caller to find none under way sends, for itself and for whoever
// queued behind it, until nothing is queued.
type offsetLookups struct {
	client sarama.Client
	topic  string

	mu     sync.Mutex
	queued []*lookup
	busy   bool // a caller is sending rounds
}

// lookup is one partition's question and, once done is closed, its answer.
type lookup struct {
	p         int32
	time      int64 // sarama.OffsetNewest, sarama.OffsetOldest
	committed bool  // read_committed: newest is the last stable offset
	offset    int64
	err       error
	done      chan struct{}
}

// get returns partition p's offset at time (sarama.OffsetNewest or
// OffsetOldest); with committed, newest is the last stable offset, as a
// read_committed consumer sees it. Like sarama's GetOffset, a lookup that
// fails is tried once more after a metadata refresh.
func (l *offsetLookups) get(ctx context.Context, p int32, time int64, committed bool) (int64, error) {
	lk := &lookup{p: p, time: time, committed: committed, done: make(chan struct{})}
	l.mu.Lock()
	l.queued = append(l.queued, lk)
	send := !l.busy
	l.busy = true
	l.mu.Unlock()
	if send {
		l.send()
	}
	select {
	case <-lk.done:
		return lk.offset, lk.err
	case <-ctx.Done():
		return -1, fmt.Errorf("offset of partition %d: %w", p, ctx.Err())
	}
}

// send runs rounds until nothing is queued.
func (l *offsetLookups) send() {
	for {
		l.mu.Lock()
		batch := l.queued
		l.queued = nil
		if len(batch) == 0 {
			l.busy = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		if failed := l.round(batch); len(failed) > 0 {
			if err := l.client.RefreshMetadata(l.topic); err != nil {
				for _, lk := range failed {
					lk.err = fmt.Errorf("offset of partition %d: %w (refreshing metadata: %w)", lk.p, lk.err, err)
				}
			} else {
				failed = l.round(failed)
			}
			for _, lk := range failed {
				close(lk.done)
			}
		}
	}
}

// round asks the leaders for batch's offsets, one request per leader and
// isolation level (a partition asked twice goes in a second request). It
// answers the lookups that succeeded and returns those that failed, their
// err set.
func (l *offsetLookups) round(batch []*lookup) (failed []*lookup) {
	type key struct {
		broker    int32
		committed bool
	}
	type request struct {
		broker  *sarama.Broker
		req     *sarama.OffsetRequest
		asked   map[int32]bool
		lookups []*lookup
	}
	var reqs []*request
	byKey := map[key][]*request{}
	for _, lk := range batch {
		broker, err := l.client.Leader(l.topic, lk.p)
		if err != nil {
			lk.err = fmt.Errorf("leader of partition %d: %w", lk.p, err)
			failed = append(failed, lk)
			continue
		}
		k := key{broker.ID(), lk.committed}
		var r *request
		for _, c := range byKey[k] {
			if !c.asked[lk.p] {
				r = c
				break
			}
		}
		if r == nil {
			r = &request{broker: broker, req: sarama.NewOffsetRequest(l.client.Config().Version), asked: map[int32]bool{}}
			if lk.committed {
				r.req.IsolationLevel = sarama.ReadCommitted
			}
			byKey[k] = append(byKey[k], r)
			reqs = append(reqs, r)
		}
		r.req.AddBlock(l.topic, lk.p, lk.time, 1)
		r.asked[lk.p] = true
		r.lookups = append(r.lookups, lk)
	}
	for _, r := range reqs {
		resp, err := r.broker.GetAvailableOffsets(r.req)
		if err != nil {
			_ = r.broker.Close() // as sarama does: the next use reconnects
		}
		for _, lk := range r.lookups {
			lk.offset, lk.err = answer(resp, err, l.topic, lk.p)
			if lk.err != nil {
				failed = append(failed, lk)
				continue
			}
			close(lk.done)
		}
	}
	return failed
}

// answer is partition p's offset in resp, the answer to a request that
// returned err.
func answer(resp *sarama.OffsetResponse, err error, topic string, p int32) (int64, error) {
	if err != nil {
		return -1, fmt.Errorf("offset of partition %d: %w", p, err)
	}
	block := resp.GetBlock(topic, p)
	switch {
	case block == nil:
		return -1, fmt.Errorf("offset of partition %d: %w", p, sarama.ErrIncompleteResponse)
	case !errors.Is(block.Err, sarama.ErrNoError):
		return -1, fmt.Errorf("offset of partition %d: %w", p, block.Err)
	case len(block.Offsets) != 1:
		return -1, fmt.Errorf("offset of partition %d: %w", p, sarama.ErrOffsetOutOfRange)
	}
	return block.Offsets[0], nil
}
