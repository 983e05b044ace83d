package server

import (
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/protocol"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A Hello is read under protocol.MaxHelloSize, whatever MaxFrameSize allows
// after the handshake.
func TestHelloSizeLimited(t *testing.T) {
	s := startServer(t) // MaxFrameSize 1 MiB
	hello := func(idLen int) *protocol.Frame {
		return protocol.HelloFrame(&protocol.Hello{ClientId: strings.Repeat("x", idLen), ProtocolVersion: protocol.Version})
	}
	big := dial(t, s)
	big.send(hello(protocol.MaxHelloSize))
	e := big.expectError(protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE)
	if !strings.Contains(e.GetMessage(), "4096") {
		t.Errorf("error %q does not name the hello limit", e.GetMessage())
	}
	big.expectClosed()

	ok := dial(t, s)
	ok.send(hello(protocol.MaxHelloSize - 100))
	if f := ok.expect(); f.GetWelcome() == nil {
		t.Fatalf("got %v, want a Welcome for a Hello under the limit", f)
	}
	// After the handshake the configured limit applies: a 100 KiB Goodbye
	// is a legal frame.
	ok.send(protocol.GoodbyeFrame(strings.Repeat("g", 100<<10)))
	ok.expectClosed()
	if got := s.Stats().Closed[closeGoodbye]; got != 1 {
		t.Errorf("goodbyes counted %d, want 1", got)
	}
}

// Connections that never say hello are bounded by MaxHandshakes: each new
// one closes the one that has waited longest, so a real client that says
// hello at once is served whatever the flood.
func TestSilentConnectionsEvicted(t *testing.T) {
	const max, silent = 8, 40
	s := startServer(t, func(c *Config) { c.MaxHandshakes = max })
	conns := make([]*client, silent)
	for i := range conns {
		conns[i] = dial(t, s)
	}
	testutil.WaitFor(t, testTimeout, "silent connections evicted", func() bool {
		return s.Stats().Closed[closeEvicted] == silent-max
	})
	if n := s.Stats().Handshaking; n != max {
		t.Fatalf("%d connections waiting for hello, want %d", n, max)
	}
	// The oldest got a temporary error; the newest still wait.
	conns[0].expectError(protocol.ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS)
	conns[0].expectClosed()

	c, id := connect(t, s)
	d := dispatch.Delivery{ID: 7, Attempt: 1, Msg: testMessage(0, 7, 100)}
	s.b.sink(t, id).Send([]dispatch.Delivery{d})
	c.expectDeliver(d)
	c.send(protocol.AckFrame([]uint64{7}))
	s.b.waitCall(t, "ack", id)
	// The client's connection took the place of the oldest silent one, and
	// left the list with its hello.
	if n := s.Stats().Handshaking; n != max-1 {
		t.Errorf("%d connections waiting for hello after the client's, want %d", n, max-1)
	}
	// A late hello on a waiting connection is still welcome.
	conns[silent-1].hello(nil)
	if n := s.Stats().Handshaking; n != max-2 {
		t.Errorf("%d connections waiting for hello, want %d", n, max-2)
	}
}
