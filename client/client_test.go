package client

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

func TestHelloFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want *protocol.Hello
	}{
		{"explicit", Config{ClientID: "worker-7", MaxInFlight: 5, AuthToken: "s3cret", MaxFrameSize: 1 << 20},
			&protocol.Hello{ClientId: "worker-7", ProtocolVersion: 1, MaxInFlight: 5, AuthToken: "s3cret", MaxFrameSize: 1 << 20}},
		{"defaults", Config{ClientID: "w"},
			&protocol.Hello{ClientId: "w", ProtocolVersion: 1, MaxInFlight: DefaultMaxInFlight, MaxFrameSize: protocol.DefaultMaxFrameSize}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startFake(t)
			c, _, h := connectTo(t, d, tt.cfg)
			if h.GetClientId() != tt.want.ClientId || h.GetProtocolVersion() != tt.want.ProtocolVersion ||
				h.GetMaxInFlight() != tt.want.MaxInFlight || h.GetAuthToken() != tt.want.AuthToken ||
				h.GetMaxFrameSize() != tt.want.MaxFrameSize ||
				!slices.Equal(h.GetCapabilities(), []protocol.Capability{protocol.Capability_CAPABILITY_MEMBERS, protocol.Capability_CAPABILITY_BATCH}) {
				t.Errorf("hello = %v, want %v", h, tt.want)
			}
			if got := cap(c.Messages()); got != int(tt.want.MaxInFlight) {
				t.Errorf("cap(Messages()) = %d, want %d", got, tt.want.MaxInFlight)
			}
		})
	}
}

func TestDefaultClientID(t *testing.T) {
	t.Parallel()
	cfg, err := Config{Addrs: []string{"x:1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientID == "" || !bytes.Contains([]byte(cfg.ClientID), []byte("-")) {
		t.Errorf("default ClientID = %q, want hostname-pid", cfg.ClientID)
	}
	if _, err := (Config{}).withDefaults(); !errors.Is(err, ErrNoAddrs) {
		t.Errorf("empty Addrs: err = %v, want ErrNoAddrs", err)
	}
}

func TestDeliveryFields(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	ts := time.UnixMilli(1700000000123)
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{
		DeliveryId: 42, Partition: 3, Offset: 1001, Key: []byte("k"), Value: []byte("v\x00\xff"),
		Headers:     []*protocol.Header{{Key: "h1", Value: []byte("x")}, {Key: "h2"}},
		TimestampMs: ts.UnixMilli(), Attempt: 2,
	}))
	m := receive(t, c)
	if m.DeliveryID != 42 || m.Partition != 3 || m.Offset != 1001 || string(m.Key) != "k" ||
		string(m.Value) != "v\x00\xff" || !m.Timestamp.Equal(ts) || m.Attempt != 2 {
		t.Errorf("message = %+v", m)
	}
	if len(m.Headers) != 2 || m.Headers[0].Key != "h1" || string(m.Headers[0].Value) != "x" || m.Headers[1].Key != "h2" {
		t.Errorf("headers = %+v", m.Headers)
	}
}

func TestAcksAreBatched(t *testing.T) {
	t.Parallel()
	const n = 2000
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{MaxInFlight: n})
	for i := 1; i <= n; i++ {
		if err := fc.w.WriteFrame(protocol.DeliverFrame(&protocol.Deliver{DeliveryId: uint64(i)})); err != nil {
			t.Fatal(err)
		}
	}
	if err := fc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	msgs := make([]*Message, n)
	for i := range msgs {
		msgs[i] = receive(t, c)
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	ids, frames := fc.expectIDs(t, n, ackIDs)
	if frames >= n {
		t.Errorf("%d acks took %d frames; want them batched", n, frames)
	}
	slices.Sort(ids)
	for i, id := range ids {
		if id != uint64(i+1) {
			t.Fatalf("acked ids not each id once: ids[%d] = %d", i, id)
		}
	}
	if len(ids) != n {
		t.Fatalf("got %d acked ids, want %d", len(ids), n)
	}
	t.Logf("%d acks in %d frames", n, frames)
}

