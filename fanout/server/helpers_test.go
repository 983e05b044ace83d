package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// testTimeout bounds every wait in the tests: how long until a test that
// waits for an event that does not come fails. Generous, as the machine may
// be loaded; a wait ends as soon as its event happens.
const testTimeout = 30 * time.Second

// call is one recorded Backend call.
type call struct {
	op     string // join, observe, ack, nack, touch, leave
	id     uint64
	name   string
	max    int
	ids    []uint64
	ranges []dispatch.Range // Settle
	reason dispatch.LeaveReason
	nack   dispatch.NackInfo
}

// fakeBackend records the calls it gets and keeps the sinks of joined clients.
type fakeBackend struct {
	mu         sync.Mutex // guards the fields below
	calls      []call
	sinks      map[uint64]dispatch.ClientSink
	panicOnAck bool
	onJoin     func(dispatch.ClientSink) // called from Join when set
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{sinks: make(map[uint64]dispatch.ClientSink)}
}

func (b *fakeBackend) record(c call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, c)
}

func (b *fakeBackend) Join(id uint64, name string, maxInFlight int, sink dispatch.ClientSink) {
	b.mu.Lock()
	b.sinks[id] = sink
	onJoin := b.onJoin
	b.mu.Unlock()
	b.record(call{op: "join", id: id, name: name, max: maxInFlight})
	if onJoin != nil {
		onJoin(sink)
	}
}

func (b *fakeBackend) Ack(id uint64, ids []uint64) {
	b.mu.Lock()
	p := b.panicOnAck
	b.mu.Unlock()
	if p {
		panic("fake backend: ack")
	}
	b.record(call{op: "ack", id: id, ids: ids})
}

func (b *fakeBackend) Nack(id uint64, ids []uint64, how dispatch.NackInfo) {
	b.record(call{op: "nack", id: id, ids: ids, nack: how})
}

func (b *fakeBackend) Observe(id uint64, name string, sink dispatch.ClientSink) {
	b.mu.Lock()
	b.sinks[id] = sink
	b.mu.Unlock()
	b.record(call{op: "observe", id: id, name: name})
}

func (b *fakeBackend) Touch(id uint64, ids []uint64) { b.record(call{op: "touch", id: id, ids: ids}) }

// Settle records ranges as an ack, nack or touch call.
func (b *fakeBackend) Settle(id uint64, op dispatch.Op, ranges []dispatch.Range, how dispatch.NackInfo) {
	b.record(call{op: [...]string{"ack", "nack", "touch"}[op], id: id, ranges: ranges, nack: how})
}

func (b *fakeBackend) Leave(id uint64, reason dispatch.LeaveReason) {
	b.record(call{op: "leave", id: id, reason: reason})
}

// find returns the recorded calls matching op and id.
func (b *fakeBackend) find(op string, id uint64) []call {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []call
	for _, c := range b.calls {
		if c.op == op && c.id == id {
			out = append(out, c)
		}
	}
	return out
}

// waitCall waits for a call with op and id and returns the first one.
func (b *fakeBackend) waitCall(t testing.TB, op string, id uint64) call {
	t.Helper()
	var got call
	testutil.WaitFor(t, testTimeout, fmt.Sprintf("%s call for client %d", op, id), func() bool {
		cs := b.find(op, id)
		if len(cs) > 0 {
			got = cs[0]
		}
		return len(cs) > 0
	})
	return got
}

// sink returns the sink of a joined client.
func (b *fakeBackend) sink(t testing.TB, id uint64) dispatch.ClientSink {
	t.Helper()
	b.waitCall(t, "join", id)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sinks[id]
}

// observerSink returns the sink of an observer.
func (b *fakeBackend) observerSink(t testing.TB, id uint64) dispatch.ClientSink {
	t.Helper()
	b.waitCall(t, "observe", id)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sinks[id]
}

// testConfig is a Config for tests; opts adjust it. Its heartbeat is an
// hour, so that no ping comes between the frames a test reads on a slow
// machine; the tests of pings and liveness set their own.
func testConfig(opts ...func(*Config)) Config {
	logger, _ := logtest.NewNullLogger()
	cfg := Config{
		Listen:       "127.0.0.1:0",
		NodeID:       "node-1",
		Topic:        "orders",
		MaxInFlight:  100,
		AckTimeout:   30 * time.Second,
		Heartbeat:    time.Hour,
		MaxFrameSize: 1 << 20,
		Logger:       logrus.NewEntry(logger),
	}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// testServer is a started server with its fake backend and log hook.
type testServer struct {
	*Server
	b    *fakeBackend
	logs *logtest.Hook
}

// startServer starts a server on 127.0.0.1:0 and closes it at the end of the test.
func startServer(t testing.TB, opts ...func(*Config)) *testServer {
	t.Helper()
	cfg := testConfig(opts...)
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	cfg.Logger = logrus.NewEntry(logger)
	b := newFakeBackend()
	s, err := New(cfg, b)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &testServer{Server: s, b: b, logs: hook}
}

// panics returns the messages of logged panics.
func (s *testServer) panics() []string {
	var out []string
	for _, e := range s.logs.AllEntries() {
		if p, ok := e.Data["panic"]; ok {
			out = append(out, fmt.Sprint(p))
		}
	}
	return out
}

// closeLogs returns the "connection closed" log entries of a session.
func (s *testServer) closeLogs(id uint64) []*logrus.Entry {
	var out []*logrus.Entry
	for _, e := range s.logs.AllEntries() {
		if e.Message == "client connection closed" && e.Data["session"] == id {
			out = append(out, e)
		}
	}
	return out
}

// client is a raw-protocol test client.
type client struct {
	t  testing.TB
	nc net.Conn
	r  *protocol.Reader
	w  *protocol.Writer
	// keepPings makes expect return server Pings instead of skipping them.
	keepPings bool
}

// dial connects a client to s.
func dial(t testing.TB, s *testServer) *client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", s.Addr().String(), testTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &client{t: t, nc: nc, r: protocol.NewReader(nc, 64<<20), w: protocol.NewWriter(nc, 0)}
}

