package offsets

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Delays in Progress. A message nacked with a delay, or delayed by the
// retry backoff, waits in the dispatcher until its due time; a commit
// records that time with the partition's progress, so that after a
// failover or restart the message still waits until then before its first
// delivery in the new term.
//
// The time is absolute, Unix milliseconds of the wall clock of the member
// that delayed the message, rounded up. A member that restores it reads it
// on its own clock: one whose clock is ahead by some skew delivers early by
// that skew, one whose clock is behind, late by it; a restored delay is cut
// to the longest delay a nack may ask for (the dispatcher's rule), so that a
// member far behind cannot park a message.
//
// The delays are encoded apart from the rest of the progress (Encode), and
// the stores keep the two texts side by side: a daemon that knows no delays
// refuses any field it does not know in the progress text, which would void
// its acked ranges and failure counts, while it never reads the delays'.

// Delay is an unacked message waiting out a retry delay: it is not
// delivered before NotBefore, Unix milliseconds (wall clock).
type Delay struct {
	Offset    int64
	NotBefore int64
}

// Bounds of the delays of a Progress.
const (
	// MaxDelayBytes bounds EncodeDelays: with MaxProgressBytes and the
	// term it fits a Kafka offset commit's metadata (4096 bytes by
	// default).
	MaxDelayBytes = 1024
	// MaxProgressDelays bounds the delays recorded per partition. Beyond
	// it, and beyond MaxDelayBytes, those due earliest are left out: after
	// a failover they are delivered at once.
	MaxProgressDelays = 128
)

// delaysVersion starts every encoding of delays; a later format gets
// another, which this one skips.
const delaysVersion = "d1"

// maxNotBefore bounds decoded times (9999-12-31, in Unix ms), so that sums
// cannot overflow.
const maxNotBefore = 253402300799999

// NotBefore returns t in the form of Delay.NotBefore: Unix milliseconds,
// rounded up, so that a message is never due before t.
func NotBefore(t time.Time) int64 {
	ns := t.UnixNano()
	ms := ns / 1e6
	if ns%1e6 > 0 {
		ms++
	}
	return ms
}

// DelayAt returns the NotBefore p records for offset o, and false when it
// records none. p.Delayed must be ascending by offset.
func (p Progress) DelayAt(o int64) (int64, bool) {
	i, ok := slices.BinarySearchFunc(p.Delayed, o, func(d Delay, o int64) int { return cmpInt64(d.Offset, o) })
	if !ok {
		return 0, false
	}
	return p.Delayed[i].NotBefore, true
}

// SortDelays makes p.Delayed what a Progress holds: at most
// MaxProgressDelays delays, those due latest, ascending by offset, one per
// offset (the latest), none below Base.
func (p *Progress) SortDelays() {
	p.Delayed = keepDelays(p.Base, p.Delayed, false)
}

// keepDelays returns the delays of ds that a Progress above base holds (see
// SortDelays), in a slice of its own when clone is set.
func keepDelays(base int64, ds []Delay, clone bool) []Delay {
	if clone {
		ds = slices.Clone(ds)
	}
	ds = slices.DeleteFunc(ds, func(d Delay) bool { return d.Offset < base || d.NotBefore <= 0 || d.NotBefore > maxNotBefore })
	if len(ds) > MaxProgressDelays {
		slices.SortStableFunc(ds, func(a, b Delay) int { return cmpInt64(b.NotBefore, a.NotBefore) })
		ds = ds[:MaxProgressDelays]
	}
	slices.SortFunc(ds, func(a, b Delay) int {
		if c := cmpInt64(a.Offset, b.Offset); c != 0 {
			return c
		}
		return cmpInt64(b.NotBefore, a.NotBefore)
	})
	return slices.CompactFunc(ds, func(a, b Delay) bool { return a.Offset == b.Offset })
}

