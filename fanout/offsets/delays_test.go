package offsets

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestDelaysEncodeDecode(t *testing.T) {
	const t0 = 1_700_000_000_500 // Unix ms
	for _, tc := range []struct {
		name     string
		p        Progress
		progress string // Encode
		delays   string // EncodeDelays
	}{
		{"none", Progress{Base: 7, Acked: []Range{{8, 9}}}, "v1 b=7 a=0+2", ""},
		{"the doc's example", Progress{Base: 100, Failed: []Failure{{100, 1}, {103, 2}},
			Delayed: []Delay{{100, t0}, {103, t0 + 29_500}}},
			"v1 b=100 f=0:1,3:2", "d1 b=100 t=1700000000500 d=0:0,2:29500"},
		{"delays alone", Progress{Base: 5, Delayed: []Delay{{9, t0}}}, "v1 b=5", "d1 b=5 t=1700000000500 d=4:0"},
		{"the same time twice", Progress{Base: 0, Delayed: []Delay{{1, t0}, {2, t0}}}, "v1 b=0", "d1 b=0 t=1700000000500 d=1:0,0:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Encode(); got != tc.progress {
				t.Fatalf("Encode = %q, want %q", got, tc.progress)
			}
			if got := tc.p.EncodeDelays(); got != tc.delays {
				t.Fatalf("EncodeDelays = %q, want %q", got, tc.delays)
			}
			back, err := DecodeProgress(tc.progress, tc.delays)
			if err != nil {
				t.Fatalf("DecodeProgress(%q, %q): %v", tc.progress, tc.delays, err)
			}
			if !reflect.DeepEqual(back, tc.p) {
				t.Fatalf("DecodeProgress(%q, %q) = %+v, want %+v", tc.progress, tc.delays, back, tc.p)
			}
			for _, d := range tc.p.Delayed {
				if nb, ok := back.DelayAt(d.Offset); !ok || nb != d.NotBefore {
					t.Fatalf("DelayAt(%d) = %d, %v; want %d", d.Offset, nb, ok, d.NotBefore)
				}
			}
			if _, ok := back.DelayAt(tc.p.Base + 1000); ok {
				t.Fatal("DelayAt of an offset without a delay says it has one")
			}
		})
	}
	// Delays stored without progress: the base is theirs.
	if p, err := DecodeProgress("", "d1 b=5 t=1700000000500 d=4:0"); err != nil || p.Base != 5 || len(p.Delayed) != 1 {
		t.Fatalf("delays without progress: %+v, %v", p, err)
	}
	if p, err := DecodeProgress("", ""); err != nil || p.Base != -1 || !p.IsZero() {
		t.Fatalf(`DecodeProgress("", "") = %+v, %v; want none`, p, err)
	}
}

// What an older daemon wrote reads as no delays; delays recorded above
// another base are stale (a daemon that writes none committed the progress
// since) and left out; a later format of the delays, or a field this one
// does not know, is skipped, so that a newer daemon's record never voids
// this one's reading of the rest.
func TestDelaysCompatible(t *testing.T) {
	for _, tc := range []struct {
		name, progress, delays string
		want                   Progress
	}{
		{"written before delays were", "v1 b=10 f=0:2 a=1+3", "", Progress{Base: 10, Acked: []Range{{12, 14}}, Failed: []Failure{{10, 2}}}},
		{"stale delays", "v1 b=10 f=0:2", "d1 b=4 t=1700000000000 d=6:0", Progress{Base: 10, Failed: []Failure{{10, 2}}}},
		{"a later format", "v1 b=10 f=0:2", "d9 whatever it says", Progress{Base: 10, Failed: []Failure{{10, 2}}}},
		{"an unknown field", "v1 b=10", "d1 b=10 t=1700000000000 d=0:5 x=1,2,3", Progress{Base: 10, Delayed: []Delay{{10, 1700000000005}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeProgress(tc.progress, tc.delays)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("DecodeProgress(%q, %q) = %+v, %v; want %+v", tc.progress, tc.delays, got, err, tc.want)
			}
		})
	}
}

