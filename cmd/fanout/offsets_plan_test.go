package main

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

func TestParseResetTarget(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	tests := []struct {
		in      string
		want    resetTarget
		wantErr string // a substring of the error; "" for none
	}{
		{in: "oldest", want: resetTarget{kind: toOldest}},
		{in: " NEWEST ", want: resetTarget{kind: toNewest}},
		{in: "2026-03-04T05:06:07Z", want: resetTarget{kind: toTime, at: at}},
		{in: "2026-03-04T06:06:07.5+01:00", want: resetTarget{kind: toTime, at: at.Add(500 * time.Millisecond)}},
		{in: "0=12", want: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 12}}},
		{in: "2=0, 0=7 ,1=9", want: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 7, 1: 9, 2: 0}}},
		{in: "", wantErr: "--to is required"},
		{in: "latest", wantErr: "RFC 3339"},
		{in: "2026-03-04", wantErr: "RFC 3339"},
		{in: "2026-03-04 05:06:07", wantErr: "RFC 3339"},
		{in: "0=1,0=2", wantErr: "partition 0 is given twice"},
		{in: "0=-1", wantErr: "offset \"-1\" of partition 0"},
		{in: "0=x", wantErr: "offset \"x\" of partition 0"},
		{in: "-1=3", wantErr: `"-1=3" is not <partition>=<offset>`},
		{in: "a=3", wantErr: `"a=3" is not <partition>=<offset>`},
		{in: "0=1,", wantErr: `"" is not <partition>=<offset>`},
		{in: "0=1,newest", wantErr: `"newest" is not <partition>=<offset>`},
	}
	for _, tt := range tests {
		got, err := parseResetTarget(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseResetTarget(%q): %+v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("parseResetTarget(%q): %v", tt.in, err)
		case got.kind != tt.want.kind || !got.at.Equal(tt.want.at) || !maps.Equal(got.offsets, tt.want.offsets):
			t.Errorf("parseResetTarget(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
	if s := (resetTarget{kind: toOffsets, offsets: map[int32]int64{2: 0, 0: 7}}).String(); s != "0=7,2=0" {
		t.Errorf("String() = %q, want 0=7,2=0", s)
	}
}

func TestParsePartitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      []string
		want    []int32
		wantErr string
	}{
		{in: nil, want: nil},
		{in: []string{"2,0"}, want: []int32{0, 2}},
		{in: []string{"1", " 3 "}, want: []int32{1, 3}},
		{in: []string{"1,x"}, wantErr: `"x" is not a partition number`},
		{in: []string{"-1"}, wantErr: `"-1" is not a partition number`},
		{in: []string{"1", "1"}, wantErr: "partition 1 is given twice"},
	}
	for _, tt := range tests {
		got, err := parsePartitions(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parsePartitions(%q): %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
		case err != nil || !slices.Equal(got, tt.want):
			t.Errorf("parsePartitions(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// i64 returns a pointer to v.
func i64(v int64) *int64 { return &v }

// The plan per target: oldest is the log start, newest the last stable
// offset, a time the first offset at or after it (newest when none is),
// explicit offsets as given within the log; --partitions limits it.
func TestPlanReset(t *testing.T) {
	t.Parallel()
	// Partition 0: log [10, 50], committed 30; 1: [0, 20] with an open
	// transaction from 15, nothing committed; 2: empty [5, 5], committed 5.
	states := map[int32]partitionState{
		0: {Partition: 0, Committed: i64(30), Start: 10, End: 50, Stable: 50, AtTime: 42},
		1: {Partition: 1, Start: 0, End: 20, Stable: 15, AtTime: -1},
		2: {Partition: 2, Committed: i64(5), Start: 5, End: 5, Stable: 5, AtTime: -1},
	}
	type row struct {
		p    int32
		to   int64
		note string // a substring of the note; "" for none
	}
	tests := []struct {
		name    string
		target  resetTarget
		limit   []int32
		allow   bool
		want    []row
		wantErr string
	}{
		{name: "oldest", target: resetTarget{kind: toOldest},
			want: []row{{0, 10, ""}, {1, 0, ""}, {2, 5, ""}}},
		{name: "newest is the last stable offset", target: resetTarget{kind: toNewest},
			want: []row{{0, 50, ""}, {1, 15, "open transaction"}, {2, 5, ""}}},
		{name: "a time", target: resetTarget{kind: toTime, at: time.Now()},
			want: []row{{0, 42, ""}, {1, 15, "no record at or after the time"}, {2, 5, "no record"}}},
		{name: "limited", target: resetTarget{kind: toOldest}, limit: []int32{2, 0},
			want: []row{{2, 5, ""}, {0, 10, ""}}},
		{name: "explicit offsets at both ends of the log", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{2: 5, 0: 50, 1: 0}},
			want: []row{{0, 50, ""}, {1, 0, ""}, {2, 5, ""}}},
		{name: "explicit offsets of some partitions", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{1: 7}},
			want: []row{{1, 7, ""}}},
		{name: "an offset beyond the log end", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 51, 1: 3}},
			wantErr: "partition 0: offset 51 is outside its log [10, 50]"},
		{name: "an offset below the log start", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 9}},
			wantErr: "--allow-out-of-range"},
		{name: "out of range allowed", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 9, 2: 6}}, allow: true,
			want: []row{{0, 9, "below the log start"}, {2, 6, "beyond the log end"}}},
		{name: "a partition the topic lacks", target: resetTarget{kind: toOldest}, limit: []int32{1, 3, 4},
			wantErr: "no partition 3, 4 (it has partitions 0 to 2)"},
		{name: "an offset of a partition the topic lacks", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{7: 0}},
			wantErr: "no partition 7"},
		{name: "--partitions with explicit offsets", target: resetTarget{kind: toOffsets, offsets: map[int32]int64{0: 12}}, limit: []int32{0},
			wantErr: "--partitions goes with oldest, newest or a time"},
	}
	for _, tt := range tests {
		plan, err := planReset(tt.target, tt.limit, states, tt.allow)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errBadReset) {
				t.Errorf("%s: %+v, %v; want an errBadReset containing %q", tt.name, plan, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if len(plan) != len(tt.want) {
			t.Errorf("%s: plan %+v, want %d rows", tt.name, plan, len(tt.want))
			continue
		}
		for i, w := range tt.want {
			c, st := plan[i], states[w.p]
			if c.Partition != w.p || c.To != w.to || c.From != st.Committed || c.LogStart != st.Start || c.LogEnd != st.End ||
				(w.note == "") != (c.Note == "") || !strings.Contains(c.Note, w.note) {
				t.Errorf("%s: row %d is %+v, want partition %d to %d with note %q", tt.name, i, c, w.p, w.to, w.note)
			}
		}
	}
}

