package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		change  func(*Config)
		backend dispatch.Backend
		wantErr string
	}{
		{name: "valid", change: func(*Config) {}},
		{name: "nil backend", change: func(*Config) {}, backend: nilBackend{}, wantErr: "nil backend"},
		{name: "no listen", change: func(c *Config) { c.Listen = "" }, wantErr: "Listen"},
		{name: "no node id", change: func(c *Config) { c.NodeID = "" }, wantErr: "NodeID"},
		{name: "no topic", change: func(c *Config) { c.Topic = "" }, wantErr: "Topic"},
		{name: "no max in flight", change: func(c *Config) { c.MaxInFlight = 0 }, wantErr: "MaxInFlight"},
		{name: "no ack timeout", change: func(c *Config) { c.AckTimeout = 0 }, wantErr: "AckTimeout"},
		{name: "negative heartbeat", change: func(c *Config) { c.Heartbeat = -time.Second }, wantErr: "Heartbeat"},
		{name: "negative liveness", change: func(c *Config) { c.Liveness = -1 }, wantErr: "Liveness"},
		{name: "negative write timeout", change: func(c *Config) { c.WriteTimeout = -1 }, wantErr: "WriteTimeout"},
		{name: "negative max clients", change: func(c *Config) { c.MaxClients = -1 }, wantErr: "MaxClients"},
		{name: "negative max frame size", change: func(c *Config) { c.MaxFrameSize = -1 }, wantErr: "MaxFrameSize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(tt.change)
			var b dispatch.Backend = newFakeBackend()
			if _, ok := tt.backend.(nilBackend); ok {
				b = nil
			}
			s, err := New(cfg, b)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if s.cfg.Heartbeat != cfg.Heartbeat || s.cfg.Liveness != DefaultLiveness ||
					s.cfg.WriteTimeout != DefaultWriteTimeout || s.cfg.HelloTimeout != DefaultHelloTimeout {
					t.Errorf("defaults not applied: %+v", s.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New: error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// nilBackend marks the table case that passes a nil Backend.
type nilBackend struct{ dispatch.Backend }

func TestWelcome(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	w := c.hello(&protocol.Hello{ClientId: "worker-7", ProtocolVersion: 1, MaxInFlight: 10})
	want := &protocol.Welcome{
		NodeId:            "node-1",
		SessionId:         w.GetSessionId(),
		ProtocolVersion:   1,
		MaxInFlight:       10,
		AckTimeoutMs:      30000,
		HeartbeatMs:       uint32(time.Hour / time.Millisecond),
		LivenessIntervals: 2,
		MaxFrameSize:      1 << 20,
		Topic:             "orders",
	}
	if w.GetSessionId() == 0 || w.String() != want.String() {
		t.Fatalf("Welcome %v, want %v", w, want)
	}
	j := s.b.waitCall(t, "join", w.GetSessionId())
	if j.name != "worker-7" || j.max != 10 {
		t.Fatalf("Join(%d, %q, %d), want name worker-7 and max 10", j.id, j.name, j.max)
	}
	if n := s.Clients(); n != 1 {
		t.Fatalf("Clients() = %d, want 1", n)
	}
}

func TestMaxInFlightCapped(t *testing.T) {
	t.Parallel()
	s := startServer(t) // MaxInFlight 100
	for _, tt := range []struct {
		asked uint32
		want  int
	}{{0, 100}, {10000, 100}, {100, 100}, {5, 5}} {
		c := dial(t, s)
		w := c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: 1, MaxInFlight: tt.asked})
		if got := int(w.GetMaxInFlight()); got != tt.want {
			t.Errorf("hello max_in_flight %d: Welcome.max_in_flight = %d, want %d", tt.asked, got, tt.want)
		}
		if j := s.b.waitCall(t, "join", w.GetSessionId()); j.max != tt.want {
			t.Errorf("hello max_in_flight %d: Join maxInFlight = %d, want %d", tt.asked, j.max, tt.want)
		}
	}
}

func TestDeliveriesArriveWithAllFields(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	sink := s.b.sink(t, id)
	var ds []dispatch.Delivery
	for i := range 50 {
		ds = append(ds, dispatch.Delivery{ID: uint64(1000 + i), Attempt: uint32(1 + i%3), Msg: testMessage(int32(i%4), int64(i), 100+i)})
	}
	want := append([]dispatch.Delivery(nil), ds...)
	sink.Send(ds[:10])
	sink.Send(ds[10:])
	for _, d := range want {
		c.expectDeliver(d)
	}
}

func TestWelcomeBeforeDeliveries(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	// A backend that sends from inside Join, the earliest moment possible.
	s.b.mu.Lock()
	s.b.onJoin = func(sink dispatch.ClientSink) {
		sink.Send([]dispatch.Delivery{{ID: 1, Attempt: 1, Msg: testMessage(0, 1, 10)}})
	}
	s.b.mu.Unlock()
	c := dial(t, s)
	c.hello(nil) // fails unless the Welcome comes first
	c.expectDeliver(dispatch.Delivery{ID: 1, Attempt: 1, Msg: testMessage(0, 1, 10)})
}

// countConn counts the writes to a net.Conn.
type countConn struct {
	net.Conn
	mu     chan struct{}
	writes int
}

func (c *countConn) Write(p []byte) (int, error) {
	c.mu <- struct{}{}
	c.writes++
	<-c.mu
	return c.Conn.Write(p)
}

func (c *countConn) count() int {
	c.mu <- struct{}{}
	defer func() { <-c.mu }()
	return c.writes
}

func TestManyDeliveriesOneFlush(t *testing.T) {
	t.Parallel()
	b := newFakeBackend()
	s, err := New(testConfig(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv, cli := net.Pipe()
	defer cli.Close()
	cc := &countConn{Conn: srv, mu: make(chan struct{}, 1)}
	s.serveConn(cc)
	c := &client{t: t, nc: cli, r: protocol.NewReader(cli, 0), w: protocol.NewWriter(cli, 0)}
	w := c.hello(nil)
	sink := b.sink(t, w.GetSessionId())
	before := cc.count()
	var ds []dispatch.Delivery
	for i := range 40 {
		ds = append(ds, dispatch.Delivery{ID: uint64(i + 1), Attempt: 1, Msg: testMessage(0, int64(i), 512)})
	}
	sink.Send(ds)
	for i := range 40 {
		c.expectDeliver(dispatch.Delivery{ID: uint64(i + 1), Attempt: 1, Msg: testMessage(0, int64(i), 512)})
	}
	if n := cc.count() - before; n != 1 {
		t.Fatalf("40 deliveries of ~600 bytes took %d writes, want 1", n)
	}
}

func TestAckNackTouchReachBackend(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	tests := []struct {
		op    string
		frame func([]uint64) *protocol.Frame
	}{
		{"ack", protocol.AckFrame},
		{"nack", protocol.NackFrame},
		{"touch", protocol.TouchFrame},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			// The empty list first: it must be dropped, not forwarded.
			c.send(tt.frame(nil), tt.frame([]uint64{7, 1 << 40, 9}))
			got := s.b.waitCall(t, tt.op, id)
			if len(s.b.find(tt.op, id)) != 1 || !equalIDs(got.ids, []uint64{7, 1 << 40, 9}) {
				t.Fatalf("%s calls %v, want one with ids [7 %d 9]", tt.op, s.b.find(tt.op, id), uint64(1<<40))
			}
		})
	}
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestClientPingAnsweredWithPong(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, _ := connect(t, s)
	for _, nonce := range []uint64{42, 1 << 60} {
		c.send(protocol.PingFrame(nonce))
		f := c.expect()
		if f.GetPong() == nil || f.GetPong().GetNonce() != nonce {
			t.Fatalf("got %v, want Pong %d", f, nonce)
		}
	}
}

func TestServerPingsAtHeartbeat(t *testing.T) {
	// Not parallel: its client must answer pings within a few 40 ms heartbeats of real time.
	const hb = 40 * time.Millisecond
	s := startServer(t, func(c *Config) { c.Heartbeat = hb })
	c, id := connect(t, s)
	c.keepPings = true
	start := time.Now()
	var last uint64
	for range 4 {
		f := c.expect()
		if f.GetPing() == nil || f.GetPing().GetNonce() <= last {
			t.Fatalf("got %v, want a Ping with nonce above %d", f, last)
		}
		last = f.GetPing().GetNonce()
		c.send(protocol.PongFrame(last))
	}
	if el := time.Since(start); el < 3*hb {
		t.Fatalf("4 pings in %v, want them %v apart", el, hb)
	}
	if ls := s.b.find("leave", id); len(ls) != 0 {
		t.Fatalf("a client answering pings left: %v", ls)
	}
}

func TestSilentClientDropped(t *testing.T) {
	// Not parallel: its live client must answer pings within a few 50 ms heartbeats of real time.
	const hb = 50 * time.Millisecond
	s := startServer(t, func(c *Config) { c.Heartbeat = hb; c.Liveness = 3 })
	start := time.Now() // before the silent client's last frame, its hello
	silent, silentID := connect(t, s)
	alive, aliveID := connect(t, s)
	alive.keepPings = true
	// The live client answers pings until the silent one is dropped.
	for len(s.b.find("leave", silentID)) == 0 {
		f := alive.expect()
		if p := f.GetPing(); p != nil {
			alive.send(protocol.PongFrame(p.GetNonce()))
		}
		if time.Since(start) > testTimeout {
			t.Fatal("silent client not dropped")
		}
	}
	if el := time.Since(start); el < 3*hb {
		t.Fatalf("silent client dropped after %v, before the liveness window of %v", el, 3*hb)
	}
	if l := s.b.waitCall(t, "leave", silentID); l.reason != dispatch.LeaveDead {
		t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveDead)
	}
	silent.expectClosed()
	if ls := s.b.find("leave", aliveID); len(ls) != 0 {
		t.Fatalf("the live client left: %v", ls)
	}
}

func TestSlowConsumerDropped(t *testing.T) {
	// Not parallel: its fast client must keep reading within the 200 ms write timeout of real time.
	s := startServer(t, func(c *Config) { c.WriteTimeout = 200 * time.Millisecond })
	slow, slowID := connect(t, s)
	if err := slow.nc.(*net.TCPConn).SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	fast, fastID := connect(t, s)
	slowSink, fastSink := s.b.sink(t, slowID), s.b.sink(t, fastID)
	// 64 MiB is far more than the socket buffers hold: the server's write blocks.
	big := bytes.Repeat([]byte{'x'}, 1<<20)
	var ds []dispatch.Delivery
	for i := range 64 {
		ds = append(ds, dispatch.Delivery{ID: uint64(i + 1), Attempt: 1, Msg: &dispatch.Message{Offset: int64(i), Value: big}})
	}
	slowSink.Send(ds)
	// The fast client keeps receiving while the slow one blocks its writer.
	next := uint64(1000)
	for len(s.b.find("leave", slowID)) == 0 {
		d := dispatch.Delivery{ID: next, Attempt: 1, Msg: testMessage(1, int64(next), 1000)}
		fastSink.Send([]dispatch.Delivery{d})
		fast.expectDeliver(d)
		next++
	}
	if l := s.b.waitCall(t, "leave", slowID); l.reason != dispatch.LeaveSlow {
		t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveSlow)
	}
	logs := s.closeLogs(slowID)
	if len(logs) != 1 || logs[0].Level != logrus.WarnLevel || logs[0].Data["reason"] != "slow consumer" ||
		logs[0].Data["remote"] != slow.nc.LocalAddr().String() || logs[0].Data["client"] != "test" {
		t.Fatalf("close logs %v, want one warning naming the slow consumer, its address and client id", logs)
	}
	d := dispatch.Delivery{ID: next, Attempt: 1, Msg: testMessage(1, int64(next), 1000)}
	fastSink.Send([]dispatch.Delivery{d})
	fast.expectDeliver(d)
	if ls := s.b.find("leave", fastID); len(ls) != 0 {
		t.Fatalf("the fast client left: %v", ls)
	}
}

func TestHandshakeRejected(t *testing.T) {
	t.Parallel()
	follower := func(c *Config) {
		c.Leadership = func() Leadership {
			return Leadership{LeaderAddr: "10.0.0.2:4987", LeaderID: "node-2", Epoch: 7, Known: true}
		}
	}
	noLeader := func(c *Config) { c.Leadership = func() Leadership { return Leadership{} } }
	auth := func(c *Config) { c.AuthToken = "s3cret" }
	hello := func(v uint32, token string) *protocol.Frame {
		return protocol.HelloFrame(&protocol.Hello{ClientId: "c", ProtocolVersion: v, AuthToken: token})
	}
	tests := []struct {
		name  string
		opts  []func(*Config)
		first *protocol.Frame
		check func(t *testing.T, f *protocol.Frame)
	}{
		{name: "unsupported version", first: hello(2, ""), check: wantError(protocol.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION, 0)},
		{name: "version 0", first: hello(0, ""), check: wantError(protocol.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION, 0)},
		{name: "missing token", opts: []func(*Config){auth}, first: hello(1, ""), check: wantError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, 0)},
		{name: "wrong token", opts: []func(*Config){auth}, first: hello(1, "s3cres"), check: wantError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, 0)},
		{name: "no leader", opts: []func(*Config){noLeader}, first: hello(1, ""), check: wantError(protocol.ErrorCode_ERROR_CODE_NO_LEADER, 1000)},
		{name: "frame before hello", first: protocol.AckFrame([]uint64{1}), check: wantError(protocol.ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, 0)},
		{name: "ping before hello", first: protocol.PingFrame(1), check: wantError(protocol.ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, 0)},
		{name: "follower redirects", opts: []func(*Config){follower}, first: hello(1, ""), check: func(t *testing.T, f *protocol.Frame) {
			r := f.GetRedirect()
			if r.GetLeaderAddress() != "10.0.0.2:4987" || r.GetLeaderNodeId() != "node-2" || r.GetEpoch() != 7 {
				t.Fatalf("got %v, want Redirect to node-2 at 10.0.0.2:4987 epoch 7", f)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, tt.opts...)
			c := dial(t, s)
			c.send(tt.first)
			tt.check(t, c.expect())
			c.expectClosed()
			s.b.mu.Lock()
			calls := s.b.calls
			s.b.mu.Unlock()
			if len(calls) != 0 {
				t.Fatalf("backend calls %v, want none", calls)
			}
			if n := s.Clients(); n != 0 {
				t.Fatalf("Clients() = %d, want 0", n)
			}
		})
	}
}

