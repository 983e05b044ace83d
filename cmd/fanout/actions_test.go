package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
)

const actionToken = "act10n-t0ken"

// fakeDaemon is a metrics listener as a daemon serves it (the metrics
// handler, the console and its actions) over a pause and clients of its
// own.
type fakeDaemon struct {
	srv *httptest.Server

	mu      sync.Mutex
	node    string
	pause   *status.Pause
	members []string          // node ids; each takes a pause once the status is read laggard+1 times
	laggard map[string]bool   // members that never take it
	reads   int               // status documents served since the last pause
	clients []status.Client   // connected clients
	asked   []string          // who asked each action
	drained map[string]string // client name: who drained it
}

// newFakeDaemon serves a daemon named node with token ("" for none).
func newFakeDaemon(t *testing.T, node, token string, members ...string) *fakeDaemon {
	t.Helper()
	f := &fakeDaemon{node: node, members: members, laggard: map[string]bool{}, drained: map[string]string{}}
	h := metrics.Handler(metrics.HandlerConfig{
		Collector: metrics.NewCollector(func(context.Context) metrics.Snapshot { return metrics.Snapshot{} }),
		Snapshot:  func(context.Context) metrics.Snapshot { return metrics.Snapshot{} },
		Token:     token,
		Console:   console.Handler(console.Config{Status: f.status}),
		Actions:   console.Actions(console.ActionsConfig{Pause: f.setPause, DrainClient: f.drain}),
	})
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

// state returns the pause and who asked each action so far.
func (f *fakeDaemon) state() (*status.Pause, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pause, append([]string(nil), f.asked...)
}

// drainedBy returns who drained the client named name.
func (f *fakeDaemon) drainedBy(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained[name]
}

func (f *fakeDaemon) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeDaemon) setPause(_ context.Context, paused bool, by string) (*status.Pause, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := uint64(1)
	if f.pause != nil {
		v = f.pause.Version + 1
	}
	f.pause = &status.Pause{Paused: paused, Version: v, Node: f.node, By: by, At: time.Now()}
	f.asked, f.reads = append(f.asked, by), 0
	return f.pause, nil
}

func (f *fakeDaemon) drain(_ context.Context, id uint64, name, by string) ([]status.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []status.Client
	for _, c := range f.clients {
		if c.ID == id || id == 0 && c.Name == name {
			c.Draining = true
			out = append(out, c)
			f.drained[c.Name] = by
		}
	}
	f.asked = append(f.asked, by)
	return out, nil
}

// status is the document: the members take the pause one read after
// another, but the laggards.
func (f *fakeDaemon) status(context.Context) *status.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	st := &status.Status{ID: "svc", Topic: "t", Pause: f.pause, Node: &status.Node{NodeID: f.node}}
	for i, m := range f.members {
		sm := status.Member{NodeID: m}
		if f.pause != nil && f.reads > i && !f.laggard[m] {
			sm.Pause = f.pause
		}
		st.Members = append(st.Members, sm)
	}
	return st
}

// runAction runs fanout with args and returns its exit code and output.
func runAction(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, out, errOut := runApp(context.Background(), t, nil, args...)
	return code, out + errOut
}

// pause and resume ask the first daemon that answers, with the token and
// who asks, then wait until every member says it took it.
func TestPauseAndResumeCommands(t *testing.T) {
	t.Parallel()
	d := newFakeDaemon(t, "node-b", actionToken, "node-a", "node-b", "node-c")
	tokenFile := writeSecret(t, actionToken+"\n")
	down := "127.0.0.1:1"
	code, out := runAction(t, "pause", "--metrics-addr", down+","+d.addr(), "--metrics-token-file", tokenFile, "--by", "alice")
	if code != 0 || !strings.Contains(out, "deliveries paused by alice from 127.0.0.1:") ||
		!strings.Contains(out, "(asked of node-b, version 1)") || !strings.Contains(out, "every member has it: node-a, node-b, node-c") {
		t.Fatalf("pause: exit %d, output %q", code, out)
	}
	code, out = runAction(t, "resume", "--metrics-addr", "http://"+d.addr()+"/", "--metrics-token-file", tokenFile, "--wait", "0")
	if code != 0 || !strings.Contains(out, "deliveries resumed by ") || strings.Contains(out, "every member") {
		t.Fatalf("resume: exit %d, output %q", code, out)
	}
	if p, asked := d.state(); p.Paused || p.Version != 2 || !strings.Contains(asked[1], "@") {
		t.Errorf("the daemon's pause %+v, asked by %q (want user@host by default)", p, asked)
	}

	d.mu.Lock()
	d.laggard["node-c"] = true
	d.mu.Unlock()
	code, out = runAction(t, "pause", "--metrics-addr", d.addr(), "--metrics-token-file", tokenFile, "--wait", "1s")
	if code != 1 || !strings.Contains(out, "members node-c have not said they took it within 1s") {
		t.Fatalf("pause with a member that does not take it: exit %d, output %q", code, out)
	}
}

