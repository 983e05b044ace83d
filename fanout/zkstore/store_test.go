package zkstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

func TestParseServers(t *testing.T) {
	tests := []struct {
		in         []string
		wantHosts  []string
		wantChroot string
		wantErr    bool
	}{
		{[]string{"zk1:2181"}, []string{"zk1:2181"}, "", false},
		{[]string{"zk1:2181,zk2:2182/fanout"}, []string{"zk1:2181", "zk2:2182"}, "/fanout", false},
		{[]string{"zk1:2181", "zk2:2181/a/b/"}, []string{"zk1:2181", "zk2:2181"}, "/a/b", false},
		{[]string{" zk1 , zk2:1/"}, []string{"zk1:2181", "zk2:1"}, "", false},
		{[]string{"[::1]:2181/x"}, []string{"[::1]:2181"}, "/x", false},
		{[]string{"zk1/a,zk2"}, nil, "", true},     // chroot not at the end
		{[]string{"zk1:2181/a//b"}, nil, "", true}, // unclean chroot
		{[]string{"zk1:2181/a/../b"}, nil, "", true},
		{[]string{"::1"}, nil, "", true},
		{[]string{""}, nil, "", true},
		{nil, nil, "", true},
	}
	for _, tt := range tests {
		hosts, chroot, err := ParseServers(tt.in)
		if (err != nil) != tt.wantErr || !slices.Equal(hosts, tt.wantHosts) || chroot != tt.wantChroot {
			t.Errorf("ParseServers(%q) = %q, %q, %v; want %q, %q, error %v",
				tt.in, hosts, chroot, err, tt.wantHosts, tt.wantChroot, tt.wantErr)
		}
	}
}

func TestPaths(t *testing.T) {
	tests := []struct {
		chroot, id, topic string
		partition         int32
		wantDir, wantPart string
	}{
		{"", "a", "orders", 0, "/consumers/fanout_a/offsets/orders", "/consumers/fanout_a/offsets/orders/0"},
		{"/fanout", "b", "t.x", 12, "/fanout/consumers/fanout_b/offsets/t.x", "/fanout/consumers/fanout_b/offsets/t.x/12"},
		{"/fanout/", "b", "t", 1, "/fanout/consumers/fanout_b/offsets/t", "/fanout/consumers/fanout_b/offsets/t/1"},
		{"/", "c", "t", 3, "/consumers/fanout_c/offsets/t", "/consumers/fanout_c/offsets/t/3"},
	}
	for _, tt := range tests {
		s := New(nil, tt.chroot, tt.id, tt.topic)
		if s.Path() != tt.wantDir || s.partitionPath(tt.partition) != tt.wantPart {
			t.Errorf("New(%q, %q, %q): %q, %q; want %q, %q",
				tt.chroot, tt.id, tt.topic, s.Path(), s.partitionPath(tt.partition), tt.wantDir, tt.wantPart)
		}
	}
}