// Progress with delays, as the stores write it, read by the parser of a
// daemon that knows no delays (parseProgressV1, below): the delays are
// written apart, so it reads the rest as before.
func TestProgressWithDelaysReadByTheFormerParser(t *testing.T) {
	p := Progress{Base: 100, Acked: []Range{{105, 110}}, Failed: []Failure{{100, 2}},
		Delayed: []Delay{{100, 1_700_000_000_000}, {103, 1_700_000_600_000}}}
	old, err := parseProgressV1(p.Encode())
	if err != nil {
		t.Fatalf("the former parser refuses %q: %v", p.Encode(), err)
	}
	want := p
	want.Delayed = nil
	if !reflect.DeepEqual(old, want) {
		t.Fatalf("the former parser read %+v, want %+v", old, want)
	}
	// The former parser refuses any field it does not know: that is why the
	// delays are not one.
	if _, err := parseProgressV1(p.Encode() + " " + p.EncodeDelays()[3:]); err == nil {
		t.Fatal("the former parser took an unknown field: the test's copy is not the former parser")
	}
}

func TestDelaysDecodeRefusesBadInput(t *testing.T) {
	for _, text := range []string{
		"d1", "d1 b=1", "d1 b=1 d=0:0", "d1 t=5 d=0:0", "d1 b=-1 t=5 d=0:0", "d1 b=x t=5 d=0:0", "d1 b=1 t=-5 d=0:0",
		"d1 b=1 t=5 d=0", "d1 b=1 t=5 d=-1:0", "d1 b=1 t=5 d=0:-1", "d1 b=1 t=5 d=0:0 d=1:0", "d1 b=1 t=5 d=0:0,,1:0",
		"d1 b=1 t=5 d=9223372036854775807:0", "d1 b=1 t=253402300799999 d=0:1",
		"d1 b=1 t=5 d=" + strings.Repeat("0:0,", MaxDelayBytes),
	} {
		p, err := DecodeProgress("v1 b=1 a=0+1", text)
		if !errors.Is(err, ErrBadProgress) {
			t.Errorf("DecodeProgress(_, %q) = %+v, %v; want ErrBadProgress", text, p, err)
			continue
		}
		// The rest of the progress stands.
		if want := (Progress{Base: 1, Acked: []Range{{2, 2}}}); !reflect.DeepEqual(p, want) {
			t.Errorf("DecodeProgress(_, %q) = %+v beside its error, want the progress without delays %+v", text, p, want)
		}
	}
	if p, err := DecodeProgress("v1 b=oops", "d1 b=1 t=5 d=0:0"); !errors.Is(err, ErrBadProgress) || !p.IsZero() {
		t.Errorf("bad progress, good delays: %+v, %v; want nothing and ErrBadProgress", p, err)
	}
}

// Encoding is bounded: at most MaxProgressDelays delays in at most
// MaxDelayBytes, those that wait longest kept (the others would go at once
// after a failover, the earliest due losing the least).
func TestDelaysEncodeBounded(t *testing.T) {
	const t0 = 1_700_000_000_000
	for _, tc := range []struct {
		name string
		gap  int64 // between the offsets
	}{{"consecutive offsets", 1}, {"far apart", 1_000_003}} {
		t.Run(tc.name, func(t *testing.T) {
			p := Progress{Base: 1000}
			for i := range int64(2000) {
				p.Delayed = append(p.Delayed, Delay{Offset: 1000 + i*tc.gap, NotBefore: t0 + (i*7919)%900_000})
			}
			text := p.EncodeDelays()
			if len(text) > MaxDelayBytes {
				t.Fatalf("encoded %d bytes, bound %d", len(text), MaxDelayBytes)
			}
			back, err := DecodeProgress("", text)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(back.Delayed); n == 0 || n > MaxProgressDelays {
				t.Fatalf("%d delays kept, want 1 to %d", n, MaxProgressDelays)
			}
			earliest := int64(1 << 62)
			kept := map[int64]bool{}
			for _, d := range back.Delayed {
				kept[d.Offset] = true
				earliest = min(earliest, d.NotBefore)
			}
			for _, d := range p.Delayed {
				if !kept[d.Offset] && d.NotBefore > earliest {
					t.Fatalf("dropped %+v, kept one due at %d", d, earliest)
				}
			}
			if !slices.IsSortedFunc(back.Delayed, func(a, b Delay) int { return cmpInt64(a.Offset, b.Offset) }) {
				t.Fatal("delays not ascending by offset")
			}
			t.Logf("%d delays kept in %d bytes", len(back.Delayed), len(text))
		})
	}
	// Entries that mean nothing are left out: below the base, not ascending.
	p := Progress{Base: 10, Delayed: []Delay{{5, 100}, {12, 200}, {11, 300}, {12, 400}}}
	back, err := DecodeProgress("", p.EncodeDelays())
	if err != nil || !reflect.DeepEqual(back.Delayed, []Delay{{11, 300}, {12, 400}}) {
		t.Fatalf("from %+v: %+v, %v", p.Delayed, back.Delayed, err)
	}
}

