package server

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// memberList is what a test's Config.Members returns; set and version
// change it.
type memberList struct {
	mu    sync.Mutex
	addrs []string
	v     *protocol.MembersVersion
}

func (l *memberList) get() ([]string, *protocol.MembersVersion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addrs, l.v
}

func (l *memberList) list() []string {
	addrs, _ := l.get()
	return addrs
}

func (l *memberList) set(addrs ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs = addrs
}

func (l *memberList) version(epoch, generation uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.v = &protocol.MembersVersion{Epoch: epoch, Generation: generation}
}

// startMembersServer starts a server whose Config.Members returns what l
// holds, pinging only once an hour so that no Ping comes between frames a
// test compares.
func startMembersServer(t *testing.T, l *memberList, opts ...func(*Config)) *testServer {
	t.Helper()
	return startServer(t, append([]func(*Config){func(c *Config) {
		c.Members = l.get
		c.Heartbeat = time.Hour
	}}, opts...)...)
}

// capableHello is a Hello that announces CAPABILITY_MEMBERS.
func capableHello() *protocol.Hello {
	return &protocol.Hello{ClientId: "capable", ProtocolVersion: protocol.Version,
		Capabilities: []protocol.Capability{protocol.Capability_CAPABILITY_MEMBERS}}
}

// readRaw reads the bytes of the next frame, length prefix included, from
// the socket (not through c.r: a test using it reads every frame with it).
func (c *client) readRaw() []byte {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(testTimeout))
	hdr := make([]byte, protocol.HeaderSize)
	if _, err := io.ReadFull(c.nc, hdr); err != nil {
		c.t.Fatalf("read frame header: %v", err)
	}
	frame := make([]byte, protocol.HeaderSize+int(binary.BigEndian.Uint32(hdr)))
	copy(frame, hdr)
	if _, err := io.ReadFull(c.nc, frame[protocol.HeaderSize:]); err != nil {
		c.t.Fatalf("read frame body: %v", err)
	}
	return frame
}

// wire returns the bytes protocol.Writer writes for f.
func wire(t testing.TB, f *protocol.Frame) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := protocol.NewWriter(&buf, 0)
	if err := w.WriteFrame(f); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// expectTodaysWelcome reads the Welcome that answers a Hello without
// capabilities and checks its bytes are today's protocol's, byte for byte:
// the test server's Welcome (heartbeat an hour) for a client of
// maxInFlight. It returns the Welcome's session id.
func (c *client) expectTodaysWelcome(t *testing.T, maxInFlight uint32) uint64 {
	t.Helper()
	got := c.readRaw()
	var welcome protocol.Frame
	if err := proto.Unmarshal(got[protocol.HeaderSize:], &welcome); err != nil {
		t.Fatal(err)
	}
	id := welcome.GetWelcome().GetSessionId()
	want := wire(t, protocol.WelcomeFrame(&protocol.Welcome{
		NodeId: "node-1", SessionId: id, ProtocolVersion: 1, MaxInFlight: maxInFlight,
		AckTimeoutMs: 30000, HeartbeatMs: uint32(time.Hour / time.Millisecond), LivenessIntervals: 2,
		MaxFrameSize: 1 << 20, Topic: "orders",
	}))
	if !bytes.Equal(got, want) {
		t.Fatalf("Welcome bytes\n%x\nwant today's\n%x", got, want)
	}
	return id
}

// expectMembers reads the next frame, which must be a Members frame listing
// want; it returns the frame's version.
func (c *client) expectMembers(want ...string) *protocol.MembersVersion {
	c.t.Helper()
	f := c.expect()
	if f.GetMembers() == nil {
		c.t.Fatalf("got %v, want Members %q", f, want)
	}
	if got := protocol.Addresses(f.GetMembers().GetMembers()); !slices.Equal(got, want) {
		c.t.Fatalf("Members %q, want %q", got, want)
	}
	return f.GetMembers().GetVersion()
}

// expectPong pings and expects the Pong as the next frame: nothing was
// queued before the Ping.
func (c *client) expectPong(nonce uint64) {
	c.t.Helper()
	c.send(protocol.PingFrame(nonce))
	if f := c.expect(); f.GetPong().GetNonce() != nonce {
		c.t.Fatalf("got %v, want the Pong %d next", f, nonce)
	}
}

func TestWelcomeListsMembersToCapableClients(t *testing.T) {
	t.Parallel()
	l := &memberList{}
	l.set("10.0.0.1:4987", "10.0.0.2:4987", "10.0.0.3:4987")
	s := startMembersServer(t, l)

	c := dial(t, s)
	w := c.hello(capableHello())
	if got := protocol.Addresses(w.GetMembers()); !slices.Equal(got, l.list()) {
		t.Errorf("Welcome.members = %q, want %q", got, l.list())
	}

	// Leader mode: no members, the Welcome of a capable client is today's.
	l.set()
	c = dial(t, s)
	if w := c.hello(capableHello()); len(w.GetMembers()) != 0 {
		t.Errorf("Welcome.members = %v in leader mode, want none", w.GetMembers())
	}
}