// wantError checks for a fatal Error frame with code and retry_after_ms.
func wantError(code protocol.ErrorCode, retryMs uint32) func(*testing.T, *protocol.Frame) {
	return func(t *testing.T, f *protocol.Frame) {
		t.Helper()
		e := f.GetError()
		if e == nil || e.GetCode() != code || !e.GetFatal() || e.GetRetryAfterMs() != retryMs || e.GetMessage() == "" {
			t.Fatalf("got %v, want a fatal Error %v with retry_after_ms %d and a message", f, code, retryMs)
		}
	}
}

func TestRightTokenAccepted(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.AuthToken = "s3cret" })
	c := dial(t, s)
	c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: 1, AuthToken: "s3cret"})
}

func TestTooManyClients(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaxClients = 2 })
	connect(t, s)
	_, id2 := connect(t, s)
	c := dial(t, s)
	c.send(protocol.HelloFrame(&protocol.Hello{ClientId: "c", ProtocolVersion: 1}))
	c.expectError(protocol.ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS)
	c.expectClosed()
	if n := s.Clients(); n != 2 {
		t.Fatalf("Clients() = %d, want 2", n)
	}
	// A slot freed by a leaving client can be taken again.
	s.b.sink(t, id2)
	s.Server.mu.Lock()
	cn := s.Server.conns[id2]
	s.Server.mu.Unlock()
	cn.close(closeDisconnect, errors.New("test"), nil)
	testutil.WaitFor(t, testTimeout, "a free slot", func() bool { return s.Clients() == 1 })
	connect(t, s)
}

