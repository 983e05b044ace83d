package main

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// memoryEnd is a copy end on a MemoryStore, fenced by a term of its own.
func memoryEnd(s *offsets.MemoryStore) offsetEnd {
	return offsetEnd{name: "memory", store: s, fence: func() (offsets.Fence, error) { return s.NewTerm(), nil }}
}

// kafkaEnd is the copy end of the group of store.
func kafkaEnd(s *kafkastore.Store) offsetEnd {
	return offsetEnd{name: "kafka group " + s.Group(), store: s, fence: func() (offsets.Fence, error) { return s.EmptyFence("test"), nil }}
}

// mustCommit commits offs to s under a new term.
func mustCommit(t *testing.T, s *offsets.MemoryStore, offs map[int32]int64) {
	t.Helper()
	if err := s.Commit(context.Background(), s.NewTerm(), offs); err != nil {
		t.Fatal(err)
	}
}

// The copy writes every offset of the source to the destination, reads them
// back and says what it did; the destination's other partitions are kept.
func TestCopyOffsets(t *testing.T) {
	_, group := kfakeGroup(t)
	src := offsets.NewMemoryStore()
	mustCommit(t, src, map[int32]int64{0: 12, 1: 7})
	var out bytes.Buffer
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, &out); err != nil {
		t.Fatal(err)
	}
	got, err := group.Load(t.Context())
	if err != nil || !maps.Equal(got, map[int32]int64{0: 12, 1: 7}) {
		t.Fatalf("the group holds %v, %v; want 0:12 1:7", got, err)
	}
	if !strings.Contains(out.String(), "copied the offsets of 2 partitions") || !strings.Contains(out.String(), "verified") {
		t.Errorf("output:\n%s", out.String())
	}
	t.Logf("output:\n%s", out.String())

	// Back the other way, into a store that holds a partition more.
	dst := offsets.NewMemoryStore()
	mustCommit(t, dst, map[int32]int64{0: 1, 2: 4})
	out.Reset()
	if err := copyOffsets(t.Context(), kafkaEnd(group), memoryEnd(dst), []int32{0, 1, 2}, &out); err != nil {
		t.Fatal(err)
	}
	if got, _ := dst.Load(t.Context()); !maps.Equal(got, map[int32]int64{0: 12, 1: 7, 2: 4}) {
		t.Fatalf("the destination holds %v, want 0:12 1:7 and its own 2:4", got)
	}
	if !strings.Contains(out.String(), "not in the source: kept") {
		t.Errorf("output does not say partition 2 was kept:\n%s", out.String())
	}
}

// lossyStore drops partition 1 from every commit, as a store that wrote
// half would.
type lossyStore struct{ *offsets.MemoryStore }

func (s lossyStore) Commit(ctx context.Context, f offsets.Fence, offs map[int32]int64) error {
	offs = maps.Clone(offs)
	delete(offs, 1)
	return s.MemoryStore.Commit(ctx, f, offs)
}

// The copy refuses what it cannot do whole, and says so: an empty source,
// offsets of partitions the topic lacks, a group a leader holds, and a
// destination that reads back otherwise than written.
func TestCopyOffsetsRefuses(t *testing.T) {
	_, group, client := kfakeGroupClient(t)
	src := offsets.NewMemoryStore()
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer)); !errors.Is(err, errNothingToCopy) {
		t.Errorf("empty source: %v, want errNothingToCopy", err)
	}
	mustCommit(t, src, map[int32]int64{0: 3, 5: 1})
	if err := copyOffsets(t.Context(), memoryEnd(src), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer)); err == nil ||
		!strings.Contains(err.Error(), "partition 5") {
		t.Errorf("a partition the topic lacks: %v, want an error naming it", err)
	}
	src2 := offsets.NewMemoryStore()
	mustCommit(t, src2, map[int32]int64{0: 3, 1: 2})

	m, err := group.Join(t.Context(), kafkastore.Leader{Epoch: 1, Node: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	err = copyOffsets(t.Context(), memoryEnd(src2), kafkaEnd(group), []int32{0, 1}, new(bytes.Buffer))
	if !errors.Is(err, offsets.ErrFenced) || !strings.Contains(err.Error(), "started meanwhile") {
		t.Errorf("copy into a group a leader holds: %v, want a fenced error", err)
	}
	if got, _ := group.Load(t.Context()); len(got) != 0 {
		t.Errorf("the refused copy wrote %v", got)
	}
	err = checkStopped(t.Context(), client, group, "fanout_svc_jobs", time.Minute, time.Now())
	if err == nil || !strings.Contains(err.Error(), "has a member") {
		t.Errorf("checkStopped with a leader in the group: %v, want an error naming it", err)
	}
	if err := group.Leave(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	if err := checkStopped(t.Context(), client, group, "fanout_svc_jobs", time.Minute, time.Now()); err != nil {
		t.Errorf("checkStopped of a stopped cluster: %v", err)
	}

	dst := lossyStore{offsets.NewMemoryStore()}
	err = copyOffsets(t.Context(), memoryEnd(src2), offsetEnd{name: "lossy", store: dst,
		fence: func() (offsets.Fence, error) { return dst.NewTerm(), nil }}, []int32{0, 1}, new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "verify") || !strings.Contains(err.Error(), "partition 1") {
		t.Errorf("a destination that lost a partition: %v, want a failed verification naming it", err)
	}
}
