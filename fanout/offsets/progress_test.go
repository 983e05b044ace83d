package offsets

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestProgressEncodeParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Progress
		text string
	}{
		{"empty", Progress{Base: 7}, "v1 b=7"},
		{"the doc's example", Progress{Base: 100, Acked: []Range{{105, 110}, {112, 112}}, Failed: []Failure{{100, 2}}},
			"v1 b=100 f=0:2 a=4+6,1+1"},
		{"failures only", Progress{Base: 0, Failed: []Failure{{3, 1}, {9, 4}}}, "v1 b=0 f=3:1,6:4"},
		{"acked right above the base", Progress{Base: 5, Acked: []Range{{6, 6}}}, "v1 b=5 a=0+1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Encode(); got != tc.text {
				t.Fatalf("Encode = %q, want %q", got, tc.text)
			}
			back, err := ParseProgress(tc.text)
			if err != nil {
				t.Fatalf("ParseProgress(%q): %v", tc.text, err)
			}
			if !reflect.DeepEqual(back, tc.p) {
				t.Fatalf("ParseProgress(%q) = %+v, want %+v", tc.text, back, tc.p)
			}
		})
	}
	if p, err := ParseProgress(""); err != nil || p.Base != -1 || !p.IsZero() {
		t.Fatalf(`ParseProgress("") = %+v, %v; want none`, p, err)
	}
}

func TestProgressParseRefusesBadInput(t *testing.T) {
	for _, text := range []string{
		"v2 b=1", "v1", "v1 a=1+1", "v1 b=-1", "v1 b=x", "v1 b=1 a=1+0", "v1 b=1 a=-1+2", "v1 b=1 f=1:0",
		"v1 b=1 f=1:1,0:1", "v1 b=1 a=1+1 f=1:1", "v1 b=1 x=2", "v1 b=1 a=1+1 a=1+1",
		"v1 b=1 a=9223372036854775807+1", "v1 b=4611686018427387903 f=9223372036854775807:1",
		"v1 b=1 " + strings.Repeat("a", 2*MaxProgressBytes),
	} {
		if p, err := ParseProgress(text); !errors.Is(err, ErrBadProgress) {
			t.Errorf("ParseProgress(%q) = %+v, %v; want ErrBadProgress", text, p, err)
		}
	}
}

// Encoding is bounded: ranges beyond MaxProgressBytes are dropped from the
// highest (what is kept is exact up to some offset), and failure counts
// beyond MaxProgressFailures keep the highest counts.
func TestProgressEncodeBounded(t *testing.T) {
	p := Progress{Base: 0}
	for i := range int64(5000) {
		p.Acked = append(p.Acked, Range{First: 1 + 3*i, Last: 2 + 3*i})
	}
	for i := range int64(200) {
		p.Failed = append(p.Failed, Failure{Offset: 15000 + i, Count: uint32(1 + i%7)})
	}
	text := p.Encode()
	if len(text) > MaxProgressBytes {
		t.Fatalf("encoded %d bytes, bound %d", len(text), MaxProgressBytes)
	}
	back, err := ParseProgress(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Failed) != MaxProgressFailures {
		t.Fatalf("%d failures kept, want %d", len(back.Failed), MaxProgressFailures)
	}
	kept := map[int64]bool{}
	minKept := uint32(1 << 31)
	for _, f := range back.Failed {
		kept[f.Offset] = true
		minKept = min(minKept, f.Count)
	}
	for _, f := range p.Failed {
		if !kept[f.Offset] && f.Count > minKept {
			t.Fatalf("dropped %+v, kept a count of %d", f, minKept)
		}
	}
	if len(back.Acked) == 0 || !reflect.DeepEqual(back.Acked, p.Acked[:len(back.Acked)]) {
		t.Fatalf("kept ranges %v..., want a prefix of the ranges", back.Acked[:min(3, len(back.Acked))])
	}
	if !back.AckedAt(1) || back.AckedAt(3) || back.AckedAt(3*int64(len(back.Acked))+1) {
		t.Fatal("AckedAt disagrees with the ranges kept")
	}
}

func TestTrackerProgress(t *testing.T) {
	tr := NewTracker()
	tr.TrackProgress()
	tr.Start(0, 100)
	for o := int64(100); o < 110; o++ {
		tr.Received(0, o)
	}
	tr.Dirty()
	for _, o := range []int64{102, 103, 105, 106, 107, 109} {
		tr.Ack(0, o)
	}
	tr.SetFailures(0, 100, tr.Gen(0), 2)
	tr.SetFailures(0, 104, tr.Gen(0), 1)
	want := Progress{Base: 100, Acked: []Range{{102, 103}, {105, 107}, {109, 109}}, Failed: []Failure{{100, 2}, {104, 1}}}
	if got := tr.Progress(0); !reflect.DeepEqual(got, want) {
		t.Fatalf("Progress = %+v, want %+v", got, want)
	}
	// The committable offset did not move, its progress did: Dirty says so.
	if d := tr.Dirty(); d[0] != 100 {
		t.Fatalf("Dirty = %v after acks above the committable offset, want partition 0 at 100", d)
	}
	if d := tr.Dirty(); d != nil {
		t.Fatalf("Dirty = %v with nothing new", d)
	}
	tr.Ack(0, 100)
	tr.Ack(0, 101)
	if got := tr.Progress(0); !reflect.DeepEqual(got, Progress{Base: 104, Acked: []Range{{105, 107}, {109, 109}}, Failed: []Failure{{104, 1}}}) {
		t.Fatalf("Progress after the prefix popped = %+v", got)
	}
	if tr.SetFailures(0, 105, tr.Gen(0), 1) || tr.SetFailures(0, 100, tr.Gen(0), 1) {
		t.Fatal("SetFailures of an acked offset succeeded")
	}
	// Without TrackProgress an ack above the committable offset is not news.
	plain := NewTracker()
	plain.Start(0, 0)
	plain.Received(0, 0)
	plain.Received(0, 1)
	plain.Dirty()
	plain.Ack(0, 1)
	if d := plain.Dirty(); d != nil {
		t.Fatalf("Dirty = %v without TrackProgress", d)
	}
}

func TestMemoryStoreKeepsProgressWithItsOffset(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore()
	f := s.NewTerm()
	pr := Progress{Base: 10, Acked: []Range{{12, 14}}, Failed: []Failure{{10, 3}}}
	if err := s.CommitProgress(ctx, f, map[int32]int64{0: 10, 1: 5}, map[int32]Progress{0: pr}); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadProgress(ctx)
	if err != nil || !reflect.DeepEqual(got, map[int32]Progress{0: pr}) {
		t.Fatalf("LoadProgress = %v, %v; want partition 0's", got, err)
	}
	// A plain commit of the offset voids the progress recorded above the old one.
	if err := s.Commit(ctx, f, map[int32]int64{0: 11}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.LoadProgress(ctx); len(got) != 0 {
		t.Fatalf("LoadProgress = %v after a commit without progress", got)
	}
	// Under an old fence nothing is written.
	s.NewTerm()
	if err := s.CommitProgress(ctx, f, map[int32]int64{0: 10}, map[int32]Progress{0: pr}); !errors.Is(err, ErrFenced) {
		t.Fatalf("CommitProgress under an old fence: %v", err)
	}
	if got, _ := s.LoadProgress(ctx); len(got) != 0 {
		t.Fatalf("LoadProgress = %v after a fenced commit", got)
	}
}