func TestParseOffset(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"0", 0, false},
		{"42", 42, false},
		{"9223372036854775807", 9223372036854775807, false},
		{" 7\n", 7, false},
		{"", 0, true},
		{"-1", 0, true},
		{"0x10", 0, true},
		{"12a", 0, true},
		{"9223372036854775808", 0, true},
	}
	for _, tt := range tests {
		got, err := parseOffset([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseOffset(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCommitOps(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	s.known[1] = true
	offs := map[int32]int64{0: 10, 1: 20}
	owner := func(p, v int32) Version { return Version{Path: fmt.Sprintf("/r/owners/%d", p), Version: v} }
	tests := []struct {
		name  string
		fence offsets.Fence
		want  []string
	}{
		{"topic fence", offsets.TopicFence(Version{Path: "/r/fence", Version: 7}),
			[]string{"check /r/fence@7", "create /r/consumers/fanout_i/offsets/t/0=10", "set /r/consumers/fanout_i/offsets/t/1=20"}},
		// A per-partition fence checks exactly the partitions written.
		{"partition fence", offsets.PartitionFence(map[int32]offsets.Condition{0: owner(0, 3), 1: owner(1, 5), 2: owner(2, 9)}),
			[]string{"check /r/owners/0@3", "check /r/owners/1@5", "create /r/consumers/fanout_i/offsets/t/0=10", "set /r/consumers/fanout_i/offsets/t/1=20"}},
		{"shared condition checked once", offsets.PartitionFence(map[int32]offsets.Condition{0: owner(0, 3), 1: owner(0, 3)}),
			[]string{"check /r/owners/0@3", "create /r/consumers/fanout_i/offsets/t/0=10", "set /r/consumers/fanout_i/offsets/t/1=20"}},
	}
	for _, tt := range tests {
		checks, err := versions(tt.fence, []int32{0, 1})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var got []string
		for _, op := range s.commitOps(checkOps(checks), []int32{0, 1}, offs, nil) {
			switch op := op.(type) {
			case *zk.CheckVersionRequest:
				got = append(got, fmt.Sprintf("check %s@%d", op.Path, op.Version))
			case *zk.CreateRequest:
				got = append(got, fmt.Sprintf("create %s=%s", op.Path, op.Data))
			case *zk.SetDataRequest:
				if op.Version != -1 {
					t.Errorf("%s: SetData with version %d, want -1", tt.name, op.Version)
				}
				got = append(got, fmt.Sprintf("set %s=%s", op.Path, op.Data))
			default:
				t.Errorf("%s: unexpected op %T", tt.name, op)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: ops %q, want %q", tt.name, got, tt.want)
		}
	}
}

// Progress goes in the same multi as its offset, in its own tree: created or
// set when there is some, emptied when there was some and is no more, left
// alone when there is none and was none.
func TestCommitOpsWithProgress(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	s.known[0], s.known[1], s.known[2] = true, true, true
	s.progress[1] = progFull  // holds progress
	s.progress[2] = progEmpty // exists, empty
	offs := map[int32]int64{0: 10, 1: 20, 2: 30, 3: 40}
	texts := map[int32]progressTexts{0: {progress: "v1 b=10 a=0+1"}, 3: {progress: "v1 b=40 f=0:1"}}
	var got []string
	for _, op := range s.commitOps(nil, []int32{0, 1, 2, 3}, offs, texts) {
		switch op := op.(type) {
		case *zk.CreateRequest:
			got = append(got, fmt.Sprintf("create %s=%s", op.Path, op.Data))
		case *zk.SetDataRequest:
			got = append(got, fmt.Sprintf("set %s=%s", op.Path, op.Data))
		}
	}
	want := []string{
		"set /r/consumers/fanout_i/offsets/t/0=10", "create /r/consumers/fanout_i/progress/t/0=v1 b=10 a=0+1",
		"set /r/consumers/fanout_i/offsets/t/1=20", "set /r/consumers/fanout_i/progress/t/1=",
		"set /r/consumers/fanout_i/offsets/t/2=30",
		"create /r/consumers/fanout_i/offsets/t/3=40", "create /r/consumers/fanout_i/progress/t/3=v1 b=40 f=0:1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ops\n%q\nwant\n%q", got, want)
	}
}

// A commit that takes znodes writes each at the version read, before the
// partitions, in the same multi.
func TestCommitOpsTaking(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	s.known[0] = true
	takes := []Take{{Path: "/r/fence", Version: 7, Data: []byte(`{"epoch":4}`)}, {Path: "/r/owners/0", Version: 2, Data: []byte("x")}}
	var got []string
	for _, op := range s.commitOps(takeOps(takes), []int32{0}, map[int32]int64{0: 5}, nil) {
		op := op.(*zk.SetDataRequest)
		got = append(got, fmt.Sprintf("set %s@%d=%s", op.Path, op.Version, op.Data))
	}
	want := []string{`set /r/fence@7={"epoch":4}`, "set /r/owners/0@2=x", "set /r/consumers/fanout_i/offsets/t/0@-1=5"}
	if !slices.Equal(got, want) {
		t.Errorf("ops %q, want %q", got, want)
	}
	if err := s.CommitTaking(t.Context(), nil, map[int32]int64{0: 5}); !errors.Is(err, offsets.ErrFenced) {
		t.Errorf("a commit that takes nothing: %v, want ErrFenced", err)
	}
}

// otherCondition is a fence condition of another store.
type otherCondition struct{}

func (otherCondition) String() string { return "other" }

// A commit without a fence, under another store's fence, or writing a
// partition its fence does not cover is refused before ZooKeeper is asked
// (the Store has no connection here).
func TestCommitRefusedWithoutItsFence(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	tests := []struct {
		name  string
		fence offsets.Fence
	}{
		{"no fence", offsets.Fence{}},
		{"another store's fence", offsets.TopicFence(otherCondition{})},
		{"partition not covered", offsets.PartitionFence(map[int32]offsets.Condition{1: Version{Path: "/r/o/1"}})},
	}
	for _, tt := range tests {
		err := s.Commit(context.Background(), tt.fence, map[int32]int64{0: 1})
		if !errors.Is(err, offsets.ErrFenced) {
			t.Errorf("%s: Commit = %v, want ErrFenced", tt.name, err)
		}
	}
}

func TestFailedOp(t *testing.T) {
	unknown := errors.New("zk: unknown error: -2")
	tests := []struct {
		name    string
		resps   []zk.MultiResponse
		err     error
		wantIdx int
		wantErr error
	}{
		{"check failed", []zk.MultiResponse{{Error: zk.ErrBadVersion}, {Error: unknown}}, zk.ErrBadVersion, 0, zk.ErrBadVersion},
		{"second op failed", []zk.MultiResponse{{}, {Error: zk.ErrNodeExists}, {Error: unknown}}, zk.ErrNodeExists, 1, zk.ErrNodeExists},
		{"no responses", nil, zk.ErrConnectionClosed, -1, zk.ErrConnectionClosed},
	}
	for _, tt := range tests {
		idx, err := failedOp(tt.resps, tt.err)
		if idx != tt.wantIdx || !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: failedOp = %d, %v; want %d, %v", tt.name, idx, err, tt.wantIdx, tt.wantErr)
		}
	}
}

// Delays go in the same multi, into a tree of their own beside the
// progress (a daemon that knows no delays reads the progress znode alone):
// created or set when there are some, emptied when there were some and are
// no more, left alone otherwise; each tree as its own znodes are known.
func TestCommitOpsWithDelays(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	s.known[0], s.known[1], s.known[2] = true, true, true
	s.progress[0], s.progress[1], s.progress[2] = progFull, progFull, progEmpty
	s.delays[1] = progFull  // holds delays
	s.delays[2] = progEmpty // exists, empty
	offs := map[int32]int64{0: 10, 1: 20, 2: 30}
	texts := map[int32]progressTexts{0: {"v1 b=10 f=0:1", "d1 b=10 t=1700000000000 d=0:0"}, 1: {progress: "v1 b=20 f=0:1"},
		2: {"v1 b=30 f=0:1", "d1 b=30 t=1700000000000 d=0:0"}}
	var got []string
	for _, op := range s.commitOps(nil, []int32{0, 1, 2}, offs, texts) {
		switch op := op.(type) {
		case *zk.CreateRequest:
			got = append(got, fmt.Sprintf("create %s=%s", op.Path, op.Data))
		case *zk.SetDataRequest:
			got = append(got, fmt.Sprintf("set %s=%s", op.Path, op.Data))
		}
	}
	want := []string{
		"set /r/consumers/fanout_i/offsets/t/0=10", "set /r/consumers/fanout_i/progress/t/0=v1 b=10 f=0:1",
		"create /r/consumers/fanout_i/delays/t/0=d1 b=10 t=1700000000000 d=0:0",
		"set /r/consumers/fanout_i/offsets/t/1=20", "set /r/consumers/fanout_i/progress/t/1=v1 b=20 f=0:1",
		"set /r/consumers/fanout_i/delays/t/1=",
		"set /r/consumers/fanout_i/offsets/t/2=30", "set /r/consumers/fanout_i/progress/t/2=v1 b=30 f=0:1",
		"set /r/consumers/fanout_i/delays/t/2=d1 b=30 t=1700000000000 d=0:0",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ops\n%q\nwant\n%q", got, want)
	}
	if DelaysPath("/r", "i", "t") != "/r/consumers/fanout_i/delays/t" {
		t.Fatalf("DelaysPath = %q", DelaysPath("/r", "i", "t"))
	}
}

// A commit's partitions go in multis of at most maxMultiBytes each (their
// paths, data and per-op overhead, with a check per partition), in order,
// as few as fit; one partition too large for any goes alone.
func TestChunk(t *testing.T) {
	s := New(nil, "/r", "i", "t")
	var parts []int32
	offs := map[int32]int64{}
	texts := map[int32]progressTexts{}
	for p := range int32(1024) {
		parts = append(parts, p)
		offs[p] = 1 << 40
		texts[p] = progressTexts{progress: string(make([]byte, 2000)), delays: string(make([]byte, 900))}
	}
	texts[7] = progressTexts{progress: string(make([]byte, 2*maxMultiBytes))}
	var chunks [][]int32
	for rest := parts; len(rest) > 0; {
		c := s.chunk(rest, offs, texts)
		chunks = append(chunks, c)
		rest = rest[len(c):]
	}
	if got := slices.Concat(chunks...); !slices.Equal(got, parts) {
		t.Fatalf("the chunks hold %d partitions, not the %d in order", len(got), len(parts))
	}
	for i, c := range chunks {
		size := 0
		for _, p := range c {
			for _, w := range s.writeOps(p, offsetData(offs[p]), texts[p]) {
				size += len(w.znode) + len(w.data) + opOverhead
			}
			size += len(s.dir) + opOverhead
		}
		switch {
		case slices.Contains(c, 7):
			if len(c) != 1 {
				t.Errorf("chunk %d holds partition 7, larger than a multi, and %d others", i, len(c)-1)
			}
		case size > maxMultiBytes:
			t.Errorf("chunk %d of %d partitions: %d bytes, more than %d", i, len(c), size, maxMultiBytes)
		case i < len(chunks)-1 && !slices.Contains(chunks[i+1], 7) && size+3500 < maxMultiBytes:
			t.Errorf("chunk %d of %d bytes: the next partition would have fit", i, size)
		}
	}
	if len(chunks) < 5 {
		t.Fatalf("%d chunks for about 3 MB", len(chunks))
	}
}