func TestNackAndTouch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		call func(*Message) error
		get  func(*protocol.Frame) []uint64
	}{
		{"ack", (*Message).Ack, ackIDs},
		{"nack", (*Message).Nack, nackIDs},
		{"touch", (*Message).Touch, touchIDs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startFake(t)
			c, fc, _ := connectTo(t, d, Config{})
			fc.deliver(t, 7, "x")
			if err := tt.call(receive(t, c)); err != nil {
				t.Fatal(err)
			}
			if ids, _ := fc.expectIDs(t, 1, tt.get); !slices.Equal(ids, []uint64{7}) {
				t.Errorf("ids = %v, want [7]", ids)
			}
		})
	}
}

func TestFinishedMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		first, then func(*Message) error
	}{
		{"ack twice", (*Message).Ack, (*Message).Ack},
		{"nack after ack", (*Message).Ack, (*Message).Nack},
		{"ack after nack", (*Message).Nack, (*Message).Ack},
		{"touch after ack", (*Message).Ack, (*Message).Touch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startFake(t)
			c, fc, _ := connectTo(t, d, Config{})
			fc.deliver(t, 1, "a")
			fc.deliver(t, 2, "b")
			m1, m2 := receive(t, c), receive(t, c)
			if err := tt.first(m1); err != nil {
				t.Fatal(err)
			}
			if err := tt.then(m1); !errors.Is(err, ErrAlreadyAcked) {
				t.Errorf("second call: err = %v, want ErrAlreadyAcked", err)
			}
			// A later ack of another message proves nothing more was sent for m1.
			if err := m2.Ack(); err != nil {
				t.Fatal(err)
			}
			// Frames of one batch come in the order acks, nacks, touches.
			var got []uint64
			for !slices.Contains(got, 1) || !slices.Contains(got, 2) {
				f := fc.next(t)
				got = append(got, ackIDs(f)...)
				got = append(got, nackIDs(f)...)
				got = append(got, touchIDs(f)...)
			}
			if slices.Sort(got); !slices.Equal(got, []uint64{1, 2}) {
				t.Errorf("ids sent = %v, want [1 2]", got)
			}
		})
	}
}

func TestPingAnswered(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	_, fc, _ := connectTo(t, d, Config{})
	for _, nonce := range []uint64{99, 1 << 60} {
		fc.send(t, protocol.PingFrame(nonce))
		f := fc.next(t)
		if f.GetPong() == nil || f.GetPong().GetNonce() != nonce {
			t.Errorf("answer to ping %d = %v, want pong %d", nonce, f, nonce)
		}
	}
}

func TestRedirectFollowed(t *testing.T) {
	t.Parallel()
	follower, leader := startFake(t), startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{follower.addr()}})
	fc := follower.accept(t)
	fc.expectHello(t)
	fc.send(t, protocol.RedirectFrame(leader.addr(), "leader", 3))
	_ = fc.nc.Close()
	lc := leader.accept(t)
	lc.handshake(t)
	c := connected(t, ch)
	lc.deliver(t, 5, "from leader")
	if m := receive(t, c); string(m.Value) != "from leader" {
		t.Errorf("value = %q", m.Value)
	}
	// After a disconnect the client goes back to the leader first.
	_ = lc.nc.Close()
	lc = leader.accept(t)
	lc.handshake(t)
}

func TestNoLeaderRetriedAfterDelay(t *testing.T) {
	t.Parallel()
	const retry = 200 * time.Millisecond
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}})
	fc := d.accept(t)
	fc.expectHello(t)
	ef := protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_NO_LEADER, true, "no leader yet")
	ef.GetError().RetryAfterMs = uint32(retry / time.Millisecond)
	// Measured from before the refusal is sent: the client may read it
	// before fc.send returns.
	refused := time.Now()
	fc.send(t, ef)
	_ = fc.nc.Close()
	fc = d.accept(t)
	if waited := time.Since(refused); waited < retry {
		t.Errorf("retried after %v, want at least %v", waited, retry)
	}
	fc.handshake(t)
	connected(t, ch)
}

// A leader that steps down closes its clients with NO_LEADER; the client
// then tries the other daemons it knows instead of the one that refused.
func TestNoLeaderAfterWelcomeTriesAnotherDaemon(t *testing.T) {
	t.Parallel()
	old, next := startFake(t), startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{old.addr(), next.addr()}})
	fc := old.accept(t)
	fc.handshake(t)
	connected(t, ch)
	ef := protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_NO_LEADER, true, "stepping down")
	ef.GetError().RetryAfterMs = 50
	fc.send(t, ef)
	_ = fc.nc.Close()
	nc := next.accept(t)
	nc.handshake(t)
}