// send writes frames and flushes.
func (c *client) send(fs ...*protocol.Frame) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(testTimeout))
	for _, f := range fs {
		if err := c.w.WriteFrame(f); err != nil {
			c.t.Fatalf("write %v: %v", f, err)
		}
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatalf("flush: %v", err)
	}
}

// sendRaw writes bytes as they are.
func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(testTimeout))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write raw: %v", err)
	}
}

// read reads the next frame, skipping server Pings unless keepPings is set.
func (c *client) read() (*protocol.Frame, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(testTimeout))
	for {
		f := &protocol.Frame{}
		if err := c.r.ReadFrame(f); err != nil {
			return nil, err
		}
		if f.GetPing() != nil && !c.keepPings {
			continue
		}
		return f, nil
	}
}

// expect reads the next frame and fails the test on error.
func (c *client) expect() *protocol.Frame {
	c.t.Helper()
	f, err := c.read()
	if err != nil {
		c.t.Fatalf("read frame: %v", err)
	}
	return f
}

// expectError reads an Error frame with the given code and fatal flag.
func (c *client) expectError(code protocol.ErrorCode) *protocol.Error {
	c.t.Helper()
	f := c.expect()
	e := f.GetError()
	if e == nil {
		c.t.Fatalf("got %v, want an Error %v", f, code)
	}
	if e.GetCode() != code || !e.GetFatal() {
		c.t.Fatalf("got Error %v fatal=%v (%q), want %v fatal", e.GetCode(), e.GetFatal(), e.GetMessage(), code)
	}
	return e
}

// expectClosed reads until the server closes the connection; any frame is
// a failure.
func (c *client) expectClosed() {
	c.t.Helper()
	f, err := c.read()
	if err == nil {
		c.t.Fatalf("got %v, want the connection closed", f)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection still open after %v", testTimeout)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
		c.t.Logf("connection ended with %v", err) // a reset also counts as closed
	}
}

// hello sends a Hello and returns the Welcome.
func (c *client) hello(h *protocol.Hello) *protocol.Welcome {
	c.t.Helper()
	if h == nil {
		h = &protocol.Hello{ClientId: "test", ProtocolVersion: protocol.Version}
	}
	c.send(protocol.HelloFrame(h))
	f := c.expect()
	if f.GetWelcome() == nil {
		c.t.Fatalf("got %v, want a Welcome", f)
	}
	return f.GetWelcome()
}

// connect dials, says hello, and returns the client and its session id.
func connect(t testing.TB, s *testServer) (*client, uint64) {
	t.Helper()
	c := dial(t, s)
	w := c.hello(nil)
	return c, w.GetSessionId()
}

// testMessage returns a message with a payload of n bytes.
func testMessage(partition int32, offset int64, n int) *dispatch.Message {
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(offset) + byte(i)
	}
	return &dispatch.Message{
		Partition: partition,
		Offset:    offset,
		Key:       []byte(fmt.Sprintf("key-%d", offset)),
		Value:     v,
		Headers:   []dispatch.Header{{Key: "trace", Value: []byte("abc")}, {Key: "n", Value: []byte{byte(offset)}}},
		Timestamp: time.UnixMilli(1764672000000 + offset),
	}
}

// expectDeliver reads a Deliver frame and checks it against d.
func (c *client) expectDeliver(d dispatch.Delivery) {
	c.t.Helper()
	f := c.expect()
	got := f.GetDeliver()
	if got == nil {
		c.t.Fatalf("got %v, want a Deliver of %d", f, d.ID)
	}
	m := d.Msg
	if got.GetDeliveryId() != d.ID || got.GetAttempt() != d.Attempt ||
		got.GetPartition() != m.Partition || got.GetOffset() != m.Offset ||
		string(got.GetKey()) != string(m.Key) || string(got.GetValue()) != string(m.Value) ||
		got.GetTimestampMs() != m.Timestamp.UnixMilli() {
		c.t.Fatalf("Deliver %d/%d p%d@%d ts %d, want %d/%d p%d@%d ts %d (or payload differs)",
			got.GetDeliveryId(), got.GetAttempt(), got.GetPartition(), got.GetOffset(), got.GetTimestampMs(),
			d.ID, d.Attempt, m.Partition, m.Offset, m.Timestamp.UnixMilli())
	}
	if !slices.EqualFunc(got.GetHeaders(), m.Headers, func(g *protocol.Header, w dispatch.Header) bool {
		return g.GetKey() == w.Key && string(g.GetValue()) == string(w.Value)
	}) {
		c.t.Fatalf("Deliver %d headers %v, want %v", d.ID, got.GetHeaders(), m.Headers)
	}
}
