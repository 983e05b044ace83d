package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/urfave/cli/v2"
)

// tailTestTimeout bounds every wait of the tail tests for an event: how long
// until a test whose event does not come fails (the machine may be loaded).
const tailTestTimeout = 30 * time.Second

// tailDaemon is a fake daemon for one client: it welcomes it, sends the
// given deliveries and records the acked ids until the client leaves.
type tailDaemon struct {
	addr   string
	acked  chan []uint64         // every acked id, sent when the client has gone
	nacked chan []*protocol.Nack // every nack, sent when the client has gone
	hello  chan *protocol.Hello
}

func startTailDaemon(t *testing.T, deliveries ...*protocol.Deliver) *tailDaemon {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startTailDaemonOn(t, ln, deliveries...)
}

// startTailDaemonOn is startTailDaemon on ln (a TLS listener, say).
func startTailDaemonOn(t *testing.T, ln net.Listener, deliveries ...*protocol.Deliver) *tailDaemon {
	t.Helper()
	t.Cleanup(func() { _ = ln.Close() })
	d := &tailDaemon{addr: ln.Addr().String(), acked: make(chan []uint64, 1), nacked: make(chan []*protocol.Nack, 1),
		hello: make(chan *protocol.Hello, 1)}
	go func() {
		var acked []uint64
		var nacked []*protocol.Nack
		defer func() { d.acked <- acked; d.nacked <- nacked }()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(tailTestTimeout))
		r, w := protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0)
		var f protocol.Frame
		if err := r.ReadFrame(&f); err != nil || f.GetHello() == nil {
			return
		}
		d.hello <- f.GetHello()
		_ = w.WriteFrame(protocol.WelcomeFrame(&protocol.Welcome{
			NodeId: "fake", ProtocolVersion: protocol.Version, MaxInFlight: 64,
			HeartbeatMs: 10000, LivenessIntervals: 3, Observer: f.GetHello().GetObserver(),
		}))
		for _, dv := range deliveries {
			_ = w.WriteFrame(protocol.DeliverFrame(dv))
		}
		if w.Flush() != nil {
			return
		}
		for r.ReadFrame(&f) == nil && f.GetGoodbye() == nil {
			acked = append(acked, f.GetAck().GetDeliveryIds()...)
			if n := f.GetNack(); n != nil {
				nacked = append(nacked, n)
			}
		}
	}()
	return d
}

// ackedIDs waits for the client to leave and returns the ids it acked.
func (d *tailDaemon) ackedIDs(t *testing.T) []uint64 {
	t.Helper()
	select {
	case ids := <-d.acked:
		slices.Sort(ids)
		return ids
	case <-time.After(tailTestTimeout):
		t.Fatal("the client did not leave")
		return nil
	}
}

func deliveries(values ...string) []*protocol.Deliver {
	var ds []*protocol.Deliver
	for i, v := range values {
		ds = append(ds, &protocol.Deliver{DeliveryId: uint64(i + 1), Partition: 2, Offset: int64(10 + i),
			Value: []byte(v), Attempt: 1, TimestampMs: 1700000000000})
	}
	return ds
}

// runTail runs the tail command with args and returns its output.
func runTailCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Name: "fanout", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{tailCommand()}}
	ctx, cancel := context.WithTimeout(context.Background(), tailTestTimeout)
	defer cancel()
	err := runCLI(ctx, app, append([]string{"fanout", "tail"}, args...))
	return out.String(), err
}

func TestTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		values    []string
		args      []string
		want      string
		wantAcked []uint64
	}{
		{"count", []string{"a", "b", "c"}, []string{"--count", "2"}, "a\nb\n", []uint64{1, 2}},
		{"meta", []string{"a"}, []string{"--count", "1", "--meta"}, "2/10 1 a\n", []uint64{1}},
		{"no-ack", []string{"a", "b"}, []string{"--count", "2", "--no-ack"}, "a\nb\n", nil},
		{"json", []string{"text", "\xff\x00"}, []string{"--count", "2", "--json"},
			`{"partition":2,"offset":10,"key":null,"value":"text","attempt":1,"timestamp":"2023-11-14T22:13:20Z"}` + "\n" +
				`{"partition":2,"offset":11,"key":null,"value_b64":"/wA=","attempt":1,"timestamp":"2023-11-14T22:13:20Z"}` + "\n",
			[]uint64{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startTailDaemon(t, deliveries(tt.values...)...)
			out, err := runTailCommand(t, append([]string{"--connect", d.addr}, tt.args...)...)
			if err != nil {
				t.Fatalf("tail: %v", err)
			}
			if out != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", out, tt.want)
			}
			if got := d.ackedIDs(t); !slices.Equal(got, tt.wantAcked) {
				t.Errorf("acked %v, want %v", got, tt.wantAcked)
			}
		})
	}
}

