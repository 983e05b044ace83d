package offsets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Progress is what a commit records of one partition above its committed
// offset, so that a restart or a failover need not deliver it all again:
// the offsets acked above the oldest unacked one, how often each unacked
// message failed, and until when the unacked messages waiting out a retry
// delay must wait. It is written in the same atomic write as the offset it
// was recorded above (Base), and applies only to a partition that starts
// there again: an offset changed by a tool, or a restart elsewhere, makes it
// void.
//
// It is bounded (MaxProgressBytes encoded, and MaxDelayBytes for the
// delays, encoded apart: EncodeDelays): what does not fit falls back to the
// committed offset's guarantee, which is delivering again. Ranges are
// dropped from the highest, so what is recorded is exact up to some offset;
// failure counts are kept for the messages that failed most, delays for the
// messages that wait longest.
type Progress struct {
	Base   int64     // the committed offset the progress was recorded above
	Acked  []Range   // acked offsets above Base, ascending, disjoint
	Failed []Failure // unacked messages at or above Base that failed, ascending by offset
	// Delayed are the unacked messages at or above Base waiting out a
	// retry delay, ascending by offset (delays.go).
	Delayed []Delay
}

// Range is the offsets First to Last, both included. In a Progress it stands
// for the records received between them, all acked: offsets inside it that
// were never received are not records (compaction, transaction markers).
type Range struct {
	First, Last int64
}

// Failure is how many deliveries of the unacked message at Offset failed
// (timed out, were nacked, or their client left).
type Failure struct {
	Offset int64
	Count  uint32
}

// IsZero reports whether p records nothing above its base.
func (p Progress) IsZero() bool {
	return len(p.Acked) == 0 && len(p.Failed) == 0 && len(p.Delayed) == 0
}

// AckedAt reports whether offset o lies in one of p's acked ranges.
func (p Progress) AckedAt(o int64) bool {
	i, _ := slices.BinarySearchFunc(p.Acked, o, func(r Range, o int64) int {
		switch {
		case r.Last < o:
			return -1
		case r.First > o:
			return 1
		}
		return 0
	})
	return i < len(p.Acked) && p.Acked[i].First <= o && o <= p.Acked[i].Last
}

// FailuresAt returns the failure count p records for offset o (0: none).
func (p Progress) FailuresAt(o int64) uint32 {
	i, ok := slices.BinarySearchFunc(p.Failed, o, func(f Failure, o int64) int {
		switch {
		case f.Offset < o:
			return -1
		case f.Offset > o:
			return 1
		}
		return 0
	})
	if !ok {
		return 0
	}
	return p.Failed[i].Count
}

// Bounds of a Progress.
const (
	// MaxProgressBytes bounds a Progress's encoding: it fits a Kafka offset
	// commit's metadata (offset.metadata.max.bytes, 4096 by default) with
	// room for the rest of the metadata, and is small for a znode.
	MaxProgressBytes = 2048
	// MaxProgressFailures bounds the failure counts recorded per partition.
	MaxProgressFailures = 64
)

// progressVersion starts every encoding: a later format gets another.
const progressVersion = "v1"

// Encode returns p but its delays (EncodeDelays) as text of at most
// MaxProgressBytes bytes, the same for every store: "v1 b=<base>
// f=<failures> a=<ranges>", numbers in decimal and relative. A failure is
// <offset − previous failure's offset (the first's: − base)>:<count>; a
// range is <first − (previous range's last + 1, the first's: base +
// 1)>+<length>. E.g. base 100, 105-110 and 112 acked, 100
// failed twice: "v1 b=100 f=0:2 a=4+6,1+1". What does not fit is left out:
// the failures beyond MaxProgressFailures (keeping the highest counts),
// then ranges from the highest. Entries at or below base (acked) or below it
// (failed) are left out as they mean nothing there.
func (p Progress) Encode() string {
	var b strings.Builder
	b.WriteString(progressVersion)
	b.WriteString(" b=")
	b.WriteString(strconv.FormatInt(p.Base, 10))
	failed := p.Failed
	if len(failed) > MaxProgressFailures {
		failed = slices.Clone(failed)
		slices.SortStableFunc(failed, func(a, b Failure) int { return int(b.Count) - int(a.Count) })
		failed = failed[:MaxProgressFailures]
		slices.SortFunc(failed, func(a, b Failure) int { return cmpInt64(a.Offset, b.Offset) })
	}
	var item []byte
	sep := " f="
	prev := p.Base
	for _, f := range failed {
		if f.Offset < prev || f.Count == 0 {
			continue
		}
		item = append(item[:0], sep...)
		item = strconv.AppendInt(item, f.Offset-prev, 10)
		item = append(item, ':')
		item = strconv.AppendUint(item, uint64(f.Count), 10)
		if b.Len()+len(item) > MaxProgressBytes {
			break
		}
		b.Write(item)
		sep, prev = ",", f.Offset
	}
	sep = " a="
	next := p.Base + 1
	for _, r := range p.Acked {
		if r.First < next || r.Last < r.First {
			continue
		}
		item = append(item[:0], sep...)
		item = strconv.AppendInt(item, r.First-next, 10)
		item = append(item, '+')
		item = strconv.AppendInt(item, r.Last-r.First+1, 10)
		if b.Len()+len(item) > MaxProgressBytes {
			break
		}
		b.Write(item)
		sep, next = ",", r.Last+1
	}
	return b.String()
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ErrBadProgress is wrapped by the errors of progress that does not decode.
// A store that finds one loads the offset alone: the committed offset's
// guarantee still holds.
var ErrBadProgress = errors.New("progress does not decode")

// ParseProgress decodes what Encode wrote. The empty string is the zero
// Progress with base -1 (none recorded).
func ParseProgress(s string) (Progress, error) {
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
	if fields[0] != progressVersion {
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

// maxOffset bounds decoded offsets, so that sums cannot overflow.
const maxOffset = 1<<62 - 1

// ProgressStore is a Store that also keeps each partition's Progress, in
// the same atomic write as its offset. Stores that do not implement it still
// work: after a restart they deliver everything from the committed offset
// again, as before.
type ProgressStore interface {
	Store
	// LoadProgress returns the progress stored with each partition's
	// offset, for the partitions that have one. Progress that does not
	// decode is left out, and reported in an error wrapping ErrBadProgress
	// beside the rest; other errors return no map.
	LoadProgress(ctx context.Context) (map[int32]Progress, error)
	// CommitProgress is Commit that also stores, with each partition p of
	// offsets, progress[p] (whose Base is offsets[p]; absent: none), in
	// the same atomic write under fence as p's offset. A commit too large
	// for one write of the store (ZooKeeper's request limit, reached by
	// hundreds of partitions with progress) may take several, each under
	// the fence: when one fails, the partitions of those before it are
	// written.
	CommitProgress(ctx context.Context, fence Fence, offsets map[int32]int64, progress map[int32]Progress) error
}
