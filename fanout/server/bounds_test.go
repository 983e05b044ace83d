package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A Hello is read under protocol.MaxHelloSize, whatever MaxFrameSize allows
// after the handshake.
func TestHelloSizeLimited(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	// Not parallel: it bounds the whole process's heap.
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
	written, nudges := 0, 0
	for written < 16<<20 && len(s.b.find("leave", floodID)) == 0 {
		_ = flood.nc.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := flood.nc.Write(chunk)
		written += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Loopback TCP can stall both ways with a full 4 KiB receive
			// buffer here: the kernel drops the daemon's segments, which
			// carry the acks of our Pings, and backs off its window probes
			// for minutes (seen on a loaded machine, TcpExtTCPRcvQDrop).
			// Reading one buffer's worth opens the window; the daemon still
			// queues Pongs thousands of times faster than we read them.
			_ = flood.nc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = flood.nc.Read(make([]byte, 4<<10))
			nudges++
			continue
		}
		if err != nil {
			break // the server closed the connection
		}
	}
	peak := stop()
	// The bound: the outbox and the batch the pump is writing hold at most
	// MaxOutboxBytes of entries each, their slices as much again, plus the
	// connection's buffers (4 KiB read-ahead, 64 KiB write) and the garbage of
	// decoded Pings between collections (the GC's 4 MiB minimum heap goal);
	// 8 MiB more for the test's own allocations and the sampling lag. Without
	// the bound the heap grows by hundreds of MiB.
	const bound = 4*outbox + 96<<10 + 4<<20 + 8<<20
	if growth := int64(peak) - int64(base); growth > bound {
		t.Errorf("heap grew by %d KiB during a flood of %d KiB of Pings, bound %d KiB", growth>>10, written>>10, bound>>10)
	}
	t.Logf("flood of %d KiB of Pings (%d stalled writes followed by a read of 4 KiB): heap peak %d KiB above the baseline (bound %d KiB)",
		written>>10, nudges, (int64(peak)-int64(base))>>10, bound>>10)

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
	t.Parallel()
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

// An Ack, Nack or Touch naming more ids than the client's in-flight limit is
// refused, fatally, before its ids are decoded; one at the limit is handed
// to the backend.
func TestIDsPerFrameCapped(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		frame func([]uint64) *protocol.Frame
		op    string
	}{
		{"ack", protocol.AckFrame, "ack"},
		{"nack", protocol.NackFrame, "nack"},
		{"touch", protocol.TouchFrame, "touch"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t)
			c := dial(t, s)
			w := c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: protocol.Version, MaxInFlight: 10})
			id := w.GetSessionId()
			ids := make([]uint64, 11)
			for i := range ids {
				ids[i] = uint64(i + 1)
			}
			c.send(tt.frame(ids[:10]))
			if got := s.b.waitCall(t, tt.op, id); len(got.ids) != 10 {
				t.Fatalf("%s of %d ids reached the backend, want 10", tt.op, len(got.ids))
			}
			c.send(tt.frame(ids))
			e := c.expectError(protocol.ErrorCode_ERROR_CODE_TOO_MANY_IDS)
			if !strings.Contains(e.GetMessage(), "11") || !strings.Contains(e.GetMessage(), "10") {
				t.Errorf("error %q does not name the count and the limit", e.GetMessage())
			}
			c.expectClosed()
			if l := s.b.waitCall(t, "leave", id); l.reason != dispatch.LeaveProtocol {
				t.Fatalf("Leave reason %v, want %v", l.reason, dispatch.LeaveProtocol)
			}
			if n := len(s.b.find(tt.op, id)); n != 1 {
				t.Fatalf("%d %s calls, want only the one at the limit", n, tt.op)
			}
		})
	}
}

// blockingBackend is a fakeBackend whose Ack blocks for the clients named
// in block until release is closed, as when the dispatcher's queue is full.
type blockingBackend struct {
	*fakeBackend
	block   map[string]bool // client names
	release chan struct{}
	mu      sync.Mutex
	names   map[uint64]string
	blocked atomic.Int64
}