// The actions need the metrics token: none given is a usage error, a wrong
// one is refused, and a daemon without one takes no action.
func TestActionCommandsNeedTheToken(t *testing.T) {
	t.Parallel()
	d := newFakeDaemon(t, "node-a", actionToken)
	open := newFakeDaemon(t, "node-o", "")
	good, wrong := writeSecret(t, actionToken), writeSecret(t, "nope")
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"no token", []string{"pause", "--metrics-addr", d.addr()}, 2, "actions need the metrics token"},
		{"a wrong token", []string{"pause", "--metrics-addr", d.addr(), "--metrics-token-file", wrong}, 1, "refused the metrics token"},
		{"a daemon without a token", []string{"drain-client", "--metrics-addr", open.addr(), "--metrics-token-file", good, "w1"}, 1,
			"takes no action: actions need the metrics token, and this daemon has none"},
		{"nobody answers", []string{"pause", "--metrics-addr", "127.0.0.1:1", "--metrics-token-file", good}, 1, "no daemon took it"},
		{"a bad address", []string{"pause", "--metrics-addr", "ftp://x", "--metrics-token-file", good}, 2, "want host:port or http(s)://host:port"},
		{"an argument", []string{"pause", "now", "--metrics-token-file", good}, 2, `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runAction(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Fatalf("exit %d, output %q; want %d with %q", code, out, tc.code, tc.out)
			}
		})
	}
	if p, _ := d.state(); p != nil {
		t.Errorf("an action was taken: %+v", p)
	}
	if p, asked := open.state(); p != nil || len(asked) != 0 {
		t.Errorf("the daemon without a token acted: %+v, %q", p, asked)
	}
}

// drain-client asks every daemon given; one that has no such client says
// so; none that has is a failure.
func TestDrainClientCommand(t *testing.T) {
	t.Parallel()
	a, b := newFakeDaemon(t, "node-a", actionToken), newFakeDaemon(t, "node-b", actionToken)
	b.clients = []status.Client{{ID: 7, Name: "w1", Addr: "10.0.0.9:4000", InFlight: 3}, {ID: 8, Name: "w2"}}
	tokenFile := writeSecret(t, actionToken)
	addrs := a.addr() + "," + b.addr()
	code, out := runAction(t, "drain-client", "--metrics-addr", addrs, "--metrics-token-file", tokenFile, "--by", "ops", "w1")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("http://%s: no client named \"w1\" is connected to this daemon", a.addr())) ||
		!strings.Contains(out, "draining w1 (session 7, 10.0.0.9:4000, holding 3)") {
		t.Fatalf("drain-client: exit %d, output %q", code, out)
	}
	if by := b.drainedBy("w1"); !strings.HasPrefix(by, "ops from 127.0.0.1:") {
		t.Errorf("w1 drained by %q", by)
	}
	code, out = runAction(t, "drain-client", "--session", "8", "--metrics-addr", b.addr(), "--metrics-token-file", tokenFile)
	if code != 0 || !strings.Contains(out, "draining w2 (session 8") {
		t.Fatalf("drain-client --session: exit %d, output %q", code, out)
	}
	code, out = runAction(t, "drain-client", "--metrics-addr", addrs, "--metrics-token-file", tokenFile, "ghost")
	if code != 1 || !strings.Contains(out, "no daemon had such a client") {
		t.Fatalf("drain-client of nobody: exit %d, output %q", code, out)
	}
	if code, out := runAction(t, "drain-client", "--metrics-token-file", tokenFile, "w1", "--help"); code != 0 || !strings.Contains(out, "fanout drain-client - end a client's sessions") {
		t.Errorf("drain-client NAME --help: exit %d, output %q; want the help", code, out)
	}
	for _, args := range [][]string{{}, {"--session", "3", "w1"}, {"w1", "w2"}, {"w1", "--by", "x"}} {
		if code, out := runAction(t, append([]string{"drain-client", "--metrics-token-file", tokenFile}, args...)...); code != 2 {
			t.Errorf("%q: exit %d, output %q; want a usage error", args, code, out)
		}
	}
}