func TestReconnectAfterServerClose(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	fc.deliver(t, 1, "old")
	old := receive(t, c)
	_ = fc.nc.Close()

	fc = d.accept(t)
	fc.handshake(t)
	fc.deliver(t, 2, "new")
	if m := receive(t, c); string(m.Value) != "new" {
		t.Errorf("value = %q, want new", m.Value)
	}
	for _, call := range []func(*Message) error{(*Message).Ack, (*Message).Nack, (*Message).Touch} {
		if err := call(old); !errors.Is(err, ErrStale) {
			t.Errorf("call on a message of the dead connection: err = %v, want ErrStale", err)
		}
	}
	if _, err := fc.read(100 * time.Millisecond); err == nil {
		t.Error("a stale ack reached the new connection")
	}
}

func TestGoodbyeFromDaemonReconnects(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	fc.deliver(t, 1, "x")
	m := receive(t, c)
	fc.send(t, protocol.GoodbyeFrame("shutting down"))
	// Acks are still taken until the daemon closes.
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if ids, _ := fc.expectIDs(t, 1, ackIDs); !slices.Equal(ids, []uint64{1}) {
		t.Errorf("acked %v", ids)
	}
	_ = fc.nc.Close()
	d.accept(t).handshake(t)
}

func TestSilentDaemonDetected(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}})
	fc := d.accept(t)
	fc.expectHello(t)
	w := testWelcome()
	w.HeartbeatMs, w.LivenessIntervals = 50, 2
	fc.send(t, protocol.WelcomeFrame(w))
	connected(t, ch)
	start := time.Now()
	fc.expectEOF(t) // the client gave up on the silent connection
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("connection dropped after %v, before two heartbeats", took)
	}
	d.accept(t).handshake(t)
}

func TestPingsKeepConnectionAlive(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}})
	fc := d.accept(t)
	fc.expectHello(t)
	w := testWelcome()
	w.HeartbeatMs, w.LivenessIntervals = 50, 2
	fc.send(t, protocol.WelcomeFrame(w))
	connected(t, ch)
	// Ping for 5 liveness windows: the client must keep answering.
	for i := range uint64(25) {
		fc.send(t, protocol.PingFrame(i))
		if f := fc.next(t); f.GetPong().GetNonce() != i {
			t.Fatalf("answer = %v", f)
		}
		time.Sleep(20 * time.Millisecond) // the daemon's ping interval, not synchronisation
	}
}

func TestCloseSendsAcksThenGoodbye(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	for i := uint64(1); i <= 3; i++ {
		fc.deliver(t, i, "x")
	}
	var msgs []*Message
	for range 3 {
		msgs = append(msgs, receive(t, c))
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 2)
	go func() { closed <- c.Close() }()
	go func() { closed <- c.Close() }() // concurrent Close is safe
	ids, _ := fc.expectIDs(t, 3, ackIDs)
	if !slices.Equal(ids, []uint64{1, 2, 3}) {
		t.Errorf("acked %v", ids)
	}
	if f := fc.next(t); f.GetGoodbye() == nil {
		t.Errorf("after the acks: %v, want goodbye", f)
	}
	fc.expectEOF(t)
	_ = fc.nc.Close()
	for range 2 {
		if err := <-closed; err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if _, ok := <-c.Messages(); ok {
		t.Error("Messages not closed after Close")
	}
	if err := msgs[0].Nack(); !errors.Is(err, ErrClosed) && !errors.Is(err, ErrAlreadyAcked) {
		t.Errorf("Nack after Close: %v", err)
	}
	if c.Err() != nil {
		t.Errorf("Err after Close = %v, want nil", c.Err())
	}
}

func TestAckAfterCloseFails(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	fc.deliver(t, 1, "x")
	m := receive(t, c)
	go func() {
		fc.expectIDs(t, 0, ackIDs)
		for {
			if _, err := fc.read(testTimeout); err != nil {
				_ = fc.nc.Close()
				return
			}
		}
	}()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(); !errors.Is(err, ErrClosed) {
		t.Errorf("Ack after Close: err = %v, want ErrClosed", err)
	}
}

func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code    protocol.ErrorCode
		inDial  bool
		wantErr bool
	}{
		{protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, true, true},
		{protocol.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION, true, true},
		{protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, false, true},
		{protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, false, true},
		{protocol.ErrorCode_ERROR_CODE_TOO_MANY_IDS, false, true},
		{protocol.ErrorCode_ERROR_CODE_SHUTTING_DOWN, false, false},
		{protocol.ErrorCode_ERROR_CODE_INTERNAL, false, false},
	}
	for _, tt := range tests {
		name := tt.code.String()
		if tt.inDial {
			name += "/dial"
		}
		t.Run(name, func(t *testing.T) {
			d := startFake(t)
			ef := protocol.ErrorFrame(tt.code, true, "no")
			if tt.inDial {
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				errc := make(chan error, 1)
				go func() {
					_, err := Dial(ctx, Config{Addrs: []string{d.addr()}})
					errc <- err
				}()
				fc := d.accept(t)
				fc.expectHello(t)
				fc.send(t, ef)
				err := <-errc
				var re *protocol.RemoteError
				if !errors.As(err, &re) || re.Code != tt.code {
					t.Fatalf("Dial: err = %v, want a *protocol.RemoteError with %v", err, tt.code)
				}
				return
			}
			c, fc, _ := connectTo(t, d, Config{})
			fc.send(t, ef)
			_ = fc.nc.Close()
			if !tt.wantErr {
				d.accept(t).handshake(t) // reconnected
				return
			}
			for range c.Messages() {
			}
			var re *protocol.RemoteError
			if !errors.As(c.Err(), &re) || re.Code != tt.code {
				t.Errorf("Err() = %v, want a *protocol.RemoteError with %v", c.Err(), tt.code)
			}
		})
	}
}

