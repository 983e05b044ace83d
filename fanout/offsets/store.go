// Package offsets turns acks into committable offsets and stores them.
package offsets

import (
	"context"
	"errors"
	"sync"
)

// ErrFenced is returned by Store.Commit when this node is no longer allowed
// to commit (another node leads now). It is never retryable.
var ErrFenced = errors.New("offset commit fenced: not the leader")

// Store keeps, per partition, the next offset to consume.
type Store interface {
	// Load returns the stored offsets of every partition that has one.
	Load(ctx context.Context) (map[int32]int64, error)
	// Commit stores the given offsets atomically (all or none). It returns an
	// error wrapping ErrFenced when this node may not commit.
	Commit(ctx context.Context, offsets map[int32]int64) error
}

// MemoryStore is a Store in memory, for tests and the dev mode. It is not
// durable: its offsets are lost with the process.
type MemoryStore struct {
	mu      sync.Mutex // guards offsets
	offsets map[int32]int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{offsets: map[int32]int64{}} }

// Load returns a copy of the stored offsets.
func (s *MemoryStore) Load(context.Context) (map[int32]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int32]int64, len(s.offsets))
	for p, o := range s.offsets {
		out[p] = o
	}
	return out, nil
}

// Commit stores the offsets.
func (s *MemoryStore) Commit(_ context.Context, offsets map[int32]int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, o := range offsets {
		s.offsets[p] = o
	}
	return nil
}