func TestUnexpectedFrameAfterHello(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		frame *protocol.Frame
	}{
		{"second hello", protocol.HelloFrame(&protocol.Hello{ProtocolVersion: 1})},
		{"welcome", protocol.WelcomeFrame(&protocol.Welcome{})},
		{"deliver", protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 1})},
		{"redirect", protocol.RedirectFrame("a:1", "n", 1)},
		{"error", protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_INTERNAL, false, "x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t)
			c, id := connect(t, s)
			c.send(tt.frame)
			c.expectError(protocol.ErrorCode_ERROR_CODE_UNEXPECTED_FRAME)
			c.expectClosed()
			if l := s.b.waitCall(t, "leave", id); l.reason != dispatch.LeaveProtocol {
				t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveProtocol)
			}
		})
	}
}

// frameBytes returns a length prefix declaring n bytes followed by body.
func frameBytes(n uint32, body ...byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, n)
	return append(b, body...)
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		afterHello bool
		input      []byte
		code       protocol.ErrorCode
	}{
		{"http request", false, []byte("GET / HTTP/1.1\r\nHost: fanout\r\n\r\n"), protocol.ErrorCode_ERROR_CODE_UNSPECIFIED}, // answered in HTTP
		{"tls client hello", false, []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc}, protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"oversized length before hello", false, frameBytes(1<<20 + 1), protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"oversized length", true, frameBytes(0xffffffff, 1, 2, 3), protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"undecodable body before hello", false, frameBytes(3, 0xff, 0xff, 0xff), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{"undecodable body", true, frameBytes(3, 0xff, 0xff, 0xff), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{"empty frame", true, frameBytes(0), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
		{"truncated ack", true, frameBytes(4, 0x2a, 0x05, 0x0a, 0x03), protocol.ErrorCode_ERROR_CODE_BAD_FRAME},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t)
			good, goodID := connect(t, s)
			bad := dial(t, s)
			var badID uint64
			if tt.afterHello {
				badID = bad.hello(nil).GetSessionId()
			}
			bad.sendRaw(tt.input)
			if tt.code == protocol.ErrorCode_ERROR_CODE_UNSPECIFIED {
				_ = bad.nc.SetReadDeadline(time.Now().Add(testTimeout))
				if answer, _ := io.ReadAll(bad.nc); !bytes.HasPrefix(answer, []byte("HTTP/1.1 400 Bad Request\r\n")) {
					t.Fatalf("answer %q, want an HTTP 400", answer)
				}
			} else {
				bad.expectError(tt.code)
				bad.expectClosed()
			}
			if tt.afterHello {
				if l := s.b.waitCall(t, "leave", badID); l.reason != dispatch.LeaveProtocol {
					t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveProtocol)
				}
			}
			d := dispatch.Delivery{ID: 99, Attempt: 1, Msg: testMessage(0, 99, 64)}
			s.b.sink(t, goodID).Send([]dispatch.Delivery{d})
			good.expectDeliver(d)
			if ls := s.b.find("leave", goodID); len(ls) != 0 {
				t.Fatalf("the good client left: %v", ls)
			}
		})
	}
}

