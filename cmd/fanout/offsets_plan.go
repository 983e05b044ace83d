package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Kinds of reset target (--to).
const (
	toOldest  = "oldest"
	toNewest  = "newest"
	toTime    = "time"
	toOffsets = "offsets"
)

// resetTarget is where fanout offsets reset moves partitions (--to): to
// their oldest or newest offset, to the first offset at or after a time, or
// to explicit offsets.
type resetTarget struct {
	kind    string          // toOldest, toNewest, toTime or toOffsets
	at      time.Time       // toTime
	offsets map[int32]int64 // toOffsets: per partition
}

// String is the target as --to gives it.
func (t resetTarget) String() string {
	switch t.kind {
	case toTime:
		return t.at.Format(time.RFC3339Nano)
	case toOffsets:
		var b strings.Builder
		for i, p := range slices.Sorted(maps.Keys(t.offsets)) {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%d=%d", p, t.offsets[p])
		}
		return b.String()
	}
	return t.kind
}

// parseResetTarget parses --to: oldest, newest, an RFC 3339 time
// (2026-03-04T05:06:07Z, with a fraction or a zone offset), or
// <partition>=<offset>,... .
func parseResetTarget(s string) (resetTarget, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "":
		return resetTarget{}, errors.New("--to is required: oldest, newest, an RFC 3339 time, or <partition>=<offset>,...")
	case toOldest, toNewest:
		return resetTarget{kind: strings.ToLower(s)}, nil
	}
	if strings.Contains(s, "=") {
		offs := map[int32]int64{}
		for _, item := range strings.Split(s, ",") {
			ps, offStr, ok := strings.Cut(strings.TrimSpace(item), "=")
			p, perr := strconv.ParseInt(strings.TrimSpace(ps), 10, 32)
			o, oerr := strconv.ParseInt(strings.TrimSpace(offStr), 10, 64)
			switch {
			case !ok || perr != nil || p < 0:
				return resetTarget{}, fmt.Errorf("--to %q: %q is not <partition>=<offset> (a partition number, then =, then an offset)", s, item)
			case oerr != nil || o < 0:
				return resetTarget{}, fmt.Errorf("--to %q: offset %q of partition %d is not a whole number of 0 or more", s, strings.TrimSpace(offStr), p)
			}
			if _, dup := offs[int32(p)]; dup {
				return resetTarget{}, fmt.Errorf("--to %q: partition %d is given twice", s, p)
			}
			offs[int32(p)] = o
		}
		return resetTarget{kind: toOffsets, offsets: offs}, nil
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return resetTarget{}, fmt.Errorf("--to %q: want oldest, newest, an RFC 3339 time such as 2026-03-04T05:06:07Z, or <partition>=<offset>,...", s)
	}
	return resetTarget{kind: toTime, at: at}, nil
}

// parsePartitions parses --partitions: partition numbers, comma-separated
// or repeated; nil when none is given.
func parsePartitions(in []string) ([]int32, error) {
	var out []int32
	for _, s := range splitAll(in) {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("--partitions: %q is not a partition number", s)
		}
		if slices.Contains(out, int32(p)) {
			return nil, fmt.Errorf("--partitions: partition %d is given twice", p)
		}
		out = append(out, int32(p))
	}
	slices.Sort(out)
	return out, nil
}

// partitionState is what a reset plan is made from, per partition: the
// committed offset (nil: none) and the log as Kafka lists it.
type partitionState struct {
	Partition int32
	Committed *int64
	Start     int64 // the log start: the oldest offset
	End       int64 // the log end: the high watermark
	Stable    int64 // newest: the last stable offset (below any open transaction)
	AtTime    int64 // toTime: the first offset whose timestamp is at or after the time; -1 when none is
}

// change is one partition's line of a reset plan.
type change struct {
	Partition int32  `json:"partition"`
	From      *int64 `json:"from"` // the committed offset when read; nil: none
	To        int64  `json:"to"`
	LogStart  int64  `json:"log_start"`
	LogEnd    int64  `json:"log_end"`
	Note      string `json:"note,omitempty"`
}

// unchanged reports whether the change writes what is committed already.
func (c change) unchanged() bool { return c.From != nil && *c.From == c.To }

// errBadReset ends the error of a reset that names partitions or offsets
// the topic does not have: bad values, not a failure.
var errBadReset = errors.New("nothing written")

// planReset computes, for target, the offset every partition of limit (or,
// when limit is empty, every partition of states; toOffsets names its own)
// is reset to. An offset outside its partition's log [start, end] is
// refused unless allowOutOfRange. Errors wrap errBadReset.
func planReset(target resetTarget, limit []int32, states map[int32]partitionState, allowOutOfRange bool) ([]change, error) {
	parts := limit
	if target.kind == toOffsets {
		if len(limit) > 0 {
			return nil, fmt.Errorf("--partitions goes with oldest, newest or a time; --to %s names its partitions: %w", target, errBadReset)
		}
		parts = slices.Sorted(maps.Keys(target.offsets))
	}
	if len(parts) == 0 {
		parts = slices.Sorted(maps.Keys(states))
	}
	var unknown []string
	for _, p := range parts {
		if _, ok := states[p]; !ok {
			unknown = append(unknown, strconv.Itoa(int(p)))
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("the topic has no partition %s (it has partitions 0 to %d): %w",
			strings.Join(unknown, ", "), len(states)-1, errBadReset)
	}
	var out []change
	var outside []string
	for _, p := range parts {
		st := states[p]
		c := change{Partition: p, From: st.Committed, LogStart: st.Start, LogEnd: st.End}
		switch target.kind {
		case toOldest:
			c.To = st.Start
		case toNewest:
			c.To = st.Stable
			if st.Stable < st.End {
				c.Note = "newest is below an open transaction's records"
			}
		case toTime:
			c.To = st.AtTime
			if st.AtTime < 0 {
				c.To, c.Note = st.Stable, "no record at or after the time: newest"
			}
		case toOffsets:
			c.To = target.offsets[p]
			switch {
			case c.To >= st.Start && c.To <= st.End:
			case !allowOutOfRange:
				outside = append(outside, fmt.Sprintf("partition %d: offset %d is outside its log [%d, %d]", p, c.To, st.Start, st.End))
			case c.To < st.Start:
				c.Note = "below the log start (allowed): the daemon starts at the oldest offset"
			default:
				c.Note = "beyond the log end (allowed): the daemon starts by --initial-offset"
			}
		default:
			return nil, fmt.Errorf("reset target %q: %w", target.kind, errBadReset)
		}
		out = append(out, c)
	}
	if len(outside) > 0 {
		return nil, fmt.Errorf("%s (retention removed the records below the log start; the log end is the next offset to be written); "+
			"--allow-out-of-range writes such offsets anyway, and the daemon then starts below the log start at the oldest offset, "+
			"beyond the log end by --initial-offset: %w", strings.Join(outside, "; "), errBadReset)
	}
	return out, nil
}

// writePlan prints a plan as a table: per partition the committed offset,
// the new one and the log.
func writePlan(w io.Writer, plan []change) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tLOG START\tLOG END\tNOTE")
	for _, c := range plan {
		note := c.Note
		if c.unchanged() {
			note = strings.TrimPrefix(note+"; unchanged", "; ")
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\n", c.Partition, optInt(c.From), c.To, c.LogStart, c.LogEnd, note)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the plan: %w", err)
	}
	return nil
}
