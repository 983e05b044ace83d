package offsets

import (
	"maps"
	"math"
	"slices"
	"testing"
	"time"
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
		{"restart above keeps pending below", []op{
			{"start", 0, true}, {"recv", 0, true}, {"recv", 1, true}, {"ack", 1, true},
			{"start", 500, true},
		}, 0},
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

// Restarts of a partition at another offset R (Start): offsets at or above
// R are forgotten, unacked offsets below R stay outstanding and their acks,
// of the generation they were received in, still count. The committable
// offset never passes an unacked offset that was received and not
// forgotten.
func TestTrackerRestart(t *testing.T) {
	type op struct {
		kind   string // "start", "recv", "ack" (as received last), "ack-first" (as received first)
		offset int64
		ok     bool // expected result of recv/ack
		want   int64
	}
	recv := func(o int64) op { return op{"recv", o, true, -1} }
	ack := func(o int64, ok bool, want int64) op { return op{"ack", o, ok, want} }
	ackFirst := func(o int64, ok bool, want int64) op { return op{"ack-first", o, ok, want} }
	start := func(o, want int64) op { return op{"start", o, true, want} }
	recvRange := func(from, to int64) []op {
		var ops []op
		for o := from; o < to; o++ {
			ops = append(ops, recv(o))
		}
		return ops
	}
	tests := []struct {
		name string
		ops  []op
	}{
		// The case: fetched 100-109, 100-102 in flight, 103-109
		// acked; unclean leader election truncated the log to 103, the
		// partition restarts at 103. 100-102 are still in Kafka: their
		// acks count and the commit waits for them.
		{"forward restart keeps unacked below R", slices.Concat(
			[]op{start(100, 100)}, recvRange(100, 110),
			[]op{ack(105, true, 100), ack(109, true, 100)},
			[]op{start(103, 100)},
			[]op{ackFirst(105, false, 100)}, // forgotten: re-fetched or gone
			[]op{ackFirst(101, true, 100), ackFirst(100, true, 102), ackFirst(102, true, 103)},
			[]op{recv(103), recv(104), ack(104, true, 103), ack(103, true, 105)},
		)},
		{"forward restart beyond everything received", slices.Concat(
			[]op{start(0, 0)}, recvRange(0, 3),
			[]op{start(10, 0), ackFirst(1, true, 0), ackFirst(0, true, 2), ackFirst(2, true, 10)},
			[]op{{"recv", 9, false, -1}, recv(10), ack(10, true, 11)},
		)},
		{"forward restart with nothing outstanding", slices.Concat(
			[]op{start(0, 0)}, recvRange(0, 2), []op{ack(0, true, 1), ack(1, true, 2), start(7, 7)},
		)},
		// Truncated below what was committed (policy oldest, or newest on a
		// shorter log): the offsets from R are other records now.
		{"restart lower forgets everything above R", slices.Concat(
			[]op{start(100, 100)}, recvRange(100, 105), []op{ack(100, true, 101), ack(101, true, 102)},
			[]op{start(50, 50), ackFirst(102, false, 50)},
			recvRange(50, 53), []op{ack(50, true, 51)},
		)},
		{"restart lower keeps unacked below R", slices.Concat(
			[]op{start(0, 0)}, recvRange(0, 10),
			[]op{ack(1, true, 0), ack(2, true, 0), ack(7, true, 0)},
			[]op{start(5, 0)},
			recvRange(5, 7),
			[]op{ackFirst(5, false, 0)}, // the 5 received before the restart is forgotten
			[]op{ackFirst(3, true, 0), ackFirst(4, true, 0), ackFirst(0, true, 5)},
			[]op{ack(5, true, 6), ack(6, true, 7)},
		)},
		{"refetched offset is a new entry", slices.Concat(
			[]op{start(0, 0)}, recvRange(0, 2),
			[]op{start(0, 0)}, recvRange(0, 2),
			[]op{ackFirst(0, false, 0), ackFirst(1, false, 0), ack(0, true, 1), ack(1, true, 2)},
		)},
		{"restart where fetching went on keeps everything", slices.Concat(
			[]op{start(0, 0)}, recvRange(0, 3),
			[]op{start(3, 0), ackFirst(0, true, 1), ackFirst(2, true, 1), ackFirst(1, true, 3)},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker()
			gens := map[int64][]uint32{} // generations each offset was received in
			for i, o := range tt.ops {
				var got bool
				switch o.kind {
				case "start":
					tr.Start(0, o.offset)
					got = true
				case "recv":
					got = tr.Received(0, o.offset)
					if got {
						gens[o.offset] = append(gens[o.offset], tr.Gen(0))
					}
				case "ack", "ack-first":
					g := gens[o.offset]
					if len(g) == 0 {
						t.Fatalf("op %d: ack of offset %d never received", i, o.offset)
					}
					gen := g[len(g)-1]
					if o.kind == "ack-first" {
						gen = g[0]
					}
					got = tr.AckIn(0, o.offset, gen)
				}
				if got != o.ok {
					t.Fatalf("op %d %s(%d) = %v, want %v", i, o.kind, o.offset, got, o.ok)
				}
				if o.want >= 0 {
					if c, _ := tr.Committable(0); c != o.want {
						t.Fatalf("op %d %s(%d): committable %d, want %d", i, o.kind, o.offset, c, o.want)
					}
				}
			}
		})
	}
}

func TestTrackerPendingAndReport(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 10)
	tr.Received(0, 10)
	tr.Received(0, 11)
	g := tr.Gen(0)
	if !tr.Pending(0, 10, g) || tr.Pending(0, 12, g) || tr.Pending(0, 10, g+1) || tr.Pending(1, 10, g) {
		t.Fatal("Pending wrong before the restart")
	}
	tr.Start(0, 11)
	if !tr.Pending(0, 10, g) || tr.Pending(0, 11, g) {
		t.Fatal("after a restart at 11, 10 must stay pending and 11 be forgotten")
	}
	tr.AckIn(0, 10, g)
	if tr.Pending(0, 10, g) {
		t.Fatal("acked offset still pending")
	}
	if c, ok := tr.Report(0); !ok || c != 11 {
		t.Fatalf("Report = %d, %v; want 11", c, ok)
	}
	if d := tr.Dirty(); d != nil {
		t.Fatalf("Dirty after Report = %v, want nothing", d)
	}
	if _, ok := tr.Report(5); ok {
		t.Fatal("Report of an untracked partition")
	}
}

