// Package offsets turns acks into committable offsets and stores them.
package offsets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrFenced is returned by Store.Commit when the commit's fence no longer
// holds (another node leads or owns the partitions now), or when it was
// given no fence or a fence of another store. It is never retryable.
var ErrFenced = errors.New("offset commit fenced: not the leader")

// Store keeps, per partition, the next offset to consume.
type Store interface {
	// Load returns the stored offsets of every partition that has one.
	Load(ctx context.Context) (map[int32]int64, error)
	// Commit stores the given offsets atomically (all or none) if fence
	// still holds for every partition written, checked in the same atomic
	// write. Otherwise it writes nothing and returns an error wrapping
	// ErrFenced.
	Commit(ctx context.Context, fence Fence, offsets map[int32]int64) error
}

// Fence is the authority a commit is made under: the proof, won by a term,
// that it may write the offsets of some partitions. It is a value: a term
// receives its fence when it begins and gives it to each of its commits; a
// store keeps none. A commit under a fence that no longer holds is refused,
// however late it runs, so a deposed or abandoned committer cannot write.
// The zero Fence holds for nothing.
//
// A fence is made of conditions that the store checks in the commit's own
// atomic write: one Condition for the whole topic (a term that owns every
// partition), or one per partition (a member that owns a set of partitions,
// each fenced on its own; a commit checks exactly the conditions of the
// partitions it writes). Leader code only carries a fence; who wins one
// makes it, and the store it is meant for checks it.
type Fence struct {
	topic Condition           // holds for every partition; nil in a per-partition fence
	parts map[int32]Condition // per partition; nil in a topic fence
}

// Condition is one condition of a Fence, of the kind its store checks (a
// ZooKeeper znode version, a term of a MemoryStore, ...). A store refuses
// conditions of other kinds with ErrFenced. Conditions must be comparable
// with ==: a commit checks each distinct condition once.
type Condition interface {
	// String describes the condition for logs and errors.
	String() string
}

// TopicFence returns the fence of a term that owns every partition under
// the one condition c.
func TopicFence(c Condition) Fence { return Fence{topic: c} }

// PartitionFence returns the fence of a term that owns the partitions of
// conds, each under its own condition.
func PartitionFence(conds map[int32]Condition) Fence {
	parts := make(map[int32]Condition, len(conds))
	for p, c := range conds {
		if c != nil {
			parts[p] = c
		}
	}
	return Fence{parts: parts}
}

// IsZero reports whether f is the zero Fence, which holds for nothing.
func (f Fence) IsZero() bool { return f.topic == nil && len(f.parts) == 0 }

// Conditions returns the distinct conditions that a commit of parts must
// check, in the order of parts. It returns an error wrapping ErrFenced when
// f does not cover one of them.
func (f Fence) Conditions(parts []int32) ([]Condition, error) {
	if f.topic != nil {
		return []Condition{f.topic}, nil
	}
	var out []Condition
	for _, p := range parts {
		c, ok := f.parts[p]
		if !ok {
			return nil, fmt.Errorf("partition %d is not covered by fence %v: %w", p, f, ErrFenced)
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// String describes the fence for logs and errors.
func (f Fence) String() string {
	switch {
	case f.topic != nil:
		return f.topic.String()
	case len(f.parts) == 0:
		return "no fence"
	}
	parts := make([]int32, 0, len(f.parts))
	for p := range f.parts {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d: %v", p, f.parts[p])
	}
	return "{" + b.String() + "}"
}

// MemoryStore is a Store in memory, for tests and the dev mode. It is not
// durable: its offsets are lost with the process. It fences like the
// ZooKeeper store: NewTerm begins a term and returns its fence, and commits
// under the fence of an earlier term are refused.
type MemoryStore struct {
	mu       sync.Mutex // guards offsets, progress and term
	offsets  map[int32]int64
	progress map[int32][2]string // Progress.Encode and EncodeDelays, as a real store keeps them
	term     uint64              // the current term; 0 before the first NewTerm
}

var _ ProgressStore = (*MemoryStore)(nil)

// memoryTerm is the Condition of a MemoryStore's fences: term of store.
type memoryTerm struct {
	store *MemoryStore
	term  uint64
}

func (c memoryTerm) String() string { return fmt.Sprintf("memory store term %d", c.term) }

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{offsets: map[int32]int64{}, progress: map[int32][2]string{}}
}

// NewTerm begins a new term and returns its fence: from now on, commits
// under the fence of any earlier term are refused with ErrFenced.
func (s *MemoryStore) NewTerm() Fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.term++
	return TopicFence(memoryTerm{store: s, term: s.term})
}

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

// Commit stores the offsets if fence is of the store's current term; the
// progress of the partitions written is dropped.
func (s *MemoryStore) Commit(ctx context.Context, fence Fence, offsets map[int32]int64) error {
	return s.CommitProgress(ctx, fence, offsets, nil)
}

// LoadProgress returns the stored progress, encoded and decoded as a real
// store does (so bounded by MaxProgressBytes and MaxDelayBytes).
func (s *MemoryStore) LoadProgress(context.Context) (map[int32]Progress, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int32]Progress, len(s.progress))
	var errs []error
	for p, texts := range s.progress {
		pr, err := DecodeProgress(texts[0], texts[1])
		if err != nil {
			errs = append(errs, fmt.Errorf("memory store: partition %d: %w", p, err))
		}
		if !pr.IsZero() {
			out[p] = pr
		}
	}
	return out, errors.Join(errs...)
}

// CommitProgress stores the offsets and their progress if fence is of the
// store's current term.
func (s *MemoryStore) CommitProgress(_ context.Context, fence Fence, offsets map[int32]int64, progress map[int32]Progress) error {
	if fence.IsZero() {
		return fmt.Errorf("memory store: commit without a fence: %w", ErrFenced)
	}
	parts := make([]int32, 0, len(offsets))
	for p := range offsets {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	conds, err := fence.Conditions(parts)
	if err != nil {
		return fmt.Errorf("memory store: commit: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range conds {
		if c != (memoryTerm{store: s, term: s.term}) {
			return fmt.Errorf("memory store: commit under %v, the current term is %d: %w", c, s.term, ErrFenced)
		}
	}
	for p, o := range offsets {
		s.offsets[p] = o
		if pr, ok := progress[p]; ok && !pr.IsZero() && pr.Base == o {
			s.progress[p] = [2]string{pr.Encode(), pr.EncodeDelays()}
		} else {
			delete(s.progress, p)
		}
	}
	return nil
}