func (b *blockingBackend) Join(id uint64, name string, maxInFlight int, sink dispatch.ClientSink) {
	b.mu.Lock()
	b.names[id] = name
	b.mu.Unlock()
	b.fakeBackend.Join(id, name, maxInFlight, sink)
}

func (b *blockingBackend) Ack(id uint64, ids []uint64) {
	b.mu.Lock()
	block := b.block[b.names[id]]
	b.mu.Unlock()
	if block {
		b.blocked.Add(1)
		<-b.release
	}
	b.fakeBackend.Ack(id, ids)
}

// A flood of Ack frames from clients whose acks the dispatcher does not take
// (a full queue) pins at most one frame per reader, and a frame names at most
// the client's credit of ids: the heap stays under a bound derived from the
// in-flight limit, and another client is served.
func TestAckFloodBounded(t *testing.T) {
	// Not parallel: it bounds the whole process's heap.
	const credit, flooders = 1000, 8
	logger, hook := logtest.NewNullLogger()
	b := &blockingBackend{fakeBackend: newFakeBackend(), block: map[string]bool{"flood": true},
		release: make(chan struct{}), names: map[uint64]string{}}
	cfg := testConfig(func(c *Config) { c.MaxInFlight = credit; c.MaxFrameSize = protocol.DefaultMaxFrameSize })
	cfg.Logger = logrus.NewEntry(logger)
	srv, err := New(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(b.release); _ = srv.Close() })
	s := &testServer{Server: srv, b: b.fakeBackend, logs: hook}

	// Half the flooders send frames at the limit (legal, each blocks its
	// reader), half 4 MiB frames of one-byte ids: 4 million ids, 32 MiB
	// decoded, were they decoded.
	legal := make([]uint64, credit)
	for i := range legal {
		legal[i] = uint64(i + 1)
	}
	legalFrame := encodeFrame(t, protocol.AckFrame(legal))
	const hugeIDs = protocol.DefaultMaxFrameSize - 32
	huge := protowire.AppendTag(nil, 1, protowire.BytesType)
	huge = protowire.AppendVarint(huge, hugeIDs)
	huge = append(huge, bytes.Repeat([]byte{1}, hugeIDs)...)
	hugeBody := protowire.AppendTag(nil, 5, protowire.BytesType) // Frame.ack
	hugeBody = protowire.AppendVarint(hugeBody, uint64(len(huge)))
	hugeBody = append(hugeBody, huge...)
	hugeFrame := append(binary.BigEndian.AppendUint32(nil, uint32(len(hugeBody))), hugeBody...)

	good, goodID := connect(t, s)
	base := heapNow()
	stop := heapPeak()
	var wg sync.WaitGroup
	for i := range flooders {
		c := dial(t, s)
		c.hello(&protocol.Hello{ClientId: "flood", ProtocolVersion: protocol.Version})
		frame := legalFrame
		if i%2 == 1 {
			frame = hugeFrame
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 32 MiB per flooder, or until the server stops reading.
			for sent := 0; sent < 32<<20; sent += len(frame) {
				_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.nc.Write(frame); err != nil {
					return
				}
			}
		}()
	}
	testutil.WaitFor(t, testTimeout, "every flooder's reader blocked or closed", func() bool {
		return b.blocked.Load()+int64(s.Stats().Closed[closeProtocol]) == flooders
	})
	wg.Wait() // every flooder's writes stopped: blocked readers, closed connections
	peak := stop()
	refused := 0
	for _, e := range s.logs.AllEntries() {
		if e.Message == "client connection closed" && strings.Contains(fmt.Sprint(e.Data["error"]), "names 4194272 delivery ids") {
			refused++
		}
	}
	if refused != flooders/2 {
		t.Errorf("%d connections closed for too many ids, want %d", refused, flooders/2)
	}
	// The bound: a blocked reader holds one frame of at most credit ids
	// (8 KiB) and its buffers (4 KiB read-ahead, at most 64 KiB kept after a
	// frame); a refused frame is read whole into the read buffer (4 MiB,
	// growing by doubling: 8 MiB allocated) and released. 8 flooders: under
	// 40 MiB; with the GC's own slack and the test's allocations, 80 MiB.
	// Decoding the refused frames' ids alone would take 4 x 32 MiB.
	const bound = 80 << 20
	if growth := int64(peak) - int64(base); growth > bound {
		t.Errorf("heap grew by %d MiB during the ack flood, bound %d MiB", growth>>20, bound>>20)
	}
	t.Logf("ack flood: heap peak %d MiB above the baseline (bound %d MiB)", (int64(peak)-int64(base))>>20, bound>>20)

	d := dispatch.Delivery{ID: 5, Attempt: 1, Msg: testMessage(0, 5, 100)}
	s.b.sink(t, goodID).Send([]dispatch.Delivery{d})
	good.expectDeliver(d)
	good.send(protocol.AckFrame([]uint64{5}))
	s.b.waitCall(t, "ack", goodID)
}

