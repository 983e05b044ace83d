package client

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// testTimeout bounds every wait in these tests.
const testTimeout = 5 * time.Second

// fakeDaemon is an in-process daemon speaking the raw protocol; a test
// drives each accepted connection with send and expect.
type fakeDaemon struct {
	ln    net.Listener
	conns chan *fakeConn
}

// startFake listens on 127.0.0.1:0 until the test ends.
func startFake(tb testing.TB) *fakeDaemon {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return startFakeOn(tb, ln)
}

// startFakeOn serves ln (a TLS listener, say) until the test ends.
func startFakeOn(tb testing.TB, ln net.Listener) *fakeDaemon {
	d := &fakeDaemon{ln: ln, conns: make(chan *fakeConn, 16)}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				close(d.conns)
				return
			}
			d.conns <- &fakeConn{nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0)}
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		for fc := range d.conns {
			_ = fc.nc.Close()
		}
	})
	return d
}

func (d *fakeDaemon) addr() string { return d.ln.Addr().String() }

// accept returns the next connection from a client.
func (d *fakeDaemon) accept(tb testing.TB) *fakeConn {
	tb.Helper()
	select {
	case fc := <-d.conns:
		tb.Cleanup(func() { _ = fc.nc.Close() })
		return fc
	case <-time.After(testTimeout):
		tb.Fatal("no client connected")
		return nil
	}
}

// fakeConn is the daemon's end of one connection.
type fakeConn struct {
	nc net.Conn
	r  *protocol.Reader
	w  *protocol.Writer
}

func (fc *fakeConn) send(tb testing.TB, f *protocol.Frame) {
	tb.Helper()
	if err := fc.w.WriteFrame(f); err != nil {
		tb.Fatal(err)
	}
	if err := fc.w.Flush(); err != nil {
		tb.Fatal(err)
	}
}

// next reads the next frame, failing the test after testTimeout.
func (fc *fakeConn) next(tb testing.TB) *protocol.Frame {
	tb.Helper()
	f, err := fc.read(testTimeout)
	if err != nil {
		tb.Fatalf("expected a frame: %v", err)
	}
	return f
}

// countAcks reads fc's frames in a goroutine until they have acked n
// delivery ids (by id or by range) or reading fails, and then sends how many
// they acked: the daemon's side of a benchmark's acks.
func (fc *fakeConn) countAcks(n int) <-chan int {
	counted := make(chan int, 1)
	go func() {
		got := 0
		for got < n {
			f, err := fc.read(time.Minute)
			if err != nil {
				break
			}
			got += len(f.GetAck().GetDeliveryIds())
			rs := f.GetAck().GetRanges()
			for i := 1; i < len(rs); i += 2 {
				got += int(rs[i])
			}
		}
		counted <- got
	}()
	return counted
}

func (fc *fakeConn) read(timeout time.Duration) (*protocol.Frame, error) {
	_ = fc.nc.SetReadDeadline(time.Now().Add(timeout))
	var f protocol.Frame
	if err := fc.r.ReadFrame(&f); err != nil {
		return nil, err
	}
	return &f, nil
}

// expectEOF waits for the client to close its side.
func (fc *fakeConn) expectEOF(tb testing.TB) {
	tb.Helper()
	f, err := fc.read(testTimeout)
	if err == nil {
		tb.Fatalf("expected EOF, got %v", f)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		tb.Fatal("client kept the connection open")
	}
}

// expectHello reads the Hello.
func (fc *fakeConn) expectHello(tb testing.TB) *protocol.Hello {
	tb.Helper()
	f := fc.next(tb)
	h := f.GetHello()
	if h == nil {
		tb.Fatalf("expected hello, got %v", f)
	}
	return h
}

// testWelcome is the Welcome the fake sends unless a test needs another.
func testWelcome() *protocol.Welcome {
	return &protocol.Welcome{
		NodeId:            "fake",
		SessionId:         1,
		ProtocolVersion:   protocol.Version,
		MaxInFlight:       64,
		AckTimeoutMs:      30000,
		HeartbeatMs:       10000,
		LivenessIntervals: 3,
		MaxFrameSize:      protocol.DefaultMaxFrameSize,
		Topic:             "test",
	}
}

// handshake reads the Hello and welcomes the client.
func (fc *fakeConn) handshake(tb testing.TB) *protocol.Hello {
	tb.Helper()
	h := fc.expectHello(tb)
	fc.send(tb, protocol.WelcomeFrame(testWelcome()))
	return h
}

// deliver sends a delivery with the given id and value.
func (fc *fakeConn) deliver(tb testing.TB, id uint64, value string) {
	tb.Helper()
	fc.send(tb, protocol.DeliverFrame(&protocol.Deliver{
		DeliveryId: id, Partition: 1, Offset: int64(id), Value: []byte(value), Attempt: 1,
	}))
}

// expectIDs reads frames until n delivery ids of the kind picked by get
// have arrived, skipping other frames, and returns them with the number of
// frames that carried them.
func (fc *fakeConn) expectIDs(tb testing.TB, n int, get func(*protocol.Frame) []uint64) (ids []uint64, frames int) {
	tb.Helper()
	for len(ids) < n {
		f := fc.next(tb)
		if got := get(f); got != nil {
			ids = append(ids, got...)
			frames++
		}
	}
	return ids, frames
}

