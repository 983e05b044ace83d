package server

import (
	"testing"

	"github.com/nanoservice/core-fanout/client/protocol"
	"google.golang.org/protobuf/proto"
)

// FuzzConnInput sends random bytes after a valid hello. Whatever they are,
// the server must not panic (a recovered panic is logged, and fails the
// target), and the connection must end with exactly one Leave.
func FuzzConnInput(f *testing.F) {
	for _, fr := range []*protocol.Frame{
		protocol.AckFrame([]uint64{1, 2, 3}),
		protocol.NackFrame([]uint64{1 << 63}),
		protocol.TouchFrame(nil),
		protocol.PingFrame(7),
		protocol.PongFrame(7),
		protocol.GoodbyeFrame("bye"),
		protocol.HelloFrame(&protocol.Hello{ProtocolVersion: 1}),
		protocol.DeliverFrame(&protocol.Deliver{DeliveryId: 1, Value: []byte("v")}),
		protocol.MembersFrame([]string{"a:1"}, nil), // daemon -> client only
	} {
		b, err := proto.Marshal(fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frameBytes(uint32(len(b)), b...))
	}
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(frameBytes(3, 0xff, 0xff, 0xff))
	f.Add(frameBytes(0))
	f.Add([]byte{0, 0})

	s := startServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, id := connect(t, s)
		// The server may close the connection before it has read everything.
		_, _ = c.nc.Write(data)
		_ = c.nc.Close()
		s.b.waitCall(t, "leave", id)
		if n := len(s.b.find("leave", id)); n != 1 {
			t.Fatalf("%d Leave calls, want 1", n)
		}
		if p := s.panics(); len(p) > 0 {
			t.Fatalf("server panicked on %x: %v", data, p)
		}
	})
}