// FuzzDecodeProgress: whatever a store holds, decoding it neither panics nor
// takes what the encoders would not write back as it was: what decodes
// encodes within the bounds, and decodes again to the same.
func FuzzDecodeProgress(f *testing.F) {
	f.Add("v1 b=100 f=0:2 a=4+6,1+1", "d1 b=100 t=1700000000500 d=0:0,2:29500")
	f.Add("", "d1 b=5 t=1700000000500 d=4:0")
	f.Add("v1 b=10", "d9 later")
	f.Add("v1 b=1 a=9223372036854775807+1", "d1 b=1 t=5 d=0:0 x=1")
	f.Add("v1 b=0 f=3:1,6:4", "")
	f.Fuzz(func(t *testing.T, progress, delays string) {
		p, err := DecodeProgress(progress, delays)
		if err != nil && !errors.Is(err, ErrBadProgress) {
			t.Fatalf("error %v does not wrap ErrBadProgress", err)
		}
		if p.IsZero() && p.Base < 0 {
			return
		}
		for i, d := range p.Delayed {
			if d.Offset < p.Base || (i > 0 && d.Offset <= p.Delayed[i-1].Offset) || d.NotBefore <= 0 || d.NotBefore > maxNotBefore {
				t.Fatalf("decoded delays %+v above base %d: not ascending, below the base or out of range", p.Delayed, p.Base)
			}
		}
		text, dtext := p.Encode(), p.EncodeDelays()
		if len(text) > MaxProgressBytes || len(dtext) > MaxDelayBytes {
			t.Fatalf("re-encoded %d and %d bytes", len(text), len(dtext))
		}
		again, err := DecodeProgress(text, dtext)
		if err != nil {
			t.Fatalf("what %+v encodes to (%q, %q) does not decode: %v", p, text, dtext, err)
		}
		if t2, d2 := again.Encode(), again.EncodeDelays(); t2 != text || d2 != dtext {
			t.Fatalf("encodings differ after a round trip: %q, %q then %q, %q", text, dtext, t2, d2)
		}
		if len(text) < MaxProgressBytes/2 && len(dtext) < MaxDelayBytes/2 && len(p.Failed) <= MaxProgressFailures &&
			len(p.Delayed) <= MaxProgressDelays && !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip of %+v gave %+v", p, again)
		}
	})
}