// EncodeDelays returns p's delays as text of at most MaxDelayBytes bytes,
// the same for every store, or "" when there are none: "d1 b=<base>
// t=<earliest NotBefore> d=<delays>", numbers in decimal; a delay is
// <offset − (previous delay's offset + 1; the first's: base)>:<NotBefore −
// t>. E.g. base 100, 100 due at 1700000000500 and 103 at 1700000030000:
// "d1 b=100 t=1700000000500 d=0:0,2:29500". What does not fit (beyond
// MaxProgressDelays or MaxDelayBytes) is left out, the earliest due first;
// so are delays below base, and all but the latest of an offset.
func (p Progress) EncodeDelays() string {
	ds := keepDelays(p.Base, p.Delayed, true)
	for len(ds) > 0 {
		if s := encodeDelays(p.Base, ds); len(s) <= MaxDelayBytes {
			return s
		}
		earliest := 0
		for i, d := range ds {
			if d.NotBefore < ds[earliest].NotBefore {
				earliest = i
			}
		}
		ds = slices.Delete(ds, earliest, earliest+1)
	}
	return ""
}

// encodeDelays encodes ds, ascending by offset, none below base.
func encodeDelays(base int64, ds []Delay) string {
	t := ds[0].NotBefore
	for _, d := range ds {
		t = min(t, d.NotBefore)
	}
	b := make([]byte, 0, 32+12*len(ds))
	b = append(b, delaysVersion+" b="...)
	b = strconv.AppendInt(b, base, 10)
	b = append(b, " t="...)
	b = strconv.AppendInt(b, t, 10)
	b = append(b, " d="...)
	next := base
	for i, d := range ds {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, d.Offset-next, 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, d.NotBefore-t, 10)
		next = d.Offset + 1
	}
	return string(b)
}

// parseDelays decodes what EncodeDelays wrote: the base the delays were
// recorded above (-1 when there are none) and the delays. Text of a later
// format is none, and fields this format does not know are skipped, so that
// a newer daemon's record voids nothing here.
func parseDelays(s string) (base int64, ds []Delay, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return -1, nil, nil
	}
	if len(s) > 2*MaxDelayBytes {
		return -1, nil, fmt.Errorf("%w: delays of %d bytes", ErrBadProgress, len(s))
	}
	bad := func(format string, args ...any) (int64, []Delay, error) {
		return -1, nil, fmt.Errorf("%w: delays %q: %s", ErrBadProgress, s, fmt.Sprintf(format, args...))
	}
	fields := strings.Fields(s)
	if fields[0] != delaysVersion {
		return -1, nil, nil
	}
	var b, t, d string
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		var into *string
		switch k {
		case "b":
			into = &b
		case "t":
			into = &t
		case "d":
			into = &d
		default:
			continue
		}
		if *into != "" {
			return bad("field %q twice", k)
		}
		*into = v
	}
	base, err1 := strconv.ParseInt(b, 10, 64)
	t0, err2 := strconv.ParseInt(t, 10, 64)
	if err1 != nil || base < 0 || base > maxOffset {
		return bad("base %q", b)
	}
	if err2 != nil || t0 < 1 || t0 > maxNotBefore {
		return bad("time %q", t)
	}
	if d == "" {
		return bad("no delays")
	}
	next := base
	for _, item := range strings.Split(d, ",") {
		g, dt, ok := strings.Cut(item, ":")
		gap, err1 := strconv.ParseInt(g, 10, 64)
		after, err2 := strconv.ParseInt(dt, 10, 64)
		if !ok || err1 != nil || err2 != nil || gap < 0 || gap > maxOffset-next || after < 0 || after > maxNotBefore-t0 {
			return bad("delay %q", item)
		}
		ds = append(ds, Delay{Offset: next + gap, NotBefore: t0 + after})
		next += gap + 1
	}
	return base, ds, nil
}

// DecodeProgress decodes a partition's progress and its delays as a store
// keeps them side by side (Encode, EncodeDelays; either may be empty: the
// zero Progress with base -1 when both are). Delays recorded above another
// base than the progress's are left out: a daemon that writes no delays
// committed the progress since. Progress that does not decode is an error
// wrapping ErrBadProgress, with the zero Progress; delays that do not
// decode, such an error too, with the progress without them.
func DecodeProgress(progress, delays string) (Progress, error) {
	p, err := ParseProgress(progress)
	if err != nil {
		return Progress{}, err
	}
	base, ds, err := parseDelays(delays)
	switch {
	case err != nil:
		return p, err
	case ds == nil:
	case p.Base < 0:
		p.Base, p.Delayed = base, ds
	case p.Base == base:
		p.Delayed = ds
	}
	return p, nil
}