func TestHelloTimeout(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.HelloTimeout = 50 * time.Millisecond })
	start := time.Now() // before the dial: the server's deadline starts at its accept
	c := dial(t, s)
	c.expectClosed()
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("closed after %v, before the hello timeout", el)
	}
}

func TestClientGoodbye(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	c.send(protocol.GoodbyeFrame("done"))
	if l := s.b.waitCall(t, "leave", id); l.reason != dispatch.LeaveGoodbye {
		t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveGoodbye)
	}
	c.expectClosed()
	testutil.WaitFor(t, testTimeout, "no clients", func() bool { return s.Clients() == 0 })
}

func TestSinkGoodbyeKeepsConnectionForAcks(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	sink := s.b.sink(t, id)
	d := dispatch.Delivery{ID: 5, Attempt: 1, Msg: testMessage(0, 5, 10)}
	sink.Send([]dispatch.Delivery{d})
	sink.Goodbye("draining")
	c.expectDeliver(d)
	if f := c.expect(); f.GetGoodbye().GetReason() != "draining" {
		t.Fatalf("got %v, want Goodbye draining", f)
	}
	c.send(protocol.AckFrame([]uint64{5}))
	if a := s.b.waitCall(t, "ack", id); !equalIDs(a.ids, []uint64{5}) {
		t.Fatalf("ack ids %v, want [5]", a.ids)
	}
	if ls := s.b.find("leave", id); len(ls) != 0 {
		t.Fatalf("client left after the daemon's goodbye: %v", ls)
	}
}