// parseProgressV1 is ParseProgress as a daemon that knows no delays has it,
// kept as it was: the record a daemon of this version writes must read in it.
func parseProgressV1(s string) (Progress, error) {
	p := Progress{Base: -1}
	s = strings.TrimSpace(s)
	if s == "" {
		return p, nil
	}
	if len(s) > 2*MaxProgressBytes {
		return Progress{}, fmt.Errorf("%w: %d bytes", ErrBadProgress, len(s))
	}
	bad := func(format string, args ...any) (Progress, error) {
		return Progress{}, fmt.Errorf("%w: %q: %s", ErrBadProgress, s, fmt.Sprintf(format, args...))
	}
	fields := strings.Fields(s)
	if fields[0] != "v1" {
		return bad("unknown version %q", fields[0])
	}
	if len(fields) < 2 || !strings.HasPrefix(fields[1], "b=") {
		return bad("no base")
	}
	base, err := strconv.ParseInt(fields[1][2:], 10, 64)
	if err != nil || base < 0 || base > maxOffset {
		return bad("base %q", fields[1])
	}
	p.Base = base
	rest := fields[2:]
	if len(rest) > 0 && strings.HasPrefix(rest[0], "f=") {
		prev := p.Base
		for i, item := range strings.Split(rest[0][2:], ",") {
			d, c, ok := strings.Cut(item, ":")
			delta, err1 := strconv.ParseInt(d, 10, 64)
			count, err2 := strconv.ParseUint(c, 10, 32)
			if !ok || err1 != nil || err2 != nil || delta < 0 || (i > 0 && delta == 0) || count == 0 || delta > maxOffset-prev {
				return bad("failure %q", item)
			}
			prev += delta
			p.Failed = append(p.Failed, Failure{Offset: prev, Count: uint32(count)})
		}
		rest = rest[1:]
	}
	if len(rest) > 0 && strings.HasPrefix(rest[0], "a=") {
		next := p.Base + 1
		for _, item := range strings.Split(rest[0][2:], ",") {
			g, l, ok := strings.Cut(item, "+")
			gap, err1 := strconv.ParseInt(g, 10, 64)
			n, err2 := strconv.ParseInt(l, 10, 64)
			if !ok || err1 != nil || err2 != nil || gap < 0 || n < 1 || gap > maxOffset-next || n > maxOffset-next-gap {
				return bad("range %q", item)
			}
			first := next + gap
			p.Acked = append(p.Acked, Range{First: first, Last: first + n - 1})
			next = first + n
		}
		rest = rest[1:]
	}
	if len(rest) > 0 {
		return bad("field %q", rest[0])
	}
	return p, nil
}

func TestMemoryStoreKeepsDelays(t *testing.T) {
	ctx := t.Context()
	s := NewMemoryStore()
	f := s.NewTerm()
	pr := Progress{Base: 10, Failed: []Failure{{10, 1}}, Delayed: []Delay{{10, 1_700_000_020_000}, {11, 1_700_000_030_000}}}
	if err := s.CommitProgress(ctx, f, map[int32]int64{0: 10}, map[int32]Progress{0: pr}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadProgress(ctx); err != nil || !reflect.DeepEqual(got, map[int32]Progress{0: pr}) {
		t.Fatalf("LoadProgress = %+v, %v; want %+v", got, err, pr)
	}
	// Delays alone are progress too.
	only := Progress{Base: 10, Delayed: []Delay{{12, 1_700_000_020_000}}}
	if err := s.CommitProgress(ctx, f, map[int32]int64{0: 10}, map[int32]Progress{0: only}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadProgress(ctx); err != nil || !reflect.DeepEqual(got, map[int32]Progress{0: only}) {
		t.Fatalf("LoadProgress = %+v, %v; want %+v", got, err, only)
	}
}

func TestTrackerMarkProgress(t *testing.T) {
	tr := NewTracker()
	tr.TrackProgress()
	tr.Start(0, 5)
	tr.Received(0, 5)
	tr.Dirty()
	tr.MarkProgress(0)
	tr.MarkProgress(3) // not tracked: nothing
	if d := tr.Dirty(); !reflect.DeepEqual(d, map[int32]int64{0: 5}) {
		t.Fatalf("Dirty after MarkProgress = %v, want partition 0 at 5", d)
	}
	plain := NewTracker()
	plain.Start(0, 5)
	plain.Dirty()
	plain.MarkProgress(0)
	if d := plain.Dirty(); d != nil {
		t.Fatalf("Dirty = %v after MarkProgress without TrackProgress", d)
	}
}