func TestTailJSONIsValid(t *testing.T) {
	t.Parallel()
	d := startTailDaemon(t, &protocol.Deliver{DeliveryId: 1, Key: []byte("\xfe"), Value: []byte(`{"x":"<y>"}`)})
	out, err := runTailCommand(t, "--connect", d.addr, "--count", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if rec["key_b64"] != "/g==" || rec["value"] != `{"x":"<y>"}` || rec["key"] != nil {
		t.Errorf("record = %v", rec)
	}
}

// TestTailJSONKeys: a record without a key prints "key": null, an empty key
// "", a text key as text (HTML characters as they are), a binary one as
// key_b64.
func TestTailJSONKeys(t *testing.T) {
	t.Parallel()
	ds := deliveries("a", "b", "c", "d")
	ds[1].Key, ds[2].Key, ds[3].Key = []byte{}, []byte("<k&>"), []byte{0xff}
	d := startTailDaemon(t, ds...)
	out, err := runTailCommand(t, "--connect", d.addr, "--count", "4", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		k, ok := rec["key"]
		if !ok {
			k = json.RawMessage("absent")
		}
		keys = append(keys, fmt.Sprintf("%s %s", k, rec["key_b64"]))
	}
	if want := []string{"null ", `"" `, `"<k&>" `, `absent "/w=="`}; !slices.Equal(keys, want) {
		t.Errorf("keys %q, want %q", keys, want)
	}
}

func TestTailUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	// tail gives up by its own --timeout: its error carries that deadline,
	// while the test's context is only ever cancelled (a tail that waited
	// for it would return nil, as when interrupted).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := &cli.App{Name: "fanout", Writer: io.Discard, ErrWriter: io.Discard, Commands: []*cli.Command{tailCommand()}}
	done := make(chan error, 1)
	go func() {
		done <- runCLI(ctx, app, []string{"fanout", "tail", "--connect", addr, "--timeout", "300ms"})
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("tail has not given up a minute after its --timeout 300ms (returned %v once interrupted)", <-done)
	}
	if err == nil {
		t.Fatal("tail succeeded with nothing listening")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %q: want tail's own deadline (--timeout) exceeded", err)
	}
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "cannot connect") ||
		!strings.Contains(err.Error(), "within 300ms") {
		t.Errorf("error %q does not say what failed", err)
	}
}

// TestTailHTTPServer: tail pointed at an HTTP server (a daemon's metrics
// and console port) says so at once, not that a frame is too large.
func TestTailHTTPServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), tailTestTimeout)
	defer cancel()
	if code := run(ctx, []string{"fanout", "tail", "--connect", addr}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	want := "fanout: tail: --connect " + addr + ": this is an HTTP server (the metrics and console port?), not a fanout client port\n"
	if got := stderr.String(); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// A message larger than tail accepts (a daemon that ignores Hello's
// max_frame_size sent it) ends tail with a clear error, not a reconnect loop.
func TestTailFrameTooLarge(t *testing.T) {
	d := startTailDaemon(t, &protocol.Deliver{DeliveryId: 1, Value: make([]byte, 10<<10)})
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), tailTestTimeout)
	defer cancel()
	code := run(ctx, []string{"fanout", "tail", "--connect", d.addr, "--max-frame-size", "8192"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	if msg := stderr.String(); !strings.Contains(msg, "--max-frame-size 8192") || !strings.Contains(msg, "larger --max-frame-size") {
		t.Errorf("stderr %q does not say what to do", msg)
	}
	if code := run(ctx, []string{"fanout", "tail", "--connect", d.addr, "--max-frame-size", "100"}, &stdout, &stderr); code != 2 {
		t.Errorf("--max-frame-size 100: exit code %d, want 2", code)
	}
}

// --no-ack --nack-delay gives each printed message back with the delay;
// --weight and --observe go in the Hello (an observer's copies are not
// acked).
func TestTailPolicies(t *testing.T) {
	d := startTailDaemon(t, deliveries("a", "b")...)
	if _, err := runTailCommand(t, "--connect", d.addr, "--count", "2", "--no-ack", "--nack-delay", "1500ms"); err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	_ = d.ackedIDs(t)
	for _, n := range <-d.nacked {
		if n.GetDelayMs() != 1500 {
			t.Fatalf("nack %v: want delay_ms 1500", n)
		}
		ids = append(ids, n.GetDeliveryIds()...)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 2}) {
		t.Fatalf("nacked %v, want 1 and 2", ids)
	}

	d = startTailDaemon(t, deliveries("a")...)
	if _, err := runTailCommand(t, "--connect", d.addr, "--count", "1", "--weight", "5"); err != nil {
		t.Fatal(err)
	}
	if h := <-d.hello; h.GetWeight() != 5 || h.GetObserver() {
		t.Fatalf("hello %v: want weight 5", h)
	}

	obs := &protocol.Deliver{Partition: 2, Offset: 10, Value: []byte("seen"), Attempt: 1}
	d = startTailDaemon(t, obs)
	out, err := runTailCommand(t, "--connect", d.addr, "--count", "1", "--observe")
	if err != nil || out != "seen\n" {
		t.Fatalf("tail --observe: %q, %v", out, err)
	}
	if h := <-d.hello; !h.GetObserver() {
		t.Fatalf("hello %v: want an observer", h)
	}
	if acked := d.ackedIDs(t); len(acked) != 0 {
		t.Fatalf("an observer acked %v", acked)
	}

	for _, args := range [][]string{{"--nack-delay", "1s"}, {"--observe", "--weight", "5"}, {"--weight", "-1"},
		{"--no-ack", "--nack-delay", "1h"}} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"fanout", "tail", "--connect", "127.0.0.1:1"}, args...), &stdout, &stderr); code != 2 {
			t.Errorf("tail %v: exit code %d, want 2 (usage); stderr %q", args, code, stderr.String())
		}
	}
}