// Partitions are found by number below maxDense and in a map above it (and
// below 0): every method sees them all.
func TestTrackerSparsePartitions(t *testing.T) {
	tr := NewTracker()
	parts := []int32{5, -1, maxDense, 0, math.MaxInt32, math.MinInt32}
	for i, p := range parts {
		tr.Start(p, int64(10*i))
		for o := int64(10 * i); o < int64(10*i+3); o++ {
			if !tr.Received(p, o) {
				t.Fatalf("partition %d offset %d not received", p, o)
			}
		}
		if !tr.Ack(p, int64(10*i)) || !tr.Ack(p, int64(10*i+2)) {
			t.Fatalf("partition %d: acks refused", p)
		}
	}
	want := map[int32]int64{}
	outstanding := map[int32]int{}
	for i, p := range parts {
		want[p] = int64(10*i + 1)
		outstanding[p] = 2
		if c, ok := tr.Committable(p); !ok || c != int64(10*i+1) {
			t.Fatalf("partition %d committable %d, %v", p, c, ok)
		}
		if tr.Gen(p) != 1 || tr.Outstanding(p) != 2 {
			t.Fatalf("partition %d gen %d outstanding %d", p, tr.Gen(p), tr.Outstanding(p))
		}
	}
	if got := tr.All(); !maps.Equal(got, want) {
		t.Fatalf("All = %v, want %v", got, want)
	}
	if got := tr.Dirty(); !maps.Equal(got, want) {
		t.Fatalf("Dirty = %v, want %v", got, want)
	}
	if got := tr.OutstandingAll(); !maps.Equal(got, outstanding) {
		t.Fatalf("OutstandingAll = %v", got)
	}
	if _, ok := tr.Committable(6); ok || tr.Outstanding(maxDense+1) != 0 || tr.Ack(-2, 0) {
		t.Fatal("untracked partitions found")
	}
}

// Acks find their entries whether offsets are consecutive or not (gaps of
// compaction), and whatever the order of the acks.
func TestTrackerAckFindsEntriesAcrossGaps(t *testing.T) {
	tr := NewTracker()
	tr.Start(0, 0)
	var offs []int64
	for o := int64(0); o < 300; o += 1 + o%7 {
		offs = append(offs, o)
		tr.Received(0, o)
	}
	for i := len(offs) - 1; i > 0; i-- { // every one but the first, backwards
		if !tr.Ack(0, offs[i]) || tr.Ack(0, offs[i]) {
			t.Fatalf("ack of %d: first refused or second accepted", offs[i])
		}
		if tr.Ack(0, offs[i]+1) && !slices.Contains(offs, offs[i]+1) {
			t.Fatalf("ack of %d, never received, accepted", offs[i]+1)
		}
	}
	if c, _ := tr.Committable(0); c != 0 {
		t.Fatalf("committable %d, want 0", c)
	}
	tr.Ack(0, 0)
	if c, _ := tr.Committable(0); c != offs[len(offs)-1]+1 || tr.Outstanding(0) != 0 {
		t.Fatalf("committable %d, outstanding %d", c, tr.Outstanding(0))
	}
}

// BenchmarkTrackerBatches measures a message through the tracker as the
// dispatcher drives it: batches of 256 received per partition, 8
// partitions, each batch's arrival marked, acked in delivery order a batch
// later.
func BenchmarkTrackerBatches(b *testing.B) {
	const parts, batch = 8, 256
	tr := NewTracker()
	for p := range int32(parts) {
		tr.Start(p, 0)
	}
	var next [parts]int64
	now := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	for i := 0; i < b.N; i += batch {
		p := int32(i / batch % parts)
		from := next[p]
		mark, _ := tr.Receivable(p)
		for o := from; o < from+batch; o++ {
			tr.Received(p, o)
		}
		tr.Arrived(p, mark, now)
		next[p] += batch
		if from >= batch {
			for o := from - batch; o < from; o++ {
				tr.Ack(p, o)
			}
		}
	}
}
