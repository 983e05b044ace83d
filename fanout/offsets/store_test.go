package offsets

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
)

// cond is a test Condition.
type cond string

func (c cond) String() string { return string(c) }

func TestFenceConditions(t *testing.T) {
	tests := []struct {
		name    string
		fence   Fence
		parts   []int32
		want    []Condition
		fenced  bool
		wantStr string
	}{
		{"zero fence holds for nothing", Fence{}, []int32{0}, nil, true, "no fence"},
		{"topic fence covers every partition", TopicFence(cond("leader@3")), []int32{0, 7}, []Condition{cond("leader@3")}, false, "leader@3"},
		{"partition fence: exactly the partitions written",
			PartitionFence(map[int32]Condition{0: cond("o0"), 1: cond("o1"), 2: cond("o2")}), []int32{2, 0},
			[]Condition{cond("o2"), cond("o0")}, false, "{0: o0, 1: o1, 2: o2}"},
		{"partition fence: a shared condition once",
			PartitionFence(map[int32]Condition{0: cond("g5"), 1: cond("g5")}), []int32{0, 1},
			[]Condition{cond("g5")}, false, "{0: g5, 1: g5}"},
		{"partition fence: a partition not owned",
			PartitionFence(map[int32]Condition{0: cond("o0")}), []int32{0, 1}, nil, true, "{0: o0}"},
	}
	for _, tt := range tests {
		got, err := tt.fence.Conditions(tt.parts)
		if errors.Is(err, ErrFenced) != tt.fenced || (err != nil && !tt.fenced) || !slices.Equal(got, tt.want) {
			t.Errorf("%s: Conditions(%v) = %v, %v; want %v, fenced %v", tt.name, tt.parts, got, err, tt.want, tt.fenced)
		}
		if s := tt.fence.String(); s != tt.wantStr {
			t.Errorf("%s: String() = %q, want %q", tt.name, s, tt.wantStr)
		}
	}
	if !(Fence{}).IsZero() || TopicFence(cond("x")).IsZero() || !PartitionFence(nil).IsZero() {
		t.Error("IsZero wrong")
	}
}

// An abandoned committer of an old term cannot write after a new term began,
// however late its commit runs; the new term's commits pass.
func TestMemoryStoreFencesEarlierTerms(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	if err := s.Commit(ctx, Fence{}, map[int32]int64{0: 1}); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit without a fence: %v, want ErrFenced", err)
	}
	first := s.NewTerm()
	if err := s.Commit(ctx, first, map[int32]int64{0: 5, 1: 5}); err != nil {
		t.Fatalf("commit of the current term: %v", err)
	}
	second := s.NewTerm()
	if err := s.Commit(ctx, first, map[int32]int64{0: 9}); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit of the earlier term after a new one began: %v, want ErrFenced", err)
	}
	if err := s.Commit(ctx, second, map[int32]int64{1: 7}); err != nil {
		t.Fatalf("commit of the new term: %v", err)
	}
	other := NewMemoryStore().NewTerm() // term 1 of another store
	if err := s.Commit(ctx, other, map[int32]int64{0: 3}); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit under another store's fence: %v, want ErrFenced", err)
	}
	got, _ := s.Load(ctx)
	if want := map[int32]int64{0: 5, 1: 7}; !maps.Equal(got, want) {
		t.Fatalf("stored %v, want %v (refused commits write nothing)", got, want)
	}
}
