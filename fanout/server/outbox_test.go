package server

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"google.golang.org/protobuf/proto"
)

func TestDeliverEdgeValues(t *testing.T) {
	t.Parallel()
	// writeDelivery encodes with WriteDeliver: edge values arrive as the
	// generated code would encode them, and header keys that are not UTF-8
	// are repaired rather than failing the connection.
	s := startServer(t)
	c, id := connect(t, s)
	sink := s.b.sink(t, id)
	ds := []dispatch.Delivery{
		{ID: 1, Attempt: 1, Msg: &dispatch.Message{Partition: -1, Offset: -2, Key: []byte{}, Value: nil,
			Headers: []dispatch.Header{{Key: "bad \xff key", Value: []byte{0xff}}, {}}}},
		{ID: 1<<64 - 1, Attempt: 1<<32 - 1, Msg: nil},
		{ID: 3, Attempt: 2, Msg: testMessage(2, 3, 100<<10)}, // larger than the write buffer
	}
	want := []*protocol.Deliver{
		{DeliveryId: 1, Attempt: 1, Partition: -1, Offset: -2, Key: []byte{}, // an empty key, not none
			Headers: []*protocol.Header{{Key: "bad \uFFFD key", Value: []byte{0xff}}, {}}},
		{DeliveryId: 1<<64 - 1, Attempt: 1<<32 - 1},
	}
	sink.Send(ds)
	for i, w := range want {
		if got := c.expect().GetDeliver(); !proto.Equal(got, w) {
			t.Fatalf("delivery %d: %v, want %v", i, got, w)
		}
	}
	c.expectDeliver(ds[2])
}

// The liveness judge: silence longer than the window is death, except at a
// tick that came late (the daemon itself was paused, the client's frames
// wait unread), which judges nothing, and only once in a row.
func TestLivenessAfterThePumpWasPaused(t *testing.T) {
	t.Parallel()
	const hb, window = time.Second, 2 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	type tick struct {
		at, lastSeen time.Duration // since t0
		dead         bool
	}
	for _, tc := range []struct {
		name  string
		ticks []tick
	}{
		{"heard from", []tick{{hb, 0, false}, {2 * hb, hb, false}, {3 * hb, 2 * hb, false}}},
		{"silent on time", []tick{{hb, 0, false}, {2 * hb, 0, false}, {3 * hb, 0, true}}},
		// Paused from 1s to 5s: the client's pings of 2s to 5s are unread at
		// the late tick; the next tick sees them read.
		{"paused, then reads", []tick{{hb, 0, false}, {5 * hb, 0, false}, {6 * hb, 5 * hb, false}}},
		{"paused, silent after", []tick{{hb, 0, false}, {5 * hb, 0, false}, {6 * hb, 0, true}}},
		// Paused before the first tick (the pump had just started the ticker).
		{"paused at the start", []tick{{4 * hb, 0, false}, {5 * hb, 4 * hb, false}}},
		// Starved for good: every tick is late; every other one judges.
		{"always late", []tick{{hb, 0, false}, {3 * hb, 0, false}, {5 * hb, 0, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := liveness{lastTick: t0} // the ticker started at t0
			for i, tk := range tc.ticks {
				if _, dead := l.silence(t0.Add(tk.at), t0.Add(tk.lastSeen), hb, window); dead != tk.dead {
					t.Fatalf("tick %d at %v (last heard at %v): dead %v, want %v", i+1, tk.at, tk.lastSeen, dead, tk.dead)
				}
			}
		})
	}
}

// The pump's writer on a TCP connection refers to the values it delivers
// rather than copying them (the bytes on the wire are the value's bytes as
// they are at the flush, one writev through the deadline writer); on any
// other connection (TLS, a pipe) it copies them as it encodes.
func TestPumpWriterRefersToValuesOnTCP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	tcp := <-accepted
	if tcp == nil {
		t.Fatal("no connection accepted")
	}
	defer tcp.Close()
	pipeSrv, pipeCli := net.Pipe()
	defer pipeSrv.Close()
	defer pipeCli.Close()

	for _, tc := range []struct {
		name    string
		srv     net.Conn
		cli     net.Conn
		aliased bool
	}{{"tcp", tcp, dialed, true}, {"pipe", pipeSrv, pipeCli, false}} {
		p := &pumpState{dw: deadlineWriter{c: &conn{}, nc: tc.srv}}
		w := p.writer()
		value := bytes.Repeat([]byte("a"), 4<<10)
		if err := w.WriteDeliver(&protocol.Deliver{DeliveryId: 1, Value: value}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		copy(value, "changed after it was encoded")
		flushed := make(chan error, 1)
		go func() { flushed <- w.Flush() }() // a pipe's write waits for the read
		var f protocol.Frame
		if err := protocol.NewReader(tc.cli, 0).ReadFrame(&f); err != nil {
			t.Fatalf("%s: read: %v", tc.name, err)
		}
		if err := <-flushed; err != nil {
			t.Fatalf("%s: flush: %v", tc.name, err)
		}
		got := f.GetDeliver().GetValue()
		if aliased := bytes.HasPrefix(got, []byte("changed")); aliased != tc.aliased {
			t.Errorf("%s: the value sent refers to the message's bytes: %v, want %v", tc.name, aliased, tc.aliased)
		}
	}
}
