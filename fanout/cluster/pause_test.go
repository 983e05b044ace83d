package cluster

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The pause of the highest version wins; of two of one version, the one
// asked of the member with the higher node id.
func TestPauseOrder(t *testing.T) {
	t.Parallel()
	p := func(v uint64, node string) Pause { return Pause{Version: v, Action: Action{NodeID: node}} }
	for _, tc := range []struct {
		p, q Pause
		want bool
	}{
		{p(2, "a"), p(1, "z"), true},
		{p(1, "z"), p(2, "a"), false},
		{p(3, "b"), p(3, "a"), true},
		{p(3, "a"), p(3, "b"), false},
		{p(3, "a"), p(3, "a"), false},
		{p(1, "a"), Pause{}, true},
	} {
		if got := tc.p.after(tc.q); got != tc.want {
			t.Errorf("%+v after %+v = %v, want %v", tc.p, tc.q, got, tc.want)
		}
	}
}

// An operator's text is kept without control characters, at most
// maxActionField bytes of whole runes; a heartbeat whose pause has a longer
// field is not taken.
func TestActionFieldsBounded(t *testing.T) {
	t.Parallel()
	if got := Cut("ops\n\x1b[31mroot"); got != "ops[31mroot" {
		t.Errorf("Cut kept control characters: %q", got)
	}
	long := strings.Repeat("é", maxActionField) // 2 bytes each
	if got := Cut(long); len(got) > maxActionField || !utf8.ValidString(got) || len(got) < maxActionField-1 {
		t.Errorf("Cut of %d bytes: %d bytes, valid %v", len(long), len(got), utf8.ValidString(got))
	}
	hb := &Heartbeat{Pause: &DeliveryPause{Version: 3, Paused: true, Action: &OperatorAction{Kind: ActionPause, By: long}}}
	if _, ok := PauseOf(hb); ok {
		t.Error("PauseOf took a pause whose author is longer than a member writes")
	}
	hb.Pause.Action.By = "ops"
	if p, ok := PauseOf(hb); !ok || p.Version != 3 || !p.Paused || p.Action.By != "ops" {
		t.Errorf("PauseOf = %+v, %v", p, ok)
	}
	if _, ok := PauseOf(&Heartbeat{Pause: &DeliveryPause{}}); ok {
		t.Error("PauseOf took a pause of version 0")
	}
}

// pauses records what OnPause is told.
type pauses struct {
	mu  sync.Mutex
	got []Pause
}

func (p *pauses) on(q Pause) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, q)
}

func (p *pauses) last() Pause {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return Pause{}
	}
	return p.got[len(p.got)-1]
}

// A pause asked of a follower reaches every member through the heartbeats
// and survives the leader's crash: the new leader is paused too. A resume
// asked of the new leader reaches the others. With --cluster-secret a
// forged heartbeat changes nothing, whatever its version.
func TestElectorPauseReachesEveryMemberAndOutlivesTheLeader(t *testing.T) {
	t.Parallel()
	c := newKafka(t)
	fence := &memFence{}
	told := map[string]*pauses{}
	var all []*node
	for _, id := range []string{"a", "b", "c"} {
		told[id] = &pauses{}
		all = append(all, startNodeWith(t, c, fence, "pause", id, func(cfg *Config) {
			cfg.OnPause, cfg.Secret = told[id].on, []byte("a secret of sixteen bytes or more")
		}))
	}
	a, b, cc := all[0], all[1], all[2]
	testutil.WaitFor(t, 10*time.Second, "c to lead", func() bool { return len(leaders(cc)) == 1 && a.e.Leadership().LeaderID == "c" })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := a.e.SetPaused(ctx, true, "ops (127.0.0.1:5000)")
	if err != nil || p.Version != 1 || !p.Paused || p.Action.NodeID != "a" || p.Action.Kind != ActionPause || p.Action.By != "ops (127.0.0.1:5000)" {
		t.Fatalf("SetPaused = %+v, %v", p, err)
	}
	if got := told["a"].last(); got != p {
		t.Errorf("a's OnPause was told %+v before SetPaused returned, want %+v", got, p)
	}
	samePause := func(want Pause, nodes ...*node) func() bool {
		return func() bool {
			for _, n := range nodes {
				if n.e.Pause() != want || told[n.e.cfg.NodeID].last() != want {
					return false
				}
			}
			return true
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every member paused by a", samePause(p, all...))

	cc.stop()
	testutil.WaitFor(t, 10*time.Second, "b to lead after c's crash", func() bool { return b.e.Leadership().Leader })
	if got := b.e.Pause(); got != p {
		t.Fatalf("the new leader's pause %+v, want %+v", got, p)
	}

	// A forged record, without the MAC.
	produceHeartbeat(t, c, "pause", &Heartbeat{NodeId: "zz-forged", Addr: "evil:1", Seq: 1, Seen: 0,
		Pause: &DeliveryPause{Version: 1000, Paused: false, Action: &OperatorAction{Kind: ActionResume, NodeId: "zz-forged"}}})
	testutil.WaitFor(t, 10*time.Second, "b to ignore the forged record", func() bool { return b.e.Unauthenticated() > 0 })
	if got := b.e.Pause(); got != p {
		t.Fatalf("b's pause %+v after a forged record, want %+v", got, p)
	}

	r, err := b.e.SetPaused(ctx, false, "ops")
	if err != nil || r.Version != 2 || r.Paused || r.Action.NodeID != "b" {
		t.Fatalf("resume asked of b = %+v, %v", r, err)
	}
	testutil.WaitFor(t, 10*time.Second, "a and b resumed by b", samePause(r, a, b))
}

// SetPaused of an election that does not run fails at once.
func TestSetPausedNotRunning(t *testing.T) {
	t.Parallel()
	e := newElector(Config{NodeID: "a"}.withDefaults(), nil)
	if _, err := e.SetPaused(context.Background(), true, "ops"); err != ErrNotRunning {
		t.Fatalf("SetPaused = %v, want ErrNotRunning", err)
	}
}