// encodeFrame returns f as bytes on the wire.
func encodeFrame(t testing.TB, f *protocol.Frame) []byte {
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

// DeliverFrameSize bounds the Deliver frame of a message whatever its id and
// attempt, and not by much.
func TestDeliverFrameSizeBound(t *testing.T) {
	t.Parallel()
	msgs := []*dispatch.Message{
		{},
		{Partition: 7, Offset: 1 << 40, Value: []byte("v")},
		testMessage(3, 99, 1000),
		testMessage(0, 0, 300<<10),
		{Partition: 1, Offset: 5, Key: make([]byte, 200), Value: make([]byte, 70000),
			Headers:   []dispatch.Header{{Key: "\xff\xfe bad utf-8 \xfd", Value: make([]byte, 129)}, {}, {Key: "k"}},
			Timestamp: time.Unix(1<<40, 0)},
	}
	for i, m := range msgs {
		p := &pumpState{}
		var buf bytes.Buffer
		p.w = protocol.NewWriter(&buf, 0)
		p.w.SetMaxFrameSize(1 << 30)
		d := dispatch.Delivery{ID: ^uint64(0), Attempt: ^uint32(0), Msg: m}
		if err := p.writeDelivery(&d); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if err := p.w.Flush(); err != nil {
			t.Fatal(err)
		}
		got := buf.Len() - protocol.HeaderSize
		bound := DeliverFrameSize(m)
		if bound < got || bound > got+48 {
			t.Errorf("message %d: DeliverFrameSize %d, frame of %d bytes", i, bound, got)
		}
	}
}

// A client's Hello.max_frame_size is its sink's limit (the dispatcher sends
// it nothing larger) and the pump's: a delivery above it is never written,
// whoever queued it.
func TestClientFrameLimit(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	def, defID := connect(t, s)
	if got := s.b.sink(t, defID).(dispatch.LimitedSink).MaxFrameSize(); got != protocol.DefaultMaxFrameSize {
		t.Errorf("a Hello without max_frame_size: limit %d, want the default %d", got, protocol.DefaultMaxFrameSize)
	}
	c := dial(t, s)
	id := c.hello(&protocol.Hello{ClientId: "small", ProtocolVersion: protocol.Version, MaxFrameSize: 8 << 10}).GetSessionId()
	sink := s.b.sink(t, id)
	if got := sink.(dispatch.LimitedSink).MaxFrameSize(); got != 8<<10 {
		t.Fatalf("sink limit %d, want %d", got, 8<<10)
	}
	fits := dispatch.Delivery{ID: 1, Attempt: 1, Msg: testMessage(0, 1, 7<<10)}
	sink.Send([]dispatch.Delivery{fits})
	c.expectDeliver(fits)
	big := dispatch.Delivery{ID: 2, Attempt: 1, Msg: testMessage(0, 2, 9<<10)}
	sink.Send([]dispatch.Delivery{big})
	c.expectError(protocol.ErrorCode_ERROR_CODE_INTERNAL)
	c.expectClosed()
	// The default client takes it.
	big.ID = 3
	s.b.sink(t, defID).Send([]dispatch.Delivery{big})
	def.expectDeliver(big)
}
