package offsets

import (
	"maps"
	"testing"
)

func TestTrackerCommittable(t *testing.T) {
	type op struct {
		kind   string // "start", "recv", "ack"
		offset int64
		ok     bool // expected result of recv/ack
	}
	tests := []struct {
		name string
		ops  []op
		want int64
	}{
		{"started, nothing received", []op{{"start", 100, true}}, 100},
		{"received, nothing acked", []op{{"start", 100, true}, {"recv", 100, true}, {"recv", 101, true}}, 100},
		{"prefix acked", []op{{"start", 100, true}, {"recv", 100, true}, {"recv", 101, true}, {"ack", 100, true}}, 101},
		{"all acked", []op{{"start", 100, true}, {"recv", 100, true}, {"recv", 101, true}, {"ack", 101, true}, {"ack", 100, true}}, 102},
		{"105 acked and 104 not commits 104", []op{
			{"start", 103, true}, {"recv", 103, true}, {"recv", 104, true}, {"recv", 105, true},
			{"ack", 103, true}, {"ack", 105, true},
		}, 104},
		{"gaps in offsets (compaction)", []op{
			{"start", 10, true}, {"recv", 12, true}, {"recv", 17, true}, {"recv", 30, true},
			{"ack", 12, true}, {"ack", 17, true},
		}, 30},
		{"gaps all acked", []op{{"start", 10, true}, {"recv", 12, true}, {"recv", 17, true}, {"ack", 17, true}, {"ack", 12, true}}, 18},
		{"double ack ignored", []op{{"start", 0, true}, {"recv", 0, true}, {"recv", 1, true}, {"ack", 1, true}, {"ack", 1, false}}, 0},
		{"ack of unknown offset ignored", []op{{"start", 0, true}, {"recv", 0, true}, {"ack", 7, false}, {"ack", -1, false}}, 0},
		{"ack before start ignored", []op{{"ack", 5, false}}, -1},
		{"ack of committed offset ignored", []op{{"start", 0, true}, {"recv", 0, true}, {"ack", 0, true}, {"ack", 0, false}}, 1},
		{"re-received offset ignored", []op{{"start", 0, true}, {"recv", 0, true}, {"recv", 1, true}, {"recv", 1, false}, {"recv", 0, false}}, 0},
		{"offset below start ignored", []op{{"start", 50, true}, {"recv", 49, false}, {"recv", 50, true}, {"ack", 50, true}}, 51},
		{"restart forgets pending", []op{
			{"start", 0, true}, {"recv", 0, true}, {"recv", 1, true}, {"ack", 1, true},
			{"start", 500, true}, {"ack", 0, false},
		}, 500},
		{"receive without start starts there", []op{{"recv", 42, true}, {"ack", 42, true}}, 43},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker()
			for i, o := range tt.ops {
				var got bool
				switch o.kind {
				case "start":
					tr.Start(0, o.offset)
					got = true
				case "recv":
					got = tr.Received(0, o.offset)
				case "ack":
					got = tr.Ack(0, o.offset)
				}
				if got != o.ok {
					t.Fatalf("op %d %s(%d) = %v, want %v", i, o.kind, o.offset, got, o.ok)
				}
			}
			got, ok := tr.Committable(0)
			if !ok {
				got = -1
			}
			if got != tt.want {
				t.Fatalf("committable = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTrackerWrapsAndGrows(t *testing.T) {
	tr := NewTracker()
	tr.Start(3, 0)
	// Acks in a sliding window force the ring to wrap many times and grow once.
	const n = 1000
	next := int64(0)
	for off := int64(0); off < n; off++ {
		if !tr.Received(3, off) {
			t.Fatalf("Received(%d) = false", off)
		}
		if off >= 100 { // keep ~100 outstanding, acked out of order in pairs
			a := off - 100
			if a%2 == 0 {
				continue
			}
			if !tr.Ack(3, a) || !tr.Ack(3, a-1) {
				t.Fatalf("ack %d or %d failed", a, a-1)
			}
			next = a + 1
		}
		if got, _ := tr.Committable(3); got != next {
			t.Fatalf("after offset %d: committable %d, want %d", off, got, next)
		}
	}
	if got := tr.Outstanding(3); got != int(n-next) {
		t.Fatalf("outstanding = %d, want %d", got, n-next)
	}
}

func TestTrackerDirty(t *testing.T) {
	tr := NewTracker()
	if d := tr.Dirty(); d != nil {
		t.Fatalf("empty tracker dirty = %v", d)
	}
	tr.Start(0, 10)
	tr.Start(1, 20)
	if d := tr.Dirty(); !maps.Equal(d, map[int32]int64{0: 10, 1: 20}) {
		t.Fatalf("after start: %v", d)
	}
	if d := tr.Dirty(); d != nil {
		t.Fatalf("second call: %v", d)
	}
	tr.Received(0, 10)
	tr.Received(0, 11)
	tr.Ack(0, 11) // 10 still outstanding: committable unchanged
	if d := tr.Dirty(); d != nil {
		t.Fatalf("ack behind a gap made it dirty: %v", d)
	}
	tr.Ack(0, 10)
	if d := tr.Dirty(); !maps.Equal(d, map[int32]int64{0: 12}) {
		t.Fatalf("after prefix ack: %v", d)
	}
	tr.Start(1, 20) // same offset: nothing to commit
	if d := tr.Dirty(); d != nil {
		t.Fatalf("restart at same offset: %v", d)
	}
	if all := tr.All(); !maps.Equal(all, map[int32]int64{0: 12, 1: 20}) {
		t.Fatalf("All = %v", all)
	}
}

func BenchmarkTrackerReceiveAck(b *testing.B) {
	tr := NewTracker()
	tr.Start(0, 0)
	b.ReportAllocs()
	for i := range b.N {
		off := int64(i)
		tr.Received(0, off)
		if off >= 64 {
			tr.Ack(0, off-64)
		}
	}
}

func TestTrackerAckOfAnEarlierGenerationIgnored(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 10)
	tr.Received(0, 10)
	old := tr.Gen(0)
	tr.Start(0, 5) // the log was truncated: offsets 5.. come again
	tr.Received(0, 5)
	tr.Received(0, 10)
	if tr.AckIn(0, 10, old) {
		t.Fatal("an ack of offset 10 received before the restart counted for the new offset 10")
	}
	if !tr.AckIn(0, 5, tr.Gen(0)) || !tr.Ack(0, 10) {
		t.Fatal("acks of the current generation refused")
	}
	if c, _ := tr.Committable(0); c != 11 {
		t.Fatalf("committable = %d, want 11 (5 and 10 acked; 6-9 never received)", c)
	}
}
