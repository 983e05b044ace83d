package server

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

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

// heapPeak samples the heap until stop is called and returns the highest
// HeapAlloc seen. The caller measures its baseline before starting it.
func heapPeak() (stop func() uint64) {
	done := make(chan struct{})
	peak := make(chan uint64, 1)
	go func() {
		var ms runtime.MemStats
		var top uint64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			top = max(top, ms.HeapAlloc)
			select {
			case <-done:
				peak <- top
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// heapNow returns HeapAlloc after a collection.
func heapNow() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A client that sends Pings and never reads its Pongs is dropped as a slow
// consumer once its queued Pongs pass MaxOutboxBytes, and the heap stays
// under a bound derived from it; another client is served meanwhile.
func TestPingFloodBounded(t *testing.T) {
	const outbox = 256 << 10
	s := startServer(t, func(c *Config) { c.MaxOutboxBytes = outbox })
	good, goodID := connect(t, s)
	flood, floodID := connect(t, s)
	if err := flood.nc.(*net.TCPConn).SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	// 64 KiB of Pings, written again and again: 16 MiB in all at most, which
	// without the bound queues millions of Pongs (about 150 bytes of heap each).
	chunk := encodePings(64 << 10)
	base := heapNow()
	stop := heapPeak()
	written := 0
	for written < 16<<20 && len(s.b.find("leave", floodID)) == 0 {
		_ = flood.nc.SetWriteDeadline(time.Now().Add(testTimeout))
		n, err := flood.nc.Write(chunk)
		written += n
		if err != nil {
			break // the server closed the connection
		}
	}
	peak := stop()
	// The bound: the outbox and the batch the pump is writing hold at most
	// MaxOutboxBytes of entries each, their slices as much again, plus the
	// connection's buffers (32 KiB read, 64 KiB write) and the garbage of
	// decoded Pings between collections (the GC's 4 MiB minimum heap goal);
	// 8 MiB more for the test's own allocations and the sampling lag. Without
	// the bound the heap grows by hundreds of MiB.
	const bound = 4*outbox + 96<<10 + 4<<20 + 8<<20
	if growth := int64(peak) - int64(base); growth > bound {
		t.Errorf("heap grew by %d KiB during a flood of %d KiB of Pings, bound %d KiB", growth>>10, written>>10, bound>>10)
	}
	t.Logf("flood of %d KiB of Pings: heap peak %d KiB above the baseline (bound %d KiB)", written>>10, (int64(peak)-int64(base))>>10, bound>>10)

	if l := s.b.waitCall(t, "leave", floodID); l.reason != dispatch.LeaveSlow {
		t.Fatalf("flooding client left with %v, want %v", l.reason, dispatch.LeaveSlow)
	}
	logs := s.closeLogs(floodID)
	if len(logs) != 1 || logs[0].Data["reason"] != "slow consumer" ||
		!strings.Contains(fmt.Sprint(logs[0].Data["error"]), "--max-outbox-bytes") {
		t.Fatalf("close logs %v, want one naming the outbox bound", logs)
	}
	if got := s.Stats().Closed[closeSlow]; got != 1 {
		t.Errorf("slow consumers counted %d, want 1", got)
	}
	d := dispatch.Delivery{ID: 5, Attempt: 1, Msg: testMessage(0, 5, 100)}
	s.b.sink(t, goodID).Send([]dispatch.Delivery{d})
	good.expectDeliver(d)
	good.send(protocol.AckFrame([]uint64{5}))
	s.b.waitCall(t, "ack", goodID)
	if ls := s.b.find("leave", goodID); len(ls) != 0 {
		t.Fatalf("the good client left: %v", ls)
	}
}

// encodePings returns about n bytes of Ping frames.
func encodePings(n int) []byte {
	var buf bytes.Buffer
	w := protocol.NewWriter(&buf, 0)
	for i := uint64(1); buf.Len()+w.Buffered() < n; i++ {
		_ = w.WriteFrame(protocol.PingFrame(i))
	}
	_ = w.Flush()
	return buf.Bytes()
}

// A client that reads, but only a trickle, is dropped as a slow consumer
// once what was queued for it is not written within WriteTimeout, even
// though each write to its socket makes progress; a client that reads at
// full speed is not.
func TestTrickleReaderDropped(t *testing.T) {
	const writeTimeout = 2 * time.Second
	s := startServer(t, func(c *Config) { c.WriteTimeout = writeTimeout })
	trickle, trickleID := connect(t, s)
	fast, fastID := connect(t, s)
	if err := trickle.nc.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	s.Server.mu.Lock()
	server := s.Server.conns[trickleID].nc.(*net.TCPConn)
	s.Server.mu.Unlock()
	if err := server.SetWriteBuffer(32 << 10); err != nil {
		t.Fatal(err)
	}
	// 4 MiB of small deliveries: each write call of the pump (64 KiB) ends
	// in about 200 ms at the trickle's pace, 320 KiB/s, but the whole takes
	// over 12 s.
	var ds, fds []dispatch.Delivery
	for i := range 4 << 10 {
		m := testMessage(0, int64(i), 1<<10)
		ds = append(ds, dispatch.Delivery{ID: uint64(i + 1), Attempt: 1, Msg: m})
		fds = append(fds, dispatch.Delivery{ID: uint64(i + 1 + 1<<20), Attempt: 1, Msg: m})
	}
	stopTrickle := make(chan struct{})
	defer close(stopTrickle)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-stopTrickle:
				return
			case <-time.After(50 * time.Millisecond):
			}
			_ = trickle.nc.SetReadDeadline(time.Now().Add(testTimeout))
			if _, err := io.ReadFull(trickle.nc, buf); err != nil {
				return
			}
		}
	}()
	fastDone := make(chan int64, 1)
	go func() {
		_ = fast.nc.SetReadDeadline(time.Now().Add(3 * testTimeout))
		n, _ := io.CopyN(io.Discard, fast.nc, 4<<20) // at least 4 MiB of frames
		fastDone <- n
	}()
	start := time.Now() // before the deliveries are queued
	s.b.sink(t, trickleID).Send(ds)
	s.b.sink(t, fastID).Send(fds)
	l := s.b.waitCall(t, "leave", trickleID)
	if l.reason != dispatch.LeaveSlow {
		t.Fatalf("trickle reader left with %v, want %v", l.reason, dispatch.LeaveSlow)
	}
	if el := time.Since(start); el < writeTimeout {
		t.Fatalf("trickle reader dropped %v after its deliveries were queued, before the write timeout %v", el, writeTimeout)
	}
	if n := <-fastDone; n != 4<<20 {
		t.Fatalf("fast reader got %d bytes, want at least 4 MiB", n)
	}
	if ls := s.b.find("leave", fastID); len(ls) != 0 {
		t.Fatalf("the fast reader left: %v", ls)
	}
}