func ackIDs(f *protocol.Frame) []uint64   { return f.GetAck().GetDeliveryIds() }
func nackIDs(f *protocol.Frame) []uint64  { return f.GetNack().GetDeliveryIds() }
func touchIDs(f *protocol.Frame) []uint64 { return f.GetTouch().GetDeliveryIds() }

// testConfig fills in a test client id and short reconnect backoffs.
func testConfig(cfg Config) Config {
	if cfg.ClientID == "" {
		cfg.ClientID = "test-client"
	}
	if cfg.MaxBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	return cfg
}

// dial connects a client to addrs with test-friendly settings and closes it
// when the test ends.
func dial(tb testing.TB, cfg Config) *Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := Dial(ctx, testConfig(cfg))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// dialAsync runs Dial in the background so that the test can play the
// daemon's part of the handshake.
func dialAsync(tb testing.TB, cfg Config) <-chan *Client {
	tb.Helper()
	ch := make(chan *Client, 1)
	go func() {
		defer close(ch)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		c, err := Dial(ctx, testConfig(cfg))
		if err != nil {
			tb.Error(err)
			return
		}
		ch <- c
	}()
	return ch
}

// connected waits for dialAsync's client.
func connected(tb testing.TB, ch <-chan *Client) *Client {
	tb.Helper()
	select {
	case c := <-ch:
		if c == nil {
			tb.FailNow()
		}
		tb.Cleanup(func() { _ = c.Close() })
		return c
	case <-time.After(testTimeout):
		tb.Fatal("Dial did not return")
		return nil
	}
}

// receive waits for the next message.
func receive(tb testing.TB, c *Client) *Message {
	tb.Helper()
	select {
	case m, ok := <-c.Messages():
		if !ok {
			tb.Fatalf("Messages closed: %v", c.Err())
		}
		return m
	case <-time.After(testTimeout):
		tb.Fatal("no message")
		return nil
	}
}

// connectTo dials d, lets it welcome the client and returns both ends.
func connectTo(tb testing.TB, d *fakeDaemon, cfg Config) (*Client, *fakeConn, *protocol.Hello) {
	tb.Helper()
	cfg.Addrs = append(cfg.Addrs, d.addr())
	ch := dialAsync(tb, cfg)
	fc := d.accept(tb)
	h := fc.handshake(tb)
	c := connected(tb, ch)
	// Runs before c.Close, which then need not wait for the daemon to close.
	tb.Cleanup(func() { _ = fc.nc.Close() })
	return c, fc, h
}

// memberAddrs returns the addresses of the fakes, sorted, as daemons list
// their members.
func memberAddrs(ds ...*fakeDaemon) []string {
	addrs := make([]string, len(ds))
	for i, d := range ds {
		addrs[i] = d.addr()
	}
	slices.Sort(addrs)
	return addrs
}

// welcomeMembers is testWelcome listing addrs as the members (spread mode).
func welcomeMembers(addrs ...string) *protocol.Welcome {
	w := testWelcome()
	w.Members = protocol.MemberList(addrs)
	return w
}

// join accepts the client's next connection to d, checks that its Hello
// asks for credit and announces CAPABILITY_MEMBERS, and welcomes it listing
// members.
func (d *fakeDaemon) join(tb testing.TB, credit int, members ...string) *fakeConn {
	tb.Helper()
	return d.joinWith(tb, credit, welcomeMembers(members...))
}

// joinWith is join with the Welcome w.
func (d *fakeDaemon) joinWith(tb testing.TB, credit int, w *protocol.Welcome) *fakeConn {
	tb.Helper()
	fc := d.accept(tb)
	h := fc.expectHello(tb)
	if !h.HasCapability(protocol.Capability_CAPABILITY_MEMBERS) {
		tb.Fatalf("%s: Hello without CAPABILITY_MEMBERS: %v", d.addr(), h)
	}
	if got := int(h.GetMaxInFlight()); got != credit {
		tb.Fatalf("%s: Hello asks max_in_flight %d, want %d", d.addr(), got, credit)
	}
	fc.send(tb, protocol.WelcomeFrame(w))
	return fc
}

// expectGoodbye reads frames until the client's Goodbye and returns the ids
// acked before it; then it closes the connection, as a daemon does.
func (fc *fakeConn) expectGoodbye(tb testing.TB) (acked []uint64) {
	tb.Helper()
	for {
		f := fc.next(tb)
		if f.GetGoodbye() != nil {
			_ = fc.nc.Close()
			return acked
		}
		acked = append(acked, ackIDs(f)...)
	}
}

// syncNonce makes the nonces of sync's Pings unique.
var syncNonce atomic.Uint64

// sync pings the client and waits for the Pong. The session's reader runs
// once it answers, so the client has taken in the Welcome: a list a test
// sends after sync, on any session, comes after that Welcome's list.
func (fc *fakeConn) sync(tb testing.TB) {
	tb.Helper()
	nonce := syncNonce.Add(1) + 1<<32
	fc.send(tb, protocol.PingFrame(nonce))
	for {
		f := fc.next(tb)
		if f.GetGoodbye() != nil {
			tb.Fatal("goodbye instead of a pong")
		}
		if f.GetPong().GetNonce() == nonce {
			return
		}
	}
}

// waitFor polls cond every 10 ms until it returns true, and fails the test
// once timeout has passed. It is internal/testutil.WaitFor's rule, copied:
// the client is a module of its own (see go.mod), which cannot import the
// daemon's module.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