// The Welcome and the Members frames carry the list's version, the
// assignment's epoch and generation, so that a client keeps the newest list
// when members disagree for a moment.
func TestMembersListsCarryTheirVersion(t *testing.T) {
	t.Parallel()
	l := &memberList{}
	l.set("a:1", "b:2")
	l.version(3, 7)
	s := startMembersServer(t, l)
	c := dial(t, s)
	w := c.hello(capableHello())
	if v := w.GetMembersVersion(); v.GetEpoch() != 3 || v.GetGeneration() != 7 {
		t.Fatalf("Welcome.members_version = %v, want epoch 3 generation 7", v)
	}
	l.set("a:1", "b:2", "c:3")
	l.version(4, 8)
	s.MembersChanged()
	if v := c.expectMembers("a:1", "b:2", "c:3"); v.GetEpoch() != 4 || v.GetGeneration() != 8 {
		t.Fatalf("Members.version = %v, want epoch 4 generation 8", v)
	}
}

// A client that announces no capability gets exactly the frames it got
// before members existed, whatever the list and its changes.
func TestClientWithoutCapabilitySeesTodaysFrames(t *testing.T) {
	t.Parallel()
	l := &memberList{}
	l.set("10.0.0.1:4987", "10.0.0.2:4987")
	s := startMembersServer(t, l)
	c := dial(t, s)
	c.send(protocol.HelloFrame(&protocol.Hello{ClientId: "old", ProtocolVersion: protocol.Version, MaxInFlight: 10}))
	id := c.expectTodaysWelcome(t, 10)

	l.set("10.0.0.1:4987", "10.0.0.2:4987", "10.0.0.3:4987")
	s.MembersChanged()
	msg := testMessage(2, 7, 10)
	s.b.sink(t, id).Send([]dispatch.Delivery{{ID: 5, Attempt: 1, Msg: msg}})
	got := c.readRaw()
	want := wire(t, protocol.DeliverFrame(&protocol.Deliver{
		DeliveryId: 5, Partition: 2, Offset: 7, Key: msg.Key, Value: msg.Value,
		Headers:     []*protocol.Header{{Key: "trace", Value: []byte("abc")}, {Key: "n", Value: []byte{7}}},
		TimestampMs: msg.Timestamp.UnixMilli(), Attempt: 1,
	}))
	if !bytes.Equal(got, want) {
		t.Fatalf("after MembersChanged: frame\n%x\nwant the Deliver\n%x", got, want)
	}
	c.send(protocol.PingFrame(9))
	if got, want := c.readRaw(), wire(t, protocol.PongFrame(9)); !bytes.Equal(got, want) {
		t.Fatalf("after MembersChanged: frame\n%x\nwant the Pong\n%x", got, want)
	}
}

func TestMembersChangedReachesCapableClients(t *testing.T) {
	t.Parallel()
	l := &memberList{}
	l.set("a:1", "b:2")
	s := startMembersServer(t, l)
	capable := dial(t, s)
	capable.hello(capableHello())
	old, _ := connect(t, s)
	half := dial(t, s) // has said hello, not yet welcomed: its Welcome will carry the list

	l.set("a:1", "b:2", "c:3")
	s.MembersChanged()
	capable.expectMembers("a:1", "b:2", "c:3")
	l.set("a:1", "c:3")
	s.MembersChanged()
	capable.expectMembers("a:1", "c:3")
	old.expectPong(1) // nothing for a client without the capability

	w := half.hello(capableHello())
	if got := protocol.Addresses(w.GetMembers()); !slices.Equal(got, []string{"a:1", "c:3"}) {
		t.Errorf("Welcome.members = %q, want the latest list", got)
	}
	half.expectPong(2)

	l.set()
	s.MembersChanged()
	capable.expectMembers() // an empty list is a list too
	capable.expectPong(3)
}

// Changes of the list while the pump is busy writing are coalesced: the
// client gets the latest list once, never a backlog of older ones.
func TestMembersCoalesced(t *testing.T) {
	t.Parallel()
	l := &memberList{}
	l.set("a:1")
	s := startMembersServer(t, l)
	c := dial(t, s)
	h := capableHello()
	h.MaxFrameSize = 64 << 20
	w := c.hello(h)
	id := w.GetSessionId()
	// A delivery larger than the socket buffers keeps the pump in its write
	// while the client does not read.
	big := &dispatch.Message{Partition: 1, Value: make([]byte, 48<<20)}
	s.b.sink(t, id).Send([]dispatch.Delivery{{ID: 1, Attempt: 1, Msg: big}})
	cn := s.conn(t, id)
	testutil.WaitFor(t, testTimeout, "the pump to take the delivery", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return len(cn.out) == 0
	})
	var last []string
	for i := range 100 {
		last = []string{"a:1", fmt.Sprintf("b:%d", i)}
		l.set(last...)
		s.MembersChanged()
	}
	if f := c.expect(); f.GetDeliver().GetDeliveryId() != 1 {
		t.Fatalf("got %v, want the delivery", f)
	}
	c.expectMembers(last...)
	c.expectPong(1)
}

// A list too large for the client's max_frame_size is not sent (a warning
// says so); the session goes on.
func TestMembersAboveClientFrameLimitNotSent(t *testing.T) {
	t.Parallel()
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("member-%02d.example.com:4987", i))
	}
	l := &memberList{}
	l.set(many...)
	s := startMembersServer(t, l)
	c := dial(t, s)
	h := capableHello()
	h.MaxFrameSize = 512
	if w := c.hello(h); len(w.GetMembers()) != 0 {
		t.Errorf("Welcome of %d bytes sent to a client of 512", proto.Size(w))
	}
	l.set(many[1:]...)
	s.MembersChanged()
	c.expectPong(1)
	l.set("a:1")
	s.MembersChanged()
	c.expectMembers("a:1")
}

// conn returns the open connection with session id.
func (s *testServer) conn(t testing.TB, id uint64) *conn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.conns[id]
	if c == nil {
		t.Fatalf("no connection %d", id)
	}
	return c
}
