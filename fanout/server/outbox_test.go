package server

import (
	"testing"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/protocol"
	"google.golang.org/protobuf/proto"
)

func TestDeliverEdgeValues(t *testing.T) {
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
		{DeliveryId: 1, Attempt: 1, Partition: -1, Offset: -2,
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