// A frame larger than the client's MaxFrameSize would come again after a
// reconnect (the daemon redelivers the message): the client stops for good,
// with Err saying why, instead of reconnecting forever.
func TestFrameTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, h := connectTo(t, d, Config{MaxFrameSize: 64 << 10})
	if h.GetMaxFrameSize() != 64<<10 {
		t.Fatalf("Hello.max_frame_size = %d, want %d", h.GetMaxFrameSize(), 64<<10)
	}
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 1, Value: make([]byte, 100<<10)}))
	select {
	case m, ok := <-c.Messages():
		if ok {
			t.Fatalf("message %d arrived", m.DeliveryID)
		}
	case <-time.After(testTimeout):
		t.Fatalf("client still running %v after a frame above its limit (reconnecting?)", testTimeout)
	}
	var tooLarge *protocol.FrameTooLargeError
	if !errors.As(c.Err(), &tooLarge) || tooLarge.Max != 64<<10 {
		t.Fatalf("Err() = %v, want a *protocol.FrameTooLargeError over 64 KiB", c.Err())
	}
	select {
	case fc2, ok := <-d.conns:
		if ok {
			t.Fatalf("the client reconnected (%v)", fc2.nc.RemoteAddr())
		}
	default:
	}
}

func TestMaxFrameSizeChecked(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, 100, protocol.MaxHelloSize - 1, 1 << 33} {
		if _, err := Dial(context.Background(), Config{Addrs: []string{"127.0.0.1:1"}, MaxFrameSize: n}); err == nil {
			t.Errorf("Dial with MaxFrameSize %d: no error", n)
		}
	}
}

func TestNoReconnect(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{NoReconnect: true})
	_ = fc.nc.Close()
	for range c.Messages() {
	}
	if c.Err() == nil {
		t.Error("Err() = nil after the connection ended with NoReconnect")
	}
}