// tailMember is a fake member of a spread-mode cluster: every session gets
// a Welcome listing the members; a session that asks for credit (the
// client's share) gets the deliveries, others nothing. It records what
// those sessions ack.
type tailMember struct {
	ln    net.Listener
	acked chan uint64
}

func startTailMember(t *testing.T) *tailMember {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &tailMember{ln: ln, acked: make(chan uint64, 100)}
}

func (m *tailMember) addr() string { return m.ln.Addr().String() }

// serve accepts sessions until the listener closes.
func (m *tailMember) serve(members []string, credit uint32, ds ...*protocol.Deliver) {
	go func() {
		for {
			nc, err := m.ln.Accept()
			if err != nil {
				return
			}
			go m.session(nc, members, credit, ds)
		}
	}()
}

func (m *tailMember) session(nc net.Conn, members []string, credit uint32, ds []*protocol.Deliver) {
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(tailTestTimeout))
	r, w := protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0)
	var f protocol.Frame
	if err := r.ReadFrame(&f); err != nil || f.GetHello() == nil {
		return
	}
	deliver := f.GetHello().GetMaxInFlight() == credit
	_ = w.WriteFrame(protocol.WelcomeFrame(&protocol.Welcome{
		NodeId: "fake", ProtocolVersion: protocol.Version, MaxInFlight: f.GetHello().GetMaxInFlight(),
		HeartbeatMs: 10000, LivenessIntervals: 3, Members: protocol.MemberList(members),
	}))
	for _, dv := range ds {
		if deliver {
			_ = w.WriteFrame(protocol.DeliverFrame(dv))
		}
	}
	if w.Flush() != nil {
		return
	}
	for r.ReadFrame(&f) == nil && f.GetGoodbye() == nil {
		for _, id := range f.GetAck().GetDeliveryIds() {
			m.acked <- id
		}
	}
}

// Given one member's address, tail prints and acks the messages of every
// member of a spread-mode cluster.
func TestTailSpread(t *testing.T) {
	t.Parallel()
	a, b := startTailMember(t), startTailMember(t)
	members := []string{a.addr(), b.addr()}
	slices.Sort(members)
	a.serve(members, 4, deliveries("a1", "a2")...)
	b.serve(members, 4, deliveries("b1", "b2")...)
	out, err := runTailCommand(t, "--connect", a.addr(), "--max-in-flight", "8", "--count", "4")
	if err != nil {
		t.Fatalf("tail: %v", err)
	}
	lines := strings.Fields(out)
	slices.Sort(lines)
	if want := []string{"a1", "a2", "b1", "b2"}; !slices.Equal(lines, want) {
		t.Errorf("printed %q, want %q", lines, want)
	}
	for name, m := range map[string]*tailMember{"a": a, "b": b} {
		var ids []uint64
		for len(ids) < 2 {
			select {
			case id := <-m.acked:
				ids = append(ids, id)
			case <-time.After(tailTestTimeout):
				t.Fatalf("member %s: acked %v, want both", name, ids)
			}
		}
		if slices.Sort(ids); !slices.Equal(ids, []uint64{1, 2}) {
			t.Errorf("member %s acked %v, want [1 2]", name, ids)
		}
	}
}