func TestWritePlan(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	err := writePlan(&b, []change{
		{Partition: 0, From: i64(30), To: 10, LogStart: 10, LogEnd: 50},
		{Partition: 1, To: 15, LogEnd: 20, Note: "newest is below an open transaction's records"},
		{Partition: 2, From: i64(5), To: 5, LogStart: 5, LogEnd: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `PARTITION  FROM  TO  LOG START  LOG END  NOTE
0          30    10  10         50
1          none  15  0          20       newest is below an open transaction's records
2          5     5   5          5        unchanged
`
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ") // the padding of an empty last cell
	}
	if got := strings.Join(lines, "\n"); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestConfirm(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, " yes ": true, "n\n": false, "\n": false, "": false, "yes please\n": false} {
		var out bytes.Buffer
		got, err := confirm(strings.NewReader(in), &out, "reset? [y/N] ")
		if err != nil || got != want {
			t.Errorf("answer %q: %v, %v; want %v", in, got, err, want)
		}
		if out.String() != "reset? [y/N] " {
			t.Errorf("answer %q: the question written is %q", in, out.String())
		}
	}
	if isTerminal(strings.NewReader("y\n")) {
		t.Error("a strings.Reader is taken for a terminal")
	}
}

// A time before 1970 asks Kafka for timestamp 0, never for the negative
// values that mean oldest and newest.
func TestTimestampMillis(t *testing.T) {
	t.Parallel()
	if got := timestampMillis(time.UnixMilli(-1)); got != 0 {
		t.Errorf("1 ms before the epoch: %d, want 0", got)
	}
	at := time.Date(2026, 3, 4, 5, 6, 7, 8e6, time.UTC)
	if got := timestampMillis(at); got != at.UnixMilli() {
		t.Errorf("%v: %d, want %d", at, got, at.UnixMilli())
	}
}

// The read-back of a reset: what was written verifies; a partition that
// holds another offset fails, unless a later epoch is recorded (the next
// leader committed since), which is noted.
func TestVerifyReset(t *testing.T) {
	t.Parallel()
	written := map[int32]int64{0: 3, 1: 4}
	read := func(leader *status.Leader, offs map[int32]int64) func(context.Context) (*status.Leader, map[int32]int64, error) {
		return func(context.Context) (*status.Leader, map[int32]int64, error) { return leader, offs, nil }
	}
	tool := &status.Leader{Node: "fanout-offsets-tool", Epoch: 5}
	if note, err := verifyReset(t.Context(), read(tool, map[int32]int64{0: 3, 1: 4, 2: 9}), "store", 5, written); err != nil || note != "" {
		t.Errorf("as written: %q, %v; want no note, no error", note, err)
	}
	_, err := verifyReset(t.Context(), read(tool, map[int32]int64{0: 3}), "store", 5, written)
	if err == nil || !strings.Contains(err.Error(), "partition 1 holds none, want 4") {
		t.Errorf("a partition lost: %v, want an error naming it", err)
	}
	_, err = verifyReset(t.Context(), read(nil, map[int32]int64{0: 3, 1: 2}), "store", 5, written)
	if err == nil || !strings.Contains(err.Error(), "partition 1 holds 2, want 4") {
		t.Errorf("a partition with another offset: %v, want an error naming it", err)
	}
	next := &status.Leader{Node: "node-b", Epoch: 6}
	note, err := verifyReset(t.Context(), read(next, map[int32]int64{0: 3, 1: 6}), "store", 5, written)
	if err != nil || !strings.Contains(note, "the next leader, node-b at epoch 6, has committed since") {
		t.Errorf("moved on by the next leader: %q, %v; want a note", note, err)
	}
	if _, err := verifyReset(t.Context(), func(context.Context) (*status.Leader, map[int32]int64, error) {
		return nil, nil, errors.New("connection lost")
	}, "store", 5, written); err == nil || !strings.Contains(err.Error(), "reading it back failed") {
		t.Errorf("a failed read: %v", err)
	}
}