func TestDialUnreachable(t *testing.T) {
	// Not parallel: it counts the goroutines of the whole process.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	before := runtime.NumGoroutine()

	// Dial retries until its context ends, then returns: one that went on
	// retrying would not return at all.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	type result struct {
		c   *Client
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Dial(ctx, Config{Addrs: []string{addr}, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		done <- result{c, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(testTimeout):
		t.Fatalf("Dial has not returned %v after its context ended", testTimeout)
	}
	if r.err == nil {
		_ = r.c.Close()
		t.Fatal("Dial succeeded")
	}
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", r.err)
	}
	t.Log(r.err)
	waitFor(t, testTimeout, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

// TestDialHTTPServer: an address that answers HTTP (a daemon's metrics and
// console port) fails Dial at once, saying so, not with a frame length, and
// is not retried.
func TestDialHTTPServer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	// The default frame size limit, and one that takes HTTP's first bytes
	// as a length.
	for _, maxFrame := range []int{0, 1<<32 - 1} {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		c, err := Dial(ctx, Config{Addrs: []string{srv.Listener.Addr().String()}, MaxFrameSize: maxFrame})
		cancel()
		if err == nil {
			_ = c.Close()
			t.Fatal("Dial succeeded")
		}
		var he *protocol.HTTPError
		if !errors.As(err, &he) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("MaxFrameSize %d: Dial: %v; want an HTTPError at once, not a retry until the deadline", maxFrame, err)
		}
		if want := "this is an HTTP server (the metrics and console port?), not a fanout client port"; !strings.Contains(err.Error(), want) {
			t.Errorf("Dial: %v; want it to say %q", err, want)
		}
	}
}

func TestDialAllRefusedNoReconnect(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if _, err := Dial(context.Background(), Config{Addrs: []string{addr, addr}, NoReconnect: true}); err == nil {
		t.Fatal("Dial succeeded")
	}
}

func TestBackoffNeverOverflows(t *testing.T) {
	t.Parallel()
	c := &Client{cfg: Config{MinBackoff: time.Minute, MaxBackoff: 10 * time.Minute}}
	for n := 1; n < 100; n++ {
		if d := c.backoff(n); d < 30*time.Second || d > 10*time.Minute {
			t.Fatalf("backoff(%d) = %v, want between MinBackoff/2 and MaxBackoff", n, d)
		}
	}
	c.cfg = Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second}
	if d := c.backoff(3); d < 200*time.Millisecond || d > 400*time.Millisecond {
		t.Fatalf("backoff(3) = %v, want 200-400ms", d)
	}
}

// The daemon refuses a frame naming more ids than Welcome.max_in_flight
// (ERROR_CODE_TOO_MANY_IDS), and a client can hold more ids than that: a
// delivery whose ack timed out plus its credit's new ones. Acks are split.
func TestAckFramesWithinWelcomeInFlight(t *testing.T) {
	t.Parallel()
	const credit, n = 8, 200
	if got := idsPerFrame(protocol.DefaultMaxFrameSize, credit); got != credit {
		t.Fatalf("idsPerFrame(4 MiB, %d) = %d", credit, got)
	}
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}, MaxInFlight: n})
	fc := d.accept(t)
	fc.expectHello(t)
	w := testWelcome()
	w.MaxInFlight = credit
	fc.send(t, protocol.WelcomeFrame(w))
	c := connected(t, ch)
	for i := 1; i <= n; i++ {
		if err := fc.w.WriteFrame(protocol.DeliverFrame(&protocol.Deliver{DeliveryId: uint64(i)})); err != nil {
			t.Fatal(err)
		}
	}
	if err := fc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	msgs := make([]*Message, n)
	for i := range msgs {
		msgs[i] = receive(t, c)
	}
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	var got int
	for got < n {
		f := fc.next(t)
		ids := f.GetAck().GetDeliveryIds()
		if len(ids) > credit {
			t.Fatalf("an Ack frame named %d ids, more than the Welcome's max_in_flight %d", len(ids), credit)
		}
		got += len(ids)
	}
}

func TestIDsPerFrameFitTheLimit(t *testing.T) {
	t.Parallel()
	for _, max := range []int{0, 100, 1024, 20000, protocol.DefaultMaxFrameSize} {
		n := idsPerFrame(max, 0)
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = ^uint64(0) // the longest varint
		}
		limit := max
		if limit <= 0 {
			limit = protocol.DefaultMaxFrameSize
		}
		var buf bytes.Buffer
		w := protocol.NewWriter(&buf, limit)
		if err := w.WriteFrame(protocol.AckFrame(ids)); err != nil {
			t.Errorf("max frame %d: %d ids of 10 bytes do not fit: %v", max, n, err)
		}
	}
}

// TestMessageKeyNilOnlyWithoutAKey: a record without a key comes with a nil
// Key, one with an empty key with an empty, non-nil one (Kafka tells them
// apart, and so does the wire).
func TestMessageKeyNilOnlyWithoutAKey(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 1, Value: []byte("none")}))
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 2, Key: []byte{}, Value: []byte("empty")}))
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 3, Key: []byte("k"), Value: []byte("k")}))
	for _, want := range []struct {
		value string
		key   []byte
	}{{"none", nil}, {"empty", []byte{}}, {"k", []byte("k")}} {
		m := receive(t, c)
		if string(m.Value) != want.value || (m.Key == nil) != (want.key == nil) || !bytes.Equal(m.Key, want.key) {
			t.Errorf("message %q: key %#v, want %#v", m.Value, m.Key, want.key)
		}
	}
}