func TestBackendPanicClosesOnlyThatConnection(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	victim, victimID := connect(t, s)
	other, otherID := connect(t, s)
	s.b.mu.Lock()
	s.b.panicOnAck = true
	s.b.mu.Unlock()
	victim.send(protocol.AckFrame([]uint64{1}))
	victim.expectError(protocol.ErrorCode_ERROR_CODE_INTERNAL)
	victim.expectClosed()
	if l := s.b.waitCall(t, "leave", victimID); l.reason != dispatch.LeaveDisconnect {
		t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveDisconnect)
	}
	if p := s.panics(); len(p) != 1 || !strings.Contains(p[0], "fake backend: ack") {
		t.Fatalf("logged panics %q, want the backend's", p)
	}
	d := dispatch.Delivery{ID: 1, Attempt: 1, Msg: testMessage(0, 1, 10)}
	s.b.sink(t, otherID).Send([]dispatch.Delivery{d})
	other.expectDeliver(d)
}

func TestCloseLeavesEveryClient(t *testing.T) {
	// Not parallel: it counts the goroutines of the whole process.
	before := runtime.NumGoroutine()
	s := startServer(t)
	var ids []uint64
	var cs []*client
	for range 3 {
		c, id := connect(t, s)
		cs, ids = append(cs, c), append(ids, id)
	}
	half := dial(t, s) // connected, no hello yet
	testutil.WaitFor(t, testTimeout, "4 registered connections", func() bool {
		s.Server.mu.Lock()
		defer s.Server.mu.Unlock()
		return len(s.Server.conns) == 4
	})
	if n := s.Clients(); n != 3 {
		t.Fatalf("Clients() = %d, want 3", n)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, c := range cs {
		c.expectError(protocol.ErrorCode_ERROR_CODE_SHUTTING_DOWN)
		c.expectClosed()
		if l := s.b.find("leave", ids[i]); len(l) != 1 || l[0].reason != dispatch.LeaveShutdown {
			t.Fatalf("client %d leave calls %v, want one with %v", ids[i], l, dispatch.LeaveShutdown)
		}
	}
	half.expectError(protocol.ErrorCode_ERROR_CODE_SHUTTING_DOWN)
	if n := s.Clients(); n != 0 {
		t.Fatalf("Clients() = %d after Close, want 0", n)
	}
	if _, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
	for _, c := range append(cs, half) {
		_ = c.nc.Close()
	}
	testutil.WaitFor(t, testTimeout, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

func TestContextCancelClosesServer(t *testing.T) {
	t.Parallel()
	b := newFakeBackend()
	s, err := New(testConfig(), b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, b: b}
	_, id := connect(t, ts)
	cancel()
	if l := b.waitCall(t, "leave", id); l.reason != dispatch.LeaveShutdown {
		t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveShutdown)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRedirectAll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		l     Leadership
		check func(*testing.T, *protocol.Frame)
	}{
		{"known leader", Leadership{LeaderAddr: "10.0.0.3:4987", LeaderID: "node-3", Epoch: 9, Known: true}, func(t *testing.T, f *protocol.Frame) {
			if r := f.GetRedirect(); r.GetLeaderAddress() != "10.0.0.3:4987" || r.GetLeaderNodeId() != "node-3" || r.GetEpoch() != 9 {
				t.Fatalf("got %v, want Redirect to node-3", f)
			}
		}},
		{"no leader", Leadership{}, wantError(protocol.ErrorCode_ERROR_CODE_NO_LEADER, 1000)},
		{"no leader, retry after 200ms", Leadership{RetryAfter: 200 * time.Millisecond}, wantError(protocol.ErrorCode_ERROR_CODE_NO_LEADER, 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t)
			c1, id1 := connect(t, s)
			c2, id2 := connect(t, s)
			s.RedirectAll(Leadership{Leader: true}) // no-op
			s.RedirectAll(tt.l)
			for _, c := range []*client{c1, c2} {
				tt.check(t, c.expect())
				c.expectClosed()
			}
			for _, id := range []uint64{id1, id2} {
				if l := s.b.waitCall(t, "leave", id); l.reason != dispatch.LeaveShutdown {
					t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveShutdown)
				}
			}
		})
	}
}

func TestStopAcceptingKeepsConnections(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	s.StopAccepting()
	_, err := net.DialTimeout("tcp", s.Addr().String(), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after StopAccepting: %v, want connection refused", err)
	}
	d := dispatch.Delivery{ID: 3, Attempt: 2, Msg: testMessage(2, 3, 10)}
	s.b.sink(t, id).Send([]dispatch.Delivery{d})
	c.expectDeliver(d)
}

// Sessions lists the connections past their Hello with the client's name
// and address; a silent connection and a closed one are not listed.
func TestSessions(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	dial(t, s) // silent: no Hello
	before := time.Now()
	c := dial(t, s)
	w := c.hello(&protocol.Hello{ClientId: "worker-7", ProtocolVersion: protocol.Version})
	s.b.waitCall(t, "join", w.GetSessionId())
	after := time.Now()
	got := s.Sessions()
	if len(got) != 1 {
		t.Fatalf("Sessions() = %+v, want the welcomed connection only", got)
	}
	if g := got[0]; g.ID != w.GetSessionId() || g.Name != "worker-7" || g.Remote != c.nc.LocalAddr().String() ||
		g.Since.Before(before) || g.Since.After(after) { // accepted between the dial and the join
		t.Errorf("Sessions()[0] = %+v, want id %d, worker-7 from %s", g, w.GetSessionId(), c.nc.LocalAddr())
	}
	_ = c.nc.Close()
	s.b.waitCall(t, "leave", w.GetSessionId())
	if got := s.Sessions(); len(got) != 0 {
		t.Errorf("Sessions() after close = %+v, want none", got)
	}
}
